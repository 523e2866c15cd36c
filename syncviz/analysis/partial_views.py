"""The per-partition halves of what views need beyond the summary's numbers, and their combines
(analysis.partitioned runs them in its two passes): the rank × step lateness map (Ratios, the HTML
report), the TensorBoard and HTML exports' per-bucket and per-step pieces, and the rows of
``syncviz summary --json``. Each equals the whole-run function it names (tests/test_runcache.py,
test_export*.py, test_partitioned.py compare them)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis import keys as K
from syncviz.analysis import partition_joined as PJ
from syncviz.analysis import queueing as Q
from syncviz.analysis import spill
from syncviz.analysis.metrics import lateness_matrix
from syncviz.trace import schema as S

LATE_KEY = ["step", "micro", "bucket"]        # a gradient bucket matched across ranks (tables.launch_lateness)


def reduce_bucket_first(parts: list) -> pd.Series | None:
    """Each bucket's (LATE_KEY) earliest launch over the partitions' (each a sorted groupby's min)."""
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    one = parts[0].index
    if one.is_unique and one.is_monotonic_increasing and all(p.index.equals(one) for p in parts[1:]):
        # every partition saw the same buckets (a DDP run: all of them): the groupby's answer, elementwise.
        # The summary reduces as partitions arrive: 147 groupbys of ~190,000 rows were 2.3 s of the
        # 10^8-event summary's main process.
        return pd.Series(np.minimum.reduce([p.to_numpy() for p in parts]), index=one, name=parts[0].name)
    return pd.concat(parts).groupby(level=list(range(len(LATE_KEY)))).min()


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
    """``events`` with collective_order's ``order`` and ``label`` columns (lateness_rows uses them);
    ``label`` categorical, "" among its categories (each partition's lateness rows take its codes)."""
    ordinal, label = collective_order(events, first)
    label = pd.Categorical(label, categories=sorted(set(label.tolist()) | {""}))
    return events.assign(order=ordinal, label=label)


def rank_step_lateness(late: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per (rank, step) of these ranks: the sum and count of tables.sync_lateness' ``late_ns``
    (``late``: lateness_rows), and whether they are of buckets (a step's rows are all buckets or all
    collectives): metrics.lateness_matrix's mean from partitions (integer sums: exact)."""
    if late is None:
        return None
    if not len(late):
        g = late.groupby(["rank", "step"])
        return pd.DataFrame({"sum": g["late_ns"].sum(), "count": g.size(), "buckets": g["buckets"].first()})
    # the same frame as that groupby, on sorted group codes (late_ns is integer: lateness' launch
    # differences): pandas' three aggregations took ~1.3% of the 10^8-event summary's CPU (py-spy);
    # tests/test_partition_engine.py compares the two
    rank, step = late["rank"].to_numpy(), late["step"].to_numpy()
    first, codes = K.group_rows(rank, step)
    n = len(first)
    index = pd.MultiIndex.from_arrays([rank[first], step[first]], names=["rank", "step"])
    return pd.DataFrame({"sum": PJ.int_sums(codes, late["late_ns"].to_numpy(), n),
                         "count": np.bincount(codes, minlength=n).astype(np.int64),
                         "buckets": late["buckets"].to_numpy()[first]}, index=index)


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


def reduce_step_first(parts: list) -> pd.Series | None:
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return pd.concat(parts).groupby(level=0).min()


def bucket_rows(comm: pd.DataFrame) -> pd.DataFrame:
    """``syncviz summary --json``'s per-bucket table: metrics.bucket_metrics' rows, less the name
    (comm: comm_metrics of every comm kind, as pass 2 has them)."""
    return comm[(comm["kind"] == S.BUCKET).to_numpy()].reset_index(drop=True).drop(columns=["name"])
