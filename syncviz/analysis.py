"""Metrics of a run: the single definition of every number syncviz shows (DESIGN.md, "Metric
definitions"). Pure functions of the trace tables: no plotting, no I/O, no torch.

All interval arithmetic is vectorized over (rank, step) groups so a run with a million bucket
events is analysed in well under a second.

Definitions, per rank and step:
- comm interval of a bucket/collective: [launch, done] (start_ns, end_ns of the row).
- comm busy = |∪ comm intervals|.
- compute intervals: forward rows, backward compute = [backward start, last gradient ready]
  (the backward row's end when no gradient-ready rows exist), and optimizer rows — only the
  innermost optimizer of a nested step (the ``layout`` column holds the nesting depth): a ZeRO-1
  ZeroRedundancyOptimizer row wraps the inner Adam step *and* its parameter broadcasts, which
  the rank waits for; counting the wrapper as compute would hide that wait.
  Time a rank spent blocked in a synchronous collective (rows named ``... (blocking)``, e.g.
  FSDP2's all-gathers and reduce-scatters on gloo) is removed from the compute intervals: the
  host did no compute while it waited, so that communication is exposed, not overlapped.
- overlapped = |∪ comm ∩ ∪ compute|; exposed = comm busy − overlapped; overlap % = overlapped/comm busy.
- compute/comm ratio = (forward + backward + optimizer compute) / comm busy.
- launch delay of a bucket = launch − ready.
- algbw = bytes / duration; busbw = algbw × factor (nccl-tests): all_reduce 2(n−1)/n,
  reduce_scatter and all_gather (n−1)/n (bytes = whole array), broadcast/reduce 1. GB/s = 1e9 B/s.
- skew of a collective = max − min launch across ranks for the same (step, micro, bucket/name);
  the rank that launched last is the straggler.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import schema as S
from .trace import Run

NS = 1e-9

# Interval arithmetic lives in syncviz.intervals; these names are re-exported so analysis stays
# the one entry point of every metric and its building blocks.
from .intervals import (BLOCKING, Coverage, _groups, _valid_intervals, blocking_rows,  # noqa: F401
                        comm_rows, compute_intervals, innermost_optimizer_rows, merge_intervals,
                        subtract_intervals, wire_mask)


# ------------------------------------------------------------------------- bandwidth conventions

def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``op`` on ``n`` ranks."""
    if n <= 1:
        return 0.0 if op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all") else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send/recv, ...


def _busbw_factors(ops: pd.Series, n: pd.Series) -> np.ndarray:
    ops = ops.astype(str).to_numpy()
    n = n.to_numpy().astype(float)
    nn = np.maximum(n, 1.0)
    f = np.ones(len(ops))
    ar = ops == "all_reduce"
    rs = np.isin(ops, ("reduce_scatter", "all_gather", "all_to_all"))
    f[ar] = 2.0 * (nn[ar] - 1) / nn[ar]
    f[rs] = (nn[rs] - 1) / nn[rs]
    return f


# ----------------------------------------------------------------------------- public metrics

def step_metrics(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step): step time, compute phases, comm busy/overlapped/exposed, ratios,
    bytes. Times in ns; overlap_pct in 0..100."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comp = compute_intervals(ev)
    comm = comm_rows(ev)
    steps = _valid_intervals(ev[ev["kind"] == S.STEP])
    if not len(comp) and not len(comm) and not len(steps):
        return pd.DataFrame(columns=STEP_COLUMNS)
    idx, (cc, mc, sc), base, span = _groups(comp, comm, steps)
    n = len(idx)
    gc = lambda f, c: (c, f["start_ns"].to_numpy(), f["end_ns"].to_numpy())  # noqa: E731
    comp_cov = Coverage(*gc(comp, cc), n, base, span)
    comm_cov = Coverage(*gc(comm, mc), n, base, span)
    # overlapped = |∪comm ∩ ∪compute| = Σ over merged comm intervals of compute coverage inside them
    ov = comp_cov.overlap(comm_cov.mg, comm_cov.ms, comm_cov.me)
    overlapped = np.bincount(comm_cov.mg, weights=ov, minlength=n)
    comm_busy = comm_cov.total
    out = pd.DataFrame({"rank": idx.get_level_values(0).astype(int),
                        "step": idx.get_level_values(1).astype(int)})

    def per_kind(kind):
        f = comp[comp["kind"] == kind]
        return np.bincount(cc[(comp["kind"] == kind).to_numpy()],
                           weights=(f["end_ns"] - f["start_ns"]).to_numpy(), minlength=n)

    out["forward_ns"] = per_kind(S.FORWARD)
    out["backward_ns"] = per_kind(S.BACKWARD)
    out["optimizer_ns"] = per_kind(S.OPTIMIZER)
    out["compute_ns"] = comp_cov.total
    out["comm_busy_ns"] = comm_busy
    out["overlapped_ns"] = overlapped
    out["exposed_ns"] = comm_busy - overlapped
    with np.errstate(divide="ignore", invalid="ignore"):
        out["overlap_pct"] = np.where(comm_busy > 0, 100.0 * overlapped / comm_busy, np.nan)
        phases = out["forward_ns"] + out["backward_ns"] + out["optimizer_ns"]
        out["compute_comm_ratio"] = np.where(comm_busy > 0, phases / comm_busy, np.inf)
    out["step_ns"] = np.bincount(sc, weights=(steps["end_ns"] - steps["start_ns"]).to_numpy(), minlength=n)
    # Bytes on the wire: every bucket, plus collectives not issued from inside a bucket's hook
    # (those are already counted by their bucket).
    wire = comm[(comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)]
    wire_codes = mc[((comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)).to_numpy()]
    out["bytes"] = np.bincount(wire_codes, weights=wire["bytes"].to_numpy(), minlength=n).astype(np.int64)
    out["n_comm"] = np.bincount(wire_codes, minlength=n)
    for c in ("forward_ns", "backward_ns", "optimizer_ns", "compute_ns", "comm_busy_ns",
              "overlapped_ns", "exposed_ns", "step_ns"):
        out[c] = out[c].round().astype(np.int64)
    return out[STEP_COLUMNS]


STEP_COLUMNS = ["rank", "step", "step_ns", "forward_ns", "backward_ns", "optimizer_ns", "compute_ns",
                "comm_busy_ns", "overlapped_ns", "exposed_ns", "overlap_pct", "compute_comm_ratio",
                "bytes", "n_comm"]


def comm_metrics(run_or_events: Run | pd.DataFrame, kinds=(S.BUCKET,)) -> pd.DataFrame:
    """One row per comm event (bucket rows by default; pass kinds=("collective",) or both):
    duration, launch delay, algbw/busbw (GB/s), and the part not hidden under compute."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    rows = comm_rows(ev)
    rows = rows[rows["kind"].isin(kinds)].copy()
    cols = ["rank", "step", "micro", "kind", "bucket", "name", "op", "bytes", "logical_bytes", "dtype",
            "group_size", "layout", "phase", "ready_ns", "launch_ns", "start_ns", "end_ns"]
    rows = rows[cols].reset_index(drop=True)
    for c in ("kind", "op", "phase"):
        rows[c] = rows[c].astype(str)
    dur = (rows["end_ns"] - rows["start_ns"]).astype(np.int64)
    rows["duration_ns"] = dur
    rows["launch_delay_ns"] = np.where(rows["ready_ns"] >= 0, rows["launch_ns"] - rows["ready_ns"], np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, rows["bytes"] / dur, np.nan)   # bytes/ns == GB/s
    rows["algbw_gbps"] = algbw
    rows["busbw_gbps"] = algbw * _busbw_factors(rows["op"], rows["group_size"])
    comp = compute_intervals(ev)
    rows["exposed_ns"] = 0
    if len(rows):
        idx, (cc, rc), base, span = _groups(comp, rows)
        cov = Coverage(cc, comp["start_ns"].to_numpy(), comp["end_ns"].to_numpy(), len(idx), base, span)
        hidden = cov.overlap(rc, rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy())
        rows["exposed_ns"] = np.round(dur - hidden).astype(np.int64)
        # Where compute ended before the collective finished, the exposed part lies after
        # backward: the classic "last bucket waits" pattern.
        bwd_end = comp[comp["kind"] == S.BACKWARD].groupby(["rank", "step"])["end_ns"].max()
        be = bwd_end.reindex(pd.MultiIndex.from_frame(rows[["rank", "step"]])).to_numpy()
        rows["after_backward_ns"] = np.where(np.isnan(be), 0,
                                             np.clip(rows["end_ns"] - np.maximum(rows["start_ns"], np.nan_to_num(be)), 0, None))
    else:
        rows["after_backward_ns"] = 0
    return rows


def bucket_metrics(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    return comm_metrics(run_or_events, kinds=(S.BUCKET,))


def skew(run_or_events: Run | pd.DataFrame, kinds=(S.BUCKET,)) -> pd.DataFrame:
    """Per (step, micro, kind, bucket, name): launch spread across ranks and the straggler rank
    (the one that launched last). Only events seen on at least two ranks."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    rows = comm_rows(ev)
    rows = rows[rows["kind"].isin(kinds)].copy()
    rows["kind"] = rows["kind"].astype(str)
    keys = ["step", "micro", "kind", "bucket", "name"]
    if not len(rows):
        return pd.DataFrame(columns=keys + ["ranks", "launch_min_ns", "launch_max_ns", "skew_ns",
                                            "straggler", "duration_spread_ns"])
    rows["duration_ns"] = rows["end_ns"] - rows["start_ns"]
    g = rows.groupby(keys, observed=True, sort=True)
    out = g.agg(ranks=("rank", "nunique"), launch_min_ns=("launch_ns", "min"),
                launch_max_ns=("launch_ns", "max"),
                dmin=("duration_ns", "min"), dmax=("duration_ns", "max"))
    out["straggler"] = rows.loc[g["launch_ns"].idxmax().to_numpy(), "rank"].to_numpy()
    out["skew_ns"] = out["launch_max_ns"] - out["launch_min_ns"]
    out["duration_spread_ns"] = out["dmax"] - out["dmin"]
    out = out.drop(columns=["dmin", "dmax"]).reset_index()
    return out[out["ranks"] >= 2].reset_index(drop=True)


def rank_step_skew(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """Rank × step table of how late each rank launched its collectives (mean over buckets of
    launch − earliest launch among ranks, ns). Stragglers stand out as a hot row."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    rows = comm_rows(ev)
    rows = rows[rows["kind"] == S.BUCKET]
    if not len(rows):
        return pd.DataFrame()
    keys = ["step", "micro", "bucket"]
    first = rows.groupby(keys, observed=True)["launch_ns"].transform("min")
    late = (rows["launch_ns"] - first).rename("late_ns")
    return pd.concat([rows[["rank", "step"]], late], axis=1).pivot_table(
        index="rank", columns="step", values="late_ns", aggfunc="mean")


# -------------------------------------------------------------------------------- run level

def headline_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps used for headline numbers: all but step 0 when there are more (step 0 includes
    warm-up and DDP's bucket rebuild)."""
    if steps["step"].nunique() > 1:
        return steps[steps["step"] > steps["step"].min()]
    return steps


def run_summary(run: Run) -> dict:
    """Headline numbers and a one-line verdict for a run (used by summary, dashboard, exports)."""
    steps = step_metrics(run)
    buckets = comm_metrics(run, kinds=S.COMM_KINDS)
    buckets = buckets[wire_mask(buckets)] if len(buckets) else buckets
    h = headline_steps(steps) if len(steps) else steps
    hb = buckets[buckets["step"].isin(h["step"].unique())] if len(buckets) else buckets
    comm = float(h["comm_busy_ns"].sum()) if len(h) else 0.0
    exposed = float(h["exposed_ns"].sum()) if len(h) else 0.0
    out = {
        "name": run.name,
        "strategy": run.meta.get("strategy", "?"),
        "engine": run.meta.get("engine", "torch"),
        "world_size": run.world_size,
        "steps": int(steps["step"].nunique()) if len(steps) else 0,
        "headline_steps": sorted(int(s) for s in h["step"].unique()) if len(h) else [],
        "step_ms": _ms(h["step_ns"].median()) if len(h) else float("nan"),
        "compute_ms": _ms(h["compute_ns"].median()) if len(h) else float("nan"),
        "forward_ms": _ms(h["forward_ns"].median()) if len(h) else float("nan"),
        "backward_ms": _ms(h["backward_ns"].median()) if len(h) else float("nan"),
        "optimizer_ms": _ms(h["optimizer_ns"].median()) if len(h) else float("nan"),
        "comm_busy_ms": _ms(h["comm_busy_ns"].median()) if len(h) else float("nan"),
        "exposed_ms": _ms(h["exposed_ns"].median()) if len(h) else float("nan"),
        "overlap_pct": 100.0 * (comm - exposed) / comm if comm > 0 else float("nan"),
        "exposed_pct": 100.0 * exposed / comm if comm > 0 else float("nan"),
        "compute_comm_ratio": float(h["compute_comm_ratio"].replace(np.inf, np.nan).median()) if len(h) else float("nan"),
        "bytes_per_step": int(h.groupby("step")["bytes"].mean().median()) if len(h) else 0,
        "busbw_gbps": float(hb["busbw_gbps"].median()) if len(hb) else float("nan"),
        "problems": list(run.problems),
    }
    sk = skew(run)
    out["max_skew_ms"] = _ms(sk["skew_ns"].max()) if len(sk) else 0.0
    out["straggler"] = int(sk.loc[sk["skew_ns"].idxmax(), "straggler"]) if len(sk) and sk["skew_ns"].max() > 0 else None
    out["top_exposed"] = top_exposed(hb)
    out["verdict"] = verdict(out)
    return out


def top_exposed(comm: pd.DataFrame, n: int = 5) -> list[dict]:
    """Comm events (bucket/collective identity) with the most exposed time summed over steps and ranks."""
    if not len(comm):
        return []
    key = comm["bucket"].where(comm["kind"] == S.BUCKET, -1).astype(str) + "|" + comm["name"].astype(str) \
        + "|" + comm["kind"].astype(str)
    g = comm.assign(_k=key).groupby("_k", sort=False)
    agg = g.agg(kind=("kind", "first"), bucket=("bucket", "first"), name=("name", "first"),
                op=("op", "first"), bytes=("bytes", "max"), exposed_ns=("exposed_ns", "sum"),
                after_backward_ns=("after_backward_ns", "sum"), duration_ns=("duration_ns", "sum"),
                count=("exposed_ns", "size"))
    agg = agg[agg["exposed_ns"] > 0].sort_values("exposed_ns", ascending=False).head(n)
    total = comm["exposed_ns"].sum()
    return [{"kind": r["kind"], "bucket": int(r["bucket"]), "name": r["name"], "op": r["op"],
             "bytes": int(r["bytes"]), "exposed_ms_per_event": _ms(r["exposed_ns"] / r["count"]),
             "exposed_share_pct": 100.0 * r["exposed_ns"] / total if total else 0.0,
             "after_backward_pct": 100.0 * r["after_backward_ns"] / r["exposed_ns"] if r["exposed_ns"] else 0.0}
            for _, r in agg.iterrows()]


def verdict(s: dict) -> str:
    if not s["steps"]:
        return "No complete step was recorded."
    if not (s["comm_busy_ms"] > 0):
        return "No gradient communication was recorded (single rank or no data parallelism?)."
    pct = s["exposed_pct"]
    text = f"{pct:.0f}% of communication is exposed"
    if s["top_exposed"] and pct >= 1:
        t = s["top_exposed"][0]
        what = f"bucket {t['bucket']}" if t["kind"] == S.BUCKET else f"{t['op'] or t['name']}"
        where = " after backward ends" if t["after_backward_pct"] >= 50 else ""
        text += f", mostly {what}{where} ({t['exposed_share_pct']:.0f}% of it)"
    ratio = s["compute_comm_ratio"]
    if ratio == ratio:
        text += f"; compute/comm ratio {ratio:.2f}"
    if s.get("straggler") is not None and s.get("max_skew_ms", 0) > max(1.0, 0.2 * s["comm_busy_ms"]):
        text += f"; rank {s['straggler']} is a straggler (launch skew up to {s['max_skew_ms']:.1f} ms)"
    return text + "."


def _ms(ns) -> float:
    return float(ns) / 1e6 if ns == ns else float("nan")


# ------------------------------------------------------------- tables across ranks (exports)

def step_table(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """One row per step, across ranks: mean of each per-rank time (ns) and of bytes, the slowest
    rank's step time, overlap % and compute/comm ratio over the summed ranks (as run_summary
    weighs them), and the median busbw (GB/s) of that step's comm events."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    steps = step_metrics(ev)
    cols = ["step", "ranks", "step_ns", "step_max_ns", "forward_ns", "backward_ns", "optimizer_ns",
            "compute_ns", "comm_busy_ns", "overlapped_ns", "exposed_ns", "overlap_pct",
            "compute_comm_ratio", "bytes", "busbw_gbps"]
    if not len(steps):
        return pd.DataFrame(columns=cols)
    g = steps.groupby("step", sort=True)
    means = ["step_ns", "forward_ns", "backward_ns", "optimizer_ns", "compute_ns", "comm_busy_ns",
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
    comm = comm_metrics(ev, kinds=S.COMM_KINDS)
    out["busbw_gbps"] = comm.groupby("step")["busbw_gbps"].median() if len(comm) else np.nan
    return out.reset_index()[cols]


def bucket_table(run_or_events: Run | pd.DataFrame, headline: bool = True) -> pd.DataFrame:
    """One row per bucket (over ranks and, by default, headline steps): op, bytes, count, and the
    median duration, launch delay, exposed time (ns) and busbw (GB/s)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    b = bucket_metrics(ev)
    cols = ["bucket", "op", "bytes", "count", "duration_ns", "launch_delay_ns", "exposed_ns", "busbw_gbps"]
    if not len(b):
        return pd.DataFrame(columns=cols)
    if headline and b["step"].nunique() > 1:
        b = b[b["step"] > b["step"].min()]
    out = b.groupby("bucket", sort=True).agg(
        op=("op", "first"), bytes=("bytes", "max"), count=("duration_ns", "size"),
        duration_ns=("duration_ns", "median"), launch_delay_ns=("launch_delay_ns", "median"),
        exposed_ns=("exposed_ns", "median"), busbw_gbps=("busbw_gbps", "median"))
    return out.reset_index()[cols]


def bytes_in_flight(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """Per rank, the bytes of communication in flight as a step function: rows (rank, t_ns, bytes)
    where ``bytes`` holds from t_ns until the rank's next row. Counts the same events as
    step_metrics' bytes (every bucket, plus collectives not issued inside a bucket's hook)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comm = comm_rows(ev)
    wire = comm[(comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)]
    if not len(wire):
        return pd.DataFrame({"rank": pd.Series(dtype=int), "t_ns": pd.Series(dtype=np.int64),
                             "bytes": pd.Series(dtype=np.int64)})
    r = wire["rank"].to_numpy()
    nb = wire["bytes"].to_numpy(dtype=np.int64)
    changes = pd.DataFrame({"rank": np.r_[r, r],
                            "t_ns": np.r_[wire["start_ns"].to_numpy(), wire["end_ns"].to_numpy()],
                            "delta": np.r_[nb, -nb]})
    # Sum changes at the same instant first, so a collective ending exactly when the next starts
    # does not show a spurious dip or peak.
    changes = changes.groupby(["rank", "t_ns"], sort=True)["delta"].sum().reset_index()
    changes["bytes"] = changes.groupby("rank")["delta"].cumsum().astype(np.int64)
    return changes[["rank", "t_ns", "bytes"]].reset_index(drop=True)


def step_medians(steps: pd.DataFrame) -> pd.DataFrame:
    """step_metrics' columns per step, as the median over ranks (index: step)."""
    return steps.groupby("step").median(numeric_only=True)


def bucket_layout_table(comm: pd.DataFrame, layouts: pd.DataFrame) -> pd.DataFrame:
    """One row per (layout, bucket) of bucket rows from comm_metrics: parameter count (from one
    rank's layout), bytes, dtype, and median launch delay, duration, algbw, busbw, exposed."""
    lay = layouts[layouts["rank"] == layouts["rank"].min()] if len(layouts) else layouts
    nparams = lay.groupby(["layout", "bucket"]).size() if len(lay) else pd.Series(dtype=int)
    g = comm.groupby(["layout", "bucket"]).agg(
        bytes=("bytes", "max"), dtype=("dtype", "first"), launch_delay_ns=("launch_delay_ns", "median"),
        duration_ns=("duration_ns", "median"), algbw_gbps=("algbw_gbps", "median"),
        busbw_gbps=("busbw_gbps", "median"), exposed_ns=("exposed_ns", "median"))
    g["params"] = [int(nparams.get(k, 0)) for k in g.index]
    return g


def collective_table(comm: pd.DataFrame) -> pd.DataFrame:
    """One row per (phase, op) of collective rows from comm_metrics, per (rank, step) on average:
    calls, bytes and busy time; plus the median busbw (GB/s)."""
    nsteps = max(1, comm[["rank", "step"]].drop_duplicates().shape[0])
    g = comm.groupby(["phase", "op"]).agg(calls=("bytes", "size"), bytes=("bytes", "sum"),
                                          duration_ns=("duration_ns", "sum"), busbw_gbps=("busbw_gbps", "median"))
    g[["calls", "bytes", "duration_ns"]] = g[["calls", "bytes", "duration_ns"]] / nsteps
    return g


# ------------------------------------------------------------------ tables for views (dashboard)
# Small pure functions the dashboard draws from, so that the views compute nothing themselves.

def exposed_intervals(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """Where comm is exposed: per (rank, step), the disjoint intervals of ∪comm minus ∪compute.
    Their lengths sum to step_metrics' exposed_ns."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comp, comm = compute_intervals(ev), comm_rows(ev)
    cols = ["rank", "step", "start_ns", "end_ns"]
    if not len(comm):
        return pd.DataFrame(columns=cols)
    idx, (cc, mc), _, _ = _groups(comp, comm)
    cg, cs, ce = merge_intervals(cc, comp["start_ns"].to_numpy(), comp["end_ns"].to_numpy())
    mg, ms, me = merge_intervals(mc, comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy())
    # Sweep the boundaries of both unions; between consecutive boundaries of a group the state is
    # constant, and a piece is exposed where comm is on and compute is off.
    g = np.r_[mg, mg, cg, cg]
    t = np.r_[ms, me, cs, ce]
    d_comm = np.r_[np.ones(len(mg)), -np.ones(len(mg)), np.zeros(2 * len(cg))]
    d_comp = np.r_[np.zeros(2 * len(mg)), np.ones(len(cg)), -np.ones(len(cg))]
    order = np.lexsort((t, g))
    g, t = g[order], t[order]
    on_comm, on_comp = np.cumsum(d_comm[order]) > 0, np.cumsum(d_comp[order]) > 0
    keep = np.r_[(g[1:] == g[:-1]) & (t[1:] > t[:-1]) & on_comm[:-1] & ~on_comp[:-1], False]
    pg, ps, pe = merge_intervals(g[keep], t[keep], t[np.flatnonzero(keep) + 1])
    return pd.DataFrame({"rank": idx.get_level_values(0)[pg].astype(int),
                         "step": idx.get_level_values(1)[pg].astype(int),
                         "start_ns": ps, "end_ns": pe})


def launch_lateness(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """Per bucket row: how late this rank launched it (launch − earliest launch of the same
    (step, micro, bucket) among ranks, ns). rank_step_skew is its mean per (rank, step)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    rows = comm_rows(ev)
    rows = rows[rows["kind"] == S.BUCKET][["rank", "step", "micro", "bucket", "launch_ns"]]
    first = rows.groupby(["step", "micro", "bucket"], observed=True)["launch_ns"].transform("min")
    return rows.assign(late_ns=rows["launch_ns"] - first).reset_index(drop=True)


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
    out["kind"] = out["kind"].astype(str)
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
    itemsize = lay["dtype"].astype(str).str.replace("torch.", "", regex=False).map(_ITEMSIZE).fillna(4)
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
        return pd.DataFrame(columns=["op", "bytes_per_step", "count_per_step"])
    all_steps = sorted(wire["step"].unique())
    if steps is None and len(all_steps) > 1:
        wire = wire[wire["step"] > all_steps[0]]
    n = wire.groupby(["rank", "step"]).ngroups
    g = wire.assign(op=wire["op"].astype(str)).groupby("op")
    return pd.DataFrame({"bytes_per_step": g["bytes"].sum() / n,
                         "count_per_step": g.size() / n}).reset_index()


def time_split(steps: pd.DataFrame) -> dict:
    """Mean headline step split into compute only, overlapped comm, exposed comm and other (idle,
    data loading...), in ms; the parts add up to the mean step time."""
    h = headline_steps(steps) if len(steps) else steps
    if not len(h):
        return {k: float("nan") for k in ("step_ms", "compute_only_ms", "overlapped_ms", "exposed_ms", "other_ms")}
    m = h[["step_ns", "compute_ns", "overlapped_ns", "exposed_ns"]].mean()
    other = max(0.0, m["step_ns"] - m["compute_ns"] - m["exposed_ns"])
    return {"step_ms": _ms(m["step_ns"]), "compute_only_ms": _ms(m["compute_ns"] - m["overlapped_ns"]),
            "overlapped_ms": _ms(m["overlapped_ns"]), "exposed_ms": _ms(m["exposed_ns"]),
            "other_ms": _ms(other)}


def rank_spread(table: pd.DataFrame, columns, by: str = "step") -> pd.DataFrame:
    """Min, median and max over ranks of per-rank columns (e.g. step_metrics) for each ``by``
    value: columns ``<col>_min``, ``<col>_median``, ``<col>_max`` (one groupby for all)."""
    cols = list(columns)
    t = table[[by] + cols].replace([np.inf, -np.inf], np.nan)
    agg = t.groupby(by, sort=True)[cols].agg(["min", "median", "max"])
    agg.columns = [f"{c}_{s}" for c, s in agg.columns]
    return agg.reset_index()


# ------------------------------------------------------------------ cost-model inputs (fit)

def comm_service(comm: pd.DataFrame, compute: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per comm event (rows of comm_metrics, same index): ``joined_ns``, when the last rank launched
    the same collective (same step, micro, kind, bucket, name and occurrence), and ``service_ns`` =
    done − max(joined, end of this rank's previous comm event): the time the collective itself
    took, without waiting for late ranks or for earlier collectives queued ahead of it (a process
    group runs its collectives in order). NaN where clock error makes it negative. With
    ``compute`` (compute_intervals of the run), also ``service_hidden_ns``: how much of
    [done − service, done] ran while any rank was computing in that step (compute competes with
    the collective for the device, and a collective is as slow as its slowest participant)."""
    cols = ["joined_ns", "service_ns"] + (["service_hidden_ns"] if compute is not None else [])
    if not len(comm):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    c = comm[["rank", "step", "micro", "kind", "bucket", "name", "launch_ns", "start_ns", "end_ns"]].copy()
    c["kind"], c["name"] = c["kind"].astype(str), c["name"].astype(str)
    c["launch"] = np.where(c["launch_ns"] >= 0, c["launch_ns"], c["start_ns"])
    key = ["step", "micro", "kind", "bucket", "name"]
    c = c.sort_values(["rank", "launch"])
    c["occurrence"] = c.groupby(["rank"] + key, observed=True).cumcount()
    c["joined_ns"] = c.groupby(key + ["occurrence"], observed=True)["launch"].transform("max")
    prev_end = c.groupby("rank")["end_ns"].cummax().groupby(c["rank"]).shift(1)
    begin = np.fmax(c["joined_ns"].to_numpy(dtype=float), prev_end.to_numpy(dtype=float))
    service = c["end_ns"].to_numpy(dtype=float) - begin
    c["service_ns"] = np.where(service >= 0, service, np.nan)
    if compute is not None:
        c["service_hidden_ns"] = np.nan
        ok = c["service_ns"].notna().to_numpy()
        svc = c[ok]
        if len(svc) and len(compute):
            s0 = np.round(svc["end_ns"] - svc["service_ns"]).astype(np.int64)
            # one group per step: the union of every rank's compute
            probe = pd.DataFrame({"rank": 0, "step": svc["step"], "start_ns": s0, "end_ns": svc["end_ns"]})
            anyrank = compute.assign(rank=0)
            idx, (cc, pc), base, span = _groups(anyrank, probe)
            cov = Coverage(cc, anyrank["start_ns"].to_numpy(), anyrank["end_ns"].to_numpy(), len(idx), base, span)
            c.loc[ok, "service_hidden_ns"] = cov.overlap(pc, probe["start_ns"].to_numpy(), probe["end_ns"].to_numpy())
        elif len(svc):
            c.loc[ok, "service_hidden_ns"] = 0.0
    return c[cols].reindex(comm.index)
