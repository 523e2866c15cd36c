"""The per-partition halves of analysis.partitioned (run in worker processes) and the functions that
combine their results. Each pass reads one partition of whole ranks and returns small tables; the
reasons each combination equals the whole-run number are in partitioned.py's docstring."""
from __future__ import annotations


import numpy as np
import pandas as pd

from syncviz.analysis.headline import top_exposed_rows
from syncviz.analysis import queueing as Q
from syncviz.analysis import spill
from syncviz.analysis.metrics import _ms
from syncviz.analysis.partition_joined import bucket_of, headline_bucket
from syncviz.analysis.tables import BUCKET_DISTRIBUTIONS, BUCKET_MEDIANS, quantiles, with_params
from syncviz.trace import schema as S

from syncviz.analysis.partition_facts import span_table, step_facts  # noqa: F401
from syncviz.analysis.partition_passes import _EVENTS, pass1, pass2  # noqa: F401  (the workers' half)

SKEW_KEY = ["step", "micro", "kind", "bucket", "name"]


def combine_facts(parts: list[dict], problems: list[str], incomplete: list[int]) -> dict:
    """The run's facts as the dashboard caches them (LoadedRun._facts): the same values its step
    index gives when it reads the whole run (tests/test_runcache.py compares them)."""
    parts = [p for p in parts if p is not None]
    ranks = sorted({int(r) for p in parts for r in p["ranks"]})
    steps = sorted({int(s) for p in parts for s in p["steps"]})
    top = max((p["top_bucket"] for p in parts), default=-1)
    first = pd.concat([p["first"] for p in parts]).groupby(level=0).min() if parts else pd.Series(dtype=np.int64)
    last = pd.concat([p["last"] for p in parts]).groupby(level=0).max() if parts else pd.Series(dtype=np.int64)
    ext = sorted(first.index.tolist())
    return {"problems": list(problems), "incomplete_ranks": list(incomplete), "ranks": ranks,
            "n_buckets": max(1, top + 1), "steps": steps, "extent_steps": [int(k) for k in ext],
            "extent_ms": [(int(last[k]) - int(first[k])) / 1e6 for k in ext]}


def reduce_events(parts: list) -> pd.DataFrame | None:
    """pass 1's per-collective (min, max, size) of several partitions as one such table; folded
    as partitions finish, so the parent holds one table per collective, not one per partition
    (at 10^8 events: 133 partitions × 58,000 collectives)."""
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    if _same_index(parts):          # every partition saw the same collectives (the usual case)
        a = parts[0]
        return pd.DataFrame({"min": np.minimum.reduce([p["min"].to_numpy() for p in parts]),
                             "max": np.maximum.reduce([p["max"].to_numpy() for p in parts]),
                             "size": np.add.reduce([p["size"].to_numpy() for p in parts]), "op": a["op"].array},
                            index=a.index, copy=False)   # op as it is: to_numpy and back took 7.8 ms a fold
    g = pd.concat(parts).groupby(level=list(range(len(Q.EVENT_KEY))), sort=True)
    # parts in rank order (partitions are consecutive ranks, folded in order): "first" is the lowest rank's op
    return pd.DataFrame({"min": g["min"].min(), "max": g["max"].max(), "size": g["size"].sum(), "op": g["op"].first()})


def _same_index(parts: list) -> bool:
    """Whether the tables have one index, sorted: then a groupby over their concatenation is an
    elementwise reduction of their columns (the parent folds 128 partitions' tables of 58,000
    collectives at 10^8 events; concat + groupby took ~45 ms a fold, 5.7 s of the parent's CPU
    while the workers needed both cores)."""
    first = parts[0].index
    return first.is_monotonic_increasing and first.is_unique and all(p.index.equals(first) for p in parts[1:])


def combine_events(parts: list) -> pd.DataFrame:
    """Per collective (index EVENT_KEY, sorted): ``first``/``last`` launch (ns), ``ranks`` and the
    ``op`` of the lowest rank's call."""
    r = reduce_events(parts)
    if r is None:
        idx = pd.MultiIndex.from_tuples([], names=Q.EVENT_KEY)
        return pd.DataFrame({"first": pd.Series(dtype=np.int64), "last": pd.Series(dtype=np.int64),
                             "ranks": pd.Series(dtype=np.int64), "op": pd.Series(dtype=object)}, index=idx)
    out = r.rename(columns={"min": "first", "max": "last", "size": "ranks"}).sort_index()
    out.index.names = Q.EVENT_KEY
    return out


def combine_stragglers(second: list[dict], events: pd.DataFrame, map_fn=map) -> pd.DataFrame:
    """queueing.straggler_table of the run from each partition's counts and scratch rows; ``map_fn``:
    where the per-partition work runs (the summary's workers: ~1.5 s of the parent's time at 10^8
    events, 128 partitions, when it ran here)."""
    cols = ["rank", "events", "last", "last_pct", "mean_late_ms", "waited_for_ms_per_step"]
    done = [r for r in second if r["strag"]]
    if not done:
        return pd.DataFrame(columns=cols)
    n_at_max = sum(r["n_at_max"] for r in second if r["n_at_max"] is not None)
    event_wait = sum(r["wait"] for r in second if r["wait"] is not None)
    unique = n_at_max == 1
    per = pd.concat(list(map_fn(_straggler_rows, [(r["strag"], r["late"], unique, event_wait) for r in done]))).sort_index()
    nsteps = max(1, len(set().union(*(r["strag_steps"] for r in done))))
    return Q.straggler_rows(per, nsteps)


def _straggler_rows(task: tuple) -> pd.DataFrame:
    """One partition's per-rank straggler counts (events, times last, waiting for it) from its
    scratch rows (partition_joined.write_straggler_rows), given every collective's count of ranks at
    the last launch and its wait: the same sums, in the same order, as over every row."""
    path, late, unique, event_wait = task
    with open(path, "rb") as f:
        ranks, list_of, lens, evs, last_rank, last_ev = (np.lib.format.read_array(f, allow_pickle=False) for _ in range(6))
    ends = np.cumsum(lens)
    counted = np.array([np.count_nonzero(unique[evs[a:b]]) for a, b in zip((ends - lens).tolist(), ends.tolist())],
                       dtype=np.int64)
    is_last = unique[last_ev]
    code = np.searchsorted(ranks, last_rank)       # ranks: sorted
    n = len(ranks)
    return pd.DataFrame({
        "events": counted[list_of],
        "last": np.bincount(code[is_last], minlength=n).astype(np.int64),
        "mean_late_ns": late.reindex(ranks).to_numpy(),
        # rows not launched last added 0.0 to a rank's wait: the same float sums without them
        "wait_ns": np.bincount(code, weights=np.where(is_last, event_wait[last_ev], 0.0), minlength=n).astype(np.float64)},
        index=pd.Index(ranks, name="rank"))


def reduce_skew(parts: list) -> pd.DataFrame | None:
    """Earliest and latest launch per collective identity (SKEW_KEY) over several partitions."""
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    if _same_index(parts):
        return pd.DataFrame({"lo": np.minimum.reduce([p["lo"].to_numpy() for p in parts]),
                             "hi": np.maximum.reduce([p["hi"].to_numpy() for p in parts])}, index=parts[0].index)
    g = pd.concat(parts).groupby(level=list(range(len(SKEW_KEY))))
    return pd.DataFrame({"lo": g["lo"].min(), "hi": g["hi"].max()})


def combine_skew(parts: list) -> float:
    r = reduce_skew(parts)
    return 0.0 if r is None else _ms((r["hi"] - r["lo"]).max())


def combine_top_exposed(second: list[dict]) -> list[dict]:
    parts = [r["exposed"] for r in second if r["exposed"] is not None]
    if not parts:
        return []
    g = pd.concat(parts).groupby(level=0, sort=False)
    agg = g.agg(kind=("kind", "first"), bucket=("bucket", "first"), name=("name", "first"), op=("op", "first"),
                bytes=("bytes", "max"), exposed_ns=("exposed_ns", "sum"), after_backward_ns=("after_backward_ns", "sum"),
                count=("count", "sum"))
    return top_exposed_rows(agg, sum(r["exposed_total"] for r in second), sum(r["rank_steps"] for r in second))


COLLECTIVE_MEDIANS = ["queue_ns", "busbw_gbps"]


def combine_buckets(second: list[dict], layouts: pd.DataFrame, med: pd.DataFrame | None = None) -> pd.DataFrame:
    """tables.bucket_layout_table of the headline bucket rows (``med``: their medians by (layout,
    bucket), when the caller has them: spill.group_medians_many)."""
    firsts = [r["bucket_first"] for r in second if r["bucket_first"] is not None]
    if not firsts:
        return pd.DataFrame()
    g = pd.concat(firsts).groupby(level=[0, 1], sort=True)
    out = pd.DataFrame({"bytes": g["bytes"].max(), "dtype": g["dtype"].first()})
    if med is None:
        med = spill.group_medians_many([([r["buckets"] for r in second], ["layout", "bucket"], BUCKET_MEDIANS,
                                         headline_bucket)])[0]
    out = out.join(med)
    out.index.names = ["layout", "bucket"]
    return with_params(out, layouts)


def combine_bucket_stats(second: list[dict], map_fn=map) -> tuple:
    """The dashboard's bucket_stats (LoadedRun.bucket_stats: tables.quantiles of duration, bus
    bandwidth and launch delay per bucket over every bucket row, and the rows' count), from the
    partitions' spills of the bucket rows (every step: partition_joined.bucket_of)."""
    pieces = [r["buckets"] for r in second]
    n = sum(r["bucket_n"] for r in second)
    bucket = S.EVENT_SCHEMA.field("bucket").type.to_pandas_dtype()     # the index as comm_metrics has it
    if not n:
        empty = pd.DataFrame({"bucket": pd.Series(dtype=bucket), "v": pd.Series(dtype=float)})
        frames = [quantiles(empty, "bucket", "v")] * len(BUCKET_DISTRIBUTIONS)
    else:
        frames = [f.set_axis(f.index.astype(bucket), axis=0)
                  for f in spill.group_quantiles(pieces, ["bucket"], BUCKET_DISTRIBUTIONS, map_fn, select=bucket_of)]
    return (*frames, pd.DataFrame({"rows": [n]}))


def combine_collectives(second: list[dict], med: pd.DataFrame) -> pd.DataFrame:
    """tables.collective_table of the headline collective rows (``med``: their medians by (phase,
    op), from the partitions' comm spills: partitioned._combine)."""
    sums = [r["coll_sums"] for r in second if r["coll_sums"] is not None]
    if not sums:
        return pd.DataFrame()
    g = pd.concat(sums).groupby(level=[0, 1], sort=True).sum()
    out = g.join(med)[["calls", "bytes", "duration_ns", "exposed_ns", "queue_ns", "busbw_gbps"]]
    nsteps = max(1, sum(r["coll_steps"] for r in second))
    per = ["calls", "bytes", "duration_ns", "exposed_ns"]
    out[per] = out[per] / nsteps
    return out


def combine_offload(second: list[dict]) -> pd.DataFrame:
    parts = [r["offload"] for r in second if r["offload"] is not None]
    if not parts:
        return pd.DataFrame(columns=["name", "ms_per_step", "calls_per_step"])
    off = pd.concat(parts, ignore_index=True)
    n = sum(r["offload_n"] for r in second) or 1
    g = off.groupby("name")
    return pd.DataFrame({"ms_per_step": g["ms"].sum() / n, "calls_per_step": g.size() / n}).reset_index()


__all__ = ["pass1", "pass2", "step_facts", "combine_facts", "combine_events", "combine_stragglers", "combine_skew", "combine_top_exposed",
           "combine_buckets", "combine_collectives", "combine_offload"]
