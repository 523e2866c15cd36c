"""What a timeline shows, as tables: which real ranks stand for a step, and each collective split
into the part spent waiting (for peers to launch it, or for the collectives queued ahead of it on
the process group) and the part it was being served. Pure functions of analysis tables; the
drawing is in syncviz/views/timeline.py."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis.lanes import lanes
from syncviz.analysis.metrics import comm_service

# The fourth is a fact of the step shown (the rank whose launches were latest on average), not the
# run-level straggler verdict of the summary (a test over every collective): it is named for what it is.
ROLES = ("fastest step", "median step", "slowest step", "launches last")


def latest_launcher(lateness: pd.DataFrame) -> int | None:
    """The rank that launched its collectives latest on average (launch_lateness rows): the one
    the others waited for. None without bucket collectives."""
    if not len(lateness):
        return None
    return _latest(lateness.groupby("rank")["late_ns"].mean().sort_index())


def latest_in_matrix(matrix: pd.DataFrame, step: int) -> int | None:
    """latest_launcher of one step from metrics.lateness_matrix (rank × step, the same means: the
    summary keeps it for the whole run), without that step's lateness rows."""
    if step not in matrix.columns:
        return None
    return _latest(matrix[step].dropna().sort_index())


def _latest(mean: pd.Series) -> int | None:
    """The rank of the largest mean lateness (the first of equals), None when none is above 0."""
    return int(mean.idxmax()) if len(mean) and mean.max() > 0 else None


def representative_ranks(steps: pd.DataFrame, lateness: pd.DataFrame | None = None, *,
                         latest: int | None = None) -> list[tuple[int, list[str]]]:
    """Real ranks that stand for a step: the fastest, median and slowest by step time
    (step_metrics rows; several steps are summed per rank) and, with ``lateness``, the straggler
    (latest_launcher; or ``latest``, that rank found already: latest_in_matrix), as [(rank, roles)]
    in that order. Not a min/median/max composite: every bar drawn for them happened on that rank.
    The median is the lower median; ties go to the lower rank; a rank holding several roles is
    listed once."""
    if not len(steps):
        return []
    per = steps.groupby("rank")["step_ns"].sum().sort_index(kind="stable")
    order = per.sort_values(kind="stable").index.to_list()
    picks = [(ROLES[0], order[0]), (ROLES[1], order[(len(order) - 1) // 2]), (ROLES[2], order[-1])]
    late = latest_launcher(lateness) if lateness is not None else latest
    if late is not None:
        picks.append((ROLES[3], late))
    out: dict[int, list[str]] = {}
    for role, r in picks:
        out.setdefault(int(r), []).append(role)
    return list(out.items())


def collective_parts(comm: pd.DataFrame) -> pd.DataFrame:
    """Per comm row (rows of comm_metrics, same index): ``wait_ns`` from its start (the launch)
    until its service began (late peers, or collectives queued ahead on the group: comm_metrics'
    queue_ns, analysis.queueing), NaN where clock error hides the service, and ``lane``: sub-lane
    within its rank so that no two collectives of one rank share a lane while overlapping in time.
    The service part is comm_metrics' ``service_ns`` (one definition; not repeated here)."""
    out = pd.DataFrame(index=comm.index)
    if not len(comm):
        return out.assign(wait_ns=pd.Series(dtype=float), lane=pd.Series(dtype=np.int64))
    svc = comm["service_ns"] if "service_ns" in comm else comm_service(comm)["service_ns"]
    out["wait_ns"] = wait_of(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy(),
                             svc.reindex(comm.index).to_numpy(dtype=float))
    out["lane"] = lanes(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy(), groups=comm["rank"].to_numpy())
    return out


def wait_of(start: np.ndarray, end: np.ndarray, service: np.ndarray) -> np.ndarray:
    """collective_parts' ``wait_ns`` on arrays: launch → done less the service (at most the whole
    of it), NaN where the service is (clock error)."""
    dur = (end - start).astype(float)
    service = np.minimum(service, dur)
    return np.where(np.isnan(service), np.nan, dur - service)
