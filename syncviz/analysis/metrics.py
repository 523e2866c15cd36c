"""Metrics of a run: the single definition of every number syncviz shows (DESIGN.md, "Metric
definitions"). Pure functions of the trace tables: no plotting, no I/O, no torch.

All interval arithmetic is vectorized over (rank, step) groups so a run with a million bucket
events is analysed in well under a second.

Definitions, per rank and step:
- comm interval of a bucket/collective: [launch, done] (launch = the collective call; a bucket's
  comm-hook entry is kept as ``hook_ns``, see intervals.comm_rows).
- comm busy = |∪ comm intervals|.
- compute intervals: forward rows, eval forwards (a forward whose backward never ran: reported as
  ``eval_ns``, not forward time, but it keeps the rank busy so comm under it is overlapped),
  backward compute = [backward start, last gradient ready] (the backward row's end when no
  gradient-ready rows exist), and optimizer rows — only the innermost optimizer of a nested step
  (the ``layout`` column holds the nesting depth): a ZeRO-1 ZeroRedundancyOptimizer row wraps the
  inner Adam step *and* its parameter broadcasts, which the rank waits for; counting the wrapper
  as compute would hide that wait.
  Time a rank spent blocked in a synchronous collective (rows named ``... (blocking)``, e.g.
  FSDP2's all-gathers and reduce-scatters on gloo) is removed from the compute intervals: the
  host did no compute while it waited, so that communication is exposed, not overlapped.
- overlapped = |∪ comm ∩ ∪ compute|; exposed = comm busy − overlapped; overlap % = overlapped/comm busy.
- compute/comm ratio = (forward + backward + optimizer compute) / comm busy.
- per collective: queue = service start − launch (queued behind earlier collectives + waiting for
  peers), service = done − service start, exposed = its share of the step's exposed time (each
  exposed instant belongs to the collective the rank waits on): analysis.queueing.
- launch delay of a bucket = launch − ready.
- algbw = bytes / service time; busbw = algbw × factor (nccl-tests): all_reduce 2(n−1)/n,
  reduce_scatter and all_gather (n−1)/n (bytes = whole array), broadcast/reduce 1. GB/s = 1e9 B/s.
- skew of a collective = max − min launch across ranks for the same (step, micro, bucket/name);
  the run's straggler is the rank that launched last consistently (analysis.queueing.straggler).
- headline numbers of a run: analysis.headline.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

# Interval arithmetic lives in intervals.py (the package re-exports it with these metrics).
from syncviz.analysis.intervals import (Coverage, _groups, _spans, _valid_intervals, comm_rows,  # noqa: F401
                                        compute_intervals, group_spans, merge_intervals, subtract_intervals,
                                        wire_mask)
from syncviz.analysis import queueing as Q
from syncviz.trace import Run
from syncviz.trace import schema as S
from syncviz.analysis.columns import as_str

NS = 1e-9


# ------------------------------------------------------------------------- bandwidth conventions

def algbw_gbps(nbytes: np.ndarray, service_ns: np.ndarray) -> np.ndarray:
    """Algorithm bandwidth, bytes / service time (bytes/ns == GB/s), NaN where the service time is
    not > 0 (clock error hides it). The one definition: comm_metrics, the partitioned summary's
    comm_times and the spills that compute it on reading (spill_file.ratio_values) all call this."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(service_ns > 0, nbytes / service_ns, np.nan)


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
    ops = as_str(ops)   # compared in Arrow: an object array per row cost 0.24 s at 1M rows
    return busbw_factors((ops == "all_reduce").to_numpy(dtype=bool, na_value=False),
                         ops.isin(SCATTER_OPS).to_numpy(dtype=bool, na_value=False), n.to_numpy())


SCATTER_OPS = ("reduce_scatter", "all_gather", "all_to_all")


def coded_busbw_factors(op: np.ndarray, ops, n: np.ndarray) -> np.ndarray:
    """busbw_factors of rows whose ops are codes ``op`` into the names ``ops`` (each name tested
    once, then looked up per row)."""
    if not len(ops):
        return busbw_factors(np.zeros(len(op), bool), np.zeros(len(op), bool), n)
    ar = np.array([o == "all_reduce" for o in ops], dtype=bool)
    sc = np.array([o in SCATTER_OPS for o in ops], dtype=bool)
    return busbw_factors(ar[op], sc[op], n)


def busbw_factors(all_reduce: np.ndarray, scatter: np.ndarray, n: np.ndarray) -> np.ndarray:
    """busbw_factor per row: ``all_reduce`` and ``scatter`` (reduce_scatter, all_gather, all_to_all)
    mark the rows of those ops, ``n`` is the group size."""
    nn = np.maximum(np.asarray(n).astype(float), 1.0)
    if all_reduce.all():        # every row one op's (a DDP run's): the same values, none selected
        return 2.0 * (nn - 1) / nn
    f = np.ones(len(nn))
    f[all_reduce] = 2.0 * (nn[all_reduce] - 1) / nn[all_reduce]
    f[scatter] = (nn[scatter] - 1) / nn[scatter]
    return f


# ----------------------------------------------------------------------------- public metrics

def step_metrics(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step): step time, compute phases, comm busy/overlapped/exposed, ratios,
    bytes. Times in ns; overlap_pct in 0..100."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comp = compute_intervals(ev)
    comm = comm_rows(ev)
    steps = _valid_intervals(ev[ev["kind"] == S.STEP])
    kind = comp["kind"]
    return step_metric_rows(_spans(comp), {k: (kind == k).to_numpy() for k in _PHASE_KINDS}, _spans(comm),
                            wire_mask(comm), comm["bytes"].to_numpy(), _spans(steps))


_PHASE_KINDS = (S.FORWARD, S.BACKWARD, S.OPTIMIZER, S.EVAL_FORWARD)


def step_metric_rows(comp: tuple, kinds: dict, comm: tuple, wire: np.ndarray, nbytes: np.ndarray,
                     steps: tuple, keep: dict | None = None) -> pd.DataFrame:
    """step_metrics on arrays: ``comp``, ``comm`` and ``steps`` are (rank, step, start, end) of the
    compute intervals, the comm intervals ([launch, done]) and the valid step rows; ``kinds``: for each
    of forward, backward, optimizer and eval forward, which compute intervals are of it; ``wire``:
    which comm rows put bytes on the wire once (wire_mask), ``nbytes`` their bytes. ``keep``: a dict
    that gets the compute intervals' Coverage (``compute``) and the comm rows' group codes into it
    (``comm_groups``), which queueing.attributed_arrays can take instead of building its own (its
    queries all lie inside the comm intervals of their group, which these groups cover)."""
    if not len(comp[0]) and not len(comm[0]) and not len(steps[0]):
        return pd.DataFrame(columns=STEP_COLUMNS)
    (ranks, step_ids), (cc, mc, sc), base, span = group_spans(comp, comm, steps)
    n = len(ranks)
    comp_cov = Coverage(cc, comp[2], comp[3], n, base, span)
    if keep is not None:
        keep.update(compute=comp_cov, comm_groups=mc)
    comm_cov = Coverage(mc, comm[2], comm[3], n, base, span)
    # overlapped = |∪comm ∩ ∪compute| = Σ over merged comm intervals of compute coverage inside them
    ov = comp_cov.overlap(comm_cov.mg, comm_cov.ms, comm_cov.me)
    overlapped = np.bincount(comm_cov.mg, weights=ov, minlength=n)
    comm_busy = comm_cov.total
    out = pd.DataFrame({"rank": ranks.astype(int), "step": step_ids.astype(int)})
    length = comp[3] - comp[2]
    for col, kind in (("forward_ns", S.FORWARD), ("backward_ns", S.BACKWARD), ("optimizer_ns", S.OPTIMIZER),
                      ("eval_ns", S.EVAL_FORWARD)):
        m = kinds[kind]
        out[col] = np.bincount(cc[m], weights=length[m], minlength=n)
    out["compute_ns"] = comp_cov.total
    out["comm_busy_ns"] = comm_busy
    out["overlapped_ns"] = overlapped
    out["exposed_ns"] = comm_busy - overlapped
    with np.errstate(divide="ignore", invalid="ignore"):
        out["overlap_pct"] = np.where(comm_busy > 0, 100.0 * overlapped / comm_busy, np.nan)
        phases = out["forward_ns"] + out["backward_ns"] + out["optimizer_ns"]
        out["compute_comm_ratio"] = np.where(comm_busy > 0, phases / comm_busy, np.inf)
    out["step_ns"] = np.bincount(sc, weights=steps[3] - steps[2], minlength=n)
    # Bytes on the wire: every bucket, plus collectives not issued from inside a bucket's hook
    # (those are already counted by their bucket).
    wire_codes = mc[wire]
    out["bytes"] = np.bincount(wire_codes, weights=nbytes[wire], minlength=n).astype(np.int64)
    out["n_comm"] = np.bincount(wire_codes, minlength=n)
    for c in ("forward_ns", "backward_ns", "optimizer_ns", "eval_ns", "compute_ns", "comm_busy_ns",
              "overlapped_ns", "exposed_ns", "step_ns"):
        out[c] = out[c].round().astype(np.int64)
    return out[STEP_COLUMNS]


STEP_COLUMNS = ["rank", "step", "step_ns", "forward_ns", "backward_ns", "optimizer_ns", "eval_ns", "compute_ns",
                "comm_busy_ns", "overlapped_ns", "exposed_ns", "overlap_pct", "compute_comm_ratio",
                "bytes", "n_comm"]


def comm_metrics(run_or_events: Run | pd.DataFrame, kinds=(S.BUCKET,), joined: pd.Series | None = None,
                 intervals: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> pd.DataFrame:
    """One row per comm event (bucket rows by default; pass kinds=("collective",) or both).
    Times (ns): ``hook_to_launch_ns`` (comm-hook entry → collective call), ``queue_ns`` (launch →
    service start) split into ``queued_ns`` (behind this rank's earlier collectives) and
    ``wait_peers_ns`` (for the last rank to launch), ``service_ns`` = ``duration_ns`` (service
    start → done; see analysis.queueing), ``span_ns`` (launch → done), launch delay (launch −
    ready), and ``exposed_ns``: this event's share of the rank-step's exposed time (each exposed
    instant belongs to one collective, so these add up to step_metrics' exposed_ns), of which
    ``after_backward_ns`` lies after backward compute ended. algbw/busbw (GB/s) = bytes / service.
    ``joined``: each collective's last launch over all ranks, for events of some ranks only
    (queueing.collective_times; analysis.partitioned). ``intervals``: (compute_intervals(ev),
    comm_rows(ev)) when the caller has them already (the Perfetto export needs them too)."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    comp, rows = intervals if intervals is not None else (compute_intervals(ev), comm_rows(ev))
    rows = rows.reset_index(drop=True)
    cols = ["rank", "step", "micro", "kind", "bucket", "name", "op", "bytes", "logical_bytes", "dtype",
            "group_size", "layout", "phase", "ready_ns", "hook_ns", "launch_ns", "start_ns", "end_ns"]
    rows = rows[cols]
    for c in ("kind", "op", "phase"):
        rows[c] = as_str(rows[c])
    # Queueing and exposed attribution need every comm row of a rank (its stream), so they are
    # computed before the kinds filter.
    times = Q.collective_times(rows, joined)
    bwd_end = comp[comp["kind"] == S.BACKWARD].groupby(["rank", "step"])["end_ns"].max()
    exposed = Q.attributed_exposed(rows, comp, bwd_end)
    rows = pd.concat([rows, times, exposed], axis=1)
    keep = rows["kind"].isin(kinds).to_numpy()
    rows = (rows if keep.all() else rows[keep]).reset_index(drop=True)   # all comm kinds: no copy
    rows["hook_to_launch_ns"] = (rows["launch_ns"] - rows["hook_ns"]).astype(np.int64)
    rows["span_ns"] = (rows["end_ns"] - rows["launch_ns"]).astype(np.int64)
    rows["duration_ns"] = rows["service_ns"]
    rows["launch_delay_ns"] = np.where(rows["ready_ns"] >= 0, rows["launch_ns"] - rows["ready_ns"], np.nan)
    algbw = algbw_gbps(rows["bytes"].to_numpy(dtype=float), rows["service_ns"].to_numpy(dtype=float))
    rows["algbw_gbps"] = algbw
    rows["busbw_gbps"] = algbw * _busbw_factors(rows["op"], rows["group_size"])
    rows["exposed_ns"] = np.round(rows["exposed_ns"]).astype(np.int64)
    rows["after_backward_ns"] = np.round(rows["after_backward_ns"]).astype(np.int64)
    return rows


def bucket_metrics(run_or_events: Run | pd.DataFrame) -> pd.DataFrame:
    return comm_metrics(run_or_events, kinds=(S.BUCKET,))


def skew(run_or_events: Run | pd.DataFrame, kinds=(S.BUCKET,)) -> pd.DataFrame:
    """Per (step, micro, kind, bucket, name): launch spread across ranks and the straggler rank
    (the one that launched last). Only events seen on at least two ranks."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    rows = comm_rows(ev)
    rows = rows[rows["kind"].isin(kinds)].copy()
    rows["kind"] = as_str(rows["kind"])
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
    return lateness_matrix(pd.concat([rows[["rank", "step"]], late], axis=1))


def lateness_matrix(late: pd.DataFrame) -> pd.DataFrame:
    """Rank × step mean of ``late_ns`` (rows of analysis.launch_lateness): rank_step_skew from a
    lateness table already computed (the dashboard's, block by block)."""
    if not len(late):
        return pd.DataFrame()
    return late.pivot_table(index="rank", columns="step", values="late_ns", aggfunc="mean")


# -------------------------------------------------------------------------------- run level

def headline_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps used for headline numbers: all but step 0 when there are more (step 0 includes
    warm-up and DDP's bucket rebuild)."""
    if steps["step"].nunique() > 1:
        return steps[steps["step"] > steps["step"].min()]
    return steps


def _ms(ns) -> float:
    return float(ns) / 1e6 if ns == ns else float("nan")


# ------------------------------------------------------------------ cost-model inputs (fit)

def comm_service(comm: pd.DataFrame, compute: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per comm event (rows of comm_metrics, same index): ``joined_ns`` (the last rank's launch) and
    ``service_ns`` (done − service start), as analysis.queueing.collective_times defines them (the
    one definition; comm_metrics' duration_ns is the same number). With ``compute``
    (compute_intervals of the run), also ``service_hidden_ns``: how much of [service start, done]
    ran while any rank was computing in that step (compute competes with the collective for the
    device, and a collective is as slow as its slowest participant)."""
    cols = ["joined_ns", "service_ns"] + (["service_hidden_ns"] if compute is not None else [])
    if not len(comm):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    if "service_ns" in comm and "joined_ns" in comm:
        c = comm[["step", "end_ns", "joined_ns", "service_ns"]].copy()
    else:
        c = comm[["step", "end_ns"]].join(Q.collective_times(comm)[["joined_ns", "service_ns"]])
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
    return c[cols]


def offload_table(run_or_events: Run | pd.DataFrame, steps=None) -> pd.DataFrame:
    """Offloading work (kind "offload": host optimizer step, device↔host copies, NVMe swaps) per
    step and rank by what it moved: ms and calls, mean over ranks and ``steps`` (default: all but
    step 0). Offload rows lie inside forward, backward or optimizer rows, so this time is part of
    the compute phases, not added to them."""
    ev = run_or_events.events if isinstance(run_or_events, Run) else run_or_events
    off = ev[ev["kind"] == S.OFFLOAD]
    off = off[(off["end_ns"] >= off["start_ns"]) & (off["start_ns"] >= 0)]
    if not len(off):
        return pd.DataFrame(columns=["name", "ms_per_step", "calls_per_step"])
    if steps is None:
        all_steps = sorted(ev.loc[ev["step"] >= 0, "step"].unique())
        steps = all_steps[1:] if len(all_steps) > 1 else all_steps
    off = off[off["step"].isin(list(steps))]
    n = ev[ev["step"].isin(list(steps)) & (ev["kind"] == S.STEP)].groupby(["rank", "step"]).ngroups or 1
    g = off.assign(ms=(off["end_ns"] - off["start_ns"]) / 1e6, name=as_str(off["name"])).groupby("name")
    return pd.DataFrame({"ms_per_step": g["ms"].sum() / n, "calls_per_step": g.size() / n}).reset_index()
