"""GPU-side times on the recorder's clock: CUDA events mapped to aligned host nanoseconds.

A CUDA event's only absolute reading is ``a.elapsed_time(b)`` between two completed events, so
every GPU time is "some reference event + elapsed". Two things make the obvious reference (the
host time at which the step's anchor event was *enqueued*) wrong, and are handled here:

- the GPU runs behind the host: when the host records the step's anchor at the first forward,
  the previous step's optimizer kernels may still be queued (nothing in a training loop without
  ``loss.item()`` waits for them), so the anchor executes later than it was enqueued, by up to
  the queue's length (milliseconds). Using the enqueue time shifts every bucket of that step
  early by that lag.
- ``elapsed_time`` is a float32 of milliseconds: 24 bits of mantissa, so across a 1,000 s span
  its resolution is ~60 µs. References must stay close to the events they time.

So: one calibration, when a CUDA model is instrumented (DDP's constructor, not a training hook),
finds an event's GPU time on the host clock by draining the queue and spinning on
``query()`` (no ``cudaDeviceSynchronize``: a user's ``set_sync_debug_mode("error")`` stays
quiet, and ``query`` never blocks). After that each step's anchor is timed from the previous
resolved anchor (a chain of short spans) and never placed before the host enqueued it.
"""
from __future__ import annotations

from typing import Callable

import torch


def timing_event(device=None) -> "torch.cuda.Event":
    """A CUDA event with timing, recorded now on ``device``'s current stream (default: the current
    device's), never blocking. Events are compared with ``elapsed_time``, which needs both on one
    device: a model on ``cuda:k`` without ``torch.cuda.set_device(k)`` (common) has its gradients
    on k while the current device is 0, so the recorder names the model's device."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(torch.cuda.current_stream(device))
    return ev


def wait_for(events) -> None:
    """Spin until every event has completed. ``query`` is not a synchronizing call for
    ``torch.cuda.set_sync_debug_mode`` (``synchronize`` is), so this is usable at close while a
    user runs in that mode. Only for step boundaries and close, never inside a hook."""
    for ev in events:
        if ev is not None:
            while not ev.query():
                pass


class GpuClock:
    """Maps completed CUDA events onto ``now()``'s clock (aligned ns)."""

    def __init__(self, now: Callable[[], int], device=None):
        self.now = now
        self.device = device               # the instrumented model's CUDA device
        self.ref: tuple | None = None      # (completed event, its time on our clock)
        self.error_ns: int | None = None   # half-width of the calibration window

    def calibrate(self, tries: int = 5) -> None:
        """Drain the current stream, then record an event and spin until it completes: its GPU
        time lies between the host times before the record and after the completion. Keep the
        narrowest of a few tries (a few µs on an idle GPU)."""
        wait_for([timing_event(self.device)])
        best = None
        for _ in range(tries):
            t1 = self.now()
            ev = timing_event(self.device)
            wait_for([ev])
            t2 = self.now()
            if best is None or t2 - t1 < best[2] - best[1]:
                best = (ev, t1, t2)
        ev, t1, t2 = best
        self.ref = (ev, (t1 + t2) // 2)
        self.error_ns = (t2 - t1) // 2

    def anchor_time(self, host_ns: int, event) -> int:
        """Our-clock time of a completed anchor event that the host recorded at ``host_ns``.
        Chained from the previous anchor (short spans keep elapsed_time's float32 precise), and
        never before ``host_ns`` (the GPU cannot run an event before it is enqueued: this also
        bounds a GPU clock that drifts slow against the host's). Anchors must come in order."""
        if self.ref is None:
            t = host_ns
        else:
            ref_ev, ref_ns = self.ref
            t = max(host_ns, ref_ns + round(ref_ev.elapsed_time(event) * 1e6))
        self.ref = (event, t)
        return t


class CudaTimes:
    """The Recorder's CUDA side (a mixin: it uses the Recorder's ``now``, ``_cuda`` and
    ``_gpu_clock``): turning CUDA on for a model, and the GPU end of an engine's collective."""

    def use_cuda(self, device) -> None:
        """An instrumented model lives on CUDA ``device``: anchor each step with a CUDA event there,
        and calibrate the GPU clock once, here at model instrumentation (not inside a training hook)."""
        self._cuda = True
        if self._gpu_clock is None:
            self._gpu_clock = GpuClock(self.now, device)
            self._gpu_clock.calibrate()

    def collective_done(self, call) -> None:
        """``call`` (a CollectiveCall from add_collective) completed: from its future's callback,
        which on CUDA runs on streams that wait for the collective, so an event recorded here marks
        its GPU end."""
        call.done = self.now()
        if call.cuda is not None:
            call.cuda[1] = timing_event(call.cuda[2])
