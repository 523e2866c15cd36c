"""The recorder inside each rank: the step's records (appended by hooks), the rank's clock and
run.json, and the step boundary that turns the records into one Arrow record batch.

Rules (DESIGN.md): a hook only appends a named record (events.py) to a list (no device sync, no
I/O, no tensor allocation); everything else happens at the step boundary (the outermost optimizer
step's post-hook). Tracing never changes a bit of the training result.

Other parts of syncviz.record (DDP's comm hook, the collective wrapper) and syncviz's own engine
(syncviz.sync) report through the public methods below; nothing outside this module touches the
Recorder's underscored state. Starting one and hooking torch is api.py's job.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from syncviz.record import clock, first_pass
from syncviz.record.batch import apply_cuda_times, build_batch, stamp_late_ends
from syncviz.record.discover import RootDiscovery
from syncviz.record.alignment import ProcessGroupClock
from syncviz.record.cudaclock import CudaTimes, timing_event, wait_for
from syncviz.record.events import BucketCall, BucketScope, CollectiveCall, Phase
from syncviz.record.options import StepSelection
from syncviz.record.phases import PhaseHooks, release_backward_wrapper
from syncviz.record.runmeta import write_run_meta
from syncviz.trace import RankWriter
from syncviz.trace import schema as S


# A step whose collectives are still in flight waits this many steps for them before it is written
# anyway (their rows then end at -1 and the reader drops them, as before this wait existed).
LATE_STEPS = 16
# Rank 0 rewrites run.json (steps_recorded) at most this often: `syncviz trace` prints progress at
# most once a second, and a rewrite costs ~0.75 ms of CPU (timers in a traced short-steps run): at
# 0.5 s it was ~20 µs a step there.
META_INTERVAL_S = 1.0


_start_of = attrgetter("start")          # a Phase's start: the step's phases sorted by it
_NO_RANGE = contextlib.nullcontext()    # profile_range outside --profile: one, reused (it keeps no state)


class Recorder(PhaseHooks, CudaTimes, ProcessGroupClock):
    """One per rank. Collects the records of the current step; end_step() writes them."""

    def __init__(self, run_dir: str | os.PathLike, *, rank: int | None = None,
                 world_size: int | None = None, name: str | None = None,
                 steps: str | None = None, command: list[str] | None = None,
                 strategy: str | None = None, engine: str = "torch", profiler=None):
        self.run_dir = Path(run_dir)
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        self.selection = StepSelection(steps)
        self.name = name or self.run_dir.name
        self.command = command
        self.strategy = strategy
        self.engine = engine
        self.profiler = profiler
        self._writer: RankWriter | None = None   # opened once the rank is known (see writer)
        self.meta_extra: dict[str, Any] = {}
        # clock: aligned = local + offset − t0 (t0 = rank 0's clock when alignment happened)
        self.offset_ns, self.error_ns, self.t0 = 0, 0, clock.local_ns()
        self.group = None
        # the current step's records
        self.step = 0
        self._native, self._native_tried = None, False    # record/native's C++ gradient-ready log, if built
        self.micro_sinks: list = []             # C++ logs that stamp the micro-step (set_micro)
        self.bucket_sources: list = []          # timed_group.TimedBuckets: records taken at end_step
        self.micro = -1
        self._phases: list[Phase] = []
        self._ready: list = []                  # GradReady records
        self._buckets: list[BucketCall] = []
        self._collectives: list[CollectiveCall] = []
        self.settle_collectives: Callable | None = None   # set by syncviz.record.collectives.install
        self._tls = threading.local()           # the bucket in progress is per thread
        self._quiet = 0                         # > 0 while syncviz runs its own collectives
        self._step_start = None
        self._layouts_seen: set[tuple[int, int]] = set()
        self._layout_rows: dict[int, dict[str, list]] = {}
        self._written_layouts: dict[int, dict[str, list]] = {}
        self._bucket_param_cache: dict[tuple[int, int], list[int]] = {}
        self._pending: list[tuple] = []          # built steps not yet written (CUDA events pending)
        self._anchor: tuple | None = None       # (host ns, CUDA event) at the step's first forward
        self._cuda = False                      # an instrumented model lives on a CUDA device
        self._gpu_clock = None                  # cudaclock.GpuClock, once a CUDA model is instrumented
        self._param_index: dict[int, tuple[int, str]] = {}    # id(param) → (index, name)
        self._names_by_index: dict[int, str] = {}
        self._names_array = None                # _param_names()
        self._hook_handles: list = []
        self._close_callbacks: list[Callable[["Recorder"], None]] = []
        self._step_callbacks: list[Callable[[int], None]] = []
        self.grad_values = None                 # record/grads.py when --grad-values (opt-in)
        self.closed = False
        self._last_meta_write = 0.0
        self._meta_identity: dict | None = None  # run.json's run_id and created, once written
        self.observed: dict[str, Any] = {}      # what ran, as seen (discover.name_strategy names it)
        self._init_phases()
        self._discovery = RootDiscovery(self)   # the model's root module(s) when no wrapper says

    # ---------------------------------------------------------------- public API for reporters
    @property
    def current_bucket(self) -> int:
        """Index of the bucket whose hook is running in this thread (-1 outside one). Per thread:
        a compression hook (PowerSGD) issues its later collectives from future callbacks on the
        backend's thread, while the training thread may be in another bucket."""
        return getattr(self._tls, "bucket", -1)

    def in_bucket(self, index: int) -> BucketScope:
        """Collectives issued inside the block (on this thread) belong to bucket ``index``."""
        return BucketScope(self._tls, index)

    @property
    def micro(self) -> int:
        """The micro-step (backward) in progress; the C++ logs that stamp it read it from their own copy."""
        return self._micro

    @micro.setter
    def micro(self, value: int) -> None:
        self._micro = value
        for sink in self.micro_sinks:
            sink.set_micro(value)

    @property
    def quiet(self) -> bool:
        """True while syncviz runs collectives of its own (they are not training communication)."""
        return self._quiet > 0

    @contextlib.contextmanager
    def own_collectives(self):
        """syncviz's own collectives (clock alignment, rank info, memory gather) inside this block
        are not recorded as training communication (syncviz.record.collectives checks ``quiet``)."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def begin_bucket(self, index: int, layout: int, nbytes: int, dtype, hook: str) -> BucketCall:
        """A gradient bucket's hook was entered now; set ``.done`` (``now()``) when it completes."""
        call = BucketCall(index, layout, self.now(), nbytes, S.dtype_name(dtype), hook, self.micro)
        self._buckets.append(call)
        return call

    def add_bucket(self, call: BucketCall) -> None:
        """A bucket timed elsewhere (record/timed_group.py: in C++), with its times set."""
        self._buckets.append(call)

    def add_collective(self, call: CollectiveCall, device=None) -> CollectiveCall:
        """A collective (or an engine's own bucket row) of this step; ``.done`` set later (collective_done).
        On a CUDA ``device`` its start/end come from CUDA events, the start recorded now, just before
        the caller issues it (an NCCL future completes at enqueue: host stamps would not time it)."""
        if device is not None and device.type == "cuda":
            call.cuda = [timing_event(device), None, device]
        self._collectives.append(call)
        return call

    def inflight(self) -> dict:
        """This step's unfinished communication for the hang watchdog (record/watchdog.py); any
        thread may call it: it copies the lists (atomic under the GIL) and only reads."""
        return {"step": self.step, "micro": self.micro, "now": self.now(),
                "steps_written": self._writer.steps_written if self._writer else 0,
                "collectives": [c for c in list(self._collectives) if c.done < 0],
                "buckets": [b for b in list(self._buckets) if b.done < 0]
                + [b for src in list(self.bucket_sources) for b in src.inflight()]}

    def add_phase(self, kind: str, name: str, start: int, end: int, depth: int = -1) -> None:
        """A compute interval reported by an engine that has no hooks of its own (aligned ns)."""
        self._phases.append(Phase(kind, name, start, end, self.micro, depth))

    def layout_seen(self, layout: int, index: int) -> bool:
        return (layout, index) in self._layouts_seen

    def note_layout(self, layout: int, index: int, params, numels=None) -> None:
        """First sight of bucket ``index`` in a layout version: which parameters it holds, in order
        (parameters numbered by index_params). ``numels``: their full sizes where ``numel()`` is
        not (DeepSpeed's ZeRO-3 partitions parameters in place)."""
        self._layouts_seen.add((layout, index))
        rows = self._layout_rows.setdefault(layout, {c: [] for c in S.LAYOUT_COLUMNS})
        offset = 0
        params = list(params)
        for p, k in zip(params, numels or [p.numel() for p in params]):
            i, name = self.param_index(p)
            for c, v in zip(S.LAYOUT_COLUMNS, (layout, index, name, i, k, offset, S.dtype_name(p.dtype))):
                rows[c].append(v)
            offset += k

    def add_hook_handle(self, handle) -> None:
        """A hook handle removed when the recorder closes."""
        self._hook_handles.append(handle)

    def on_close(self, callback: Callable[["Recorder"], None]) -> None:
        self._close_callbacks.append(callback)

    def on_step_end(self, callback: Callable[[int], None]) -> None:
        """``callback(step)`` at every step boundary (a reporter flushes its own file there)."""
        self._step_callbacks.append(callback)

    def annotate(self, **fields) -> None:
        """Add run-level facts to run.json (rank 0 writes it)."""
        self.meta_extra.update(fields)
        self.write_meta()

    def observe(self, **facts) -> None:
        """Record what ran (wrapper, comm hook, sharding, ...); run.json's strategy is named from
        these unless set_strategy set it explicitly (discover.name_strategy)."""
        for k, v in facts.items():
            if k in ("wrappers", "optimizers", "reshard_after_forward"):
                self.observed.setdefault(k, [])
                if v not in self.observed[k]:
                    self.observed[k].append(v)
            else:
                self.observed[k] = v
        self.write_meta()

    def stop_discovery(self) -> None:
        """A model was instrumented explicitly (DDP, FSDP2, an engine): no root discovery."""
        if self._discovery is not None:
            self._discovery.stop()
            self._discovery = None

    def last_forward_mark(self):
        """The marker of the provisional forward recorded last (list [reached]; None if none)."""
        return self._fwd_open[-1][3] if self._fwd_open else None

    def set_strategy(self, strategy: str | None = None, engine: str | None = None) -> None:
        if strategy:
            self.strategy = strategy
        if engine:
            self.engine = engine

    @property
    def writer(self) -> RankWriter:
        """The rank's stream, opened on first use: ranks started by the user (mp.spawn) learn
        their rank only at init_process_group."""
        if self._writer is None:
            self._writer = RankWriter(self.run_dir, self.rank)
        return self._writer

    # ---------------------------------------------------------------- clock and process group
    def now(self) -> int:
        return clock.local_ns() + self.offset_ns - self.t0

    # ---------------------------------------------------------------------- run.json (rank 0)
    def write_meta(self, finished: bool = False) -> None:
        if self.rank == 0:    # run_id and created: kept from the first write (write_run_meta)
            steps = self._writer.steps_written if self._writer else 0
            self._meta_identity = write_run_meta(self, self._meta_identity, steps, finished)
            self._last_meta_write = time.monotonic()

    # ------------------------------------------------------------------------- profiling
    def profile_range(self, index: int, nbytes: int):
        """A named range per bucket collective in torch.profiler traces (--profile), e.g.
        "bucket 3 all_reduce 25.0 MB"; nothing outside the profiled steps."""
        if self.profiler is None:
            return _NO_RANGE
        return self.profiler.bucket_range(index, "all_reduce", nbytes)

    # ------------------------------------------------------------------------- step boundary
    def end_step(self) -> None:
        """Step boundary: turn this step's records into one record batch and write it."""
        step = self.step
        self._settle_forwards()
        for source in self.bucket_sources:    # buckets timed in C++ (timed_group.py)
            source.settle()
        self._phases.sort(key=_start_of)   # forwards are appended once a backward reached them
        if self._collectives:
            ops = self.observed.setdefault("collective_ops", [])
            ops.extend({c.op for c in self._collectives if c.kind == S.COLLECTIVE and c.op not in ops})
        if self._discovery is not None and self._discovery.step_ended():
            self._discovery = None
        if step in self.selection:
            cuda = [c for c in self._buckets + self._collectives if c.cuda is not None]
            # collectives still in flight at the boundary (an async all-reduce waited steps later):
            # the step is written once their completion callbacks have stamped them (LATE_STEPS at most)
            late = [c for c in self._collectives if c.done < 0 and c.work is not None and c.cuda is None]
            cols = self._build_batch(step)
            self._pending.append((cols, cuda, self._anchor, [c for c in late if c.done < 0], step))
            self._write_ready_steps()
            if self.rank == 0 and time.monotonic() - self._last_meta_write > META_INTERVAL_S:
                self.write_meta()
        for cb in self._step_callbacks:
            cb(step)
        self._reset_step()
        self.step += 1
        if self.profiler is not None:
            self.profiler.on_step_end(step)

    def _write_ready_steps(self, wait: bool = False) -> None:
        """Write built steps in order. A step with CUDA collectives waits (a step or more) until
        its events have completed, then gets GPU-side start/end times (batch.apply_cuda_times).
        ``wait`` (close) spins on the events: torch.cuda.synchronize() raises under a user's
        set_sync_debug_mode("error"), and close() would have dropped the pending steps with it."""
        while self._pending:
            cols, cuda, anchor, late, built = self._pending[0]
            if late:
                if not wait and any(c.done < 0 for c in late) and self.step - built < LATE_STEPS:
                    return
                for _ in range(100 if wait else 0):   # close: let queued completion callbacks stamp them
                    if all(c.done >= 0 for c in late):
                        break
                    time.sleep(0.0001)
                stamp_late_ends(cols, late)
            if cuda:
                events = [e for b in cuda for e in b.cuda[:2]] + ([anchor[1]] if anchor else [])
                if wait:
                    wait_for(events)
                elif not all(e is not None and e.query() for e in events):
                    return
                apply_cuda_times(cols, cuda, anchor, self._gpu_clock)
            cols.write_to(self.writer)
            self._pending.pop(0)

    def _reset_step(self):
        self._anchor = None
        self._phases = []
        self._ready.clear()          # the grad hooks hold this list: clear, don't replace
        self._buckets = []
        self._collectives = []
        self._reset_phases()
        self._step_start = None
        self.micro = -1

    def _build_batch(self, step: int):
        if self._collectives and self.settle_collectives is not None:
            self.settle_collectives(self._collectives)   # completion callbacks still queued
        cols = build_batch(step, phases=self._phases, ready=self._take_ready(), buckets=self._buckets,
                           collectives=self._collectives, base=self.offset_ns - self.t0,
                           world_size=self.world_size, step_start=self._step_start,
                           param_name=self._param_name, bucket_params=self._bucket_params,
                           param_names=self._param_names())
        if self._layout_rows:
            self._flush_layouts()
        return cols

    def _param_name(self, i: int) -> str:
        if len(self._names_by_index) != len(self._param_index):
            self._names_by_index = {idx: n for idx, n in self._param_index.values()}
        return self._names_by_index.get(i, f"param{i}")

    def _param_names(self):
        """Every parameter's name by index as one Arrow array, rebuilt when parameters were added:
        a step's gradient-ready names are taken from it (1,200 Python calls a step cost ~0.3 ms)."""
        if self._names_array is None or len(self._names_array) != len(self._param_index):
            self._names_array = pa.array([self._param_name(i) for i in range(len(self._param_index))], pa.string())
        return self._names_array

    def _bucket_params(self, layout: int, index: int) -> list[int]:
        key = (layout, index)
        if key not in self._bucket_param_cache:
            rows = self._layout_rows.get(layout) or self._written_layouts.get(layout, {})
            self._bucket_param_cache[key] = [pi for b, pi in zip(rows.get("bucket", []), rows.get("param_index", []))
                                             if b == index]
        return self._bucket_param_cache[key]

    def _flush_layouts(self) -> None:
        # A layout version is written once all its buckets have been seen (end of a step).
        for layout, rows in sorted(self._layout_rows.items()):
            self.writer.write_layout(rows)
            self._written_layouts[layout] = rows
        self._layout_rows = {}

    # ------------------------------------------------------------------------- lifecycle
    def close(self, finished: bool = True) -> None:
        """Write what is complete and close the stream. A step still open is dropped."""
        if self.closed:
            return
        self.closed = True
        self.stop_discovery()
        release_backward_wrapper(self)
        if self._layout_rows:
            self._flush_layouts()
        with contextlib.suppress(Exception):
            self._write_ready_steps(wait=True)
        try:
            self.writer.close()
        except Exception as e:     # disk full, file removed: one line, the rest still closes
            import sys
            print(f"[syncviz] rank {self.rank}: could not write the trace stream: {e}", file=sys.stderr, flush=True)
        for h in self._hook_handles + getattr(self, "_opt_handles", []):
            with contextlib.suppress(Exception):
                h.remove()
        if self.profiler is not None:
            with contextlib.suppress(Exception):
                self.profiler.close()
        self.write_meta(finished=finished)
        for cb in self._close_callbacks:
            cb(self)
        first_pass.keep(self.rank, self.world_size, self._writer, finished)
        # After the last step gloo's threads may still be releasing its Python objects; if the
        # process ends first it aborts (record/quiesce.py). close() is the one point every way of
        # tracing passes after the last step: `syncviz trace`, syncviz.tracing(), instrument().
        from syncviz.record.quiesce import quiesce
        quiesce()
