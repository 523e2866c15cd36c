"""summary, compare, the dashboard's data layer and the exports show the same numbers for the same
run (one test reads them all), and compare's bus traffic column."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from syncviz import analysis as A
from syncviz.cli import cli
from syncviz.trace import load_run, new_meta, write_run
from tracebuild import columns, ev, make_ddp_run

HEADLINE = ("step_ms", "compute_ms", "comm_busy_ms", "exposed_ms", "exposed_pct", "overlap_pct", "compute_comm_ratio")


@pytest.fixture
def root(tmp_path):
    make_ddp_run(tmp_path / "runs" / "ddp", steps=9, straggler=1, straggle_ms=2.0)
    return tmp_path / "runs"


def test_every_view_shows_the_same_numbers(root, tmp_path):
    from syncviz.dashboard.data.store import RunStore
    from syncviz.views.export.perfetto import chrome_trace
    from syncviz.views.export.report import html_report
    from syncviz.views.export.tensorboard import summary_markdown
    run = load_run(root / "ddp")
    ref = A.run_summary(run)
    assert ref["straggler"] == 1 and ref["exposed_ms"] > 0

    # syncviz summary --json
    r = CliRunner().invoke(cli, ["summary", str(root / "ddp"), "--json"])
    assert r.exit_code == 0, r.output
    summ = json.loads(r.output)
    for k in HEADLINE + ("busbw_gbps", "queue_ms", "service_ms", "straggler"):
        assert summ[k] == pytest.approx(ref[k]), k
    # per-bucket rows of the JSON carry the same per-collective numbers as comm_metrics
    b = A.bucket_metrics(run)
    assert [x["duration_ns"] for x in summ["buckets_table"]] == pytest.approx(b["duration_ns"].tolist())
    assert sum(x["exposed_ns"] for x in summ["buckets_table"]) == A.step_metrics(run)["exposed_ns"].sum()

    # syncviz compare --json (steady steps of a DDP run = the headline steps)
    r = CliRunner().invoke(cli, ["compare", str(root / "ddp"), "--json"])
    assert r.exit_code == 0, r.output
    comp = json.loads(r.output)[0]
    assert comp["steady_steps"] == ref["headline_steps"]
    for k in ("step_ms", "compute_ms", "comm_busy_ms", "exposed_ms", "exposed_pct", "overlap_pct"):
        assert comp[k] == pytest.approx(ref[k]), k
    assert comp["bytes_per_step"] == pytest.approx(ref["bytes_per_step"])

    # the dashboard's data layer: the runs page, the per-step tables, the time split and buckets
    store = RunStore(root)
    dash, _, _ = store.summary("ddp")
    for k in HEADLINE + ("busbw_gbps", "straggler", "verdict"):
        assert dash[k] == pytest.approx(ref[k]) if k != "verdict" else dash[k] == ref[k], k
    loaded = store.get("ddp")
    steps = loaded.step_table()
    h = steps[steps["step"].isin(ref["headline_steps"])]
    assert h["exposed_ns"].mean() / 1e6 == pytest.approx(ref["exposed_ms"])
    assert h["comm_busy_ns"].mean() / 1e6 == pytest.approx(ref["comm_busy_ms"])
    assert loaded.time_split()["exposed_ms"] == pytest.approx(ref["exposed_ms"])
    db = loaded.bucket_table().sort_values(["rank", "step", "bucket"])
    bb = b.sort_values(["rank", "step", "bucket"])
    assert db["duration_ns"].tolist() == pytest.approx(bb["duration_ns"].tolist())
    assert db["exposed_ns"].tolist() == bb["exposed_ns"].tolist()

    # exports: the HTML report and the TensorBoard text list analysis.headline_rows; Perfetto's
    # per-collective exposed time adds up to the steps' exposed time
    page = html_report(run)
    md = summary_markdown(run, ref, A.bucket_table(run))
    for label, value in A.headline_rows(ref):
        shown = value if isinstance(value, str) else f"{value:.3f}"
        assert f"<th>{label}</th><td>{shown}</td>" in page, label
        assert f"| {label} | {shown} |" in md, label
    assert ref["verdict"] in page and ref["verdict"] in md
    table = A.step_table(run)
    assert table[table["step"].isin(ref["headline_steps"])]["exposed_ns"].mean() / 1e6 == pytest.approx(ref["exposed_ms"])
    trace = chrome_trace(run)
    buckets = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "exposed_ms" in e.get("args", {})
               and e["args"].get("bucket", -1) >= 0]
    assert sum(e["args"]["exposed_ms"] for e in buckets) == pytest.approx(A.step_metrics(run)["exposed_ns"].sum() / 1e6)
    assert sorted(e["args"]["duration_ms"] for e in buckets) == pytest.approx(sorted(b["duration_ns"] / 1e6))


# ---------------------------------------------------------------------- compare: bus traffic

D = 4_000_000   # gradient bytes


def _fsdp_like(path, strategy, ops):
    meta = new_meta(path.name, 2, strategy=strategy, backend="gloo", device="cpu", engine="torch",
                    model={"name": "m", "params": D // 4, "bytes": D, "grad_bytes": D})
    by_rank = {}
    for r in range(2):
        batches = []
        for step in range(3):
            t0 = 100 * step
            evs = [ev("step", t0, t0 + 50, step=step), ev("forward", t0, t0 + 10, step=step),
                   ev("backward", t0 + 10, t0 + 30, step=step)]
            for i, op in enumerate(ops):
                evs.append(ev("collective", t0 + 30 + 5 * i, t0 + 34 + 5 * i, step=step, name=op, op=op, nbytes=D))
            batches.append(columns(evs))
        by_rank[r] = batches
    return write_run(path, meta, by_rank, {})


def test_compare_bus_traffic_vs_ddp(tmp_path):
    """On 2 ranks: DDP all-reduces D (bus 2(n−1)/n·D = D); ZeRO-2 reduce-scatters and all-gathers D
    (messages 2D = 2.00× DDP, bus 2·(n−1)/n·D = 1.00×); ZeRO-3 all-gathers twice and reduce-scatters
    (3.00× in messages, 1.50× in bus traffic) — the ZeRO paper's 1× and 1.5×."""
    runs = tmp_path / "runs"
    _fsdp_like(runs / "ddp", "ddp", ["all_reduce"])
    _fsdp_like(runs / "zero2", "zero2", ["reduce_scatter", "all_gather"])
    _fsdp_like(runs / "zero3", "zero3", ["all_gather", "all_gather", "reduce_scatter"])
    r = CliRunner().invoke(cli, ["compare", str(runs), "--json"])
    assert r.exit_code == 0, r.output
    got = {c["strategy"]: c for c in json.loads(r.output)}
    msg = {s: got[s]["bytes_per_step"] / got["ddp"]["bytes_per_step"] for s in got}
    bus = {s: got[s]["bus_bytes_per_step"] / got["ddp"]["bus_bytes_per_step"] for s in got}
    assert msg == pytest.approx({"ddp": 1.0, "zero2": 2.0, "zero3": 3.0})
    assert bus == pytest.approx({"ddp": 1.0, "zero2": 1.0, "zero3": 1.5})
    assert got["ddp"]["bus_bytes_per_step"] == pytest.approx(D)
    r = CliRunner().invoke(cli, ["compare", str(runs)], terminal_width=250)
    assert r.exit_code == 0, r.output
    line = next(li for li in r.output.splitlines() if li.startswith("│ zero3"))
    assert "3.00x" in line and "1.50x" in line
    assert "K = 8 bytes per parameter" in " ".join(r.output.split())
