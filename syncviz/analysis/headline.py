"""A run's headline numbers and verdict (used by summary, compare, the dashboard and the exports).

Every headline number has one definition, and all of them come from one aggregate so numbers
that are ratios of each other agree as printed:

- headline steps: every recorded step but the first (it includes warm-up and DDP's bucket
  rebuild), all steps when there is only one.
- step, forward, backward, optimizer, eval, compute, comm busy, overlapped and exposed time
  (``*_ms``): the **mean over the headline (rank, step) pairs** of step_metrics' columns.
- exposed % = 100 × exposed_ms / comm_busy_ms; overlap % = 100 − exposed % (= overlapped_ms /
  comm_busy_ms).
- compute/comm ratio = (forward_ms + backward_ms + optimizer_ms) / comm_busy_ms.
- bytes per step: mean over headline (rank, step) pairs of the bytes put on the wire.
- busbw: median over the headline steps' wire collectives (buckets, and collectives not issued
  inside a bucket's hook) of busbw on service time (analysis.queueing); queue_ms / service_ms:
  their medians.
- top exposed: collectives by their attributed exposed time (each exposed instant belongs to one
  collective), so the shares add up to 100 % of exposed.
- straggler: analysis.queueing.straggler over the headline steps' wire collectives.
"""
from __future__ import annotations

import pandas as pd

from syncviz.analysis import queueing as Q
from syncviz.analysis.intervals import wire_mask
from syncviz.analysis.metrics import _ms, comm_metrics, headline_steps, offload_table, step_metrics
from syncviz.trace import Run
from syncviz.trace import schema as S
from syncviz.analysis.columns import as_str

HEADLINE_AGGREGATE = "mean over ranks and headline steps"
_MEAN_COLUMNS = ("step", "forward", "backward", "optimizer", "eval", "compute", "comm_busy", "overlapped", "exposed")


def headline(steps: pd.DataFrame) -> dict:
    """The time headline of step_metrics rows (already restricted to the steps to summarize):
    ``<x>_ms`` means over (rank, step) rows, and the percentages and ratio from those means."""
    out = {}
    for c in _MEAN_COLUMNS:
        col = f"{c}_ns"
        out[f"{c}_ms"] = _ms(steps[col].mean()) if len(steps) and col in steps else float("nan")
    busy, exposed = out["comm_busy_ms"], out["exposed_ms"]
    ok = busy == busy and busy > 0
    out["exposed_pct"] = 100.0 * exposed / busy if ok else float("nan")
    out["overlap_pct"] = 100.0 - out["exposed_pct"] if ok else float("nan")
    phases = out["forward_ms"] + out["backward_ms"] + out["optimizer_ms"]
    out["compute_comm_ratio"] = phases / busy if ok else float("nan")
    out["bytes_per_step"] = int(round(steps["bytes"].mean())) if len(steps) else 0
    out["aggregate"] = HEADLINE_AGGREGATE
    return out


def run_summary(run: Run, steps: pd.DataFrame | None = None, comm: pd.DataFrame | None = None) -> dict:
    """Headline numbers and a one-line verdict for a run (definitions in this module's docstring).
    ``steps`` and ``comm``: step_metrics and comm_metrics (all comm kinds) of the run, when a
    caller (the dashboard) has them already."""
    steps = step_metrics(run) if steps is None else steps
    comm = comm_metrics(run, kinds=S.COMM_KINDS) if comm is None else comm
    wire = comm[wire_mask(comm)] if len(comm) else comm
    h = headline_steps(steps) if len(steps) else steps
    hsteps = h["step"].unique() if len(h) else []
    hw = wire[wire["step"].isin(hsteps)] if len(wire) else wire
    out = {"name": run.name, "strategy": run.meta.get("strategy", "?"), "engine": run.meta.get("engine", "torch"),
           "world_size": run.world_size, "steps": int(steps["step"].nunique()) if len(steps) else 0,
           "headline_steps": sorted(int(s) for s in hsteps)}
    out.update(headline(h))
    out["busbw_gbps"] = float(hw["busbw_gbps"].median()) if len(hw) else float("nan")
    out["service_ms"] = _ms(hw["service_ns"].median()) if len(hw) else float("nan")
    out["queue_ms"] = _ms(hw["queue_ns"].median()) if len(hw) else float("nan")
    out["problems"] = list(run.problems)
    table = Q.straggler_table(hw)
    out["stragglers"] = table.to_dict(orient="records")
    st = Q.straggler(table, run.world_size, Q.clock_error_bound(run.meta))
    out["straggler_detail"] = st
    out["straggler"] = st["rank"] if st else None
    late = table["mean_late_ms"].max() if len(table) else 0.0
    out["max_mean_late_ms"] = float(late) if late == late else 0.0
    if len(hw):
        g = hw.groupby(["step", "micro", "kind", "bucket", "name"], observed=True)["launch_ns"]
        out["max_skew_ms"] = _ms((g.max() - g.min()).max())
    else:
        out["max_skew_ms"] = 0.0
    out["top_exposed"] = top_exposed(hw)
    off = offload_table(run, steps=out["headline_steps"])
    out["offload_ms"] = float(off["ms_per_step"].sum()) if len(off) else 0.0   # inside compute
    out["verdict"] = verdict(out)
    return out


def top_exposed(comm: pd.DataFrame, n: int = 5) -> list[dict]:
    """Comm events (bucket/collective identity) with the most attributed exposed time, summed over
    steps and ranks; ``exposed_ms_per_step`` is per (rank, step) on average, so the rows add up to
    the headline exposed time (when every exposed instant falls in a wire collective)."""
    if not len(comm):
        return []
    return top_exposed_rows(exposed_by_identity(comm), comm["exposed_ns"].sum(),
                            comm[["rank", "step"]].drop_duplicates().shape[0], n)


def exposed_by_identity(comm: pd.DataFrame) -> pd.DataFrame:
    """top_exposed's sums per collective identity, in order of first appearance (index ``_k``)."""
    key = as_str(comm["bucket"].where(comm["kind"] == S.BUCKET, -1)) + "|" + as_str(comm["name"]) \
        + "|" + as_str(comm["kind"])
    g = comm.assign(_k=key).groupby("_k", sort=False)
    return g.agg(kind=("kind", "first"), bucket=("bucket", "first"), name=("name", "first"),
                 op=("op", "first"), bytes=("bytes", "max"), exposed_ns=("exposed_ns", "sum"),
                 after_backward_ns=("after_backward_ns", "sum"), count=("exposed_ns", "size"))


def top_exposed_rows(agg: pd.DataFrame, total, rank_steps: int, n: int = 5) -> list[dict]:
    """top_exposed from exposed_by_identity's table, the comm rows' total exposed time and their
    number of (rank, step) pairs."""
    agg = agg[agg["exposed_ns"] > 0].sort_values("exposed_ns", ascending=False).head(n)
    rank_steps = max(1, rank_steps)
    return [{"kind": r["kind"], "bucket": int(r["bucket"]), "name": r["name"], "op": r["op"],
             "bytes": int(r["bytes"]), "exposed_ms_per_event": _ms(r["exposed_ns"] / r["count"]),
             "exposed_ms_per_step": _ms(r["exposed_ns"] / rank_steps),
             "exposed_share_pct": float(100.0 * r["exposed_ns"] / total) if total else 0.0,
             "after_backward_pct": float(100.0 * r["after_backward_ns"] / r["exposed_ns"]) if r["exposed_ns"] else 0.0}
            for _, r in agg.iterrows()]


def straggler_text(st: dict | None) -> str:
    if not st:
        return ""
    return (f"rank {st['rank']} is the straggler: it launched last in {st['last']} of {st['events']} collectives "
            f"({st['last_pct']:.0f}%), {st['mean_late_ms']:.2f} ms late on average; the others waited "
            f"{st['waited_for_ms_per_step']:.2f} ms per step for it ({st['wait_share_pct']:.0f}% of their waiting for peers)")


def verdict(s: dict) -> str:
    if not s["steps"]:
        return "No complete step was recorded."
    if not (s["comm_busy_ms"] > 0):
        return "No gradient communication was recorded (single rank or no data parallelism?)."
    pct = s["exposed_pct"]
    text = f"{pct:.0f}% of communication is exposed ({s['exposed_ms']:.2f} of {s['comm_busy_ms']:.2f} ms per step)"
    if s["top_exposed"] and pct >= 1:
        t = s["top_exposed"][0]
        what = f"bucket {t['bucket']}" if t["kind"] == S.BUCKET else f"{t['op'] or t['name']}"
        where = " after backward ends" if t["after_backward_pct"] >= 50 else ""
        text += f", mostly {what}{where} ({t['exposed_share_pct']:.0f}% of it)"
    ratio = s["compute_comm_ratio"]
    if ratio == ratio:
        text += f"; compute/comm ratio {ratio:.2f}"
    if s.get("straggler_detail"):
        text += "; " + straggler_text(s["straggler_detail"])
    return text + "."


def headline_rows(s: dict) -> list[tuple[str, float | str]]:
    """(label, value) pairs of the headline, for every view that lists it (exports, dashboard):
    one set of labels and numbers, each label saying its aggregate."""
    agg = "mean over rank-steps"
    st = s.get("straggler_detail")
    return [(f"step (ms, {agg})", s["step_ms"]), (f"compute (ms, {agg})", s["compute_ms"]),
            (f"comm busy (ms, {agg})", s["comm_busy_ms"]), (f"exposed comm (ms, {agg})", s["exposed_ms"]),
            ("exposed % (exposed / comm busy)", s["exposed_pct"]), ("overlap % (100 − exposed %)", s["overlap_pct"]),
            ("compute/comm ratio (fwd+bwd+opt / comm busy)", s["compute_comm_ratio"]),
            ("queue per collective (ms, median)", s["queue_ms"]), ("service per collective (ms, median)", s["service_ms"]),
            ("busbw on service time (GB/s, median)", s["busbw_gbps"]),
            (f"bytes per step (MB, {agg})", s["bytes_per_step"] / 1e6),
            ("straggler", f"rank {st['rank']} (last in {st['last']} of {st['events']})" if st else "none"),
            ("max launch skew (ms)", s["max_skew_ms"])]
