"""Dashboard without a browser: the store (safety, caching, Live), figures and callbacks, the real Dash
callback endpoint (crafted run names), and the `syncviz dash` command's errors.

Browser tests are in test_dashboard_browser.py; both use build_root() below."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from syncviz import analysis as A
from syncviz.trace import schema as S
from syncviz.dashboard.data.synth import write_synth_run
from syncviz.trace import RankWriter, TraceError, load_run, new_meta, write_json_atomic
from tracebuild import columns, make_ddp_run, simple_step

DATA = Path(__file__).parent / "data"


def build_root(root: Path) -> Path:
    """The runs the dashboard tests serve: hand-built DDP (2 ranks, rank 1 straggles), synthetic
    8 and 24 ranks, a run in a sub-folder, a run whose rank 1 file was cut short, and two broken
    runs from tests/data."""
    root.mkdir(parents=True, exist_ok=True)
    make_ddp_run(root / "ddp", steps=4, straggler=1, straggle_ms=3)
    write_synth_run(root / "synth8", world=8, steps=12, n_buckets=6, straggler=3, straggle_ms=4)
    write_synth_run(root / "synth24", world=24, steps=5, n_buckets=8, straggler=7, straggle_ms=4)
    write_synth_run(root / "nested" / "inner", world=2, steps=3, n_buckets=3)
    cut = write_synth_run(root / "truncated", world=2, steps=6, n_buckets=4)
    f = cut / S.rank_file(1)
    f.write_bytes(f.read_bytes()[: f.stat().st_size * 2 // 3])
    from test_timeline import zero3_like_run
    zero3_like_run(root / "zero3")
    for scenario in ("dash_corrupt_json", "dash_bad_stream"):
        shutil.copytree(DATA / scenario, root / scenario)
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return build_root(tmp_path_factory.mktemp("dash") / "runs")


@pytest.fixture(scope="module")
def app(root):
    from syncviz.dashboard.app import create_app
    return create_app(root)


@pytest.fixture(scope="module")
def store(app):
    from syncviz.dashboard import components as C
    return C.store()


# ------------------------------------------------------------------------------------ page scripts
def test_pages_load_dash_scripts_less_the_babel_polyfill(app):
    """page_scripts: every page loads Dash's scripts but @babel/polyfill (its RegExp feature test takes
    the tab's regular expressions off V8's fast path), and the regenerator runtime Dash's bundles call
    before the renderer that calls it; a CDN's polyfill tag goes too, other tags stay."""
    import re
    from syncviz.dashboard.page_scripts import without_polyfill
    html = app.server.test_client().get("/replay").get_data(as_text=True)
    srcs = re.findall(r'<script[^>]*src="([^"]+)"', html)
    assert srcs and not [s for s in srcs if "polyfill" in s]
    runtime = next(i for i, s in enumerate(srcs) if "/assets/regenerator_runtime.js" in s)
    renderer = next(i for i, s in enumerate(srcs) if "dash_renderer" in s)
    assert runtime < renderer and any("react-dom" in s for s in srcs)
    cdn = ('<script src="https://unpkg.com/@babel/polyfill@7.12.1/dist/polyfill.min.js"></script>\n'
           '<script src="https://unpkg.com/react@18.3.1/umd/react.production.min.js"></script>\n'
           '<script src="/_dash-component-suites/dash/deps/polyfill@7.v4_4_1m1.12.1.min.js"></script>\n')
    assert without_polyfill(cdn) == '<script src="https://unpkg.com/react@18.3.1/umd/react.production.min.js"></script>\n'


def test_pages_get_a_plotly_js_of_the_trace_types_they_draw(app, tmp_path, monkeypatch):
    """page_scripts: at the URL dash-renderer loads plotly.js from, the app serves the partial bundle,
    which holds exactly page_scripts.TRACES (tests/test_dashboard_browser.py checks every page's
    graphs against it), where it is the plotly.js version the plotly package ships; a bundle of
    another version, or none, is not served (serves_bundle)."""
    import re
    from plotly.offline import get_plotlyjs_version
    from syncviz.dashboard import page_scripts as P
    body = P.BUNDLE.read_bytes()
    assert sorted(m.decode() for m in set(re.findall(rb'name:"(\w+)",basePlotModule', body))) == sorted(P.TRACES)
    client = app.server.test_client()
    got = client.get("/" + P.PLOTLY_JS)
    assert got.status_code == 200 and got.mimetype == "text/javascript"
    if P.bundle_version() == get_plotlyjs_version():
        assert got.data == body
        assert client.get("/" + P.PLOTLY_JS, headers={"If-None-Match": got.headers["ETag"]}).status_code == 304
    else:
        assert got.data != body and b"plotly.js v" + get_plotlyjs_version().encode() in got.data[:300]
    other = tmp_path / "other.min.js"
    other.write_bytes(b"/* plotly.js v0.0.1 (MIT license): a stale bundle */ var Plotly;")
    monkeypatch.setattr(P, "BUNDLE", other)
    assert P.bundle_version() == "0.0.1" and not P.serves_bundle()
    monkeypatch.setattr(P, "BUNDLE", tmp_path / "missing.min.js")
    assert P.bundle_version() is None and not P.serves_bundle()


# ------------------------------------------------------------------------------------ store

def test_discovers_runs_by_relative_name(store):
    assert set(store.names()) == {"ddp", "synth8", "synth24", "nested/inner", "truncated", "zero3",
                                  "dash_corrupt_json", "dash_bad_stream"}
    assert "dash_corrupt_json" not in store.readable_names()


@pytest.mark.parametrize("name", ["../../etc", "..", "/etc", "/etc/passwd", "ddp/../../x", "ddp/..",
                                  "nested", "nested/../ddp", "%2e%2e/etc", "", None, ["ddp"], "ddp\x00"])
def test_crafted_names_are_refused(store, name):
    with pytest.raises(TraceError, match="no run named"):
        store.get(name)


def test_symlink_out_of_root_is_not_served(tmp_path):
    from syncviz.dashboard.data.store import RunStore
    outside = make_ddp_run(tmp_path / "outside")
    root = tmp_path / "root"
    make_ddp_run(root / "inside")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    # a run dir inside the root whose rank file links to a file outside it
    linked = make_ddp_run(root / "linked")
    (linked / S.rank_file(1)).unlink()
    (linked / S.rank_file(1)).symlink_to(outside / S.rank_file(1))
    store = RunStore(root)
    assert "escape" not in store.names()
    with pytest.raises(TraceError):
        store.get("escape")
    with pytest.raises(TraceError, match="outside the served directory"):
        store.get("linked")
    assert store.get("inside").ranks == [0, 1]


def test_a_known_run_is_served_without_a_new_scan_while_it_is_still_there(tmp_path, monkeypatch):
    """After LIST_TTL_S a request for a run of the last scan checks that run alone (still a run,
    still inside the root); a run removed, or replaced by a link out of the root, is refused as
    before; a new run is found by a new scan."""
    from syncviz.dashboard.data import store as ST
    outside = make_ddp_run(tmp_path / "outside")
    root = tmp_path / "root"
    make_ddp_run(root / "a")
    make_ddp_run(root / "b")
    store = ST.RunStore(root)
    assert store.names() == ["a", "b"]
    scans = []
    real = ST.T.find_runs
    monkeypatch.setattr(ST.T, "find_runs", lambda r: scans.append(r) or real(r))
    monkeypatch.setattr(ST, "LIST_TTL_S", 0.0)         # every listing is out of date
    assert store.get("a").ranks == [0, 1] and store.path_of("b") == root / "b" and scans == []
    shutil.rmtree(root / "b")
    (root / "b").symlink_to(outside, target_is_directory=True)      # b, now a link out of the root
    with pytest.raises(TraceError, match="no run named 'b'"):
        store.get("b")
    assert len(scans) == 1
    for t in threading.enumerate():     # get("a") keeps a's tables in its cache folder, in a thread
        if t.name == "syncviz-cache-write":
            t.join()
    shutil.rmtree(root / "a")                                        # a, removed
    with pytest.raises(TraceError, match="no run named 'a'"):
        store.path_of("a")
    make_ddp_run(root / "c")
    assert store.get("c").ranks == [0, 1]                            # found by a new scan


def test_root_that_is_one_run(tmp_path):
    """`syncviz dash traces/run1` serves that run alone, under its directory name."""
    from syncviz.dashboard.data.store import RunStore
    store = RunStore(make_ddp_run(tmp_path / "solo"))
    assert store.names() == ["solo"] and store.get("solo").last_step == 2
    with pytest.raises(TraceError):
        store.get("../solo")


def test_corrupt_runs_raise_one_line(store):
    for name, what in (("dash_corrupt_json", "corrupt JSON"), ("dash_bad_stream", "not an Arrow IPC stream")):
        with pytest.raises(TraceError, match=what) as e:
            store.get(name)
        assert "\n" not in str(e.value)


def test_truncated_rank_keeps_complete_steps(store):
    run = store.get("truncated")
    assert run.incomplete_ranks == [1] and any("rank 1" in p for p in run.problems)
    assert not run.recording            # finished in run.json: stopped, not live
    assert run.step_view(run.first_step).comm["rank"].nunique() == 2


def test_cache_is_keyed_by_file_size_and_mtime(store, root):
    a = store.get("ddp")
    assert store.get("ddp") is a
    f = root / "ddp" / "run.json"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert store.get("ddp") is not a


def test_only_recent_runs_stay_in_memory(root, monkeypatch):
    from syncviz.dashboard.data import store as store_mod
    monkeypatch.setattr(store_mod, "MAX_LOADED", 2)
    store = store_mod.RunStore(root)
    summary, recording, problems = store.summary("ddp")
    first = store.get("ddp")
    store.get("synth8")
    store.get("nested/inner")
    assert list(store._loaded) == ["synth8", "nested/inner"]
    assert store.summary("ddp")[0] is summary          # kept although the run was dropped
    assert store.get("ddp") is not first and store.get("ddp").last_step == first.last_step


def test_step_alone_equals_whole_run_analysis(store):
    """Slicing analysed blocks by step and analysing one step alone give the same tables."""
    run = store.get("synth8")
    whole_steps = A.step_metrics(run.run())
    whole_comm = A.comm_metrics(run.run(), kinds=S.COMM_KINDS)
    from syncviz.dashboard.data.stepview import StepView, analyse_block
    block = analyse_block(run.events_of(run.step_list.tolist()))
    for step in (0, 5, 11):
        alone = StepView(step, lambda s=step: run.step_events(s), None)
        sliced = StepView(step, None, block)
        for key in ("steps", "comm", "exposed", "lateness", "step_spread"):
            a = alone.get(key).reset_index(drop=True)
            b = sliced.get(key).reset_index(drop=True)
            sort = [c for c in ("rank", "bucket", "kind", "start_ns") if c in a.columns]
            pd.testing.assert_frame_equal(a.sort_values(sort).reset_index(drop=True),
                                          b.sort_values(sort).reset_index(drop=True), check_dtype=False,
                                          check_categorical=False)
        w = whole_steps[whole_steps["step"] == step].sort_values("rank").reset_index(drop=True)
        pd.testing.assert_frame_equal(alone.steps.sort_values("rank").reset_index(drop=True), w, check_dtype=False)
        wc = whole_comm[whole_comm["step"] == step]
        assert np.allclose(np.sort(alone.comm["busbw_gbps"].to_numpy()), np.sort(wc["busbw_gbps"].to_numpy()))


def test_background_blocks_cover_the_run(store):
    run = store.get("synth8")
    run.analyse_in_background()
    steps = run.step_table()      # whole-run step table: only that table of each block, in this thread
    assert sorted(steps["step"].unique()) == list(range(12))
    deadline = time.monotonic() + 60
    while not run.analysed and time.monotonic() < deadline:     # the background thread does the rest
        time.sleep(0.05)
    assert run.analysed and run.step_view(4).source == "block tables"
    assert run.step_table() is steps


def test_run_too_big_to_open_whole_is_one_line(root, tmp_path):
    """A run whose rank files exceed the server's budget is refused with one line naming the
    commands that handle big runs (a 10^8-event run would otherwise take the server down), until
    `syncviz summary` has kept what opens it (next test)."""
    from syncviz.dashboard.data.store import RunStore, default_max_run_bytes
    from syncviz.views import runcache as RC
    assert default_max_run_bytes() >= 2 ** 28
    shutil.copytree(root / "synth8", tmp_path / "runs" / "synth8", ignore=shutil.ignore_patterns(RC.CACHE_DIR))
    root = tmp_path / "runs"
    store = RunStore(root, max_run_bytes=10_000)
    with pytest.raises(TraceError) as e:
        store.get("synth8")
    msg = str(e.value)
    assert "\n" not in msg and "GB of events" in msg and f"syncviz summary {root / 'synth8'}" in msg and "--steps" in msg
    assert RunStore(root).get("synth8").table.num_rows > 0          # the default budget opens it
    assert store.meta("synth8")["world_size"] == 8                    # listing still works
    from click.testing import CliRunner
    from syncviz.cli import cli
    r = CliRunner().invoke(cli, ["dash", str(root), "--max-run-gb", "0"])
    assert r.exit_code != 0 and "--max-run-gb" in r.output


def test_run_too_big_to_open_whole_opens_from_what_syncviz_summary_kept(app, tmp_path):
    """Over the budget, a run is refused until `syncviz summary` has run on it; then the Runs
    list, the Replay (each step read alone from the rank files), Ratios' step figure, the Buckets
    page's distributions, the Strategies and the Distributed pages work without ever reading the run
    whole, with the numbers a whole read gives; a cache without a page's table (an older syncviz's)
    makes that page say in one line that it needs every event."""
    from click.testing import CliRunner
    from syncviz.cli import cli
    from syncviz.dashboard import components as C
    from syncviz.dashboard.data.loaded import LoadedRun
    from syncviz.dashboard.data.store import RunStore
    from syncviz.dashboard.pages.ratios import ratio_figures
    from syncviz.views import runcache as RC
    big = write_synth_run(tmp_path / "runs" / "big", world=8, steps=6, n_buckets=4, straggler=3, straggle_ms=4)
    store = RunStore(tmp_path / "runs", max_run_bytes=10_000)
    with pytest.raises(TraceError, match=r"run `syncviz summary \S+` once \("):
        store.get("big")
    r = CliRunner().invoke(cli, ["summary", str(big), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    # what it kept, from another syncviz (another code digest in the stamp): refused, saying to run it again
    stamp = big / RC.CACHE_DIR / RC.STAMP
    kept = stamp.read_text()
    stamp.write_text(kept.replace(json.loads(kept)["code"], "0" * 16))
    with pytest.raises(TraceError, match=r"run `syncviz summary \S+` again: what it kept is for other files or "
                                         r"another syncviz \("):
        RunStore(tmp_path / "runs", max_run_bytes=10_000).get("big")
    stamp.write_text(kept)
    run = store.get("big")
    assert run.partial and not run._opened
    truth = LoadedRun("big", big, RC.signature(big))      # the whole read (it uses the same cache: compare
    truth.disk = RC.RunCache(tmp_path / "nowhere", ())    # with a fresh computation instead)
    assert run.summary() == truth.summary()
    assert store.summary("big")[0] == truth.summary()
    pd.testing.assert_frame_equal(run.step_table(), truth.step_table(), check_exact=True)
    assert run.step_list.tolist() == truth.step_list.tolist() and run._extents == truth._extents
    # the Replay of a step: every rank's numbers from what the summary kept, the drawn ranks' tables
    # from their own events (no other rank is read), the same tables and figures as the whole read's
    for step in run.step_list:
        _read_ahead_idle(run)       # the last step's draw reads its neighbours in a thread (readahead.py)
        view, whole = run.step_view(int(step)), truth.step_view(int(step))
        assert view.source == "kept tables and the drawn ranks"
        _same_drawn_step(view, whole)
        assert view._alone._ev is None, "the step was not read for every rank"
        _same_replay_figures(store, truth, int(step))
    assert any("launches last" in roles for step in run.step_list for _, roles in run.step_view(int(step)).get("drawn").picks)
    # a summary that kept no lateness map (an older one): the step's lateness rows give the same ranks
    replay = run.step_view(run.start_step)._kept.replay
    assert replay._by_step is None, "each step's rows were read alone (RunCache.get_rows), not the whole step table"
    assert replay.latest(run.start_step)[0]
    replay._skew, replay._skew_of = None, lambda: None
    assert replay.latest(run.start_step) == (False, None)
    _read_ahead_idle(run)
    run._steps_cache.clear()
    _same_drawn_step(run.step_view(run.start_step), truth.step_view(run.start_step), lateness_map=False)
    view = run.step_view(run.start_step)
    for key in ("compute", "comm", "exposed"):     # asked for: every rank, read alone
        pd.testing.assert_frame_equal(view.get(key).reset_index(drop=True),
                                      truth.step_view(run.start_step).get(key).reset_index(drop=True), check_exact=True)
    run.analyse_in_background()                    # nothing to start: steps are read alone
    # the Buckets page's distributions from what the summary kept (test_runcache.same_stats: exact
    # but for the mean's last bits), and its figures
    from test_runcache import same_stats
    same_stats(run.bucket_stats(), truth.bucket_stats())
    from syncviz.dashboard.pages.buckets import bucket_figures
    kept_store = C._STORE
    C.set_store(store)
    try:
        figs = bucket_figures("big")
    finally:
        C.set_store(kept_store)
    assert [len(f["data"]) for f in figs[1:]] == [2, 2, 2] and list(figs[1]["data"][0]["x"]) == [0, 1, 2, 3]
    # the Strategies page: compare's numbers and bytes per op from what the summary kept, the whole read's
    from syncviz.dashboard.pages import strategies
    assert {**run.comparison(), "path": ""} == {**truth.comparison(), "path": ""}
    pd.testing.assert_frame_equal(run.op_bytes(), truth.op_bytes(), check_exact=True)
    C.set_store(store)
    try:
        table, split, op_bytes, memory, errors, notes = strategies.compare(["big"])
    finally:
        C.set_store(kept_store)
    assert not errors and len(split["data"]) and op_bytes["data"][0]["name"] == "all_reduce"
    # the Distributed page: per rank where the step goes, per op the calls, from the partitions
    for kept, whole in zip(run.distributed(), truth.distributed()):
        pd.testing.assert_frame_equal(kept, whole, check_exact=True)
    old = C._STORE
    C.set_store(store)
    try:
        steps_fig, skew_fig, recording = ratio_figures("big")
    finally:
        C.set_store(old)
    assert len(steps_fig["data"]) and not recording
    # a fresh server: the Ratios page reads the 4 step columns it draws alone, the same numbers
    from dash._utils import to_json
    fresh = RunStore(tmp_path / "runs", max_run_bytes=10_000)
    cols = ["step", "compute_comm_ratio", "overlap_pct", "exposed_ns"]
    pd.testing.assert_frame_equal(fresh.get("big").step_columns(cols), truth.step_table()[cols], check_exact=True)
    C.set_store(fresh)
    try:
        assert to_json(ratio_figures("big")[0]) == to_json(steps_fig)
    finally:
        C.set_store(old)
    assert "steps" not in fresh.get("big")._cache, "the whole step table was not read"
    # the rank × step lateness map from what the summary kept: the whole read's, exactly
    pd.testing.assert_frame_equal(run.rank_skew(), truth.rank_skew(), check_exact=True)
    assert skew_fig["data"][0]["type"] == "heatmap" and len(skew_fig["data"][0]["y"]) == 8
    assert not run._opened, "the run was never read whole"
    # a cache without the map (an older syncviz's summary): one line in its place
    for f in (big / RC.CACHE_DIR).glob("rank_skew*"):
        f.unlink()
    C.set_store(RunStore(tmp_path / "runs", max_run_bytes=10_000))
    try:
        _, skew_fig, _ = ratio_figures("big")
    finally:
        C.set_store(old)
    assert "needs every event" in json.dumps(skew_fig)
    # nor the Distributed page's tables: the page says why in one line
    for f in (big / RC.CACHE_DIR).glob("distributed*"):
        f.unlink()
    with pytest.raises(TraceError) as e:
        RunStore(tmp_path / "runs", max_run_bytes=10_000).get("big").distributed()
    assert "needs every event" in str(e.value) and "\n" not in str(e.value)


def _read_ahead_idle(run, within_s: float = 60.0) -> None:
    """Wait until ``run``'s read-ahead thread (started by a Replay draw) has stopped: a step it reads
    meanwhile has its lateness rows filled in behind the test's back, which _same_drawn_step would
    take for the drawn ranks reading them (it failed so, now and then, on a slower machine)."""
    deadline = time.monotonic() + within_s
    while run.read_ahead.busy and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not run.read_ahead.busy


def _same_drawn_step(view, whole, lateness_map: bool = True):
    """A step view's every-rank tables and drawn ranks (fastest, median, slowest, launches last: their
    timeline tables and origin) equal those of ``whole`` (the step read for every rank)."""
    read = "lateness" in view._out               # read ahead (readahead.py), for the heatmap
    a, b = view.get("drawn"), whole.get("drawn")
    # a kept step's "launches last" comes from the kept rank × step lateness map: none of its lateness rows read
    assert view._kept is None or read or ("lateness" not in view._out) == lateness_map
    for key in ("steps", "step_spread"):
        pd.testing.assert_frame_equal(view.get(key).reset_index(drop=True), whole.get(key).reset_index(drop=True),
                                      check_exact=True)
    pd.testing.assert_frame_equal(view.get("lateness").reset_index(drop=True),
                                  whole.get("lateness").drop(columns="launch_ns").reset_index(drop=True),
                                  check_exact=True, check_dtype=False)
    assert a.picks == b.picks and a.t0 == b.t0
    assert len(a.picks) >= 3
    for x, y in ((a.compute, b.compute), (a.comm, b.comm), (a.exposed, b.exposed)):
        assert len(x)
        pd.testing.assert_frame_equal(x.reset_index(drop=True), y.reset_index(drop=True), check_exact=True)


def _same_replay_figures(store, truth, step):
    """The Replay's figures and cards of ``step`` drawn from ``store``'s run equal those drawn from
    ``truth`` (a LoadedRun of the same files read whole), but for the source named in the meta."""
    from syncviz.dashboard import components as C
    from syncviz.dashboard.pages.replay import draw_step

    class Whole:          # the pages ask the store for the run by name: this one has only ``truth``
        def get(self, name):
            return truth
    old, whole = C._STORE, Whole()
    try:
        C.set_store(store)
        got = draw_step(truth.name, step, "spread")
        C.set_store(whole)
        want = draw_step(truth.name, step, "spread")
    finally:
        C.set_store(old)
    for fig in (got[0], want[0]):
        fig["layout"]["meta"].pop("source")
    assert json.dumps(got[:3], sort_keys=True, default=str) == json.dumps(want[:3], sort_keys=True, default=str)
    assert str(got[3]) == str(want[3])
    assert len(got[0]["data"]) and len(got[1]["data"][0]["y"]) == len(truth.ranks)


def test_run_read_one_step_at_a_time_prefetches_neighbours_in_bounded_memory(app, tmp_path, monkeypatch):
    """Over the budget, after a step is drawn the steps beside it are read and analysed in a thread
    (the same tables as a whole read), and the steps kept in memory are bounded by their rows."""
    from click.testing import CliRunner
    from syncviz.cli import cli
    from syncviz.dashboard.data import loaded as L
    from syncviz.dashboard.data.store import RunStore
    from syncviz.views import runcache as RC
    big = write_synth_run(tmp_path / "runs" / "big", world=4, steps=8, n_buckets=3)
    assert CliRunner().invoke(cli, ["summary", str(big), "--jobs", "1"]).exit_code == 0
    truth = L.LoadedRun("big", big, RC.signature(big))
    truth.disk = RC.RunCache(tmp_path / "nowhere", ())
    from syncviz.dashboard.data.stepview import STEP_TABLES
    keys = STEP_TABLES["spread"]
    from syncviz.dashboard.data import readahead
    monkeypatch.setattr(readahead, "DELAY_S", 0.0)
    from syncviz.dashboard import components as C
    from syncviz.dashboard.pages.replay import draw_step
    old = C._STORE
    C.set_store(store := RunStore(tmp_path / "runs", max_run_bytes=10_000))
    try:
        run = store.get("big")
        assert run.partial
        at = int(run.step_list[3])
        draw_step("big", at, "spread")        # the Replay page's draw starts the prefetch
    finally:
        C.set_store(old)
    _read_ahead_idle(run)
    for s in (at - 1, at + 1):
        assert s in run._steps_cache and run._steps_cache[s].has(keys)
        view = run.step_view(s)
        _same_drawn_step(view, truth.step_view(s))
        assert view._alone._ev is None
    truth.prefetch_neighbours(at, keys)          # a run read whole has its blocks instead
    assert not truth.read_ahead.busy
    per_step = run._steps_cache[at].rows
    assert per_step > 0
    monkeypatch.setattr(L, "STEP_CACHE_ROWS", 2 * per_step)
    for s in run.step_list:
        for key in keys:
            run.step_view(int(s)).get(key)
        # the views kept before this step's fit the bound (a new view is empty when the oldest are dropped)
        assert sum(v.rows for v in list(run._steps_cache.values())[:-1]) <= 2 * per_step
    assert len(run._steps_cache) <= 3


def test_whole_run_tables_same_from_whole_analysis_and_from_blocks(root):
    """A page opened before the background blocks are done gets its tables (steps, bucket rows,
    lateness matrix) from one whole-run analysis; once the blocks are done, from their slices. The
    two must be the same frames, row order included."""
    from syncviz.dashboard.data.store import RunStore
    run = RunStore(root).get("synth8")
    assert not run.analysed
    early = run.step_table(), run.bucket_table(), run.rank_skew()
    run.analyse_in_background()
    deadline = time.monotonic() + 60
    while not run.analysed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.analysed
    for key in ("steps", "buckets", "rank_skew"):
        run._cache.pop(key)
    late = run.step_table(), run.bucket_table(), run.rank_skew()
    assert late[0] is not early[0]
    for a, b in zip(early, late):
        pd.testing.assert_frame_equal(a, b)
    assert list(early[0]["step"]) == sorted(early[0]["step"])


def test_live_run_grows_as_steps_are_flushed(tmp_path):
    """Live: a run still being written (streams open, run.json not finished) is re-read when a rank
    flushes a step, and the replay's live callback extends the slider and follows the new step."""
    from syncviz.dashboard.data.store import RunStore
    run_dir = tmp_path / "live"
    writers = write_live_steps(run_dir, steps=2)
    try:
        store = RunStore(tmp_path)
        a = store.get("live")
        assert a.recording and a.last_step == 1
        append_live_step(writers, 2)
        b = store.get("live")
        assert b is not a and b.last_step == 2 and b.recording
        assert b.step_view(2).comm["rank"].nunique() == 2
    finally:
        for w in writers:
            w.close()


def write_live_steps(run_dir: Path, steps: int) -> list[RankWriter]:
    run_dir.mkdir(parents=True)
    meta = new_meta(run_dir.name, 2, strategy="ddp", engine="torch", finished=False)
    write_json_atomic(run_dir / S.RUN_FILE, meta)
    writers = [RankWriter(run_dir, r) for r in range(2)]
    for k in range(steps):
        append_live_step(writers, k)
    return writers


def append_live_step(writers: list[RankWriter], k: int) -> None:
    for w in writers:
        w.write_step(columns(simple_step(k, 100 * k, straggle_ms=2.0 if w.rank == 1 else 0.0)))


# ----------------------------------------------------------------------------- figures

def test_timeline_by_hand(app):
    """The hand-built step: bucket 0 [16, 26] ms hidden under backward, bucket 1 [30, 40] exposed."""
    from syncviz.dashboard.pages import replay
    fig, late, show_late, info = replay.draw_step("ddp", 0, "auto")
    traces = {t["name"]: t for t in fig["data"]}
    assert fig["layout"]["meta"]["step"] == 0 and fig["layout"]["meta"]["lanes"] == "ranks" and not show_late
    rows = fig["layout"]["meta"]["rows"]
    assert rows == ["rank 0 · compute", "rank 0 · comm", "rank 1 · compute", "rank 1 · comm"]
    # each collective's whole span (drawn by a layout shape): its hover points hold start and end
    bars = next(t for t in fig["data"] if t["name"] == "all_reduce waiting (hollow)" and t["meta"]["role"] == "bar")
    assert len(bars["y"]) == 4                                   # 2 ranks x 2 buckets
    rank0 = [i for i, y in enumerate(bars["y"]) if rows[int(y)] == "rank 0 · comm"]
    assert sorted(round(bars["customdata"][i][2], 6) for i in rank0) == [16.0, 30.0]
    exposed = traces["exposed comm (no compute)"]
    r0 = [i for i, y in enumerate(exposed["y"]) if rows[int(y)] == "rank 0 · compute"]
    assert np.allclose(np.asarray(exposed["base"])[r0], [30.0]) and np.allclose(np.asarray(exposed["x"])[r0], [10.0])
    hover = dict(zip(["what", "size", "start", "end", "dur", "wait", "service", "ready", "delay", "busbw",
                      "exposed", "where"], bars["customdata"][rank0[0]]))
    assert hover["what"] == "bucket 0 all_reduce" and hover["size"] == "4.00 MB"
    assert (hover["start"], hover["end"], hover["dur"]) == (16.0, 26.0, 10.0)
    assert hover["delay"] == "1.000 ms" and hover["busbw"] == "0.40 GB/s" and hover["ready"] == "at 15.000 ms"
    assert hover["where"] == "rank 0 · comm<br>1 params: fc2.weight"
    assert {"forward", "backward compute", "optimizer", "all_reduce"} <= set(traces)
    cards = {c.children[1].children: c.children[0].children for c in info}
    assert cards["exposed comm"] == "10.0 ms" and cards["overlap"] == "50.0 %" and "server time" not in cards


def test_many_ranks_are_aggregated(app):
    from syncviz.dashboard.pages import replay
    fig, late, show_late, _ = replay.draw_step("synth24", 1, "auto")
    assert fig["layout"]["meta"]["lanes"] == "spread" and show_late
    computes = [t for t in fig["layout"]["yaxis"]["ticktext"] if t.endswith("compute")]
    roles = [t.split(" · ")[1] for t in computes]
    assert roles[:3] == ["fastest step", "median step", "slowest step"] or "slowest step, straggler" in roles
    # the straggler (rank 7, launches every bucket late) is drawn and labelled
    assert any(t.startswith("rank 7 ·") and "launches last" in t for t in computes)
    heat = late["data"][0]
    assert len(heat["y"]) == 24 and len(heat["x"]) == 8
    assert late["layout"]["yaxis"]["tickvals"] == list(range(24))
    # the straggler (rank 7) launched every bucket late: its row is the hottest
    z = np.array([[v if v is not None else np.nan for v in row] for row in heat["z"]])
    assert heat["y"][int(np.nanargmax(np.nanmean(z, axis=1)))] == 7
    # its colour scale runs from 0 ms to the latest cell (Plotly ignores a zmin set alone), and its
    # right margin holds the colour bar at every step, so the plot does not move on a step change
    assert heat["zmin"] == 0 and heat["zmax"] == np.nanmax(z) > 0
    assert late["layout"]["margin"]["r"] == replay.TL.HEAT_MARGIN_R
    # each rank drawn on its own rows when asked for
    fig, _, show_late, _ = replay.draw_step("synth24", 1, "ranks")
    assert not show_late and sum(t.endswith("compute") for t in fig["layout"]["meta"]["rows"]) == 24


def test_draw_reports_errors_as_cards(app):
    from syncviz.dashboard.pages import replay
    for name in ("dash_corrupt_json", "dash_bad_stream", "../../etc"):
        fig, late, style, info, error, drawn = replay.render(name, 0, "auto")
        assert error is not None and "error-card" in error.className and fig["data"] == []
    fig, _, _, _, error, drawn, *front, served = replay.draw(["synth8", 3, "auto", 1234])
    assert error is None and fig["layout"]["meta"]["step"] == 3 and drawn == ["synth8", 3, "auto"]
    assert fig["layout"]["meta"]["key"] == drawn and front == ["timeline front", "timeline back"]   # brought to the front
    assert served == ["synth8", 3, "auto", 1234]          # the ask it answered (no longer in flight)
    assert replay.heatmap_after_paint(drawn) is None      # synth8: every rank's lane, no heatmap
    assert replay.draw(None) == (replay.dash.no_update,) * 9
    # asked again only to drop an answer in flight (the page drew the step itself): nothing drawn
    assert replay.draw(["synth8", 3, "auto", 1235, replay.SHOWN]) == (replay.dash.no_update,) * 9
    # the heatmap is not in the answer (the one on screen dims): the page asks for it once the
    # timeline is painted, and gets it for the step it painted
    fig, heat, style, *_ = replay.draw(["synth24", 2, "auto", 7])
    assert heat is replay.dash.no_update and style == replay.PENDING_STYLE
    late = replay.heatmap_after_paint(["synth24", 2, "auto"])
    assert late["key"] == ["synth24", 2, "auto"] and late["style"] == {}
    assert late["fig"]["data"][0]["type"] == "heatmap" and late["fig"]["layout"]["meta"] == {"step": 2}
    from dash._utils import to_json
    assert to_json(late["fig"]) == to_json(replay.draw_step("synth24", 2)[1])     # the heatmap draw_step gives
    # a step shown from the page's copy (its files_version, a 4th item) brought its own; nothing asked
    for painted in (["synth24", 2, "auto", "1:2:3"], None, ["synth24"], ["", 2, "auto"]):
        assert replay.heatmap_after_paint(painted) is None


def test_the_page_asks_a_plain_route_for_a_drawn_steps_heatmap(app):
    """The page POSTs [run, step, lane mode] to replay.HEATMAP_PATH (not a Dash callback): the answer is
    heatmap_after_paint's, encoded as Dash encodes a callback's, the heatmap draw_step gives; null
    where there is none; anything else the route is sent gets null too, never an error page."""
    import json

    from dash._utils import to_json
    from syncviz.dashboard.pages import replay
    client = app.server.test_client()
    url = "/" + replay.HEATMAP_PATH
    replay.draw(["synth24", 2, "auto", 11])          # made ahead, as after a draw
    r = client.post(url, json=["synth24", 2, "auto"])
    assert r.status_code == 200 and r.mimetype == "application/json"
    late = r.get_json()
    assert late["key"] == ["synth24", 2, "auto"] and late["style"] == {}
    assert json.loads(to_json(replay.draw_step("synth24", 2)[1])) == late["fig"]
    assert client.post(url, json=["synth24", 3, "auto"]).get_json()["fig"]["layout"]["meta"] == {"step": 3}
    for body in ([b"not json"], [b"[1, 2]"], ["synth8", 2, "auto"], ["synth24", 2, "auto", "1:2:3"], {"a": 1}, 7):
        r = client.post(url, data=body[0], content_type="application/json") if isinstance(body, list) and \
            isinstance(body[0], bytes) else client.post(url, json=body)
        assert r.status_code == 200 and r.get_json(silent=True) is None and r.data == b"null", body


def test_a_drawn_steps_heatmap_is_made_while_the_page_paints_and_answered_before_the_step_after(app, monkeypatch):
    """draw() answers without the heatmap and the server makes it meanwhile (replay_heatmap), once
    the request has ended: heatmap_after_paint answers with that figure, the one draw_step gives;
    draw_ahead, asked soon after the heatmap, draws the next step only once the heatmap
    was answered; a step not drawn here is not waited for, and a lost heatmap request is waited for
    at most WAIT_S."""
    import threading
    import time
    from dash._utils import to_json
    from syncviz.dashboard.pages import replay, replay_heatmap
    real_heat, real_render, made, order = replay.lateness_heatmap, replay.render, [], []

    def heat(view, step):
        made.append((threading.current_thread().name, step))
        return real_heat(view, step)

    def render(name, step, *args, **kw):
        order.append(("render", step))
        return real_render(name, step, *args, **kw)
    monkeypatch.setattr(replay, "lateness_heatmap", heat)
    monkeypatch.setattr(replay, "render", render)
    replay.draw(["synth24", 2, "auto", 1])
    order.clear()
    ahead = []
    t = threading.Thread(target=lambda: ahead.append(replay.draw_ahead(["synth24", 2, "auto"], 4)))
    t.start()
    time.sleep(0.3)              # draw_ahead is waiting: the step after is not drawn yet
    order.append(("heatmap", 2))
    late = replay.heatmap_after_paint(["synth24", 2, "auto"])
    t.join()
    assert order == [("heatmap", 2), ("render", 3)] and ahead[0][0]["key"] == ["synth24", 3, "auto"]
    # made once, ahead, in its own thread (not by the request that answered it)
    assert made[0] == ("syncviz-heatmap-ahead", 2) and late["key"] == ["synth24", 2, "auto"]
    assert to_json(late["fig"]) == to_json(real_heat(replay.C.store().get("synth24").step_view(2), 2))
    assert [m for m in made if m[1] == 2] == [made[0]]         # not made again when answered
    # a step this server did not draw: answered when asked, draw_ahead does not wait for it
    assert not replay._HEATMAPS.wait(["synth24", 1, "auto"])
    assert replay.heatmap_after_paint(["synth24", 1, "auto"])["fig"]["layout"]["meta"] == {"step": 1}
    # the heatmap request lost: draw_ahead waits WAIT_S, then draws the next step all the same
    monkeypatch.setattr(replay_heatmap, "WAIT_S", 0.05)
    replay.draw(["synth24", 3, "auto", 2])
    assert replay.draw_ahead(["synth24", 3, "auto"], 4)[0]["key"] == ["synth24", 4, "auto"]
    # a run whose lanes show no heatmap: none is made ahead
    made.clear()
    replay.draw(["synth8", 2, "auto", 3])
    time.sleep(0.2)
    assert made == [] and not replay._HEATMAPS.wait(["synth8", 2, "auto"])


def test_a_step_asked_for_while_it_is_being_drawn_is_drawn_once(app, monkeypatch):
    """→ held down asks the server for the step draw_ahead is drawing: the second request waits for
    that draw and gets its result; a request after it has finished draws again (nothing is kept)."""
    import threading
    import time
    from syncviz.dashboard.pages import replay
    real, calls = replay.draw_step, []

    def slow_draw(*args):          # the real draw, held long enough that the two requests overlap
        calls.append(args)
        time.sleep(0.4)
        return real(*args)
    monkeypatch.setattr(replay, "draw_step", slow_draw)
    got = [None, None]

    def ask(i, heatmaps):
        got[i] = replay.render("synth8", 2, "auto", heatmaps[i])

    def both(heatmaps):
        threads = [threading.Thread(target=ask, args=(i, heatmaps)) for i in range(2)]
        threads[0].start()
        time.sleep(0.1)
        threads[1].start()
        for t in threads:
            t.join()
    both((True, True))
    assert len(calls) == 1 and got[0] is got[1] and got[0][4] is None
    assert got[0][0]["layout"]["meta"]["step"] == 2
    # another step, or the same once drawn, is drawn on its own
    replay.render("synth8", 2, "auto")
    replay.render("synth8", 3, "auto")
    assert len(calls) == 3 and not replay._DRAWING
    # draw() (no heatmap) takes draw_ahead's draw in progress (with it); not the other way round
    both((True, False))
    assert len(calls) == 4 and got[0] is got[1]
    both((False, True))
    assert len(calls) == 6 and got[0] is not got[1] and not replay._DRAWING


def test_the_step_after_is_drawn_ahead_for_the_page_to_keep(app, store):
    """draw_ahead: the next step's outputs, exactly what the server's draw of that step returns
    (JSON-equal), with the outputs that draw leaves as they are named in "skip", and the version of
    the run's files it was drawn from added to its "replay-drawn"."""
    from dash._utils import to_json
    from syncviz.dashboard.pages import replay
    no = replay.dash.no_update
    ahead, want = replay.draw_ahead(["synth24", 1, "auto"], 4)
    assert want is no and ahead["key"] == ["synth24", 2, "auto"] and ahead["skip"] == []   # 24 ranks: the heatmap too
    drawn = list(replay.draw(["synth24", 2, "auto", 0]))
    late = replay.heatmap_after_paint(drawn[5])            # the heatmap the page asks for once it is painted
    drawn[1], drawn[2] = late["fig"], late["style"]
    version = replay.files_version(store.signature("synth24"))
    assert ahead["out"][5] == drawn[5] + [version] == ["synth24", 2, "auto", version]
    # where the tables came from may differ (the run's background block analysis, started by the first
    # draw, can finish between the two: "step analysed alone", then "block tables"); what is drawn may not
    a, b = json.loads(to_json(ahead["out"][:5])), json.loads(to_json(drawn[:5]))
    sources = {f[0]["layout"]["meta"].pop("source") for f in (a, b)}
    assert sources <= {"step analysed alone", "block tables"} and a == b
    ranks, _ = replay.draw_ahead(["synth24", 1, "ranks"], 4)     # every rank's lane: no heatmap, left as it is
    assert ranks["skip"] == [1] and ranks["out"][1] is None and ranks["out"][2] == {"display": "none"}
    assert ranks["out"][0]["layout"]["meta"]["step"] == 2 and ranks["out"][5][:3] == ["synth24", 2, "ranks"]
    # the copy, once shown, draws the step after it in turn
    assert replay.draw_ahead(ahead["out"][5], 4)[0]["key"] == ["synth24", 3, "auto"]
    assert replay.draw_ahead(["synth24", 4, "auto"], 4) == (no, no)         # the last step: nothing after it
    assert replay.draw_ahead(["dash_corrupt_json", 0, "auto"], 5) == (no, no)   # an error is not kept
    assert replay.draw_ahead(None, 4) == (no, no) and replay.draw_ahead(["synth24", 1, "auto"], None) == (no, no)


def test_a_finished_runs_files_are_not_all_statted_on_every_request(app, store, root, monkeypatch):
    """A finished run (run.json says so, every rank stream closed) is checked by its folder and its
    run.json between full signatures (FULL_SIG_S): a file changed in place by hand shows only at the
    next full one; run.json rewritten (a new trace into the folder) or a file added shows at once.
    A run still recording is checked in full every time (test_live_run... tests)."""
    from syncviz.dashboard.data import store as ST
    run_dir = root / "quick"
    write_synth_run(run_dir, world=2, steps=3, n_buckets=2)
    (run_dir / S.CACHE_DIR).mkdir(exist_ok=True)     # as `syncviz trace` leaves it: the cache's writes stay inside
    try:
        run = store.get("quick")
        assert run.meta.get("finished") and not run.incomplete_ranks and "quick" in store._finished
        sig = store.signature("quick")
        f = run_dir / S.rank_file(1)
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))      # changed in place: no folder change
        assert store.signature("quick") == sig and store.get("quick") is run
        monkeypatch.setattr(ST, "FULL_SIG_S", 0.0)                   # the full signature is due
        assert store.signature("quick") != sig and store.get("quick") is not run
        monkeypatch.setattr(ST, "FULL_SIG_S", 1e6)
        run, sig = store.get("quick"), store.signature("quick")
        assert "quick" in store._finished and store.signature("quick") == sig
        meta = json.loads((run_dir / S.RUN_FILE).read_text())
        write_json_atomic(run_dir / S.RUN_FILE, {**meta, "name": "quick again"})       # run.json rewritten
        assert store.signature("quick") != sig and store.get("quick").meta["name"] == "quick again"
        sig = store.signature("quick")
        time.sleep(0.05)      # past the kernel's coarse file-time tick, so the folder's mtime moves
        (run_dir / "layout-9.arrow").write_bytes(b"")                  # a file added: the folder changed
        assert store.signature("quick") != sig
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        store._runs(refresh=True)


def test_a_run_marked_finished_with_ranks_still_writing_is_checked_in_full(app, store, root):
    """Rank 0 writes "finished" when it closes; another rank may still be flushing its last steps
    (its stream not closed): each request checks every file, so those steps show at once."""
    run_dir = root / "closing"
    writers = write_live_steps(run_dir, steps=2)
    (run_dir / S.CACHE_DIR).mkdir(exist_ok=True)
    try:
        writers[0].close()
        write_json_atomic(run_dir / S.RUN_FILE, {**json.loads((run_dir / S.RUN_FILE).read_text()), "finished": True})
        run = store.get("closing")
        assert run.meta["finished"] and run.incomplete_ranks == [1] and "closing" not in store._finished
        assert run.last_step == 1
        store.signature("closing")
        writers[1].write_step(columns(simple_step(2, 200, straggle_ms=2.0)))   # rank 1's last step, in place
        assert store.get("closing").last_step == 2
    finally:
        for w in writers:
            w.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        store._runs(refresh=True)


def test_a_copy_of_a_run_traced_again_since_is_drawn_again(app, store, root):
    """A finished run traced again into the same folder while its Replay is open: the step the page
    drew ahead is of the old run, so once the page shows it the server is asked for that step again
    (replay-want), and that draw is of the new run's files."""
    from syncviz.dashboard.pages import replay
    run_dir = root / "again"
    write_synth_run(run_dir, world=8, steps=4, n_buckets=3)
    try:
        ahead, _ = replay.draw_ahead(["again", 0, "auto"], 3)
        copy = ahead["out"][5]
        assert replay.draw_ahead(copy, 3)[1] is replay.dash.no_update      # the same files: kept as shown
        shutil.rmtree(run_dir)
        write_synth_run(run_dir, world=4, steps=4, n_buckets=3)           # traced again, 4 ranks now
        again, want = replay.draw_ahead(copy, 3)
        assert again is replay.dash.no_update and want[:3] == ["again", 1, "auto"]
        fig, *_, drawn, _, _, _ = replay.draw(want)
        ticks = [t for t in fig["layout"]["meta"]["rows"] if t.endswith("compute")]
        assert len(ticks) == 4 and len(drawn) == 3       # the new run, drawn by the server
        # drawn by the server, not a copy: nothing to check again
        assert replay.draw_ahead(drawn, 3)[1] is replay.dash.no_update
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        store._runs(refresh=True)


def test_missing_step_is_clamped(app):
    from syncviz.dashboard.pages import replay
    fig, *_ = replay.draw_step("ddp", 99, "auto")
    assert fig["layout"]["meta"]["step"] == 3


def test_pick_run_and_live_callbacks(app, store, tmp_path):
    from syncviz.dashboard.pages import replay
    first, last, marks, value, run, badge, live_off, fig, *_, error, drawn, front, back = replay.pick_run("synth8")
    assert (first, last, value, run, live_off) == (0, 11, 1, "synth8", True) and marks["11"] == "11"  # after warm-up
    assert fig["layout"]["meta"]["step"] == 1 and error is None and drawn == ["synth8", 1, "auto"]
    assert (front, back) == replay.FRONT        # drawn in replay-timeline, brought to the front
    # a run with a heatmap: it follows once the timeline is painted (heatmap_after_paint), as after a draw
    *_, fig, heat, style, _, error, drawn, front, back = replay.pick_run("synth24")
    assert heat is replay.dash.no_update and style == replay.PENDING_STYLE and error is None
    assert replay.heatmap_after_paint(drawn)["fig"]["layout"]["meta"] == {"step": drawn[1]}
    out = replay.pick_run("dash_corrupt_json")
    assert out[3:5] == (0, "dash_corrupt_json") and "corrupt JSON" in str(out[11].children)
    out = replay.follow_live(1, "synth8", 4, 11, ["follow"])
    assert out[0] is replay.dash.no_update           # nothing new


def test_runs_page_rows(app):
    from syncviz.dashboard.pages import runs
    good = runs.summary_cells("synth8")
    assert len(good) == len(runs.COLUMNS) and "exposed" in good[-1].children
    bad = runs.summary_cells("dash_corrupt_json")
    assert "corrupt JSON" in str(bad[1].children)
    assert runs.compare_link(["ddp", "synth8"]) == "/strategies?run=ddp&run=synth8"


def test_other_pages_figures(app):
    from syncviz.dashboard.pages import buckets, ratios, strategies
    bmap, dur, busbw, delay = buckets.bucket_figures("synth8")
    assert len(bmap["data"]) == 2                                      # both layouts
    assert len(dur["data"][0]["median"]) == 6 and dur["data"][0]["type"] == "box"
    steps_fig, skew_fig, live = ratios.ratio_figures("synth8")
    assert len(steps_fig["data"]) == 9 and not live
    z = np.array([[v if v is not None else np.nan for v in row] for row in skew_fig["data"][0]["z"]])
    assert skew_fig["data"][0]["y"][int(np.nanargmax(np.nanmean(z, axis=1)))] == 3    # the straggler
    table, split, op_bytes, memory, errors, notes = strategies.compare(["ddp", "synth8", "dash_bad_stream"])
    assert len(errors) == 2 and [t["name"] for t in split["data"]][:3] == ["compute only", "overlapped comm", "exposed comm"]
    assert "different models" in str(errors[1].children[0])          # ddp (hand-built) vs synth8 (synthetic)
    assert op_bytes["data"][0]["name"] == "all_reduce" and len(op_bytes["data"][0]["y"]) == 2
    assert op_bytes["data"][0]["customdata"] == ["2", "6"]              # calls per rank and step: integers
    # the line above the table describes the runs shown, not the default selection
    assert strategies.draw(["ddp"])[-1] == strategies.selection_text(["ddp"]) and "Showing 1 run of" in strategies.draw(["ddp"])[-1]
    assert "2 different models" in strategies.draw(["ddp", "synth8"])[-1]
    assert strategies.draw(strategies.default_runs()[0])[-1] == strategies.default_runs()[1]


def test_buckets_page_on_a_run_without_buckets(app):
    """ZeRO-3 (hand-built zero3 run): one note saying where its collectives are, not four empty charts
    each saying "no data"."""
    from syncviz.dashboard.pages import buckets
    out = buckets.draw("zero3")
    assert "No gradient buckets" in str(out[-1]) and "Distributed" in str(out[-1])
    assert all(f["layout"]["annotations"][0]["text"] == "no gradient buckets in this run" for f in out[:-1])
    assert buckets.draw("synth8")[-1] is None


def test_memory_from_run_json():
    from syncviz.dashboard.figures.charts import memory_figure, memory_of
    assert memory_of({}) is None
    per_rank = {"memory": [{"params_bytes": 2 ** 20, "grads_bytes": 2 ** 21}, {"params_bytes": 1}]}
    assert memory_of(per_rank) == {"params_bytes": 2.0 ** 20, "grads_bytes": 2.0 ** 21}    # the largest rank
    fig = memory_figure({"a": memory_of(per_rank), "b": None})
    assert fig["data"][0]["x"] == ["a"] and fig["data"][0]["y"] == [2 ** 20 / 1e6]           # MB = 1e6 bytes
    assert "parameters held after forward" in [t["name"] for t in fig["data"]]


# ------------------------------------------------------------- the real callback endpoint

FIGURE_OUTPUTS = ["replay-timeline.figure", "replay-lateness.figure", "replay-lateness-box.style",
                  "replay-info.children", "replay-error.children", "replay-drawn.data"]


def post_draw(client, run, step):
    """The replay's draw callback as the browser calls it; the run name travels in its input, so a
    crafted client can put anything there. Its outputs: FIGURE_OUTPUTS and the timelines' boxes'
    classNames (those with allow_duplicate's suffix, as the browser names them), and the ask answered."""
    output = next(c["output"] for c in client.get("/_dash-dependencies").get_json()
                  if [i["id"] for i in c["inputs"]] == ["replay-want"] and c["output"].startswith(".." + FIGURE_OUTPUTS[0]))
    outputs = output.strip(".").split("...")
    assert [o.split("@")[0] for o in outputs] == FIGURE_OUTPUTS + ["replay-timeline-box.className",
                                                                   "replay-next-box.className", "replay-served.data"]
    body = {"output": output,
            "outputs": [dict(zip(("id", "property"), o.split("."))) for o in outputs],
            "inputs": [{"id": "replay-want", "property": "data", "value": [run, step, "auto", 1]}],
            "changedPropIds": ["replay-want.data"]}
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200
    return r


@pytest.mark.parametrize("name", ["../../etc", "/etc/passwd", "ddp/../../../etc", "nested/../../x"])
def test_endpoint_refuses_crafted_run_names(app, name):
    r = post_draw(app.server.test_client(), name, 0)
    text = r.get_data(as_text=True)
    assert "no run named" in text and "root:" not in text        # no /etc/passwd content
    assert r.headers["Server-Timing"].startswith("app;dur=")


def test_endpoint_draws_a_run(app):
    r = post_draw(app.server.test_client(), "nested/inner", 1)
    resp = json.loads(r.get_data(as_text=True))["response"]
    assert resp["replay-timeline"]["figure"]["layout"]["meta"]["step"] == 1


def test_pages_render(app):
    client = app.server.test_client()
    for path in ("/", "/replay", "/buckets", "/strategies", "/ratios", "/_dash-layout"):
        assert client.get(path).status_code == 200


# ------------------------------------------------------------------------------- command

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "syncviz", "dash", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_port_in_use_is_one_line_and_nonzero(root):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run_cli(str(root), "--port", str(port))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "in use" in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_missing_root_is_one_line(tmp_path):
    r = run_cli(str(tmp_path / "nope"))
    assert r.returncode != 0 and "no such directory" in r.stderr and "Traceback" not in r.stderr


def test_serves_on_loopback_and_prints_url(root):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "syncviz", "dash", str(root), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.time() + 60
        while time.time() < deadline and not any("http://" in ln for ln in lines):
            lines.append(proc.stdout.readline())
        assert any(f"http://127.0.0.1:{port}/" in ln for ln in lines), lines
        listening = _listening_addresses(port)
        if listening is not None:   # Linux: the socket is bound to 127.0.0.1 only
            deadline = time.time() + 30
            while not listening and time.time() < deadline:
                time.sleep(0.2)
                listening = _listening_addresses(port)
            assert listening == {"127.0.0.1"}
    finally:
        proc.terminate()
        proc.wait(10)


def _listening_addresses(port: int) -> set[str] | None:
    path = Path("/proc/net/tcp")
    if not path.exists():
        return None
    out = set()
    for line in path.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":
            out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


def test_bucket_map_says_why_ddp_starts_with_one_bucket():
    """The shipped real DDP run: torch holds every parameter in one bucket until its rebuild (no
    find_unused_parameters), and the map says so instead of looking like a recording gap."""
    from syncviz.dashboard.figures.charts import bucket_map_figure
    run = load_run(Path(__file__).resolve().parents[1] / "traces" / "cpu-mini-ddp")
    titles = [a["text"] for a in bucket_map_figure(A.bucket_map(run.layouts))["layout"]["annotations"]]
    assert titles[0].startswith("layout 0 (initial: DDP holds every parameter in one bucket") and "rebuild" in titles[1]


def test_buckets_page_names_zero3_units_as_units(app, tmp_path):
    """A simulated ZeRO-3 run records which parameters form each unit (gathered and reduce-scattered
    together) in its layout: the page draws that map as units, with the no-buckets note, and no DDP
    wording ("rebuild", "bucket")."""
    from click.testing import CliRunner
    from syncviz.cli import cli
    from syncviz.dashboard import components as C
    from syncviz.dashboard.data.store import RunStore
    from syncviz.dashboard.pages import buckets
    out = tmp_path / "runs" / "z3"
    r = CliRunner().invoke(cli, ["simulate", "--preset", "gpt2-medium-8", "--strategy", "zero3", "--steps", "2",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    served = C.store()
    C.set_store(RunStore(tmp_path / "runs"))
    try:
        figs = buckets.draw("z3")
    finally:
        C.set_store(served)
    assert "No gradient buckets" in str(figs[-1])
    unit_map = figs[0]
    assert "ZeRO-3 unit" in unit_map["layout"]["title"]["text"] and unit_map["data"]
    from plotly.utils import PlotlyJSONEncoder
    text = json.dumps(unit_map, cls=PlotlyJSONEncoder)
    assert "rebuild" not in text and "bucket" not in text.lower().replace("no gradient buckets", "")
    assert all(f["layout"]["annotations"][0]["text"] == "no gradient buckets in this run" for f in figs[1:-1])
    assert "the Distributed page counts" in str(figs[-1])
    # too big to read whole (after `syncviz summary`): the same page from what the summary kept, and
    # the note points to the summary, since the Distributed page cannot show such a run
    r = CliRunner().invoke(cli, ["summary", str(out), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    C.set_store(RunStore(tmp_path / "runs", max_run_bytes=10_000))
    try:
        big = buckets.draw("z3")
        assert C.store().get("z3").partial and not C.store().get("z3")._opened
    finally:
        C.set_store(served)
    assert json.dumps(big[:-1], cls=PlotlyJSONEncoder) == json.dumps(figs[:-1], cls=PlotlyJSONEncoder)
    assert "`syncviz summary` counts and times them" in str(big[-1])


def test_a_run_still_recording_is_not_drawn_ahead(app, store, root):
    """Live: the step after the one on screen may still be arriving from some ranks, so the page
    keeps no copy of it (a move there asks the server, which reads what has arrived by then)."""
    from syncviz.dashboard.pages import replay
    run_dir = root / "live-ahead"
    writers = write_live_steps(run_dir, steps=3)
    try:
        assert store.get("live-ahead").recording
        assert replay.draw_ahead(["live-ahead", 0, "auto"], 2) == (replay.dash.no_update,) * 2
        for w in writers:
            w.close()
        write_json_atomic(run_dir / S.RUN_FILE, {**json.loads((run_dir / S.RUN_FILE).read_text()), "finished": True})
        assert not store.get("live-ahead").recording
        assert replay.draw_ahead(["live-ahead", 0, "auto"], 2)[0]["key"] == ["live-ahead", 1, "auto"]
    finally:
        for w in writers:
            w.close()
        shutil.rmtree(run_dir)
        store._runs(refresh=True)     # the other tests list the root without it



def test_a_traced_run_too_big_to_read_whole_keeps_what_syncviz_summary_keeps(tmp_path, monkeypatch):
    """`syncviz trace` summarizes a run over the dashboard's budget by partitions when it ends
    (tracecmd.analyse_for_views): the cache then holds what `syncviz summary` keeps, the Replay's
    tables and the Buckets and Strategies pages' included, so every such page opens from it."""
    from syncviz.dashboard.data import store as ST
    from syncviz.dashboard.data.store import RunStore
    from syncviz.views import runcache as RC
    from syncviz.workloads.tracecmd import analyse_for_views
    big = write_synth_run(tmp_path / "runs" / "big", world=8, steps=6, n_buckets=4, straggler=3, straggle_ms=4)
    monkeypatch.setattr(ST, "default_max_run_bytes", lambda: 10_000)
    summary = analyse_for_views(big)
    kept = RC.RunCache(big, RC.signature(big))
    for key in ("facts", "summary", "steps", "rank_skew", "bucket_stats", "comparison", "op_bytes", "spans"):
        assert kept.get(key) is not None, key
    run = RunStore(tmp_path / "runs", max_run_bytes=10_000).get("big")
    assert run.partial and run.summary() == summary
    assert run.step_view(run.start_step).source == "kept tables and the drawn ranks"
    run.bucket_stats(), run.comparison(), run.op_bytes()
    assert not run._opened
