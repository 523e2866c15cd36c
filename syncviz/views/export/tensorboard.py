"""A syncviz run as a TensorBoard run: per-step scalars, bucket histograms, a summary text and a
custom-scalars layout. Every number comes from syncviz.analysis; this module only writes them.

One syncviz run becomes one TensorBoard run (``<logdir>/<run name>/``), so pointing TensorBoard at
a logdir holding several exports compares them on the same charts. torch.profiler traces found in
``<run>/profiler/`` are copied next to the events, so the PyTorch Profiler tab shows the same run
under the same name.
"""
from __future__ import annotations

import datetime
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from syncviz import analysis as A
from syncviz.trace import schema as S
from syncviz.analysis import partial_views as P_
from syncviz.analysis import spill as S_
from syncviz.analysis.partitioned import SummaryTables
from syncviz.trace import Run
from syncviz.views import palette as P

# (tag, step_table column, scale to the unit in the tag). Tags are the same for every run, which
# is what lets TensorBoard overlay runs.
STEP_SCALARS = [
    ("time/step_ms", "step_ns", 1e-6),
    ("time/step_slowest_rank_ms", "step_max_ns", 1e-6),
    ("time/compute_ms", "compute_ns", 1e-6),
    ("time/forward_ms", "forward_ns", 1e-6),
    ("time/backward_ms", "backward_ns", 1e-6),
    ("time/optimizer_ms", "optimizer_ns", 1e-6),
    ("comm/busy_ms", "comm_busy_ns", 1e-6),
    ("comm/overlapped_ms", "overlapped_ns", 1e-6),
    ("comm/exposed_ms", "exposed_ns", 1e-6),
    ("comm/overlap_pct", "overlap_pct", 1.0),
    ("comm/compute_comm_ratio", "compute_comm_ratio", 1.0),
    ("comm/busbw_GBps", "busbw_gbps", 1.0),
    ("comm/bytes_MB", "bytes", 1e-6),
]
# Per-rank series (tag/rank-<r>), for spotting a straggler.
RANK_SCALARS = [("per_rank/step_ms", "step_ns"), ("per_rank/exposed_ms", "exposed_ns")]

# The dashboard's series, in the dashboard's order, under its names (views/palette.py): the step
# split of the Ratios / Strategies pages and the phases of the Replay timeline.
# (dashboard label, tag, analysis.step_split column). Tags sort in this order ("1_"...): the Scalars
# tab lists tags by name; the custom-scalars card lists a chart's series in the order the data
# server answers (hash order in tensorboard-data-server), which no export can set.
SPLIT_SCALARS = [("compute only", "split/1_compute_only_ms", "compute_only_ns"),
                 ("overlapped comm", "split/2_overlapped_comm_ms", "overlapped_ns"),
                 ("exposed comm", "split/3_exposed_comm_ms", "exposed_ns"),
                 ("other (idle, data, host)", "split/4_other_ms", "other_ns")]
PHASE_TAGS = [(phase, f"time/{phase}_ms") for phase in ("forward", "backward", "optimizer")]

# TensorBoard cannot take the palette: its custom-scalars layout (tensorboard/plugins/custom_scalar/
# layout.proto: Chart = title + multiline tags | margin series) has no colour field, and its
# multiline card colours every line by its run (runBasedColorScale.scale(run)), telling a run's tags
# apart by marker symbol. So series keep the dashboard's names and order, and the text tab says
# which dashboard colour each one has (COLOUR_LEGEND).
LAYOUT = {
    "syncviz: step": {
        "step time vs compute (ms)": ["Multiline", ["time/step_ms", "time/compute_ms",
                                                     "time/step_slowest_rank_ms"]],
        "step split, as the dashboard (ms)": ["Multiline", [tag for _, tag, _ in SPLIT_SCALARS]],
        "compute phases (ms)": ["Multiline", [tag for _, tag in PHASE_TAGS]],
    },
    "syncviz: communication": {
        "comm busy vs exposed (ms)": ["Multiline", ["comm/busy_ms", "comm/exposed_ms",
                                                     "comm/overlapped_ms"]],
        "overlap %": ["Multiline", ["comm/overlap_pct"]],
        "compute/comm ratio": ["Multiline", ["comm/compute_comm_ratio"]],
        "bus bandwidth (GB/s)": ["Multiline", ["comm/busbw_GBps"]],
    },
    "syncviz: ranks": {
        "step time per rank (ms)": ["Multiline", [r"per_rank/step_ms/.*"]],
        "exposed comm per rank (ms)": ["Multiline", [r"per_rank/exposed_ms/.*"]],
    },
}
COLOUR_LEGEND = ([(tag, label, P.SPLIT[label]) for label, tag, _ in SPLIT_SCALARS]
                 + [(tag, phase, P.PHASE[phase]) for phase, tag in PHASE_TAGS])


def run_label(run: Run) -> str:
    """TensorBoard run (sub-directory) name: the run's name, safe as one path component."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", str(run.name)).strip("._") or "run"


def _walltimes(meta: dict, first: pd.Series, steps: pd.Series) -> dict[int, float] | None:
    """Wall-clock seconds of each step's start (run start + aligned clock; ``first``: each step's
    earliest start of a step row), or None when the run has no parseable start time. TensorBoard's
    "relative" axis then shows training time."""
    try:
        created = datetime.datetime.fromisoformat(str(meta.get("created"))).timestamp()
    except ValueError:
        return None
    return {int(s): created + float(first.get(s, 0)) * 1e-9 for s in steps}


def _inputs(run: Run | SummaryTables) -> dict:
    """What the export writes: from a loaded run, or from summarize(..., export_dir=) (a run of any
    size by partitions of ranks; the same numbers, and the histograms' values in the same order)."""
    if isinstance(run, SummaryTables):
        x = run.export
        hist = ((int(k[0]), dict(zip(P_.HISTOGRAMS, values))) for k, values in S_.group_values(x["histograms"]))
        return {"steps": run.step_table, "per_rank": run.steps, "histograms": hist, "first": x["step_first"],
                "summary": run.summary, "buckets": x["bucket_table"]}
    comm = A.bucket_metrics(run)
    ev = run.events[run.events["kind"] == S.STEP]
    hist = ((int(step), {c: g[c].to_numpy() for c in P_.HISTOGRAMS}) for step, g in comm.groupby("step", sort=True))
    return {"steps": A.step_table(run), "per_rank": A.step_metrics(run), "histograms": hist,
            "first": ev.groupby("step")["start_ns"].min(), "summary": A.run_summary(run),
            "buckets": A.bucket_table(run)}


def _markdown_table(rows: list[tuple[str, str]], header=("metric", "value")) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def summary_markdown(run: Run | SummaryTables, summary: dict, buckets: pd.DataFrame) -> str:
    """The text tab: run facts, headline numbers (analysis.run_summary) and the bucket table."""
    meta = run.meta
    ddp = meta.get("ddp") or {}
    facts = [("run", run.name), ("strategy", summary["strategy"]), ("engine", summary["engine"]),
             ("world size", summary["world_size"]), ("backend", meta.get("backend", "?")),
             ("device", meta.get("device", "?")), ("bucket cap (MB)", ddp.get("bucket_cap_mb", "–")),
             ("steps", summary["steps"]),
             ("headline steps", ", ".join(map(str, summary["headline_steps"])) or "–")]
    nums = [(k, v if isinstance(v, str) else f"{v:.3f}") for k, v in A.headline_rows(summary)]
    text = [f"**{summary['verdict']}**", "", _markdown_table(facts, ("run", "")), "",
            _markdown_table(nums)]
    if len(buckets):
        text += ["", "| bucket | op | MB | queue ms | service ms | launch delay ms | exposed ms | busbw GB/s |",
                 "|---|---|---|---|---|---|---|---|"]
        for b in buckets.itertuples():
            text.append(f"| {b.bucket} | {b.op} | {b.bytes / 1e6:.2f} | {b.queue_ns / 1e6:.3f} | {b.duration_ns / 1e6:.3f} | "
                        f"{b.launch_delay_ns / 1e6:.3f} | {b.exposed_ns / 1e6:.3f} | {b.busbw_gbps:.3f} |")
    text += ["", "TensorBoard colours a line by its run; in the dashboard these series have one colour each:", "",
             "| tag | dashboard series | dashboard colour |", "|---|---|---|"]
    text += [f"| {tag} | {label} | {P.NAME[c]} ({c}) |" for tag, label, c in COLOUR_LEGEND]
    if summary["problems"]:
        text += ["", "Problems: " + "; ".join(summary["problems"])]
    return "\n".join(text)


def write_tensorboard(run: Run | SummaryTables, logdir: str | Path, copy_profiler: bool = True) -> Path:
    """Write ``run`` (a loaded run, or summarize(..., export_dir=)'s tables) as TensorBoard run
    ``<logdir>/<run name>``; returns that directory."""
    from torch.utils.tensorboard import SummaryWriter

    out = Path(logdir) / run_label(run)
    out.mkdir(parents=True, exist_ok=True)
    # Exporting again replaces the earlier export instead of doubling every point.
    for old in [*out.glob("events.out.tfevents.*"), *out.glob("*.pt.trace.json*")]:
        old.unlink()

    x = _inputs(run)
    steps, per_rank = x["steps"], x["per_rank"]
    wall = _walltimes(run.meta, x["first"], steps["step"]) if len(steps) else None

    writer = SummaryWriter(log_dir=str(out))
    try:
        for row in steps.itertuples(index=False):
            step = int(row.step)
            wt = wall[step] if wall else None
            for tag, col, scale in STEP_SCALARS:
                value = float(getattr(row, col))
                if np.isfinite(value):      # no comm → ratio inf, overlap NaN: leave a gap
                    writer.add_scalar(tag, value * scale, step, walltime=wt)
        split = A.step_split(steps) if len(steps) else None
        for i, step in enumerate(steps["step"]):
            wt = wall[int(step)] if wall else None
            for _, tag, col in SPLIT_SCALARS:
                writer.add_scalar(tag, float(split[col].iloc[i]) * 1e-6, int(step), walltime=wt)
        for row in per_rank.itertuples(index=False):
            wt = wall.get(int(row.step)) if wall else None
            for tag, col in RANK_SCALARS:
                writer.add_scalar(f"{tag}/rank-{row.rank}", getattr(row, col) * 1e-6, int(row.step),
                                  walltime=wt)
        for step, g in x["histograms"]:         # one step's bucket rows over all ranks, in rank order
            wt = wall.get(int(step)) if wall else None
            # duration = service time (analysis.queueing); queue beside it
            for tag, col in (("buckets/duration_ms", "duration_ns"), ("buckets/queue_ms", "queue_ns"),
                             ("buckets/exposed_ms", "exposed_ns"), ("buckets/launch_delay_ms", "launch_delay_ns")):
                v = np.asarray(g[col], dtype=float)
                v = v[~np.isnan(v)]
                if len(v) or col == "exposed_ns":
                    writer.add_histogram(tag, v / 1e6, int(step), walltime=wt)
        summary = x["summary"]
        writer.add_text("syncviz/summary", summary_markdown(run, summary, x["buckets"]), 0)
        writer.add_custom_scalars(LAYOUT)
    finally:
        writer.close()

    if copy_profiler:
        for trace in sorted((run.path / "profiler").glob("*.pt.trace.json*")):
            shutil.copy2(trace, out / trace.name)
    return out
