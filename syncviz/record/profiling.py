"""torch.profiler for a window of steps, next to a syncviz run (`syncviz trace --profile`).

The rank-side half of profiling: the recorder calls ``on_step_begin(step)`` / ``on_step_end(step)``
at optimizer-step boundaries and wraps each bucket's comm-hook call in ``bucket_range(...)``.
The profiler exists only from the beginning of ``first_step`` to the end of ``last_step``
(inclusive), so its overhead stays inside those steps; outside them this class costs one integer
comparison per call.

Each rank writes one Chrome trace into ``<run>/profiler/`` in the layout torch-tb-profiler reads
(torch.profiler.tensorboard_trace_handler, worker name ``rank-<r>``), so its Overview, Operator, Trace and
Distributed views work with ``tensorboard --logdir <run>/profiler``.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import torch

PROFILER_DIR = "profiler"
DEFAULT_STEPS = (2, 3)   # step 0 warms up and step 1 runs after DDP's bucket rebuild


def parse_profile_steps(text: str | None) -> tuple[int, int]:
    """``--profile-steps`` text → (first, last) steps, both inclusive, for StepProfiler.

    The text follows ``syncviz trace --steps``: ``A:B`` is A inclusive, B exclusive (``2:4`` is
    steps 2 and 3); a single ``A`` is that one step. Raises ValueError with a readable message."""
    if text is None or str(text).strip() == "":
        return DEFAULT_STEPS
    first, sep, end = str(text).strip().partition(":")
    try:
        a = int(first)
        b = int(end) if sep else a + 1
    except ValueError:
        raise ValueError(f"profile steps must look like A:B (e.g. 2:4 for steps 2 and 3), got {text!r}") from None
    if a < 0 or b <= a:
        raise ValueError(f"profile steps A:B need 0 <= A < B (B is exclusive), got {text!r}")
    return a, b - 1


def bucket_label(bucket: int, op: str, nbytes: int) -> str:
    """The record_function name of one bucket's collective, e.g. ``bucket 3 all_reduce 25.0 MB``."""
    return f"bucket {bucket} {op} {nbytes / 1e6:.1f} MB"


def profiler_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / PROFILER_DIR


def worker_name(rank: int) -> str:
    return f"rank-{rank}"


def _always_record(step: int) -> torch.profiler.ProfilerAction:
    # A schedule (rather than none) makes torch.profiler emit "ProfilerStep#<n>" ranges, which
    # torch-tb-profiler uses to split the Overview and Distributed views per step. Start and stop
    # are explicit at our step boundaries, so the schedule only has to say "record".
    return torch.profiler.ProfilerAction.RECORD


class StepProfiler:
    """Profile steps ``first_step..last_step`` (both inclusive) of one rank.

    The profiler starts at ``on_step_begin(first_step)``, or at ``on_step_end(first_step - 1)``
    for a caller that only reports step ends (then step 0 cannot be profiled: nothing precedes
    it). ``ProfilerStep#<n>`` ranges carry syncviz step numbers; each ``on_step_end`` inside the
    window advances them; ``on_step_end(last_step)`` stops the profiler and writes the trace.
    ``close()`` stops and writes whatever was recorded when training ended inside the window.
    Calls outside the window do nothing.
    """

    def __init__(self, run_dir: str | os.PathLike, rank: int, first_step: int, last_step: int, *,
                 record_shapes: bool = True, with_stack: bool = False, profile_memory: bool = False):
        if first_step < 0 or last_step < first_step:
            raise ValueError(f"profile steps need 0 <= first <= last, got {first_step}:{last_step}")
        self.dir = profiler_dir(run_dir)
        self.rank = rank
        self.first_step, self.last_step = int(first_step), int(last_step)
        self._options = dict(record_shapes=record_shapes, with_stack=with_stack,
                             profile_memory=profile_memory)
        self._prof: torch.profiler.profile | None = None
        self.done = False               # the window was profiled and its trace written
        self.trace_path: Path | None = None
        self.write_s = 0.0              # time spent stopping the profiler and writing the trace

    @property
    def active(self) -> bool:
        return self._prof is not None

    def on_step_begin(self, step: int) -> None:
        if self._prof is None and not self.done and self.first_step <= step <= self.last_step:
            self._start(step)

    def _start(self, step: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # torch's own handler: files "<worker>.<time_ns>.pt.trace.json.gz". torch-tb-profiler
        # turns each worker's timestamps into span indices 1, 2, ..., so ranks line up in
        # its Distributed view although their clocks give different names.
        self._prof = torch.profiler.profile(
            activities=activities, schedule=_always_record,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                str(self.dir), worker_name=worker_name(self.rank), use_gzip=True),
            **self._options)
        self._prof.step_num = step      # ProfilerStep#<n> == syncviz step n
        self._prof.start()

    def on_step_end(self, step: int) -> None:
        if self._prof is None:
            if step + 1 == self.first_step and not self.done:
                self._start(step + 1)
            return
        if step >= self.last_step:
            self._finish()
        else:
            # Ends ProfilerStep#<step> and opens ProfilerStep#<step+1> (torch's usual step() call
            # at the end of an iteration, so the next range also covers data loading).
            self._prof.step()

    def bucket_range(self, bucket: int, op: str, nbytes: int):
        """Context manager naming one bucket's collective in the profiler trace (no-op outside
        the window)."""
        if self._prof is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(bucket_label(bucket, op, nbytes))

    def close(self) -> None:
        if self._prof is not None:
            self._finish()

    def _finish(self) -> None:
        t0 = time.perf_counter()
        prof, self._prof = self._prof, None
        prof.stop()       # closes the last ProfilerStep range, stops kineto, calls the handler
        self.done = True
        written = sorted(self.dir.glob(f"{worker_name(self.rank)}.*.pt.trace.json.gz"),
                         key=lambda p: p.stat().st_mtime)
        self.trace_path = written[-1] if written else None
        self.write_s = time.perf_counter() - t0
