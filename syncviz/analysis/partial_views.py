"""The per-partition halves of what views need beyond the summary's numbers, and their combines
(analysis.partitioned runs them in its two passes): the rank × step lateness map (Ratios, the HTML
report), the TensorBoard and HTML exports' per-bucket and per-step pieces, and the rows of
``syncviz summary --json``. Each equals the whole-run function it names (tests/test_runcache.py,
test_export*.py, test_partitioned.py compare them)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis import queueing as Q
from syncviz.analysis import spill
from syncviz.analysis.intervals import wire_mask
from syncviz.analysis.metrics import lateness_matrix
from syncviz.trace import schema as S

LATE_KEY = ["step", "micro", "bucket"]        # a gradient bucket matched across ranks (tables.launch_lateness)


def bucket_first(comm: pd.DataFrame) -> pd.Series | None:
    """Earliest launch of each gradient bucket (step, micro, bucket) among these ranks: the
    reference tables.launch_lateness measures a bucket's lateness from."""
    b = comm[(comm["kind"] == S.BUCKET).to_numpy()]
    return b.groupby(LATE_KEY, observed=True)["launch_ns"].min() if len(b) else None


def reduce_bucket_first(parts: list) -> pd.Series | None:
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return pd.concat(parts).groupby(level=list(range(len(LATE_KEY)))).min()


def lateness_rows(comm: pd.DataFrame, events: pd.DataFrame, first: pd.Series | None,
                  occ: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """tables.sync_lateness' rows of these ranks (rank, step, micro, bucket, late_ns, label; no
    launch_ns), plus ``buckets``: whether the row is a bucket's. ``late_ns`` = launch − the earliest
    launch of the same bucket, or of the same collective in a step without buckets, among all ranks
    (``first``: pass 1's bucket_first; ``events``: combine_events with with_collective_order's
    columns). A collective's ``bucket`` is its place in its step's order of first launch over all
    ranks, as sync_lateness numbers it (collective_order). Rows are in sync_lateness' order when the
    partition is the whole run (a step's rows by rank). ``occ``: Q.occurrences of comm's wire rows
    when the caller has it (its collective rows are numbered as the collectives alone would be:
    kind is part of the identity)."""
    parts = []
    if first is not None:
        b = comm[(comm["kind"] == S.BUCKET).to_numpy()]
        idx = first.index.get_indexer(pd.MultiIndex.from_frame(b[LATE_KEY]))
        parts.append(pd.DataFrame({"rank": b["rank"].to_numpy(), "step": b["step"].to_numpy(),
                                   "micro": b["micro"].to_numpy(), "bucket": b["bucket"].to_numpy(dtype=np.int64),
                                   "late_ns": b["launch_ns"].to_numpy() - first.to_numpy()[idx], "label": "",
                                   "buckets": True}))
    if occ is None:
        rows = comm[wire_mask(comm) & (comm["kind"] != S.BUCKET).to_numpy()]
        c = Q.occurrences(rows) if len(rows) else rows
    else:
        c = occ[(occ["kind"] != S.BUCKET).to_numpy()]
    if first is not None and len(c):
        c = c[~c["step"].isin(first.index.get_level_values("step").unique()).to_numpy()]
    if len(c):
        ev_id = events.index.get_indexer(pd.MultiIndex.from_frame(c[Q.EVENT_KEY]))
        ordinal, label = events["order"].to_numpy(), events["label"].to_numpy()
        parts.append(pd.DataFrame({"rank": c["rank"].to_numpy(), "step": c["step"].to_numpy(),
                                   "micro": c["micro"].to_numpy(), "bucket": ordinal[ev_id],
                                   "late_ns": c["launch_ns"].to_numpy() - events["first"].to_numpy()[ev_id],
                                   "label": label[ev_id], "buckets": False}))
    if not parts:
        return None
    late = pd.concat(parts, ignore_index=True)
    # as sync_lateness: its rows are sorted by (step, rank) when it has collective rows
    return late if late["buckets"].all() else late.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def collective_order(events: pd.DataFrame, first: pd.Series | None) -> tuple[np.ndarray, np.ndarray]:
    """Per collective of ``events`` (combine_events' rows): its place in its step's order of first
    launch over all ranks and its label ("all_gather #3"), as tables.sync_lateness gives them, for the
    wire collectives (not bucket rows, not inside a bucket's hook) of steps without buckets
    (``first``: the buckets' first launches); -1 and "" for the others."""
    ix = events.index
    kind, bucket, step = (ix.get_level_values(k).to_numpy() for k in ("kind", "bucket", "step"))
    keep = (kind != S.BUCKET) & (bucket < 0)
    if first is not None:
        keep &= ~np.isin(step, first.index.get_level_values("step").unique().to_numpy())
    ordinal, label = np.full(len(events), -1, dtype=np.int64), np.full(len(events), "", dtype=object)
    if keep.any():
        e = events[keep].reset_index()[Q.EVENT_KEY + ["first", "op"]]
        e["pos"] = np.flatnonzero(keep)
        e = e.sort_values(["step", "first"] + Q.EVENT_KEY[1:], kind="stable")
        n = e.groupby("step").cumcount().to_numpy(dtype=np.int64)
        op = e["op"].to_numpy(dtype=object)
        name = np.where(op == "", e["kind"].to_numpy(dtype=object), op).astype(object)
        ordinal[e["pos"].to_numpy()] = n
        label[e["pos"].to_numpy()] = name + " #" + n.astype(str).astype(object)
    return ordinal, label


def with_collective_order(events: pd.DataFrame, first: pd.Series | None) -> pd.DataFrame:
    """``events`` with collective_order's ``order`` and ``label`` columns (lateness_rows uses them)."""
    ordinal, label = collective_order(events, first)
    return events.assign(order=ordinal, label=label)


def rank_step_lateness(late: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per (rank, step) of these ranks: the sum and count of tables.sync_lateness' ``late_ns``
    (``late``: lateness_rows), and whether they are of buckets (a step's rows are all buckets or all
    collectives): metrics.lateness_matrix's mean from partitions (integer sums: exact)."""
    if late is None:
        return None
    g = late.groupby(["rank", "step"])
    return pd.DataFrame({"sum": g["late_ns"].sum(), "count": g.size(), "buckets": g["buckets"].first()})


def combine_lateness(parts: list, buckets_only: bool = False) -> pd.DataFrame:
    """metrics.lateness_matrix (rank × step mean lateness) from every partition's rank_step_lateness;
    ``buckets_only``: of the buckets alone (metrics.rank_step_skew)."""
    parts = [p for p in parts if p is not None and len(p)]
    t = pd.concat(parts) if parts else None          # each (rank, step) lies in one partition
    if t is not None and buckets_only:
        t = t[t["buckets"].to_numpy(dtype=bool)]
    if t is None or not len(t):
        return pd.DataFrame()
    mean = (t["sum"] / t["count"]).rename("late_ns").reset_index()
    return lateness_matrix(mean)


BUCKET_TABLE_MEDIANS = ["duration_ns", "queue_ns", "wait_peers_ns", "launch_delay_ns", "exposed_ns", "busbw_gbps"]
HISTOGRAMS = ["duration_ns", "queue_ns", "exposed_ns", "launch_delay_ns"]


def export_pieces(out: dict, comm: pd.DataFrame, export: dict, tag: str) -> None:
    """What the TensorBoard export needs of these ranks' bucket rows: tables.bucket_table's per-bucket
    first op, largest bytes and count, its medians (spilled), and every step's values for the
    histograms (spilled by step, rows in the whole run's order)."""
    b = comm[(comm["kind"] == S.BUCKET).to_numpy()]
    if not len(b):
        return
    head = b if export["head"] is None else b[b["step"] > export["head"]]
    if len(head):
        out["tb_first"] = head.groupby("bucket", sort=True).agg(op=("op", "first"), bytes=("bytes", "max"),
                                                                 count=("duration_ns", "size"))
        out["tb_medians"] = spill.write_piece(export["dir"], f"bt-{tag}", head, ["bucket"], BUCKET_TABLE_MEDIANS)
    out["histograms"] = spill.write_piece(export["dir"], f"h-{tag}", b, ["step"], HISTOGRAMS)


def combine_bucket_table(second: list[dict]) -> pd.DataFrame:
    """tables.bucket_table (per bucket, headline steps) from pass 2's export pieces."""
    cols = ["bucket", "op", "bytes", "count", "duration_ns", "queue_ns", "wait_peers_ns", "launch_delay_ns",
            "exposed_ns", "busbw_gbps"]
    firsts = [r["tb_first"] for r in second if r["tb_first"] is not None]
    if not firsts:
        return pd.DataFrame(columns=cols)
    g = pd.concat(firsts).groupby(level=0, sort=True)
    out = pd.DataFrame({"op": g["op"].first(), "bytes": g["bytes"].max(), "count": g["count"].sum()})
    out = out.join(spill.group_medians([r["tb_medians"] for r in second], ["bucket"], BUCKET_TABLE_MEDIANS))
    out.index.name = "bucket"
    return out.reset_index()[cols]


def step_origins(compute: pd.DataFrame, comm: pd.DataFrame) -> pd.Series:
    """Per step: its earliest compute or comm start among these ranks (compute_intervals,
    comm_rows), the time zero views.timeline.step_origin gives the step's timeline; reduce_step_first
    takes the minimum over partitions."""
    starts = pd.concat([t[["step", "start_ns"]] for t in (compute, comm) if len(t)], ignore_index=True) \
        if len(compute) or len(comm) else pd.DataFrame({"step": [], "start_ns": []}, dtype=np.int64)
    return starts.groupby("step")["start_ns"].min()


def reduce_step_first(parts: list) -> pd.Series | None:
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return pd.concat(parts).groupby(level=0).min()


def bucket_rows(comm: pd.DataFrame) -> pd.DataFrame:
    """``syncviz summary --json``'s per-bucket table: metrics.bucket_metrics' rows, less the name
    (comm: comm_metrics of every comm kind, as pass 2 has them)."""
    return comm[(comm["kind"] == S.BUCKET).to_numpy()].reset_index(drop=True).drop(columns=["name"])
