"""Exports on hand-built runs: the tables they draw from, the Perfetto/Chrome trace (valid, and
its times equal the trace's), the HTML report's contents and the CLI's error handling."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest
from pathlib import Path

from syncviz import analysis as A
from syncviz.trace import schema as S
from syncviz.views.export.perfetto import assign_lanes, chrome_trace, write_perfetto
from syncviz.views.export.report import html_report
from syncviz.trace import load_run, new_meta, write_run
from tracebuild import MS, columns, ev, make_ddp_run


# ------------------------------------------------------------------------ analysis additions

def test_step_table_by_hand(ddp_run):
    t = A.step_table(load_run(ddp_run)).set_index("step")
    assert list(t.index) == [0, 1, 2] and (t["ranks"] == 2).all()
    # tracebuild: step 45 ms, compute 10 + 20 + 5, comm 10 + 10 of which bucket 0's is hidden
    assert (t["step_ns"] == 45 * MS).all() and (t["compute_ns"] == 35 * MS).all()
    assert (t["comm_busy_ns"] == 20 * MS).all() and (t["exposed_ns"] == 10 * MS).all()
    assert (t["overlap_pct"] == 50.0).all() and (t["compute_comm_ratio"] == 1.75).all()
    # busbw: all_reduce on 2 ranks, factor 1; 4 MB / 10 ms = 0.4 GB/s, 2 MB / 10 ms = 0.2; median 0.3
    assert np.allclose(t["busbw_gbps"], 0.3)


def test_step_table_slowest_rank(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "s", straggler=1, straggle_ms=3))
    t = A.step_table(run)
    assert (t["step_max_ns"] == 48 * MS).all() and (t["step_ns"] == 46.5 * MS).all()


def test_bucket_table_by_hand(ddp_run):
    b = A.bucket_table(load_run(ddp_run)).set_index("bucket")
    assert list(b.index) == [0, 1]
    assert b.loc[0, "count"] == 4          # headline steps 1, 2 × 2 ranks
    assert b.loc[0, "duration_ns"] == 10 * MS and b.loc[0, "exposed_ns"] == 0
    assert b.loc[1, "exposed_ns"] == 10 * MS and b.loc[0, "launch_delay_ns"] == 1 * MS
    assert b.loc[0, "busbw_gbps"] == pytest.approx(0.4) and b.loc[1, "bytes"] == 2_000_000


def test_bytes_in_flight_by_hand(ddp_run):
    f = A.bytes_in_flight(load_run(ddp_run))
    r0 = f[f["rank"] == 0]
    assert list(zip(r0["t_ns"][:4] // MS, r0["bytes"][:4])) == [(16, 4_000_000), (26, 0),
                                                                 (30, 2_000_000), (40, 0)]


# --------------------------------------------------------------------------- Chrome trace

def check_chrome_trace(trace: dict) -> dict:
    """Assert what Perfetto and chrome://tracing need; returns slices grouped by (pid, tid)."""
    assert isinstance(trace["traceEvents"], list) and trace["otherData"]["syncviz_run"]
    tracks: dict[tuple, list] = defaultdict(list)
    named_pids, named_tids = set(), set()
    flows: dict[int, dict] = defaultdict(dict)
    for e in trace["traceEvents"]:
        ph = e["ph"]
        if ph == "M":
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            if e["name"] == "thread_name":
                named_tids.add((e["pid"], e["tid"]))
            continue
        for key in ("ts", "pid", "tid"):
            assert isinstance(e.get(key), (int, float)), (key, e)
        if ph == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            tracks[(e["pid"], e["tid"])].append(e)
        elif ph in ("s", "f"):
            assert ph not in flows[e["id"]], f"flow {e['id']} has two {ph} events"
            flows[e["id"]][ph] = e
        elif ph == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        else:
            assert ph == "i", e
    # slices on a track nest: sorted by (start, -end), each one is inside or after the open ones
    # (in integer ns, as Perfetto reads the µs values: adding float µs can round past a neighbour)
    for key, slices in tracks.items():
        assert key in named_tids and key[0] in named_pids
        stack: list[int] = []
        for s in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            ts, end = round(s["ts"] * 1000), round(s["ts"] * 1000) + round(s["dur"] * 1000)
            while stack and stack[-1] <= ts:
                stack.pop()
            assert not stack or end <= stack[-1], f"slice {s['name']} crosses its parent on {key}"
            stack.append(end)
    # flows pair up, go forward in time, and bind to a slice at each end
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {fid} unpaired"
        s, f = pair["s"], pair["f"]
        assert s["cat"] == f["cat"] and s["name"] == f["name"] and s["ts"] <= f["ts"]
        assert f.get("bp") == "e"
        for end in (s, f):
            assert any(x["ts"] <= end["ts"] <= x["ts"] + x["dur"] for x in tracks[(end["pid"], end["tid"])]), \
                f"flow {fid} {end['ph']} has no slice to bind to"
    return tracks


def slice_times(trace) -> Counter:
    """(pid, cat, start_ns, dur_ns) of every X slice, read back from the µs floats."""
    return Counter((e["pid"], e["cat"], round(e["ts"] * 1000), round(e["dur"] * 1000))
                   for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] not in ("bucket_ready", "exposed"))


def event_times(run) -> Counter:
    ev = run.events
    ev = ev[ev["kind"].isin(S.COMPUTE_KINDS + S.COMM_KINDS + (S.STEP,))
            & (ev["start_ns"] >= 0) & (ev["end_ns"] >= ev["start_ns"])]
    # a collective's slice is its comm interval [launch, done] (a bucket's hook entry can come
    # earlier: DDP scales the bucket by 1/N before the all_reduce call)
    def start(r):
        return int(r.launch_ns) if str(r.kind) in S.COMM_KINDS and r.launch_ns >= r.start_ns else int(r.start_ns)
    return Counter((int(r.rank) + 1, str(r.kind), start(r), int(r.end_ns - start(r)))
                   for r in ev.itertuples())


def check_times_equal_trace(run, trace):
    assert slice_times(trace) == event_times(run)
    ready = Counter((int(r.rank) + 1, int(r.start_ns)) for r in
                    run.events[run.events["kind"] == S.GRAD_READY].itertuples())
    assert Counter((e["pid"], round(e["ts"] * 1000)) for e in trace["traceEvents"]
                   if e["ph"] == "i") == ready
    flow_starts = Counter((e["pid"], round(e["ts"] * 1000)) for e in trace["traceEvents"]
                          if e["ph"] == "s")
    b = A.bucket_metrics(run)
    b = b[b["ready_ns"] >= 0]
    assert flow_starts == Counter((int(r) + 1, int(t)) for r, t in zip(b["rank"], b["ready_ns"]))
    counters = [(e["pid"], round(e["ts"] * 1000), e["args"]["bytes"]) for e in trace["traceEvents"]
                if e["ph"] == "C"]
    f = A.bytes_in_flight(run)
    assert counters == [(int(r) + 1, int(t), int(v)) for r, t, v in zip(f["rank"], f["t_ns"], f["bytes"])]


def test_perfetto_valid_and_times_equal(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "r", straggler=1, straggle_ms=3.000001))  # odd ns
    trace = chrome_trace(run)
    tracks = check_chrome_trace(trace)
    check_times_equal_trace(run, trace)
    assert trace["otherData"]["world_size"] == 2 and trace["otherData"]["strategy"] == "ddp"
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"steps", "compute", "grad ready", "bucket 0", "bucket 1", "exposed comm"} <= threads
    exposed = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "exposed"]
    assert sorted((e["pid"], e["args"]["step"], e["ts"], e["dur"]) for e in exposed if e["args"]["step"] == 1) == \
        [(1, 1, 130000.0, 10000.0), (2, 1, 133000.001, 10000.0)]   # bucket 1 after backward, both ranks
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "s") == 2 * 3 * 2   # ranks × steps × buckets
    assert len(tracks) == 2 * 6
    bucket = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "bucket")
    assert bucket["name"] == "bucket 0 all_reduce 4.0 MB" and bucket["args"]["busbw_GBps"] == pytest.approx(0.4)


def overlapping_run(path):
    """Collectives that overlap on one track (two all_gathers in flight at once, one crossing
    the other) and a collective issued inside a bucket's hook."""
    evs = [ev("step", 0, 50), ev("forward", 0, 10), ev("backward", 10, 30), ev("optimizer", 40, 50),
           ev("bucket", 20, 35, bucket=0, op="all_reduce", nbytes=1_000_000, ready_ms=19),
           ev("collective", 21, 34, bucket=0, op="all_reduce", nbytes=1_000_000),
           ev("collective", 30, 38, op="all_gather", nbytes=2_000_000),
           ev("collective", 33, 41, op="all_gather", nbytes=2_000_000),
           ev("collective", 34, 36, op="all_gather", nbytes=2_000_000)]
    for e in evs:
        e["launch_ns"] = e["start_ns"] if e["kind"] in S.COMM_KINDS else -1
    meta = new_meta(path.name, 1, strategy="zero1", backend="gloo", device="cpu")
    return write_run(path, meta, {0: [columns(evs)]})


def test_perfetto_lanes_keep_tracks_nested(tmp_path):
    run = load_run(overlapping_run(tmp_path / "o"))
    trace = chrome_trace(run)
    check_chrome_trace(trace)
    check_times_equal_trace(run, trace)
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"all_gather (collectives)", "all_gather (collectives) · 2", "bucket 0"} <= threads
    # in flight: bucket 0 [20, 35] + the two all_gathers; the in-bucket collective is not counted twice
    f = A.bytes_in_flight(run)
    assert dict(zip(f["t_ns"] // MS, f["bytes"]))[34] == 1_000_000 + 3 * 2_000_000


def test_assign_lanes():
    s = np.array([0, 1, 2, 5, 5, 6]) * 10
    e = np.array([10, 4, 3, 8, 9, 7]) * 10
    assert list(assign_lanes(s, e)) == [0] * 6                # all nested or disjoint
    crossing = assign_lanes(np.array([0, 5]), np.array([10, 15]))
    assert list(crossing) == [0, 1]


def test_write_perfetto_gz_round_trip(ddp_run, tmp_path):
    run = load_run(ddp_run)
    plain = write_perfetto(run, tmp_path / "t.json")
    packed = write_perfetto(run, tmp_path / "t.json.gz")
    assert json.loads(gzip.decompress(packed.read_bytes())) == json.loads(plain.read_bytes())


# ------------------------------------------------------------------------------ HTML report

def external_resources(text: str) -> list[str]:
    """src/href of the document's own tags (script bodies are not parsed as tags)."""
    from html.parser import HTMLParser

    found = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(f"{tag} {v}" for k, v in attrs if k in ("src", "href") and v)

    Tags().feed(text)
    return found


def test_html_report_is_self_contained(tmp_path):
    path = make_ddp_run(tmp_path / "r", straggler=1, straggle_ms=3)
    run = load_run(path)
    run.meta["name"] = "<b>run & co</b>"
    text = html_report(run)
    assert external_resources(text) == []
    assert "Plotly.newPlot" in text and len(text) > 1_000_000          # plotly.js is inlined
    for chart in ("timeline", "steps", "buckets", "skew"):
        assert f'id="chart-{chart}"' in text
    assert "&lt;b&gt;run &amp; co&lt;/b&gt;" in text and "<b>run" not in text
    assert A.run_summary(run)["verdict"] in text


# ------------------------------------------------------------------------------------ CLI

def syncviz(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "syncviz", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_cli_exports(ddp_run, tmp_path):
    r = syncviz("export", "perfetto", str(ddp_run), "-o", str(tmp_path / "t.json.gz"))
    assert r.returncode == 0, r.stderr
    check_chrome_trace(json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes())))
    r = syncviz("export", "html", str(ddp_run), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0 and (tmp_path / "r.html").stat().st_size > 1_000_000, r.stderr


@pytest.mark.parametrize("args, message", [
    (("perfetto", "{missing}", "-o", "{tmp}/x.json"), "no syncviz run here"),
    (("html", "{run}", "-o", "{tmp}/x.txt"), "expected a file name ending in .html"),
    (("perfetto", "{run}", "-o", "{tmp}/nodir/x.json"), "no such directory"),
    (("html", "{corrupt}", "-o", "{tmp}/x.html"), "corrupt JSON"),
    (("html", "{tmp}", "-o", "{tmp}/x.html"), "holds 2 runs"),
    (("tensorboard", "{run}"), "Missing option '--logdir'"),
])
def test_cli_bad_input_is_one_line(ddp_run, tmp_path, args, message):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "run.json").write_text("{not json")
    fill = dict(missing=tmp_path / "nope", run=ddp_run, tmp=tmp_path, corrupt=corrupt)
    r = syncviz("export", *(a.format(**fill) for a in args))
    assert r.returncode != 0
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("src", ["tests/data/straggler", "tests/data/zero2", "tests/data/truncated-rank", "sim"])
def test_html_report_by_partitions_is_the_whole_runs(tmp_path, src):
    """`syncviz export html` reads a run by partitions of ranks (one rank each here) and only the
    timeline's steps from the rank files: the same page, byte for byte, as from the whole run (the
    simulated run has 20 ranks, so its timeline shows the representative ones)."""
    import tempfile

    from click.testing import CliRunner
    from syncviz.analysis.partitioned import summarize
    from syncviz.cli import cli
    from tracebuild import simulated_run
    run_dir = (simulated_run(tmp_path, "sim", "--model", "gpt2-medium", "--world-size", "20", "--steps", "4",
                             "--straggler", "2:0.3") if src == "sim" else Path(__file__).parent.parent / src)
    whole = html_report(load_run(run_dir))
    with tempfile.TemporaryDirectory() as d:
        part = html_report(summarize(run_dir, jobs=1, target_events=1, export_dir=d))
    assert part == whole
    if src in ("sim", "tests/data/straggler"):
        assert 'id="chart-skew"' in whole and 'id="chart-buckets"' in whole
    if src == "sim":
        assert "rank that launches last" in whole
    r = CliRunner().invoke(cli, ["export", "html", str(run_dir), "-o", str(tmp_path / "r.html"), "--jobs", "2"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == whole
