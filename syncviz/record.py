"""Recording inside each rank: hooks that time DDP's gradient buckets, forward, backward and the
optimizer, buffered per step and flushed to the rank's Arrow stream at step boundaries.

Rules (DESIGN.md): a hook only appends a tuple to a list (no device sync, no I/O, no allocation
of tensors); everything else happens at the step boundary (optimizer post-step hook). Tracing
never changes a bit of the training result: the default bucket hook is torch's own all-reduce
hook (divide by world size, then all-reduce), which is bitwise what DDP's C++ default does.

Use from code (ranks launched yourself)::

    with syncviz.tracing("traces/myrun"):      # every DDP model built inside is instrumented
        ...
    # or
    model = syncviz.instrument(DDP(net))       # starts a recorder in ./traces/<auto> if none

``syncviz trace`` does the same through syncviz.bootstrap before the user's script runs.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from . import __version__
from . import clock
from . import schema as S
from .trace import RankWriter, new_meta, write_json_atomic

_ACTIVE: "Recorder | None" = None


def get_recorder() -> "Recorder | None":
    """The recorder of this process, if tracing is on (other modules add events through it)."""
    return _ACTIVE


class StepSelection:
    """Which optimizer steps to keep: 'all', 'A:B' (inclusive A, exclusive B), or 'N,M,...'."""

    def __init__(self, spec: str | None = None):
        self.spec = (spec or "all").strip()
        self._range = None
        self._set = None
        if self.spec in ("all", ""):
            return
        try:
            if ":" in self.spec:
                a, b = self.spec.split(":", 1)
                self._range = (int(a) if a else 0, int(b) if b else None)
            else:
                self._set = {int(x) for x in self.spec.split(",") if x.strip()}
        except ValueError:
            raise ValueError(f"bad step selection {spec!r}: use 'all', 'A:B' or 'N,M,...'") from None

    def __contains__(self, step: int) -> bool:
        if self._range:
            a, b = self._range
            return step >= a and (b is None or step < b)
        if self._set is not None:
            return step in self._set
        return True

    def done_after(self, step: int) -> bool:
        return bool(self._range and self._range[1] is not None and step + 1 >= self._range[1])


class Recorder:
    """One per rank. Collects events of the current step in plain lists; flush() writes them."""

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
        self.offset_end = None
        self.group = None
        # current step state
        self.step = 0
        self.micro = -1
        self._events: list[tuple] = []          # (kind, name, start, end, micro, extra-dict|None)
        self._ready: list[tuple[int, int, int]] = []     # (param_index, t, micro)
        self._buckets: list[list] = []
        self._collectives: list[list] = []      # filled by syncviz.collectives (issue 3)
        self.settle_collectives: Callable | None = None   # set by syncviz.collectives.install
        self._bwd_start: dict[int, int] = {}    # micro → t
        self._tls = threading.local()           # _in_bucket is per thread (see the property)
        self._quiet = 0                         # > 0 while syncviz runs its own collectives
        self._fwd_depth = 0                     # nesting of instrumented modules' forwards
        self._opt_depth = 0
        self._opt_stack: list[tuple[int, str]] = []
        self._step_start = None
        self._layouts_seen: set[tuple[int, int]] = set()
        self._layout_rows: dict[int, dict[str, list]] = {}
        self._written_layouts: dict[int, dict[str, list]] = {}
        self._pending: list[tuple] = []          # built steps not yet written (CUDA events pending)
        self._anchor: tuple | None = None       # (host ns, CUDA event) at the step's first forward
        self._cuda = False                      # an instrumented model lives on a CUDA device
        self._param_index: dict[int, tuple[int, str]] = {}    # id(param) → (index, name)
        self._hook_handles: list = []
        self._lock = threading.Lock()
        self.closed = False
        self._last_meta_write = 0.0
        self._install_optimizer_hooks()

    @property
    def _in_bucket(self) -> int:
        """Index of the DDP bucket whose comm hook is running in this thread (-1 outside one).
        Per thread: a compression hook (PowerSGD) issues its later collectives from future
        callbacks on the backend's thread, while the training thread may be in another bucket."""
        return getattr(self._tls, "bucket", -1)

    @_in_bucket.setter
    def _in_bucket(self, index: int) -> None:
        self._tls.bucket = index

    @contextlib.contextmanager
    def own_collectives(self):
        """syncviz's own collectives (clock alignment, rank info, memory gather) inside this block
        are not recorded as training communication (syncviz.collectives checks the flag)."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

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
        if self._events:   # re-base what was recorded before alignment (usually nothing)
            self._rebase(self.offset_ns - self.t0 - old_base)
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

    def _rebase(self, delta: int) -> None:
        self._events = [(k, n, s + delta, e + delta, m, x) for k, n, s, e, m, x in self._events]

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

    # ---------------------------------------------------------------------- run.json (rank 0)
    def write_meta(self, finished: bool = False) -> None:
        if self.rank != 0:
            return
        meta = new_meta(self.name, self.world_size, command=self.command, backend=None,
                        device="cpu", strategy=self.strategy or "ddp", engine=self.engine,
                        torch_version=torch.__version__, syncviz_version=__version__)
        path = self.run_dir / S.RUN_FILE
        if path.exists():   # keep run_id/created of the first write
            import json
            with contextlib.suppress(Exception):
                old = json.loads(path.read_text())
                meta["run_id"], meta["created"] = old["run_id"], old["created"]
        meta.update(self.meta_extra)
        meta["steps_recorded"] = self._writer.steps_written if self._writer else 0
        meta["finished"] = finished
        write_json_atomic(path, meta)
        self._last_meta_write = time.monotonic()

    def instrument_ddp(self, ddp: torch.nn.Module) -> torch.nn.Module:
        """Time every gradient bucket of a DDP model (see syncviz.record_ddp)."""
        from .record_ddp import instrument_ddp
        return instrument_ddp(self, ddp)

    def instrument_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Forward, backward-start and gradient-ready instrumentation of a model that is not DDP
        (an FSDP2 ``fully_shard`` module; its collectives come from syncviz.collectives). Nested
        instrumented modules (FSDP2 blocks inside the root) count one forward: the outermost."""
        if getattr(module, "_syncviz_instrumented", False):
            return module
        module._syncviz_instrumented = True
        self._index_params(module)
        # prepend: FSDP2's own hooks (the root's all-gather before forward, its pre-backward
        # all-gathers hooked on the outputs) must fall inside our forward and backward
        self._hook_handles.append(module.register_forward_pre_hook(self._forward_pre, prepend=True))
        self._hook_handles.append(module.register_forward_hook(self._forward_post_first, prepend=True))
        self._module_meta(module)
        self.write_meta()
        return module

    def _index_params(self, module: torch.nn.Module) -> None:
        """Number the parameters and hook their gradient accumulation. Sharded DTensor parameters
        (FSDP2) are skipped: FSDP2 accumulates into separate unsharded tensors, and the
        reduce-scatter collectives mark when a group's gradients were ready."""
        names = {id(p): n for n, p in module.named_parameters()}
        for p in module.parameters():
            if id(p) in self._param_index:
                continue
            i = len(self._param_index)
            self._param_index[id(p)] = (i, names.get(id(p), f"param{i}"))
            if p.requires_grad and not _is_dtensor(p):
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))

    def _module_meta(self, module: torch.nn.Module) -> None:
        params = list(module.parameters())   # DTensor numel() is the global (unsharded) size
        name = type(module).__name__
        if name.startswith("FSDP") and len(type(module).__mro__) > 2:   # FSDP2's FSDP<cls> subclass
            name = name[4:]
        self.meta_extra["model"] = {
            "name": name, "params": sum(p.numel() for p in params),
            "bytes": sum(p.numel() * p.element_size() for p in params),
            "grad_bytes": sum(p.numel() * p.element_size() for p in params if p.requires_grad)}
        self.meta_extra["device"] = params[0].device.type if params else "cpu"
        self._cuda = self._cuda or self.meta_extra["device"] == "cuda"

    # ------------------------------------------------------------------------- hooks
    def _grad_hook(self, index: int):
        ready = self._ready

        def hook(p, _i=index):
            ready.append((_i, clock.local_ns(), self.micro))
        return hook

    def _forward_pre(self, module, args):
        # Only the outermost instrumented forward counts, and not a recomputation inside backward
        # (activation checkpointing re-runs forwards while the autograd engine is running).
        if torch._C._current_graph_task_id() != -1:
            return
        self._fwd_depth += 1
        if self._fwd_depth > 1:
            return
        t = self.now()
        if self._step_start is None:
            self._step_start = t
            if self.profiler is not None:
                self.profiler.on_step_begin(self.step)
            if self._cuda:
                anchor = torch.cuda.Event(enable_timing=True)
                anchor.record()
                self._anchor = (t, anchor)
        self.micro += 1
        self._fwd_start = t

    def _forward_post(self, module, args, output):
        if torch._C._current_graph_task_id() != -1:
            return
        self._fwd_depth = max(0, self._fwd_depth - 1)
        if self._fwd_depth:
            return
        t = self.now()
        self._events.append((S.FORWARD, "forward", self._fwd_start, t, self.micro, None))
        if torch.is_grad_enabled():
            micro = self.micro
            for tensor in _tensors(output):
                if tensor.grad_fn is not None:
                    tensor.grad_fn.register_prehook(self._backward_start(micro))

    def _forward_post_first(self, module, args, output):
        """_forward_post for hooks that run before the module's other hooks: backward start is a
        tensor hook on the outputs, which runs before hooks registered later on the same tensors."""
        if torch._C._current_graph_task_id() != -1:
            return
        self._fwd_depth = max(0, self._fwd_depth - 1)
        if self._fwd_depth:
            return
        self._events.append((S.FORWARD, "forward", self._fwd_start, self.now(), self.micro, None))
        if torch.is_grad_enabled():
            for tensor in _tensors(output):
                if tensor.requires_grad and tensor.grad_fn is not None:
                    tensor.register_hook(self._backward_start_tensor(self.micro))

    def _backward_start_tensor(self, micro: int):
        # FSDP2 queues its own end-of-backward callback (the root's reduce-scatter) after ours:
        # end the backward row one callback later, after it (callbacks may queue callbacks)
        prehook = self._backward_start(micro, defer=True)

        def hook(grad):
            prehook((grad,))
        return hook

    def _backward_start(self, micro: int, defer: bool = False):
        def prehook(grad_outputs):
            if micro not in self._bwd_start:
                t = self.now()
                self._bwd_start[micro] = t
                engine = torch.autograd.Variable._execution_engine
                end = lambda: self._events.append((S.BACKWARD, "backward", t, self.now(), micro, None))  # noqa: E731
                engine.queue_callback((lambda: engine.queue_callback(end)) if defer else end)
        return prehook

    def _install_optimizer_hooks(self) -> None:
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        self._opt_handles = [register_optimizer_step_pre_hook(self._opt_pre),
                             register_optimizer_step_post_hook(self._opt_post)]

    def _opt_pre(self, opt, args, kwargs):
        self._opt_stack.append((self.now(), type(opt).__name__))

    def _opt_post(self, opt, args, kwargs):
        if not self._opt_stack:
            return
        start, name = self._opt_stack.pop()
        self._events.append((S.OPTIMIZER, name, start, self.now(), self.micro,
                             {"layout": len(self._opt_stack)}))   # nesting depth (ZeRO wraps Adam)
        if not self._opt_stack:
            self.end_step()

    # ------------------------------------------------------------------------- profiling
    def profile_range(self, index: int, buf):
        """A named range per bucket collective in torch.profiler traces (--profile), e.g.
        "bucket 3 all_reduce 25.0 MB"; nothing outside the profiled steps."""
        if self.profiler is None:
            return contextlib.nullcontext()
        return self.profiler.bucket_range(index, "all_reduce", buf.numel() * buf.element_size())

    # ------------------------------------------------------------------------- flush
    def end_step(self) -> None:
        """Step boundary: turn this step's raw records into one record batch and write it."""
        step = self.step
        if step in self.selection:
            cuda = [b for b in self._buckets if b[9] is not None]
            self._pending.append((self._build_batch(step), cuda, self._anchor))
            self._write_ready_steps()
            if self.rank == 0 and time.monotonic() - self._last_meta_write > 0.5:
                self.write_meta()
        self._reset_step()
        self.step += 1
        if self.profiler is not None:
            self.profiler.on_step_end(step)

    def _write_ready_steps(self, wait: bool = False) -> None:
        """Write built steps in order. A step with CUDA collectives waits (a step or more) until
        its events have completed, then gets GPU-side start/end times: anchor host time + the
        anchor event's elapsed time to each collective's start/end event."""
        while self._pending:
            cols, cuda, anchor = self._pending[0]
            if cuda:
                events = [e for b in cuda for e in b[9]] + ([anchor[1]] if anchor else [])
                if not wait and not all(e is not None and e.query() for e in events):
                    return
                if wait:
                    torch.cuda.synchronize()
                from .record_ddp import apply_cuda_times
                apply_cuda_times(cols, cuda, anchor)
            self.writer.write_step(cols)
            self._pending.pop(0)

    def _reset_step(self):
        self._anchor = None
        self._events.clear()
        self._ready.clear()
        self._buckets.clear()
        self._collectives.clear()
        self._bwd_start.clear()
        self._fwd_depth = 0
        self._step_start = None
        self.micro = -1

    def _build_batch(self, step: int) -> dict[str, list]:
        base = self.offset_ns - self.t0
        cols = {c: [] for c in S.EVENT_COLUMNS}
        if self._collectives and self.settle_collectives is not None:
            self.settle_collectives(self._collectives)   # completion callbacks still queued

        def add(kind, name, start, end, micro=0, bucket=-1, op="", nbytes=0, dtype="", group_size=0,
                ready=-1, launch=-1, phase="", layout=-1, logical=0):
            for c, v in zip(S.EVENT_COLUMNS, (step, micro, kind, name, start, end, bucket, op, nbytes,
                                              dtype, group_size, ready, launch, phase, layout, logical)):
                cols[c].append(v)

        phases = []   # (start, end, phase) for phase lookup
        for kind, name, s, e, micro, extra in self._events:
            add(kind, name, s, e, micro=max(micro, 0), layout=(extra or {}).get("layout", -1))
            phases.append((s, e, kind))
        ready_by = {}
        for i, t, micro in self._ready:
            t = t + base
            name = self._param_name(i)
            add(S.GRAD_READY, name, t, t, micro=max(micro, 0))
            key = (micro, i)
            ready_by[key] = max(ready_by.get(key, -1), t)
        group = self.world_size
        # What each bucket's hook really sent (a compression hook sends less than the bucket
        # holds): the collectives syncviz.collectives attributed to it. Columns 1, 6, 8, 9 of a
        # collective row are micro, bucket, bytes and dtype (schema.EVENT_COLUMNS order).
        sent: dict[tuple[int, int], int] = {}
        sent_dtype: dict[tuple[int, int], str] = {}
        for row in self._collectives:
            if row[6] >= 0:
                key = (row[1], row[6])
                sent[key] = sent.get(key, 0) + row[8]
                sent_dtype.setdefault(key, row[9])
        for index, layout, launch, done, nbytes, dtype, hook_name, micro, _, cuda_ev in self._buckets:
            pidx = self._bucket_params(layout, index)
            ready = max((ready_by.get((micro, i), -1) for i in pidx), default=-1)
            key = (max(micro, 0), index)
            add(S.BUCKET, hook_name, launch, done, micro=max(micro, 0), bucket=index, op="all_reduce",
                nbytes=sent.get(key, nbytes), dtype=sent_dtype.get(key, _dt(dtype)), group_size=group,
                ready=ready, launch=launch, phase=_phase(launch, phases), layout=layout, logical=nbytes)
        for row in self._collectives:   # rows appended by syncviz.collectives, already in column order
            rec = dict(zip(S.EVENT_COLUMNS, row))
            rec["step"] = step
            rec["phase"] = rec["phase"] or _phase(rec["launch_ns"], phases)
            for c in S.EVENT_COLUMNS:
                cols[c].append(rec[c])
        starts = [s for s in cols["start_ns"] if s >= 0]
        ends = cols["end_ns"]
        if starts:
            add(S.STEP, "step", self._step_start if self._step_start is not None else min(starts),
                max(ends), micro=0)
        if self._layout_rows:
            self._flush_layouts()
        return cols

    def _param_name(self, i: int) -> str:
        if not hasattr(self, "_names_by_index"):
            self._names_by_index = {}
        if len(self._names_by_index) != len(self._param_index):
            self._names_by_index = {idx: n for idx, n in self._param_index.values()}
        return self._names_by_index.get(i, f"param{i}")

    def _bucket_params(self, layout: int, index: int) -> list[int]:
        cache = self.__dict__.setdefault("_bucket_param_cache", {})
        key = (layout, index)
        if key not in cache:
            rows = self._layout_rows.get(layout) or self._written_layouts.get(layout, {})
            cache[key] = [pi for b, pi in zip(rows.get("bucket", []), rows.get("param_index", [])) if b == index]
        return cache[key]

    def _flush_layouts(self) -> None:
        # A layout version is written once all its buckets have been seen (end of a step).
        for layout, rows in sorted(self._layout_rows.items()):
            self.writer.write_layout(rows)
            self._written_layouts[layout] = rows
        self._layout_rows = {}

    # ------------------------------------------------------------------------- lifecycle
    def close(self, finished: bool = True) -> None:
        """Write what is complete and close the stream. A step still open is dropped."""
        global _ACTIVE
        if self.closed:
            return
        self.closed = True
        if self._layout_rows:
            self._flush_layouts()
        with contextlib.suppress(Exception):
            self._write_ready_steps(wait=True)
        self.writer.close()
        for h in self._hook_handles + getattr(self, "_opt_handles", []):
            with contextlib.suppress(Exception):
                h.remove()
        if self.profiler is not None:
            with contextlib.suppress(Exception):
                self.profiler.close()
        self.write_meta(finished=finished)
        if _ACTIVE is self:
            _ACTIVE = None


# ----------------------------------------------------------------------------- helpers

def _phase(t: int, phases: list[tuple[int, int, str]]) -> str:
    for s, e, kind in phases:
        if s <= t <= e and kind in (S.FORWARD, S.BACKWARD, S.OPTIMIZER):
            return kind
    return "other"


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" or hasattr(t, "_local_tensor")


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tensors(obj) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, k))


# ------------------------------------------------------------------------ public entry points

_DDP_PATCHED = False


def start(run_dir: str | os.PathLike, **kwargs) -> Recorder:
    """Start this process's recorder (one per process) and hook torch so that DDP models and
    process groups created from now on are instrumented."""
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    _ACTIVE = Recorder(run_dir, **kwargs)
    _patch_torch()
    atexit.register(_close_at_exit)
    if dist.is_available() and dist.is_initialized():
        _ACTIVE.attach_process_group()
    return _ACTIVE


def _close_at_exit():
    if _ACTIVE is not None:
        _ACTIVE.close(finished=True)


def _patch_torch() -> None:
    """Instrument DDP at construction and align clocks when the process group comes up."""
    global _DDP_PATCHED
    if _DDP_PATCHED:
        return
    _DDP_PATCHED = True
    from torch.nn.parallel import DistributedDataParallel as DDP
    orig_init = DDP.__init__

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if _ACTIVE is not None and not _ACTIVE.closed:
            _ACTIVE.instrument_ddp(self)

    DDP.__init__ = __init__
    _patch_fully_shard()
    orig_ipg = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if kwargs.get("backend") is None and not args and os.environ.get("SYNCVIZ_BACKEND"):
            kwargs["backend"] = os.environ["SYNCVIZ_BACKEND"]
        out = orig_ipg(*args, **kwargs)
        if _ACTIVE is not None and not _ACTIVE.closed:
            _ACTIVE.attach_process_group()
        return out

    dist.init_process_group = init_process_group
    torch.distributed.distributed_c10d.init_process_group = init_process_group
    orig_destroy = dist.destroy_process_group

    def destroy_process_group(group=None):
        if _ACTIVE is not None and not _ACTIVE.closed and group is None:
            _ACTIVE.measure_drift()
            _ACTIVE.close(finished=True)
        return orig_destroy(group)

    dist.destroy_process_group = destroy_process_group


def _patch_fully_shard() -> None:
    """FSDP2: every module passed to ``fully_shard`` while tracing gets forward/backward hooks
    (the nested ones defer to the outermost). Patched where users import it from."""
    import importlib
    try:
        impl = importlib.import_module("torch.distributed.fsdp._fully_shard._fully_shard")
        orig = impl.fully_shard
    except (ImportError, AttributeError):
        return

    @functools.wraps(orig)    # keeps contract's `fully_shard.state`, which torch itself calls
    def fully_shard(module, *args, **kwargs):
        out = orig(module, *args, **kwargs)
        if _ACTIVE is not None and not _ACTIVE.closed:
            for m in (out if isinstance(out, (list, tuple)) else [out]):
                _ACTIVE.instrument_module(m)
        return out

    # the public names only: torch's implementation module refers to its own fully_shard
    for name in ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                 "torch.distributed._composable.fsdp"):
        with contextlib.suppress(ImportError, AttributeError):
            mod = importlib.import_module(name)
            if getattr(mod, "fully_shard", None) is orig:
                mod.fully_shard = fully_shard


def instrument(model: torch.nn.Module, out: str | os.PathLike | None = None, **kwargs) -> torch.nn.Module:
    """Instrument an existing DDP model (starting a recorder if none is active). Returns it."""
    rec = _ACTIVE or start(out or _default_out(), **kwargs)
    from torch.nn.parallel import DistributedDataParallel as DDP
    if isinstance(model, DDP):
        rec.instrument_ddp(model)
    else:
        rec.instrument_module(model)
    return model


@contextlib.contextmanager
def tracing(out: str | os.PathLike | None = None, **kwargs):
    """Record every DDP model and collective created inside the block; closes the run at exit."""
    rec = start(out or _default_out(), **kwargs)
    try:
        yield rec
    except BaseException:
        rec.close(finished=False)
        raise
    else:
        rec.close(finished=True)


def _default_out() -> str:
    name = os.environ.get("SYNCVIZ_RUN_NAME") or time.strftime("run-%Y%m%d-%H%M%S")
    return os.path.join("traces", name)
