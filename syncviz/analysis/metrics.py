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

# Interval arithmetic lives in intervals.py (the package re-exports it with these metrics).
from syncviz.analysis.intervals import (Coverage, _groups, _valid_intervals, comm_rows,  # noqa: F401
                                        compute_intervals, merge_intervals, subtract_intervals, wire_mask)
from syncviz.trace import Run
from syncviz.trace import schema as S

NS = 1e-9


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
