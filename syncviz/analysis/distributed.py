"""What torch-tb-profiler's "Distributed" view shows, from syncviz's own trace (so it works
offline, on every step, without a profiler run): per rank, how a step splits into computation,
communication overlapped with it, communication alone, and waiting for peers; per collective
kind, calls, bytes and time. Means over the headline steps (all but step 0 when there are more)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis.intervals import subtract_intervals, wire_mask
from syncviz.analysis.metrics import _busbw_factors, comm_metrics, headline_steps, step_metrics
from syncviz.analysis.tables import exposed_intervals
from syncviz.analysis.timeline import collective_parts
from syncviz.trace import schema as S
from syncviz.analysis.columns import as_str

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


def _length(f: pd.DataFrame) -> pd.Series:
    if not len(f):
        return pd.Series(dtype=float)
    return (f["end_ns"] - f["start_ns"]).groupby([f["rank"], f["step"]]).sum()


def rank_breakdown(events: pd.DataFrame, steps: pd.DataFrame | None = None,
                   comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank, mean ns per headline step of: ``computation_ns`` (compute with no collective in
    flight), ``overlapped_ns`` (collectives in flight while computing), ``communication_ns``
    (collectives alone, being served), ``waiting_ns`` (collectives alone, waiting for a late peer
    or for a collective queued ahead: analysis.timeline.collective_parts), ``other_ns`` (the rest
    of the step: data loading, host work, idle); they add up to ``step_ns``. ``steps`` and
    ``comm``: step_metrics and comm_metrics (all comm kinds) of ``events``, when already computed."""
    h, ev = _headline_events(events, steps)
    cols = ["rank", "step_ns", *BREAKDOWN]
    if not len(h):
        return pd.DataFrame(columns=cols)
    t = h.set_index(["rank", "step"])[["step_ns", "compute_ns", "overlapped_ns", "exposed_ns"]].astype(float)
    exposed = exposed_intervals(ev)
    comm = _headline_comm(ev, h, comm)
    comm = comm[wire_mask(comm)].reset_index(drop=True) if len(comm) else comm
    waiting_exposed = pd.Series(0.0, index=t.index)
    if len(comm) and len(exposed):
        wait = collective_parts(comm)["wait_ns"].fillna(0.0).to_numpy()
        w = comm.loc[wait > 0, ["rank", "step", "start_ns"]].copy()
        w["end_ns"] = (w["start_ns"] + wait[wait > 0]).astype(np.int64)
        # exposed ∩ waiting = exposed − (exposed minus waiting)
        rest = subtract_intervals(exposed, w) if len(w) else exposed
        waiting_exposed = (_length(exposed).sub(_length(rest), fill_value=0)).reindex(t.index).fillna(0.0)
    t["waiting_ns"] = waiting_exposed.clip(lower=0).to_numpy()
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
    cols = ["op", "calls", "calls_min", "calls_max", "bytes", "bus_bytes", "time_ns", "mean_ns"]
    comm = _headline_comm(ev, h, comm)
    if not len(comm):
        return pd.DataFrame(columns=cols)
    comm = comm[wire_mask(comm)]
    n = max(1, len(h))                       # (rank, step) pairs
    factor = _busbw_factors(comm["op"], comm["group_size"])   # busbw_factor, vectorized
    f = pd.DataFrame({"op": as_str(comm["op"]).replace("", "other").to_numpy(),
                      "rank": comm["rank"].to_numpy(), "step": comm["step"].to_numpy(),
                      "bytes": comm["bytes"].to_numpy(dtype=float), "bus_bytes": comm["bytes"].to_numpy(dtype=float) * factor,
                      "time_ns": comm["duration_ns"].to_numpy(dtype=float)})
    # calls of each op in each headline (rank, step), zero where a pair made none
    per_pair = f.groupby(["rank", "step", "op"]).size().unstack("op")
    if len(h):
        per_pair = per_pair.reindex(pd.MultiIndex.from_frame(h[["rank", "step"]]))
    per_pair = per_pair.fillna(0).astype(np.int64)
    g = f.groupby("op")
    out = pd.DataFrame({"calls": g.size() / n, "calls_min": per_pair.min(), "calls_max": per_pair.max(),
                        "bytes": g["bytes"].sum() / n, "bus_bytes": g["bus_bytes"].sum() / n,
                        "time_ns": g["time_ns"].sum() / n, "mean_ns": g["time_ns"].mean()})
    return out.reset_index()[cols].sort_values("time_ns", ascending=False).reset_index(drop=True)
