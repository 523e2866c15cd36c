"""`syncviz export tensorboard`: the event files hold the analysis numbers, and a real TensorBoard
serves them (scalars, histograms, text, custom scalars) together with torch-tb-profiler's views of
the profiler traces (Overview, Trace, Distributed)."""
from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from syncviz import analysis as A
from syncviz.views import palette as P
from syncviz.views.export.tensorboard import (LAYOUT, PHASE_TAGS, SPLIT_SCALARS, STEP_SCALARS, run_label,
                                              write_tensorboard)
from syncviz.trace import load_run
from tracebuild import make_ddp_run


def accumulate(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    ea.Reload()
    return ea


def test_event_files_hold_analysis_numbers(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "straggly", straggler=1, straggle_ms=3))
    out = write_tensorboard(run, tmp_path / "tb")
    assert out == tmp_path / "tb" / "straggly"
    ea = accumulate(out)
    tags = ea.Tags()
    table = A.step_table(run)
    for tag, col, scale in STEP_SCALARS:
        values = [(e.step, e.value) for e in ea.Scalars(tag)]
        assert [s for s, _ in values] == list(table["step"])
        assert np.allclose([v for _, v in values], table[col] * scale, rtol=1e-6), tag
    assert [e.value for e in ea.Scalars("per_rank/step_ms/rank-1")] == pytest.approx([48.0] * 3)
    assert {"buckets/duration_ms", "buckets/exposed_ms", "buckets/launch_delay_ms"} <= set(tags["histograms"])
    h = ea.Histograms("buckets/duration_ms")[0].histogram_value
    # duration = service time: rank 0's bucket 1 waited 3 ms for rank 1 (launched at 33, done at 40)
    assert h.num == 4 and h.min == pytest.approx(7.0) and h.max == pytest.approx(10.0)
    assert "buckets/queue_ms" in tags["histograms"]
    text = ea.Tensors("syncviz/summary/text_summary")[0].tensor_proto.string_val[0].decode()
    assert A.run_summary(run)["verdict"] in text and "| bucket | op |" in text
    assert "custom_scalars__config__" in tags["tensors"]
    # walltime = run start + aligned clock: step k starts 100 ms after step k-1
    walls = [e.wall_time for e in ea.Scalars("time/step_ms")]
    assert np.allclose(np.diff(walls), 0.1)


def test_reexport_replaces_and_runs_sit_side_by_side(tmp_path):
    a = load_run(make_ddp_run(tmp_path / "a"))
    b = load_run(make_ddp_run(tmp_path / "b", straggler=0, straggle_ms=2))
    write_tensorboard(a, tmp_path / "tb")
    write_tensorboard(a, tmp_path / "tb")
    write_tensorboard(b, tmp_path / "tb")
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["a", "b"]
    assert len(list((tmp_path / "tb" / "a").glob("events.out.tfevents.*"))) == 1
    assert len(accumulate(tmp_path / "tb" / "a").Scalars("time/step_ms")) == 3


def test_run_label_is_one_safe_path_component(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "r"))
    run.meta["name"] = "../my run/2"
    assert run_label(run) == "my_run_2"


# --------------------------------------------------------------------- a real TensorBoard server

def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(base: str, path: str, **params):
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def tensorboard_server(logdir: Path, timeout_s: float = 120):
    """A real ``tensorboard`` on 127.0.0.1 (free port); yields its base URL once the scalars and
    (when traces are there) the profiler plugin have loaded; stopped on exit."""
    port = free_port()
    log = open(logdir.parent / "tensorboard.log", "w")
    proc = subprocess.Popen(["tensorboard", "--logdir", str(logdir), "--host", "127.0.0.1",
                             "--port", str(port), "--reload_interval", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        want_profiler = any(logdir.rglob("*.pt.trace.json*"))
        while True:
            assert proc.poll() is None, (logdir.parent / "tensorboard.log").read_text()[-2000:]
            try:
                ready = bool(get_json(base, "/data/plugin/scalars/tags"))
                if want_profiler:
                    runs = get_json(base, "/data/plugin/pytorch_profiler/runs")
                    ready = ready and bool(runs["runs"]) and not runs["loading"]
                if ready:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "TensorBoard did not come up"
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_series_follow_the_dashboard_palette(tmp_path):
    """TensorBoard cannot colour a tag (custom_scalar/layout.proto has no colour; the card colours
    by run), so the split and phase series carry the dashboard's names in the dashboard's order,
    and a real TensorBoard serves them in that order with analysis.step_split's numbers."""
    assert [label for label, _, _ in SPLIT_SCALARS] == [k for k in P.SPLIT if k != "waiting for peers"]
    assert [phase for phase, _ in PHASE_TAGS] == [k for k in P.PHASE if k != "other"]
    from tensorboard.plugins.custom_scalar import layout_pb2
    assert not {"color", "colour"} & {f.name for m in (layout_pb2.Chart, layout_pb2.MultilineChartContent)
                                       for f in m.DESCRIPTOR.fields}
    run = load_run(make_ddp_run(tmp_path / "runs" / "r", straggler=1, straggle_ms=3))
    write_tensorboard(run, tmp_path / "tb")
    split = A.step_split(A.step_table(run))
    with tensorboard_server(tmp_path / "tb") as base:
        layout = get_json(base, "/data/plugin/custom_scalars/layout")
        charts = {c["title"]: c["multiline"]["tag"] for cat in layout["category"] for c in cat["chart"]}
        tags = charts["step split, as the dashboard (ms)"]
        assert tags == [t for _, t, _ in SPLIT_SCALARS]
        assert charts["compute phases (ms)"] == ["time/forward_ms", "time/backward_ms", "time/optimizer_ms"]
        # the card asks for all of a chart's tags in one regex and lists the series in the order the
        # data server answers (Rust's tensorboard-data-server: hash order, not ours to set); sorted
        # by name, as the Scalars tab lists them, they are in the dashboard's order
        served = get_json(base, "/data/plugin/custom_scalars/scalars", run="r", tag="|".join(f"({t})" for t in tags))
        assert sorted(served["tag_to_events"]) == tags
        for _, tag, col in SPLIT_SCALARS:
            assert np.allclose([p[2] for p in served["tag_to_events"][tag]], split[col] / 1e6, rtol=1e-6), tag
        text_tag = get_json(base, "/data/plugin/text/tags")["r"][0]
        text = json.dumps(get_json(base, "/data/plugin/text/text", run="r", tag=text_tag))
        assert f"exposed comm</td><td>vermillion ({P.EXPOSED})" in text.replace("\\n", "")


@pytest.mark.slow
def test_tensorboard_serves_export_and_profiler_views(tmp_path):
    from test_profiling import profile_ddp

    # two syncviz runs; the first also has torch.profiler traces of a real 2-rank gloo DDP job
    first = make_ddp_run(tmp_path / "runs" / "ddp-a")
    make_ddp_run(tmp_path / "runs" / "ddp-b", straggler=1, straggle_ms=3)
    profile_ddp(first, first=2, last=3, steps=5)
    logdir = tmp_path / "tb"
    r = subprocess.run(["syncviz", "export", "tensorboard", str(tmp_path / "runs"), "--logdir", str(logdir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(+2 profiler traces)" in r.stdout

    with tensorboard_server(logdir) as base:
        tags = get_json(base, "/data/plugin/scalars/tags")
        assert set(tags) == {"ddp-a", "ddp-b"}
        assert {t for t, _, _ in STEP_SCALARS} <= set(tags["ddp-a"])
        for name in ("ddp-a", "ddp-b"):
            table = A.step_table(load_run(tmp_path / "runs" / name))
            for tag in ("time/step_ms", "comm/exposed_ms", "comm/overlap_pct", "comm/busbw_GBps"):
                col, scale = next((c, s) for t, c, s in STEP_SCALARS if t == tag)
                points = get_json(base, "/data/plugin/scalars/scalars", run=name, tag=tag)
                assert [p[1] for p in points] == list(table["step"])           # [wall, step, value]
                assert np.allclose([p[2] for p in points], table[col] * scale, rtol=1e-6)
        hist = get_json(base, "/data/plugin/histograms/tags")
        assert "buckets/duration_ms" in hist["ddp-a"]
        text_tag = get_json(base, "/data/plugin/text/tags")["ddp-b"][0]
        assert text_tag.startswith("syncviz/summary")
        text = json.dumps(get_json(base, "/data/plugin/text/text", run="ddp-b", tag=text_tag))
        assert "mostly bucket 1 after backward ends" in text and "<table>" in text
        layout = get_json(base, "/data/plugin/custom_scalars/layout")
        assert {c["title"] for c in layout["category"]} == set(LAYOUT)

        # torch-tb-profiler: the profiler traces are served under the same run name
        prof = "/data/plugin/pytorch_profiler"
        assert get_json(base, f"{prof}/runs")["runs"] == ["ddp-a"]
        views = get_json(base, f"{prof}/views", run="ddp-a")
        assert {"Overview", "Trace", "Distributed"} <= set(views)
        assert get_json(base, f"{prof}/workers", run="ddp-a", view="Overview") == ["rank-0", "rank-1"]
        assert get_json(base, f"{prof}/workers", run="ddp-a", view="Distributed") == ["All"]
        span = get_json(base, f"{prof}/spans", run="ddp-a", worker="rank-0")[0]
        overview = get_json(base, f"{prof}/overview", run="ddp-a", worker="rank-0", span=span)
        assert [row[0] for row in overview["steps"]["rows"]] == ["2", "3"]     # syncviz step numbers
        with urllib.request.urlopen(f"{base}{prof}/trace?run=ddp-a&worker=rank-1&span={span}",
                                    timeout=30) as resp:
            import gzip
            trace = json.loads(gzip.decompress(resp.read()))
        assert any(e.get("name", "").startswith("bucket ") for e in trace["traceEvents"])
        overlap = get_json(base, f"{prof}/distributed/overlap", run="ddp-a", worker="All", span=span)
        assert set(overlap["data"]["all"]) == {"rank-0", "rank-1"} and {"2", "3"} <= set(overlap["data"])
        wait = get_json(base, f"{prof}/distributed/waittime", run="ddp-a", worker="All", span=span)
        assert set(wait["data"]["all"]) == {"rank-0", "rank-1"}
        ops = get_json(base, f"{prof}/distributed/commops", run="ddp-a", worker="All", span=span)
        rows = ops["data"]["rank-0"]["rows"]
        assert rows[0][0] == "gloo:all_reduce" and rows[0][1] >= 2 * 2   # ≥ 2 buckets × 2 steps


def _events_of(out: Path) -> dict:
    """Every scalar, histogram and text of an export, exactly (wall times included)."""
    ea = accumulate(out)
    tags = ea.Tags()
    got = {("scalar", t): [(e.step, e.wall_time, e.value) for e in ea.Scalars(t)] for t in tags["scalars"]}
    for t in tags["histograms"]:
        got[("hist", t)] = [(e.step, e.wall_time, str(e.histogram_value)) for e in ea.Histograms(t)]
    got[("text",)] = ea.Tensors("syncviz/summary/text_summary")[0].tensor_proto.string_val[0].decode()
    return got


@pytest.mark.parametrize("src", ["tests/data/ddp-2rank", "tests/data/straggler", "tests/data/zero2",
                                 "tests/data/truncated-rank", "sim"])
def test_export_by_partitions_writes_what_the_whole_run_writes(tmp_path, src):
    """`syncviz export tensorboard` reads a run by partitions of ranks (one rank each here, so every
    combination runs): every scalar, histogram (its values in the same order: same sums) and the
    text are the whole-run export's, wall times included."""
    import tempfile

    from syncviz.analysis.partitioned import summarize
    from tracebuild import simulated_run
    run_dir = (simulated_run(tmp_path, "sim", "--model", "gpt2-medium", "--world-size", "5", "--steps", "4",
                             "--straggler", "2:0.3") if src == "sim" else Path(__file__).parent.parent / src)
    whole = _events_of(write_tensorboard(load_run(run_dir), tmp_path / "whole"))
    with tempfile.TemporaryDirectory() as d:
        part = _events_of(write_tensorboard(summarize(run_dir, jobs=1, target_events=1, export_dir=d),
                                            tmp_path / "part"))
    assert part.keys() == whole.keys()
    for k in whole:
        assert part[k] == whole[k], k
    if src != "tests/data/zero2":
        assert any(k[0] == "hist" for k in whole)


def test_export_command_by_partitions_and_whole(tmp_path):
    from click.testing import CliRunner
    from syncviz.cli import cli
    run_dir = make_ddp_run(tmp_path / "runs" / "r", straggler=1, straggle_ms=3)
    for name, how in (("parts", ["--jobs", "2"]), ("whole", ["--whole"])):
        r = CliRunner().invoke(cli, ["export", "tensorboard", str(run_dir), "--logdir", str(tmp_path / name), *how])
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["export", "tensorboard", str(run_dir), "--logdir", str(tmp_path / "both"), "--jobs", "2", "--whole"])
    assert r.exit_code == 2 and "--whole reads the run in this process, at once: --jobs applies" in r.output
    assert _events_of(tmp_path / "parts" / "r") == _events_of(tmp_path / "whole" / "r")
