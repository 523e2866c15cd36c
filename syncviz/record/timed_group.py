"""DDP's default bucket all-reduce timed in C++ (record/native/timedgroup.cpp): the rows its group
keeps, turned into the recorder's bucket and collective records at each step's end. Part of
syncviz.record; record/ddp.py installs it where it can, else reducer_group.py's Python group.

The same records as the Python group's (_BucketHook.reducer_allreduce): a bucket row (hook entry =
the collective call, DDP's 1/N already fused into its copy) and its "all_reduce" row, both from one
launch stamp and one done stamp. Where it is used: a CPU DDP model, no torch.profiler session
(--profile marks each bucket with a named range, from Python) and a C++ build (record/native).
tests/test_native_hooks.py compares its rows with the Python group's on a real traced run.
"""
from __future__ import annotations

import torch

from syncviz.record import clock, collectives, native
from syncviz.record.events import BucketCall, CollectiveCall
from syncviz.trace import schema as S


def usable(ddp, rec) -> bool:
    """A CPU DDP model outside --profile, with a build that has the C++ group."""
    return (getattr(ddp, "device_type", None) == "cpu" and rec.profiler is None
            and hasattr(native.load(), "TimedGroup"))


class TimedBuckets:
    """The C++ group of one DDP model (``group``, what the reducer gets; record/ddp.py gives it the
    bucket layout and each forward) and its records' source: ``settle()`` at the step's end
    (Recorder.end_step), ``inflight()`` for the hang watchdog."""

    def __init__(self, rec, hook, pg):
        self.rec, self.hook = rec, hook
        self.group = native.load().TimedGroup(pg)
        self._size = pg.size()
        self.group.set_micro(rec.micro)
        self._dtypes: dict[int, tuple[str, int]] = {}     # scalar type code → (name, element size)

    def _dtype(self, code: int) -> tuple[str, int]:
        if code not in self._dtypes:
            dt = self.group.dtype(code)
            self._dtypes[code] = (S.dtype_name(dt), torch.empty((), dtype=dt).element_size())
        return self._dtypes[code]

    def _calls(self, rows) -> list[BucketCall]:
        rec = self.rec
        base = clock.skew_ns() + rec.offset_ns - rec.t0      # raw monotonic ns → aligned (Recorder.now)
        calls = []
        for index, layout, micro, launch, done, numel, code in rows.tolist():
            dtype, size = self._dtype(code)
            call = BucketCall(index, layout, launch + base, numel * size, dtype, self.hook.name, micro,
                              done=done + base if done >= 0 else -1)
            call.issued = call.launch      # hook entry and collective call are one (as the Python group)
            calls.append(call)
        return calls

    def settle(self) -> None:
        """This step's buckets into the recorder, each with its all_reduce row (none while syncviz
        runs its own collectives, or with collectives not recorded, as bucket_all_reduce decides)."""
        rows = self.group.take()
        if not len(rows):
            return
        rec = self.rec
        with_rows = collectives.recording(rec)
        for call in self._calls(rows):
            rec.add_bucket(call)
            if with_rows:
                rec.add_collective(CollectiveCall(S.COLLECTIVE, "all_reduce", "all_reduce", max(call.micro, 0),
                                                  call.launch, call.nbytes, call.dtype, self._size, bucket=call.index,
                                                  done=call.done))

    def inflight(self) -> list[BucketCall]:
        """Buckets called and not done (any thread; nothing is taken)."""
        return self._calls(self.group.inflight())
