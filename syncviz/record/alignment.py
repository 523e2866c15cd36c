"""Clock alignment of a rank against rank 0 once the process group is up (and the drift at the
end): part of the Recorder (mixed in), kept apart because it runs once per run, not per step."""
from __future__ import annotations

import os
import socket
import time

import torch.distributed as dist

from syncviz.record import clock


class ProcessGroupClock:
    """attach_process_group / measure_drift of the Recorder (which owns the state they set)."""

    def attach_process_group(self, group=None) -> None:
        """Align clocks with rank 0 and write run.json. Collective: every rank calls it, right
        after init_process_group. Uses a gloo group (created when the default backend is not gloo)."""
        if not dist.is_available() or not dist.is_initialized():
            return
        with self.own_collectives():
            self._attach_process_group(group)

    def _attach_process_group(self, group) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if group is None and dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo")
        self.group = group
        old_base = self.offset_ns - self.t0
        self.offset_ns, self.error_ns = clock.estimate_offsets(group)
        # rank 0's clock now (in rank 0's clock) is the run's zero on every rank
        self.t0 = clock.broadcast_int(clock.local_ns(), group)
        if self._phases:   # re-base what was recorded before alignment (usually nothing)
            delta = self.offset_ns - self.t0 - old_base
            self._phases = [p._replace(start=p.start + delta, end=p.end + delta) for p in self._phases]
        info = {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(),
                "local_rank": int(os.environ.get("LOCAL_RANK", self.rank)),
                "node": int(os.environ.get("GROUP_RANK", 0)),
                "clock_offset_ns": self.offset_ns, "clock_error_ns": self.error_ns,
                # lets other tools' wall-clock timestamps (torch.profiler) be put on our clock
                "realtime_minus_clock_ns": time.time_ns() - clock.local_ns()}
        infos = [None] * self.world_size
        dist.all_gather_object(infos, info, group=group)
        self.meta_extra["ranks"] = infos
        self.meta_extra["clock_zero_ns"] = self.t0   # rank 0's monotonic clock at aligned time 0
        self.meta_extra["backend"] = dist.get_backend()
        self.meta_extra["nodes"] = len({i["node"] for i in infos})
        self.writer  # noqa: B018  (open the rank's stream now that the rank is known)
        self.write_meta()

    def measure_drift(self) -> None:
        """End-of-run exchange (collective): how far the offsets moved during the run."""
        if self.group is None and not (dist.is_available() and dist.is_initialized()):
            return
        try:
            with self.own_collectives():
                off, err = clock.estimate_offsets(self.group)
                infos = [None] * self.world_size
                dist.all_gather_object(infos, {"rank": self.rank, "clock_offset_end_ns": off,
                                               "clock_error_end_ns": err}, group=self.group)
                for i in infos:
                    for r in self.meta_extra.get("ranks", []):
                        if r["rank"] == i["rank"]:
                            r.update(i)
        except Exception:  # a peer already gone: the start offsets stand
            pass
