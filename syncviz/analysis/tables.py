"""Tables across ranks and steps built from the per-(rank, step) metrics: what the summary, the
dashboard and the exports lay out. Pure functions of the trace tables (see metrics.py for the
definitions they aggregate)."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from syncviz.trace import schema as S
from syncviz.trace import Run
from syncviz.analysis.intervals import (_groups, comm_rows, compute_intervals, group_spans,  # noqa: F401
                                        merge_intervals, subtract_intervals, wire_mask)
from syncviz.analysis.metrics import (NS, _ms, bucket_metrics, busbw_factor, comm_metrics,  # noqa: F401
                                      headline_steps, skew, step_metrics)
from syncviz.analysis.columns import as_str
from syncviz.analysis import keys as K
from syncviz.analysis import queueing as Q


# ------------------------------------------------------------- tables across ranks (exports)

def step_table(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """One row per step, across ranks: the **mean over ranks** of each per-rank time (ns) and of
    bytes, the slowest rank's step time, and overlap % and compute/comm ratio computed from those
    means (so overlap % = 100 × (1 − exposed / comm busy) as shown, the headline's aggregate),
    and the median busbw (GB/s, on service time) of that step's wire collectives."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    steps = step_metrics(ev)
    if not len(steps):
        return pd.DataFrame(columns=STEP_TABLE_COLUMNS)
    comm = comm_metrics(ev, kinds=S.COMM_KINDS)
    comm = comm[wire_mask(comm)] if len(comm) else comm
    return step_table_of(steps, comm.groupby("step")["busbw_gbps"].median() if len(comm) else np.nan)


STEP_TABLE_COLUMNS = ["step", "ranks", "step_ns", "step_max_ns", "forward_ns", "backward_ns", "optimizer_ns", "eval_ns",
                      "compute_ns", "comm_busy_ns", "overlapped_ns", "exposed_ns", "overlap_pct",
                      "compute_comm_ratio", "bytes", "busbw_gbps"]


def step_table_of(steps: pd.DataFrame, busbw) -> pd.DataFrame:
    """step_table from step_metrics rows and the per-step median busbw (Series by step, or NaN)."""
    cols = STEP_TABLE_COLUMNS
    g = steps.groupby("step", sort=True)
    means = ["step_ns", "forward_ns", "backward_ns", "optimizer_ns", "eval_ns", "compute_ns", "comm_busy_ns",
             "overlapped_ns", "exposed_ns", "bytes"]
    out = g[means].mean()
    out["ranks"] = g["rank"].nunique()
    out["step_max_ns"] = g["step_ns"].max()
    sums = g[["overlapped_ns", "comm_busy_ns", "forward_ns", "backward_ns", "optimizer_ns"]].sum()
    busy = sums["comm_busy_ns"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["overlap_pct"] = np.where(busy > 0, 100.0 * sums["overlapped_ns"] / busy, np.nan)
        phases = (sums["forward_ns"] + sums["backward_ns"] + sums["optimizer_ns"]).to_numpy(dtype=float)
        out["compute_comm_ratio"] = np.where(busy > 0, phases / busy, np.inf)
    out["busbw_gbps"] = busbw
    return out.reset_index()[cols]


def bucket_table(run_or_events: Run | pd.DataFrame, headline: bool = True) -> pd.DataFrame:
    """One row per bucket (over ranks and, by default, headline steps): op, bytes, count, and the
    median service time (``duration_ns``), queue, launch delay, exposed time (ns) and busbw (GB/s)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    b = bucket_metrics(ev)
    cols = ["bucket", "op", "bytes", "count", "duration_ns", "queue_ns", "wait_peers_ns", "launch_delay_ns",
            "exposed_ns", "busbw_gbps"]
    if not len(b):
        return pd.DataFrame(columns=cols)
    if headline and b["step"].nunique() > 1:
        b = b[b["step"] > b["step"].min()]
    out = b.groupby("bucket", sort=True).agg(
        op=("op", "first"), bytes=("bytes", "max"), count=("duration_ns", "size"),
        duration_ns=("duration_ns", "median"), queue_ns=("queue_ns", "median"),
        wait_peers_ns=("wait_peers_ns", "median"), launch_delay_ns=("launch_delay_ns", "median"),
        exposed_ns=("exposed_ns", "median"), busbw_gbps=("busbw_gbps", "median"))
    return out.reset_index()[cols]


def bytes_in_flight(run_or_events: Run | pd.DataFrame, comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank, the bytes of communication in flight as a step function: rows (rank, t_ns, bytes)
    where ``bytes`` holds from t_ns until the rank's next row. Counts the same events as
    step_metrics' bytes (every bucket, plus collectives not issued inside a bucket's hook).
    ``comm``: comm_rows(events) when the caller has it already."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comm = comm_rows(ev) if comm is None else comm
    wire = comm[(comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)]
    if not len(wire):
        return pd.DataFrame({"rank": pd.Series(dtype=int), "t_ns": pd.Series(dtype=np.int64),
                             "bytes": pd.Series(dtype=np.int64)})
    r = wire["rank"].to_numpy()
    nb = wire["bytes"].to_numpy(dtype=np.int64)
    rank = np.r_[r, r]
    t = np.r_[wire["start_ns"].to_numpy(), wire["end_ns"].to_numpy()].astype(np.int64)
    delta = np.r_[nb, -nb]
    # Sum changes at the same instant first, so a collective ending exactly when the next starts
    # does not show a spurious dip or peak. (numpy sort + reduceat: the groupby took ~15 ms of the
    # 128-rank sample's Perfetto export.)
    order = K.lexsort((t, rank))
    rank, t, delta = rank[order], t[order], delta[order]
    first = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (t[1:] != t[:-1])])
    rank, t, delta = rank[first], t[first], np.add.reduceat(delta, first)
    total = np.cumsum(delta)
    rank_first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    before = np.repeat(np.r_[0, total[rank_first[1:] - 1]], np.diff(np.r_[rank_first, len(rank)]))
    return pd.DataFrame({"rank": rank, "t_ns": t, "bytes": (total - before).astype(np.int64)})


def step_medians(steps: pd.DataFrame) -> pd.DataFrame:
    """step_metrics' columns per step, as the median over ranks (index: step)."""
    return steps.groupby("step").median(numeric_only=True)


def bucket_layout_table(comm: pd.DataFrame, layouts: pd.DataFrame) -> pd.DataFrame:
    """One row per (layout, bucket) of bucket rows from comm_metrics: parameter count (from one
    rank's layout), bytes, dtype, and median launch delay, hook entry → launch, queue (of it waiting for peers),
    service time (``duration_ns``), algbw, busbw (on service time) and attributed exposed time."""
    g = comm.groupby(["layout", "bucket"]).agg(
        bytes=("bytes", "max"), dtype=("dtype", "first"),
        **{c: (c, "median") for c in BUCKET_MEDIANS})
    return with_params(g, layouts)


BUCKET_MEDIANS = ("launch_delay_ns", "hook_to_launch_ns", "queue_ns", "wait_peers_ns", "duration_ns", "algbw_gbps",
                  "busbw_gbps", "exposed_ns")
# What the dashboard's Buckets page draws the distribution of, per bucket over every step and rank
# (tables.quantiles of these columns of the bucket rows: LoadedRun.bucket_stats; for a run too big
# to read whole, partials.combine_bucket_stats from the partitions' spills of the bucket rows).
BUCKET_DISTRIBUTIONS = ("duration_ns", "busbw_gbps", "launch_delay_ns")


def with_params(g: pd.DataFrame, layouts: pd.DataFrame) -> pd.DataFrame:
    """bucket_layout_table's ``params`` column: parameters per (layout, bucket) in one rank's layout."""
    lay = layouts[layouts["rank"] == layouts["rank"].min()] if len(layouts) else layouts
    nparams = lay.groupby(["layout", "bucket"]).size() if len(lay) else pd.Series(dtype=int)
    g["params"] = [int(nparams.get(k, 0)) for k in g.index]
    return g


def collective_table(comm: pd.DataFrame) -> pd.DataFrame:
    """One row per (phase, op) of collective rows from comm_metrics, per (rank, step) on average:
    calls, bytes, service time and attributed exposed time (neither counts a moment twice:
    service intervals of one stream do not overlap, and each exposed instant belongs to one
    collective); plus the median queue (ns) and busbw (GB/s, on service time)."""
    nsteps = max(1, comm[["rank", "step"]].drop_duplicates().shape[0])
    g = comm.groupby(["phase", "op"]).agg(calls=("bytes", "size"), bytes=("bytes", "sum"),
                                          duration_ns=("duration_ns", "sum"), exposed_ns=("exposed_ns", "sum"),
                                          queue_ns=("queue_ns", "median"), busbw_gbps=("busbw_gbps", "median"))
    per = ["calls", "bytes", "duration_ns", "exposed_ns"]
    g[per] = g[per] / nsteps
    return g


# ------------------------------------------------------------------ tables for views (dashboard)
# Small pure functions the dashboard draws from, so that the views compute nothing themselves.

def exposed_intervals(run_or_events: Run | pd.DataFrame,
                      intervals: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Where comm is exposed: per (rank, step), the disjoint intervals of ∪comm minus ∪compute.
    Their lengths sum to step_metrics' exposed_ns. ``intervals``: (compute_intervals(ev),
    comm_rows(ev)) when the caller has them already."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comp, comm = intervals if intervals is not None else (compute_intervals(ev), comm_rows(ev))
    cols = ["rank", "step", "start_ns", "end_ns"]
    if not len(comm):
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(dict(zip(cols, exposed_arrays(*(tuple(f[c].to_numpy() for c in cols) for f in (comp, comm))))))


def exposed_arrays(comp: tuple, comm: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """exposed_intervals on arrays: ``comp`` and ``comm`` are (rank, step, start, end) of the compute
    intervals and the comm rows; returns the exposed pieces' (rank, step, start, end), sorted by
    (rank, step, start). The partitioned summary's first pass keeps them (the Distributed view)."""
    if not len(comm[0]):
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
    (ranks, steps), (cc, mc), _, _ = group_spans(comp, comm)
    cg, cs, ce = merge_intervals(cc, comp[2], comp[3])
    mg, ms, me = merge_intervals(mc, comm[2], comm[3])
    # Sweep the boundaries of both unions; between consecutive boundaries of a group the state is
    # constant, and a piece is exposed where comm is on and compute is off.
    g = np.r_[mg, mg, cg, cg]
    t = np.r_[ms, me, cs, ce]
    d_comm = np.r_[np.ones(len(mg)), -np.ones(len(mg)), np.zeros(2 * len(cg))]
    d_comp = np.r_[np.zeros(2 * len(mg)), np.ones(len(cg)), -np.ones(len(cg))]
    order = K.lexsort((t, g))
    g, t = g[order], t[order]
    on_comm, on_comp = np.cumsum(d_comm[order]) > 0, np.cumsum(d_comp[order]) > 0
    keep = np.r_[(g[1:] == g[:-1]) & (t[1:] > t[:-1]) & on_comm[:-1] & ~on_comp[:-1], False]
    pg, ps, pe = merge_intervals(g[keep], t[keep], t[np.flatnonzero(keep) + 1])
    return ranks[pg].astype(int), steps[pg].astype(int), ps, pe


def launch_lateness(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """Per bucket row: how late this rank launched it (launch − earliest launch of the same
    (step, micro, bucket) among ranks, ns). rank_step_skew is its mean per (rank, step)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    rows = comm_rows(ev)
    rows = rows[rows["kind"] == S.BUCKET][["rank", "step", "micro", "bucket", "launch_ns"]]
    first = rows.groupby(["step", "micro", "bucket"], observed=True)["launch_ns"].transform("min")
    return rows.assign(late_ns=rows["launch_ns"] - first).reset_index(drop=True)


def sync_lateness(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """launch_lateness rows, and for each step without gradient buckets (ZeRO-3 / FSDP, a
    hand-written loop) the same for every collective on the wire: launch − earliest launch of the
    same collective among ranks, a collective being matched across ranks as the queueing analysis
    matches it (queueing.EVENT_KEY: the n-th call of one identity on each rank). There ``bucket``
    numbers the step's collectives by first launch (0, 1, ...) and ``label`` names them ("all_gather
    #3"); bucket rows have an empty label. Per step only, so a block of steps and a step alone agree."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    buckets = launch_lateness(ev).assign(label="")
    rows = comm_rows(ev)
    rows = rows[wire_mask(rows) & (rows["kind"] != S.BUCKET)] if len(rows) else rows
    if len(rows) and len(buckets):
        rows = rows[~rows["step"].isin(buckets["step"].unique())]
    if not len(rows):
        return buckets
    c = Q.occurrences(rows)
    c["op"] = as_str(rows["op"]).reindex(c.index).to_numpy()
    key = Q.EVENT_KEY
    c["first"] = c.groupby(key, observed=True)["launch_ns"].transform("min")
    ids = c[key + ["first", "op"]].drop_duplicates(key).sort_values(["step", "first"] + key[1:], kind="stable")
    ids["ordinal"] = ids.groupby("step").cumcount()
    c = c.drop(columns="op").merge(ids[key + ["ordinal", "op"]], on=key, how="left")
    name = np.where(c["op"].to_numpy() == "", c["kind"].to_numpy(), c["op"].to_numpy()).astype(object)
    out = pd.DataFrame({"rank": c["rank"].to_numpy(), "step": c["step"].to_numpy(), "micro": c["micro"].to_numpy(),
                        "bucket": c["ordinal"].to_numpy(dtype=np.int64), "launch_ns": c["launch_ns"].to_numpy(),
                        "late_ns": (c["launch_ns"] - c["first"]).to_numpy(),
                        "label": name + " #" + c["ordinal"].astype(str).to_numpy(object)})
    out = pd.concat([buckets, out], ignore_index=True) if len(buckets) else out
    return out.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def rank_lanes(run_or_events: Run | pd.DataFrame, stats=("min", "median", "max")) -> pd.DataFrame:
    """Events-like table of quantile lanes: for each (step, micro, kind, bucket, name) the min /
    median / max over ranks of start, end, ready and launch; ``rank`` holds the index in ``stats``.
    Analysis functions accept it like real events (one "rank" per statistic)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    # grad_ready rows too: backward compute ends at the last gradient ready (compute_intervals)
    ev = ev[ev["kind"].isin(S.COMPUTE_KINDS + S.COMM_KINDS + (S.STEP, S.GRAD_READY))]
    keys = ["step", "micro", "kind", "bucket", "name", "op", "layout"]
    times = ["start_ns", "end_ns", "ready_ns", "launch_ns"]
    g = ev.groupby(keys, observed=True, sort=False)
    first = g[["bytes", "logical_bytes", "dtype", "group_size", "phase"]].first()
    frames = []
    for i, stat in enumerate(stats):
        f = g[times].agg(stat).round().astype(np.int64).join(first).reset_index()
        f["rank"] = i
        frames.append(f)
    out = pd.concat(frames, ignore_index=True)
    out["kind"] = as_str(out["kind"])
    return out


def quantiles(table: pd.DataFrame, by: str, value: str, qs=(0.0, 0.25, 0.5, 0.75, 1.0)) -> pd.DataFrame:
    """Distribution of ``value`` per ``by`` (index) as columns q0, q25, ..., plus mean and count."""
    t = table[[by, value]].dropna()
    g = t.groupby(by, sort=True)[value]
    out = pd.concat({f"q{round(q * 100)}": g.quantile(q) for q in qs}, axis=1)
    return out.assign(mean=g.mean(), count=g.size())


_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
             "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}


def bucket_map(layouts: pd.DataFrame) -> pd.DataFrame:
    """Bucket contents per layout version (one rank's layouts): byte range of every parameter inside
    its bucket and whether DDP's rebuild moved it to another bucket."""
    if not len(layouts):
        return pd.DataFrame(columns=["layout", "bucket", "param", "param_index", "numel", "dtype",
                                     "bytes", "start_byte", "moved"])
    lay = layouts[layouts["rank"] == layouts["rank"].min()] if "rank" in layouts else layouts
    lay = lay.sort_values(["layout", "bucket", "offset"]).reset_index(drop=True)
    itemsize = as_str(lay["dtype"]).str.replace("torch.", "", regex=False).map(_ITEMSIZE).fillna(4)
    lay["bytes"] = lay["numel"] * itemsize
    lay["start_byte"] = lay["offset"] * itemsize
    home = lay[lay["layout"] == lay["layout"].min()].set_index("param")["bucket"]
    lay["moved"] = lay["param"].map(home).fillna(-1).astype(int) != lay["bucket"]
    return lay


def op_bytes_per_step(run_or_events: Run | pd.DataFrame, steps=None) -> pd.DataFrame:
    """Bytes on the wire per step and rank by collective op (mean over ranks and headline steps,
    or over ``steps`` when given); counted like step_metrics' bytes (bucket rows + collectives not
    issued inside a bucket hook)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comm = comm_rows(ev)
    wire = comm[(comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)]
    if steps is not None:
        wire = wire[wire["step"].isin(list(steps))]
    if not len(wire):
        return pd.DataFrame(columns=["op", "bytes_per_step", "count_per_step", "count_min", "count_max"])
    all_steps = sorted(wire["step"].unique())
    if steps is None and len(all_steps) > 1:
        wire = wire[wire["step"] > all_steps[0]]
    n = wire.groupby(["rank", "step"]).ngroups
    wire = wire.assign(op=as_str(wire["op"]))
    per_pair = wire.groupby(["rank", "step", "op"]).size().unstack("op").fillna(0)   # calls per (rank, step)
    g = wire.groupby("op")
    return pd.DataFrame({"bytes_per_step": g["bytes"].sum() / n, "count_per_step": g.size() / n,
                         "count_min": per_pair.min().astype(int), "count_max": per_pair.max().astype(int)}).reset_index()


SPLIT_PARTS = ("compute_only_ns", "overlapped_ns", "exposed_ns", "other_ns")


def step_split(table: pd.DataFrame) -> pd.DataFrame:
    """Each row's step (step_metrics / step_table rows, or their mean) split into ``compute_only_ns``
    (compute with no collective in flight), ``overlapped_ns``, ``exposed_ns`` and ``other_ns``
    (idle, data loading, host work: the rest, never negative)."""
    t = table[["step_ns", "compute_ns", "overlapped_ns", "exposed_ns"]].astype(float)
    return pd.DataFrame({"compute_only_ns": t["compute_ns"] - t["overlapped_ns"], "overlapped_ns": t["overlapped_ns"],
                         "exposed_ns": t["exposed_ns"],
                         "other_ns": (t["step_ns"] - t["compute_ns"] - t["exposed_ns"]).clip(lower=0.0)}, index=table.index)


def time_split(steps: pd.DataFrame) -> dict:
    """Mean headline step split into compute only, overlapped comm, exposed comm and other (idle,
    data loading...), in ms (step_split of the mean step); the parts add up to the mean step time."""
    h = headline_steps(steps) if len(steps) else steps
    if not len(h):
        return {k: float("nan") for k in ("step_ms", "compute_only_ms", "overlapped_ms", "exposed_ms", "other_ms")}
    m = h[["step_ns", "compute_ns", "overlapped_ns", "exposed_ns"]].mean().to_frame().T
    parts = step_split(m).iloc[0]
    return {"step_ms": _ms(m["step_ns"].iloc[0]), **{k.replace("_ns", "_ms"): _ms(parts[k]) for k in SPLIT_PARTS}}


def rank_spread(table: pd.DataFrame, columns, by: str = "step") -> pd.DataFrame:
    """Min, median and max over ranks of per-rank columns (e.g. step_metrics) for each ``by``
    value: columns ``<col>_min``, ``<col>_median``, ``<col>_max`` (one groupby for all)."""
    cols = list(columns)
    one = _one_group_spread(table, cols, by)
    if one is not None:
        return one
    t = table[[by] + cols].replace([np.inf, -np.inf], np.nan)
    agg = t.groupby(by, sort=True)[cols].agg(["min", "median", "max"])
    agg.columns = [f"{c}_{s}" for c, s in agg.columns]
    return agg.reset_index()


def _one_group_spread(table: pd.DataFrame, cols: list, by: str) -> pd.DataFrame | None:
    """rank_spread of a table of one ``by`` value (the Replay's cards: one step of every rank) in
    numpy: the same frame, values and dtypes (test_dashboard_analysis.py compares them), without pandas'
    groupby, which took 2.7 against 0.4 ms for a step of 1,024 ranks (session 34). None for any
    other table (several values, none, or a column that is not numeric)."""
    keys = table[by].to_numpy()
    if keys.dtype.kind not in "iu" or not len(keys) or (keys != keys[0]).any():
        return None
    out = {by: keys[:1].copy()}
    for c in cols:
        v = table[c].to_numpy()
        if v.dtype.kind == "f":
            v = np.where(np.isinf(v), np.nan, v)
            with warnings.catch_warnings():          # a column of NaN only: NaN, as the groupby gives
                warnings.simplefilter("ignore", RuntimeWarning)
                stats = (np.nanmin(v), np.nanmedian(v), np.nanmax(v))
        elif v.dtype.kind in "iu":
            stats = (v.min(), np.median(v), v.max())
        else:
            return None
        for name, x in zip(("min", "median", "max"), stats):
            out[f"{c}_{name}"] = np.array([x])
    return pd.DataFrame(out)
