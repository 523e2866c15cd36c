"""Where a collective's time goes, and whom a rank waits for (DESIGN.md, "Metric definitions").

A collective has four times on each rank:
- hook entry  (``hook_ns``: DDP called the comm hook; == launch for a plain torch.distributed call),
- launch      (``launch_ns``: the collective call),
- service start: the data can move — every rank has launched it (``joined_ns``, the last rank's
  launch) and this rank's previous collective on the same stream has finished (a process group
  runs its collectives in order),
- done        (``end_ns``).

queue = service start − launch, split into
- ``queued_ns``: the part spent behind this rank's earlier collectives (previous one still running),
- ``wait_peers_ns``: the rest, waiting for the last rank to launch;
service = done − service start (``service_ns``; what algbw/busbw divide by). NaN where clock error
makes it negative.

The "stream" of a collective: bucket rows and collectives not issued inside a bucket's comm hook
(the wire rows) queue behind each other; collectives issued inside a hook queue behind the
hook's earlier collectives (they are the bucket's own transfer).

Exposed time is attributed once: at each exposed instant the rank waits on the earliest-launched
collective that is still running (ties: the wire row, then the longer one). Row i therefore owns
[max(launch_i, latest done of the rows launched before it), done_i] of the comm union, and its
exposed time is the part of that not under compute. Per-row exposed adds up to the step's exposed.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from syncviz.analysis import keys as K
from syncviz.analysis.intervals import Coverage, _spans, group_spans, wire_mask
from syncviz.analysis.columns import as_str

TIME_COLUMNS = ["joined_ns", "service_start_ns", "queue_ns", "queued_ns", "wait_peers_ns", "service_ns"]


def stream_prev_done(rank: np.ndarray, not_wire: np.ndarray, launch: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each row: the latest done among the rows launched earlier on the same (rank, stream)
    (NaN for the first); rows launched at the same instant keep their order in the arrays (the
    order the rank issued them)."""
    order = K.lexsort((np.arange(len(rank)), launch, not_wire, rank))
    g = rank[order].astype(np.int64) * 2 + not_wire[order].astype(np.int64)
    prev = np.empty(len(rank))
    prev[order] = K.prev_cummax(g, end[order])
    return prev


def service_times(launch: np.ndarray, end: np.ndarray, prev: np.ndarray, joined: np.ndarray) -> dict:
    """TIME_COLUMNS (floats) of rows with their launch, done, previous done on their stream
    (stream_prev_done) and their collective's last launch over all ranks (``joined``)."""
    start = np.fmax(joined, prev)
    queue = start - launch
    queued = np.clip(np.nan_to_num(prev - launch, nan=0.0), 0.0, queue)
    service = end - start
    return {"joined_ns": joined, "service_start_ns": start, "queue_ns": queue, "queued_ns": queued,
            "wait_peers_ns": queue - queued, "service_ns": np.where(service >= 0, service, np.nan)}


# A collective is matched across ranks by these columns: the n-th call of one identity on a rank
# (in launch order) meets the n-th call of it on every other rank.
EVENT_KEY = ["step", "micro", "kind", "bucket", "name", "occurrence"]


def occurrences(comm: pd.DataFrame) -> pd.DataFrame:
    """Comm rows (rank, EVENT_KEY, launch_ns, end_ns, ``launch`` as float) sorted by (rank, launch),
    ties in frame order, with ``occurrence``: how many calls of the same identity the rank made
    before. Per rank only, so a partition of whole ranks numbers its rows as the whole run does."""
    c = comm[["rank", "step", "micro", "kind", "bucket", "name", "launch_ns", "end_ns"]].copy()
    c["kind"], c["name"] = as_str(c["kind"]), as_str(c["name"])
    c["launch"] = c["launch_ns"].to_numpy(dtype=float)
    c = c.iloc[K.lexsort((c["launch"].to_numpy(), c["rank"].to_numpy()))]   # stable: ties in frame order
    c["occurrence"] = K.cumcount(K.group_codes(*(c[k] for k in ["rank"] + EVENT_KEY[:-1])))
    return c


def collective_times(comm: pd.DataFrame, joined: pd.Series | None = None) -> pd.DataFrame:
    """Queue, wait and service time of comm rows (rows of comm_metrics or comm_rows; needs rank,
    step, micro, kind, bucket, name, launch_ns, end_ns). Returns TIME_COLUMNS, same index.
    Rows are matched across ranks by EVENT_KEY. ``joined``: the last launch of every event
    (Series indexed by EVENT_KEY) when ``comm`` holds only some ranks (analysis.partitioned);
    by default it comes from ``comm``'s own rows."""
    if not len(comm):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in TIME_COLUMNS})
    c = occurrences(comm)
    if joined is None:
        joined = K.group_max(K.group_codes(*(c[k] for k in EVENT_KEY)), c["launch"].to_numpy())
    else:
        joined = joined.reindex(pd.MultiIndex.from_frame(c[EVENT_KEY])).to_numpy(dtype=float)
    launch, end = c["launch"].to_numpy(), c["end_ns"].to_numpy(dtype=float)
    prev = stream_prev_done(c["rank"].to_numpy(), (~wire_mask(c)).astype(np.int64), launch, end)
    out = pd.DataFrame(service_times(launch, end, prev, joined), index=c.index)
    return out.reindex(comm.index)


def owned_intervals(comm: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the part of the comm union each row owns (see the module docstring); rows
    of one (rank, step) tile ∪ comm without overlap. end <= start where a row owns nothing."""
    if not len(comm):
        return np.zeros(0), np.zeros(0)
    return owned_arrays(K.group_codes(comm["rank"], comm["step"]), comm["start_ns"].to_numpy(dtype=float),
                        comm["end_ns"].to_numpy(dtype=float), (~wire_mask(comm)).astype(np.int64))


def owned_arrays(g: np.ndarray, launch: np.ndarray, end: np.ndarray, not_wire: np.ndarray):
    """owned_intervals on arrays: ``g`` a (rank, step) code per row, launch and done as floats."""
    order = K.lexsort((-end, not_wire, launch, g))
    prev = K.prev_cummax(g[order], end[order])
    s = np.empty(len(g))
    s[order] = np.fmax(launch[order], prev)
    return s, end


def attributed_exposed(comm: pd.DataFrame, compute: pd.DataFrame, backward_end=None) -> pd.DataFrame:
    """Per comm row (rows of comm_rows: start_ns = launch): ``exposed_ns``, its share of the
    rank-step's exposed time, and ``after_backward_ns``, the part of it after the rank's backward
    compute ended (``backward_end``: Series indexed by (rank, step))."""
    if not len(comm):
        return pd.DataFrame({"exposed_ns": np.zeros(0), "after_backward_ns": np.zeros(0)}, index=comm.index)
    rank, step = comm["rank"].to_numpy(), comm["step"].to_numpy()
    be = K.lookup(backward_end, rank, step) if backward_end is not None and len(backward_end) else None
    exposed, after = attributed_arrays(rank, step, *owned_intervals(comm), _spans(compute), be)
    return pd.DataFrame({"exposed_ns": exposed, "after_backward_ns": after}, index=comm.index)


def attributed_arrays(rank, step, s, e, compute: tuple, backward_end: np.ndarray | None, shared: dict | None = None):
    """attributed_exposed on arrays: rows' owned intervals (s, e), compute intervals (rank, step,
    start, end) and each row's backward end (NaN: none; None: no backward anywhere). ``shared``:
    metrics.step_metric_rows' ``keep`` of the same compute intervals and these rows."""
    e = np.maximum(e, s)
    ps, pe = np.round(s).astype(np.int64), np.round(e).astype(np.int64)
    if shared is not None:
        cov, pc = shared["compute"], shared["comm_groups"]
    else:
        (_, (cc, pc), base, span) = group_spans(compute, (rank, step, ps, pe))
        cov = Coverage(cc, compute[2], compute[3], len(base), base, span)
    at_end = cov.at(pc, pe)            # Coverage.overlap(pc, x, pe), its end looked up once
    exposed = (pe - ps) - (at_end - cov.at(pc, ps))
    after = np.zeros(len(rank))
    if backward_end is not None:
        has = ~np.isnan(backward_end)
        bs = np.clip(np.where(has, np.nan_to_num(backward_end), pe), ps, pe).astype(np.int64)
        after = np.where(has, (pe - bs) - (at_end - cov.at(pc, bs)), 0.0)
    return exposed, after


# ------------------------------------------------------------------------------- stragglers

def straggler_table(comm: pd.DataFrame) -> pd.DataFrame:
    """Per rank, over comm rows (wire rows of comm_metrics) seen on at least two ranks: how often it
    launched last (``last``, of the ``events`` it took part in that had one last rank), its mean
    lateness over all its events (launch − earliest launch, ms) and
    the time the other ranks waited for it (Σ over the events it launched last of the other
    ranks' ``wait_peers_ns``, ms per step; the launch gaps when that column is absent)."""
    cols = ["rank", "events", "last", "last_pct", "mean_late_ms", "waited_for_ms_per_step"]
    if not len(comm):
        return pd.DataFrame(columns=cols)
    c = comm[["rank", "step", "micro", "kind", "bucket", "name", "launch_ns"]].copy()
    c["kind"], c["name"] = as_str(c["kind"]), as_str(c["name"])
    key = ["step", "micro", "kind", "bucket", "name"]
    c = c.sort_values(["rank", "launch_ns"], kind="stable")
    c["occ"] = c.groupby(["rank"] + key, observed=True).cumcount()
    ev_id = c.groupby(key + ["occ"], observed=True, sort=False).ngroup().to_numpy()
    n_ev = int(ev_id.max()) + 1
    launch = c["launch_ns"].to_numpy(dtype=np.int64)
    nranks = np.bincount(ev_id, minlength=n_ev)
    first, last = np.full(n_ev, np.iinfo(np.int64).max), np.full(n_ev, np.iinfo(np.int64).min)
    np.minimum.at(first, ev_id, launch)
    np.maximum.at(last, ev_id, launch)
    keep = nranks[ev_id] >= 2
    if not keep.any():
        return pd.DataFrame(columns=cols)
    c["late"] = launch - first[ev_id]
    # An event has a last rank when exactly one rank launched at the latest time; events where
    # ranks tie at the latest launch (e.g. hand-built or simulated traces) have none and are not
    # counted in ``events``.
    at_max = launch == last[ev_id]
    unique = (np.bincount(ev_id, weights=at_max, minlength=n_ev) == 1)[ev_id]
    c["unique_last"], c["is_last"] = unique, at_max & unique
    # Time the others waited for the last rank: their wait_peers_ns on this event (disjoint along
    # each rank's stream, so it adds up to wall time); the launch gaps where it is not known.
    if "wait_peers_ns" in comm:
        waits = comm.loc[c.index, "wait_peers_ns"].fillna(0).to_numpy(dtype=float)
    else:
        waits = (last[ev_id] - launch).astype(float)
    event_wait = np.bincount(ev_id, weights=waits, minlength=n_ev)[ev_id]
    c["wait_caused"] = np.where(c["is_last"], event_wait, 0.0)
    c = c[keep]
    nsteps = max(1, c["step"].nunique())
    per = c.groupby("rank").agg(events=("unique_last", "sum"), last=("is_last", "sum"), mean_late_ns=("late", "mean"),
                                wait_ns=("wait_caused", "sum"))
    return straggler_rows(per, nsteps)


def straggler_rows(per: pd.DataFrame, nsteps: int) -> pd.DataFrame:
    """straggler_table's rows from its per-rank sums (index rank: events, last, mean_late_ns, wait_ns)."""
    cols = ["rank", "events", "last", "last_pct", "mean_late_ms", "waited_for_ms_per_step"]
    per["last_pct"] = 100.0 * per["last"] / per["events"]
    per["mean_late_ms"] = per["mean_late_ns"] / 1e6
    per["waited_for_ms_per_step"] = per["wait_ns"] / 1e6 / nsteps
    per["last"] = per["last"].astype(int)
    return per.reset_index()[cols]


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    i = np.arange(k, n + 1, dtype=float)
    # in log space: runs have thousands of collectives
    logpmf = (math.lgamma(n + 1) - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in i])
              + i * math.log(p) + (n - i) * math.log1p(-p))
    return float(min(1.0, np.exp(logpmf).sum()))


# A rank is the run's straggler when three things hold:
# - it launched last more often than chance allows: with each rank equally likely to be last,
#   that count or more happens in < 5% of runs (on 2 ranks: 5 of 5, 9 of 10, 12 of 16, 15 of 20,
#   31 of 49 — the run in issue 11 where rank 1 was last in 29 of 49 is not: p = 0.13);
# - the others waited for it at least twice as long as for any other single rank (the count
#   alone is fooled by a step where ranks swap order for reasons of their own: measured, 2-rank
#   runs with a rank sleeping 30 ms before each forward had the fast rank last in all 4 buckets of
#   step 1, right after DDP's bucket rebuild — last in 12 of 16, yet 98% of the waiting; on 8
#   ranks each other rank also makes the rest wait a little, so this compares with the runner-up,
#   not with their sum);
# - its mean lateness exceeds the clock alignment error bound (otherwise the order is not known).
# How small the lateness is next to communication does not matter: a consistent order is the signal.
STRAGGLER_P = 0.05
STRAGGLER_WAIT_RATIO = 2.0


def straggler(table: pd.DataFrame, world_size: int, clock_error_ns: float = 0.0) -> dict | None:
    """The run's straggler from straggler_table, or None (criteria above). Returns {rank, last,
    events, last_pct, mean_late_ms, waited_for_ms_per_step, wait_share_pct, p_chance}."""
    if not len(table) or world_size < 2:
        return None
    top = table.sort_values(["last", "waited_for_ms_per_step"], ascending=False).iloc[0]
    n_events = int(table["events"].max())
    p = binomial_tail(int(top["last"]), n_events, 1.0 / world_size)
    total_wait = float(table["waited_for_ms_per_step"].sum())
    share = float(top["waited_for_ms_per_step"]) / total_wait if total_wait > 0 else 0.0
    others = table.loc[table["rank"] != top["rank"], "waited_for_ms_per_step"]
    runner_up = float(others.max()) if len(others) else 0.0
    dominant = top["waited_for_ms_per_step"] > 0 and top["waited_for_ms_per_step"] >= STRAGGLER_WAIT_RATIO * runner_up
    if p >= STRAGGLER_P or not dominant or not top["mean_late_ms"] * 1e6 > clock_error_ns:
        return None
    return {"rank": int(top["rank"]), "last": int(top["last"]), "events": n_events,
            "last_pct": 100.0 * int(top["last"]) / n_events, "mean_late_ms": float(top["mean_late_ms"]),
            "waited_for_ms_per_step": float(top["waited_for_ms_per_step"]), "wait_share_pct": 100.0 * share,
            "p_chance": p}


def clock_error_bound(meta: dict) -> float:
    """Largest clock alignment error bound over ranks (ns; 0 when unknown)."""
    errs = [abs(float(r.get(k) or 0)) for r in (meta.get("ranks") or []) for k in ("clock_error_ns", "clock_error_end_ns")]
    return max(errs, default=0.0)
