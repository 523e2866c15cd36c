"""What torch-tb-profiler's "Distributed" view shows, from syncviz's own trace (so it works
offline, on every step, without a profiler run): per rank, how a step splits into computation,
communication overlapped with it, communication alone, and waiting for peers; per collective
kind, calls, bytes and time. Means over the headline steps (all but step 0 when there are more)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis.intervals import subtract_arrays, wire_mask
from syncviz.analysis.metrics import _busbw_factors, comm_metrics, headline_steps, step_metrics
from syncviz.analysis.tables import exposed_intervals
from syncviz.analysis.timeline import wait_of
from syncviz.trace import schema as S
from syncviz.analysis.columns import as_str
from syncviz.analysis import keys as K

BREAKDOWN = ("computation_ns", "overlapped_ns", "communication_ns", "waiting_ns", "other_ns")


def _headline_events(events: pd.DataFrame, steps: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    steps = step_metrics(events) if steps is None else steps
    h = headline_steps(steps) if len(steps) else steps
    return h, events[events["step"].isin(h["step"].unique())] if len(h) else events.iloc[:0]


def _headline_comm(ev: pd.DataFrame, h: pd.DataFrame, comm: pd.DataFrame | None) -> pd.DataFrame:
    """comm_metrics (all comm kinds) of the headline steps: computed here, or the headline steps'
    rows of ``comm`` computed beforehand for the whole run (each step's metrics depend only on
    that step's rows, so the two are the same)."""
    if comm is None:
        return comm_metrics(ev, kinds=S.COMM_KINDS) if len(ev) else pd.DataFrame()
    return comm[comm["step"].isin(h["step"].unique())].reset_index(drop=True) if len(h) and len(comm) else comm.iloc[:0]


def rank_breakdown(events: pd.DataFrame, steps: pd.DataFrame | None = None,
                   comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank, mean ns per headline step of: ``computation_ns`` (compute with no collective in
    flight), ``overlapped_ns`` (collectives in flight while computing), ``communication_ns``
    (collectives alone, being served), ``waiting_ns`` (collectives alone, waiting for a late peer
    or for a collective queued ahead: analysis.timeline.collective_parts), ``other_ns`` (the rest
    of the step: data loading, host work, idle); they add up to ``step_ns``. ``steps`` and
    ``comm``: step_metrics and comm_metrics (all comm kinds) of ``events``, when already computed."""
    h, ev = _headline_events(events, steps)
    if not len(h):
        return breakdown_of(h, None)
    comm = _headline_comm(ev, h, comm)
    comm = comm[wire_mask(comm)].reset_index(drop=True) if len(comm) else comm
    return breakdown_of(h, waiting_exposed(exposed_intervals(ev), comm))


def waiting_exposed(exposed: pd.DataFrame, comm: pd.DataFrame) -> pd.Series:
    """Per (rank, step): how long its exposed intervals (tables.exposed_intervals) lie inside a
    collective's wait (launch → service start: timeline.wait_of); ``comm``: its wire rows
    (comm_metrics: rank, step, start_ns, end_ns, service_ns). Only (rank, step) pairs with exposed
    time are listed. Each pair needs its own rank's rows alone, so the partitioned summary's second
    pass computes it per partition (partition_joined.distributed_parts)."""
    cols = ("rank", "step", "start_ns", "end_ns")
    return waiting_exposed_arrays(tuple(exposed[k].to_numpy() for k in cols) if len(exposed) else None,
                                  *(comm[k].to_numpy() for k in cols), comm["service_ns"].to_numpy(dtype=float))


def waiting_exposed_arrays(exposed: tuple | None, rank: np.ndarray, step: np.ndarray, start: np.ndarray,
                           end: np.ndarray, service: np.ndarray) -> pd.Series:
    """waiting_exposed on arrays: ``exposed`` is (rank, step, start, end) of the exposed intervals, the
    rest the wire rows' columns. exposed ∩ waiting = exposed − (exposed minus the waits), summed per
    (rank, step) in floats of whole nanoseconds (exact below 2^53). On arrays so that a partition's
    wire rows are not made a frame: 6.0 ms for a partition of the 10^8-event DDP run (7.4 ms with
    frames and pandas groupbys, best of 7 each)."""
    if exposed is None or not len(exposed[0]) or not len(rank):
        return pd.Series(dtype=float)
    wait = np.nan_to_num(wait_of(start, end, service), nan=0.0)
    k = (wait > 0) & _near(exposed, rank, step, start, start + wait)
    waits = (rank[k], step[k], start[k], (start[k] + wait[k]).astype(np.int64))
    length = (exposed[3] - exposed[2]).astype(float)
    if k.any():
        row, s, e = subtract_arrays(exposed, waits)
        inside = length - np.bincount(row, weights=(e - s).astype(float), minlength=len(length))
    else:
        inside = np.zeros(len(length))
    first, codes = K.group_rows(exposed[0], exposed[1])
    return pd.Series(np.bincount(codes, weights=inside, minlength=len(first)),
                     index=pd.MultiIndex.from_arrays([exposed[0][first], exposed[1][first]], names=["rank", "step"]))


def _near(exposed: tuple, rank: np.ndarray, step: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which of the intervals (rank, step, start, end) meet the span of their own (rank, step)'s
    exposed intervals (first start to last end): only those can cut an exposed interval, so the
    rest are left out of the subtraction, which gives the same pieces without them. Why: a DDP
    partition of the 10^8-event run has ~660,000 waits and ~5,500 exposed intervals, about one a
    rank-step at the end of its backward, and the waits' merge and sort were most of this function:
    29 -> 18 ms a partition (7 ranks of that run, best of 3 each, the same Series; session 33).
    Not keys.max_by_key (twice, for the first start and the last end): it codes both key sets
    together, ~665,000 rows a call, where here only the exposed side's ~5,500 are coded and the
    waits searched in them: waiting_exposed took 23 ms with it against 17.6 ms (five runs each,
    alternated, the same Series)."""
    er, es = np.asarray(exposed[0], dtype=np.int64), np.asarray(exposed[1], dtype=np.int64)
    rank, step = np.asarray(rank, dtype=np.int64), np.asarray(step, dtype=np.int64)
    r0, s0 = min(er.min(), rank.min()), min(es.min(), step.min())
    span = max(es.max(), step.max()) - s0 + 1
    cells = (max(er.max(), rank.max()) - r0 + 1) * span
    cell = (er - r0) * span + (es - s0)
    key = (rank - r0) * span + (step - s0)
    # a table of every (rank, step) cell where it is small, looked up directly, else the exposed cells
    # sorted and each wait searched for: 25.2 -> 10.2 ms a partition of the 10^8-event DDP run (~5,500
    # cells, ~660,000 waits; median of 30 calls each, alternated in one process, the same result; session 47)
    if cells <= len(rank) + (1 << 16):
        n, i, found = cells, key, True                  # a cell with no exposed interval: lo > hi, so False
    else:
        pairs, cell = np.unique(cell, return_inverse=True)
        n, i = len(pairs), np.minimum(np.searchsorted(pairs, key), len(pairs) - 1)
        found = pairs[i] == key
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, cell, np.asarray(exposed[2], dtype=np.int64))
    np.maximum.at(hi, cell, np.asarray(exposed[3], dtype=np.int64))
    return found & (end > lo[i]) & (start < hi[i])


def breakdown_of(h: pd.DataFrame, waiting: pd.Series | None) -> pd.DataFrame:
    """rank_breakdown from the headline step_metrics rows ``h`` and waiting_exposed of their
    (rank, step) pairs (of any partitions of ranks, concatenated)."""
    cols = ["rank", "step_ns", *BREAKDOWN]
    if not len(h):
        return pd.DataFrame(columns=cols)
    t = h.set_index(["rank", "step"])[["step_ns", "compute_ns", "overlapped_ns", "exposed_ns"]].astype(float)
    waiting = waiting.reindex(t.index).fillna(0.0) if waiting is not None and len(waiting) \
        else pd.Series(0.0, index=t.index)
    t["waiting_ns"] = waiting.clip(lower=0).to_numpy()
    t["computation_ns"] = t["compute_ns"] - t["overlapped_ns"]
    t["communication_ns"] = t["exposed_ns"] - t["waiting_ns"]
    t["other_ns"] = (t["step_ns"] - t["compute_ns"] - t["exposed_ns"]).clip(lower=0)
    return t.groupby("rank")[["step_ns", *BREAKDOWN]].mean().reset_index()[cols]


def collective_kinds(events: pd.DataFrame, steps: pd.DataFrame | None = None,
                     comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per collective op, per rank and headline step: ``calls`` (mean), ``calls_min`` /
    ``calls_max`` (the fewest and most calls of one rank in one step, integers, which tables show),
    ``bytes`` (as the collective counts them), ``bus_bytes`` (bytes × nccl-tests' bus factor: what
    the links carry), ``time_ns`` (summed durations, queued time included) and ``mean_ns`` per call."""
    h, ev = _headline_events(events, steps)
    comm = _headline_comm(ev, h, comm)
    parts = []
    if len(comm):
        comm = comm[wire_mask(comm)]
        op, names = pd.factorize(as_str(comm["op"]).to_numpy())
        parts.append(kinds_part(op, np.asarray(names, dtype=object), comm["group_size"].to_numpy(),
                                comm["rank"].to_numpy(), comm["step"].to_numpy(), comm["bytes"].to_numpy(),
                                comm["duration_ns"].to_numpy(dtype=float)))
    return kinds_of(parts, h)


def kinds_part(op: np.ndarray, names: np.ndarray, group_size: np.ndarray, rank: np.ndarray, step: np.ndarray,
               nbytes: np.ndarray, duration: np.ndarray) -> dict:
    """What collective_kinds sums of some headline wire rows (``op``: codes into ``names``, the op
    names; group sizes, ranks, steps, bytes, durations: NaN where clock error hides them): per (op,
    group size) calls, bytes, summed and counted durations; per (rank, step, op) calls. Sums of
    integers (durations are whole nanoseconds: their float sums are exact below 2^53), so the parts of
    any partitions add up to the whole run's exactly. On codes, not strings: pandas' groupby of a
    partition's ~660,000 op names cost ~90 ms of it."""
    names = np.asarray(["other" if n == "" else str(n) for n in names], dtype=object)
    if not len(op):
        return {"sums": None, "pairs": None}
    first, g = K.group_rows(op, group_size)
    k = len(first)
    nb = np.bincount(g, weights=nbytes, minlength=k)
    if nb.max() < 2.0 ** 53:                 # float sums of integers below 2^53 are exact
        nb = nb.astype(np.int64)
    else:
        nb = np.zeros(k, dtype=np.int64)
        np.add.at(nb, g, np.asarray(nbytes, dtype=np.int64))
    timed = ~np.isnan(duration)
    sums = pd.DataFrame({"calls": np.bincount(g, minlength=k).astype(np.int64), "bytes": nb,
                         "time_ns": np.bincount(g, weights=np.where(timed, duration, 0.0), minlength=k),
                         "timed": np.bincount(g, minlength=k, weights=timed).astype(np.int64)},
                        index=pd.MultiIndex.from_arrays([names[op[first]], np.asarray(group_size)[first].astype(np.int64)],
                                                        names=["op", "group_size"]))
    at, p = K.group_rows(rank, step, op)
    pairs = pd.Series(np.bincount(p, minlength=len(at)).astype(np.int64),
                      index=pd.MultiIndex.from_arrays([np.asarray(rank)[at], np.asarray(step)[at], names[op[at]]],
                                                      names=["rank", "step", "op"]))
    if len(set(names)) < len(names):        # "" and "other" are both "other"
        pairs = pairs.groupby(level=[0, 1, 2]).sum()
    return {"sums": sums, "pairs": pairs}


def kinds_of(parts: list[dict], h: pd.DataFrame) -> pd.DataFrame:
    """collective_kinds from kinds_part of disjoint sets of rows (partitions of ranks) and the
    headline step_metrics rows ``h``."""
    cols = ["op", "calls", "calls_min", "calls_max", "bytes", "bus_bytes", "time_ns", "mean_ns"]
    parts = [p for p in parts if p["pairs"] is not None and len(p["pairs"])]
    if not parts:
        return pd.DataFrame(columns=cols)
    n = max(1, len(h))                       # (rank, step) pairs
    sums = pd.concat([p["sums"] for p in parts]).groupby(level=["op", "group_size"]).sum()
    ops, sizes = sums.index.get_level_values("op"), sums.index.get_level_values("group_size")
    # busbw_factor per (op, group size), times the bytes summed in integers
    bus = sums["bytes"].to_numpy(dtype=float) * _busbw_factors(pd.Series(ops.to_numpy(), dtype=object),
                                                               pd.Series(sizes.to_numpy()))
    sums = sums.assign(bus_bytes=bus).groupby(level="op").sum()
    # calls of each op in each headline (rank, step), zero where a pair made none
    per_pair = pd.concat([p["pairs"] for p in parts]).unstack("op")
    if len(h):
        per_pair = per_pair.reindex(pd.MultiIndex.from_frame(h[["rank", "step"]]))
    per_pair = per_pair.fillna(0).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums["time_ns"].to_numpy(dtype=float) / sums["timed"].to_numpy(dtype=float)
    out = pd.DataFrame({"calls": sums["calls"] / n, "calls_min": per_pair.min(), "calls_max": per_pair.max(),
                        "bytes": sums["bytes"] / n, "bus_bytes": sums["bus_bytes"] / n,
                        "time_ns": sums["time_ns"] / n, "mean_ns": pd.Series(mean, index=sums.index)})
    out.index.name = "op"
    return out.reset_index()[cols].sort_values("time_ns", ascending=False).reset_index(drop=True)
