"""What a timeline shows, as tables: which real ranks stand for a step, and each collective split
into the part spent waiting (for peers to launch it, or for the collectives queued ahead of it on
the process group) and the part it was being served. Pure functions of analysis tables; the
drawing is in syncviz/views/timeline.py."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis.lanes import lanes
from syncviz.analysis.metrics import comm_service

ROLES = ("fastest", "median", "slowest")


def representative_ranks(steps: pd.DataFrame) -> list[tuple[str, int]]:
    """The fastest, median and slowest rank by step time (step_metrics rows; several steps are
    summed per rank), as [(role, rank)]. Real ranks, not a min/median/max composite: every bar
    drawn for them happened on that rank. The median is the lower median; ties go to the lower
    rank. Fewer than three ranks give fewer rows (a rank is listed once, under its first role)."""
    if not len(steps):
        return []
    per = steps.groupby("rank")["step_ns"].sum().sort_index(kind="stable")
    order = per.sort_values(kind="stable").index.to_list()
    picks = {"fastest": order[0], "median": order[(len(order) - 1) // 2], "slowest": order[-1]}
    out, seen = [], set()
    for role in ROLES:
        r = int(picks[role])
        if r not in seen:
            seen.add(r)
            out.append((role, r))
    return out


def collective_parts(comm: pd.DataFrame) -> pd.DataFrame:
    """Per comm row (comm_metrics columns, same index): ``wait_ns`` from its start until its
    service began (late peers, or collectives queued ahead on the group: analysis.comm_service),
    ``service_ns`` (NaN when clock error hides it) and ``lane``: sub-lane within its rank so that
    no two collectives of one rank share a lane while overlapping in time."""
    out = pd.DataFrame(index=comm.index)
    if not len(comm):
        return out.assign(wait_ns=pd.Series(dtype=float), service_ns=pd.Series(dtype=float),
                          lane=pd.Series(dtype=np.int64))
    svc = comm_service(comm).reindex(comm.index)
    dur = (comm["end_ns"] - comm["start_ns"]).to_numpy(dtype=float)
    service = np.minimum(svc["service_ns"].to_numpy(dtype=float), dur)
    out["service_ns"] = service
    out["wait_ns"] = np.where(np.isnan(service), np.nan, dur - service)
    out["lane"] = lanes(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy(), groups=comm["rank"].to_numpy())
    return out
