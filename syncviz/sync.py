"""syncviz's own bucketed data-parallel engine, small enough to read top to bottom.

Two strategies on the same buckets and the same clock, so their traces compare directly:

- ``all_reduce`` (DDP-like): each bucket is all-reduced; every rank ends backward with the
  averaged gradients in ``p.grad`` and steps the full optimizer.
- ``reduce_scatter`` (ZeRO-2-like): each bucket is reduce-scattered; rank r keeps only shard r of
  the averaged gradients (``p.grad`` is released once copied into the bucket) and the optimizer
  state of that shard, steps its shard, then all-gathers the updated parameters.

How a step runs:

1. Buckets are planned once, at construction: trainable parameters in reverse registration order
   (DDP's initial heuristic: gradients become ready from the output back; for syncviz.workloads.gpt the
   hooks' observed order matches it up to weight/bias swaps inside a layer), cut at
   ``bucket_cap_mb`` and at dtype changes. The layout never changes, so shards never move.
2. A post-accumulate-grad hook per parameter counts the bucket's ready gradients. When the last
   one arrives, ``syncviz.kernels.flatten_scale`` writes all of them into the bucket, times 1/N,
   cast to ``comm_dtype``, in one kernel launch, and the bucket's collective is launched with
   ``async_op=True``: it overlaps the rest of backward. Buckets launch in gradient-ready order
   (DDP instead launches in bucket-index order).
3. At the end of backward (an autograd engine callback) the engine waits for every bucket.
   all_reduce: ``unflatten`` writes the averages back into ``p.grad``.
4. ``engine.optimizer.step()``: all_reduce steps the wrapped optimizer on the parameters;
   reduce_scatter steps it on this rank's flat parameter shards, then all-gathers every bucket's
   parameters (async, one collective per bucket) and ``unflatten``s them into the parameters.

Public API (used by ``syncviz demo --engine syncviz --strategy all_reduce|reduce_scatter``)::

    engine = syncviz.sync.DataParallel(
        model,                        # nn.Module, same initial weights not required (rank 0's are broadcast)
        process_group=None,           # default: the WORLD group
        bucket_cap_mb=25.0,           # bucket size cap (MiB of parameter dtype), like DDP's
        strategy="all_reduce",        # or "reduce_scatter"
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),   # factory: list of tensors -> Optimizer
        comm_dtype=None)              # e.g. torch.bfloat16: buckets are cast for communication
    opt = engine.optimizer            # a torch.optim.Optimizer; its step() is the engine's step
    for x, y in batches:
        loss = engine(x, y)           # forward of the wrapped model (engine.module)
        loss.backward()               # buckets are reduced during backward
        opt.step()                    # (+ all-gather of parameters for reduce_scatter)
        opt.zero_grad(set_to_none=True)
    with engine.no_sync(): ...        # gradient accumulation: no communication in this backward

Every trainable parameter must get a gradient in each synchronized backward (like DDP with
``find_unused_parameters=False``); otherwise backward raises, naming the parameters.
Recording: when a syncviz recorder is active (``syncviz trace`` / ``syncviz.tracing``), the
engine reports forward/backward/optimizer phases, gradient-ready times, one ``bucket`` row per
bucket collective (ready, launch, done) and one ``collective`` row per parameter all-gather,
and its bucket layout: its runs are ordinary traces.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from syncviz.kernels import flatten_scale, unflatten
from syncviz.record.events import CollectiveCall
from syncviz.trace import schema as S

STRATEGIES = S.SYNC_STRATEGIES


# Looked up at call time: syncviz.record.collectives (the recorder) patches these functions in place.
# The *_tensor forms are deprecated in recent torch in favour of the *_single ones (same calls).
def _all_gather(out, inp, group, async_op=True):
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _reduce_scatter(out, inp, group, async_op=True):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)


def when_done(work, on_done: Callable[[], None]) -> torch.futures.Future:
    """A future that completes after ``work``, running ``on_done()`` at completion (it stamps the
    collective's end time) without blocking the caller."""
    try:
        fut = work.get_future()
    except RuntimeError:       # gloo's reduce-scatter and all-gather works have no future
        return _Watcher.instance().watch(work, on_done)

    def done(f):
        on_done()
        return f.value()       # re-raises a failed collective in whoever waits
    return fut.then(done)


class _Watcher:
    """One daemon thread that waits on future-less works in launch order (a process group runs
    its collectives in order, so FIFO waiting stamps each completion as it happens)."""
    _instance = None

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, name="syncviz-sync-watcher", daemon=True).start()

    @classmethod
    def instance(cls) -> "_Watcher":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def watch(self, work, on_done) -> torch.futures.Future:
        fut = torch.futures.Future()
        self.queue.put((work, on_done, fut))
        return fut

    def _run(self):
        while True:
            work, on_done, fut = self.queue.get()
            try:
                work.wait()                # releases the GIL while waiting
                on_done()
                fut.set_result(None)
            except Exception as e:         # noqa: BLE001 - handed to whoever waits on fut
                fut.set_exception(e)


@dataclass
class Bucket:
    """One gradient bucket: which parameters, its flat buffers, and this step's progress."""
    index: int
    params: list[nn.Parameter]
    numel: int                          # elements of gradients in the bucket
    buffer: torch.Tensor                # flat gradients (comm dtype), padded to a multiple of N
    shard: torch.Tensor | None = None   # reduce_scatter: this rank's reduced gradient shard
    master: torch.Tensor | None = None  # reduce_scatter: this rank's parameter shard (optimized)
    pending: int = 0                    # gradients not yet ready in this backward
    future: torch.futures.Future | None = None
    row: list | None = None             # trace row being filled (recording only)


def plan_buckets(params: Sequence[nn.Parameter], cap_bytes: int) -> list[list[int]]:
    """Indices into ``params``: reverse order, a new bucket at the cap or when the dtype changes."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        p = params[i]
        if current and (size >= cap_bytes or p.dtype != params[current[-1]].dtype):
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += p.numel() * p.element_size()
    return buckets + ([current] if current else [])


class DataParallel(nn.Module):
    """Bucketed gradient sync with overlap; see the module docstring for the API."""

    def __init__(self, module: nn.Module, process_group=None, *, bucket_cap_mb: float = 25.0,
                 strategy: str = "all_reduce",
                 optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
                 comm_dtype: torch.dtype | None = None):
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        if not dist.is_initialized():
            raise RuntimeError("syncviz.sync.DataParallel needs torch.distributed.init_process_group() first")
        self.module = module
        self.group = process_group or dist.group.WORLD
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.strategy, self.bucket_cap_mb, self.comm_dtype = strategy, bucket_cap_mb, comm_dtype
        self._sync = True                  # False inside no_sync()
        self._in_backward = False

        with torch.no_grad():              # same start on every rank, as DDP does
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=dist.get_global_rank(self.group, 0), group=self.group)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = [self._make_bucket(b, [self.params[i] for i in idx])
                        for b, idx in enumerate(plan_buckets(self.params, int(bucket_cap_mb * 2**20)))]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self.params]
        self._trace = _Trace.attach(self)
        self.optimizer = EngineOptimizer(self, optimizer) if optimizer is not None else None

    def _make_bucket(self, index: int, params: list[nn.Parameter]) -> Bucket:
        numel = sum(p.numel() for p in params)
        padded = -(-numel // self.world) * self.world     # reduce_scatter needs equal shards
        dtype = self.comm_dtype or params[0].dtype
        device = params[0].device
        b = Bucket(index, params, numel, torch.zeros(padded, dtype=dtype, device=device))
        if self.strategy == "reduce_scatter":
            shard = padded // self.world
            b.shard = torch.zeros(shard, dtype=dtype, device=device)
            flat = flatten_scale([p.detach() for p in params],
                                 torch.zeros(padded, dtype=params[0].dtype, device=device))
            b.master = flat[self.rank * shard:(self.rank + 1) * shard].clone()
        return b

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside accumulates into ``p.grad`` without communicating (gradient accumulation)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # ------------------------------------------------------------------------------- backward
    def _on_grad_ready(self, p: nn.Parameter) -> None:
        self._trace.grad_ready(p)
        if not self._sync:
            return
        if not self._in_backward:          # first gradient of this backward
            self._in_backward = True
            for b in self.buckets:
                b.pending = len(b.params)
            self._ready = set()
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        b = self._bucket_of[id(p)]
        self._ready.add(id(p))
        b.pending -= 1
        if b.pending == 0:
            self._launch(b)

    def _launch(self, b: Bucket) -> None:
        ready = self._trace.now()
        flatten_scale([p.grad for p in b.params], b.buffer, 1.0 / self.world)
        if self.strategy == "reduce_scatter":
            for p in b.params:
                p.grad = None              # ZeRO-2: the full gradient now lives only in the bucket
        b.row = self._trace.comm_row(b, "bucket", self.strategy, b.buffer, ready, logical_numel=b.numel)
        with self._trace.in_bucket(b.index):
            if self.strategy == "all_reduce":
                work = dist.all_reduce(b.buffer, group=self.group, async_op=True)
            else:
                work = _reduce_scatter(b.shard, b.buffer, self.group)
        # Completion time comes from a completion callback: no waiting, no device sync here.
        b.future = when_done(work, self._trace.done_callback(b.row))

    def _finish_backward(self) -> None:
        self._in_backward = False
        missing = [n for n, p in self.module.named_parameters() if p.requires_grad and id(p) not in self._ready]
        self._ready = set()
        if missing:
            for b in self.buckets:         # don't leave launched collectives behind
                if b.future is not None:
                    b.future.wait()
                    b.future = None
            raise RuntimeError("syncviz.sync: these parameters got no gradient in this backward, so "
                               f"their buckets were never reduced: {', '.join(missing[:8])}"
                               f"{' …' if len(missing) > 8 else ''}")
        for b in self.buckets:
            b.future.wait()
            b.future = None
            if self.strategy == "all_reduce":
                unflatten(b.buffer, [p.grad for p in b.params])

    # ------------------------------------------------------------------------------- step
    def _step_shards(self, inner: torch.optim.Optimizer, closure=None):
        """reduce_scatter: step this rank's shards, then all-gather every bucket's parameters."""
        for b in self.buckets:
            b.master.grad = b.shard if b.shard.dtype == b.master.dtype else b.shard.to(b.master.dtype)
        loss = inner.step(closure) if closure is not None else inner.step()
        gathered = []
        for b in self.buckets:
            # the gradient buffer is free now; reuse it when dtypes allow (no extra full-size copy)
            out = b.buffer if b.buffer.dtype == b.master.dtype else torch.empty(
                b.buffer.numel(), dtype=b.master.dtype, device=b.master.device)
            row = self._trace.comm_row(b, "collective", "all_gather", out, self._trace.now(), b.numel)
            with self._trace.in_bucket(b.index):
                work = _all_gather(out, b.master, self.group)
            gathered.append((b, out, when_done(work, self._trace.done_callback(row))))
        with torch.no_grad():
            for b, out, fut in gathered:
                fut.wait()
                unflatten(out, [p.detach() for p in b.params])
        return loss


class EngineOptimizer(torch.optim.Optimizer):
    """The user's optimizer, built by their factory on what this rank optimizes: all parameters
    (all_reduce) or this rank's flat parameter shards (reduce_scatter). A real Optimizer subclass,
    so optimizer hooks and LR schedulers see it; ``param_groups`` and ``state`` are the inner's."""

    def __init__(self, engine: DataParallel, factory: Callable[[list[torch.Tensor]], torch.optim.Optimizer]):
        self.engine = engine
        targets = engine.params if engine.strategy == "all_reduce" else [b.master for b in engine.buckets]
        self.inner = factory(targets)
        super().__init__(targets, dict(self.inner.defaults))
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    def step(self, closure=None):
        if self.engine.strategy == "all_reduce":
            return self.inner.step(closure) if closure is not None else self.inner.step()
        return self.engine._step_shards(self.inner, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.module.zero_grad(set_to_none=set_to_none)
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.inner.state_dict()          # reduce_scatter: this rank's shard only

    def load_state_dict(self, state_dict) -> None:
        self.inner.load_state_dict(state_dict)


# ----------------------------------------------------------------------------------- recording

class _Trace:
    """No recorder active: every report is a no-op."""

    @staticmethod
    def attach(engine: DataParallel) -> "_Trace":
        from syncviz.record.api import get_recorder
        rec = get_recorder()
        return _RecorderTrace(rec, engine) if rec is not None else _Trace()

    def now(self) -> int:
        return -1

    def grad_ready(self, p) -> None:
        pass

    def comm_row(self, b: Bucket, kind: str, op: str, buf: torch.Tensor, ready: int, logical_numel: int):
        return None

    def done_callback(self, row):
        return _nothing

    def in_bucket(self, index: int):
        return contextlib.nullcontext()


def _nothing():
    pass


class _RecorderTrace(_Trace):
    """Reports the engine to the rank's Recorder through its public API, in the same shape as its
    DDP hooks do: forward/backward phases through its module hooks, grad-ready times, rows of
    kind ``bucket`` (and ``collective`` for parameter all-gathers), and layout 0."""

    def __init__(self, rec, engine: DataParallel):
        self.rec, self.world = rec, engine.world
        self.index = rec.index_params(engine.module, hook_grads=False)   # the engine reports readiness
        rec.hook_forward(engine)
        for b in engine.buckets:
            rec.note_layout(0, b.index, b.params)
        rec.annotate_model(engine.module, grad_params=engine.params)
        rec.set_strategy(rec.strategy or f"syncviz-{engine.strategy}", engine="syncviz")
        rec.annotate(
            ddp={"bucket_cap_mb": engine.bucket_cap_mb, "first_bucket_cap_mb": engine.bucket_cap_mb,
                 "gradient_as_bucket_view": False, "static_graph": False,
                 "find_unused_parameters": False, "comm_hook": f"syncviz.sync {engine.strategy}"},
            sync={"strategy": engine.strategy, "buckets": len(engine.buckets),
                  "comm_dtype": S.dtype_name(engine.comm_dtype) if engine.comm_dtype else "",
                  "kernel_backend": _backend(engine)})

    def now(self) -> int:
        return self.rec.now()

    def grad_ready(self, p) -> None:
        self.rec.grad_ready(self.index[id(p)])

    def comm_row(self, b, kind, op, buf, ready, logical_numel):
        from syncviz.record import collectives
        if kind == S.COLLECTIVE and collectives.installed():
            return None                                # it records every collective itself
        rec = self.rec
        nbytes = buf.numel() * buf.element_size()     # whole (padded) array, as busbw wants
        return rec.add_collective(CollectiveCall(
            kind, f"syncviz {op}", op, max(rec.micro, 0), rec.now(), nbytes, S.dtype_name(buf.dtype),
            self.world, bucket=b.index, ready=ready, layout=0,
            logical_bytes=logical_numel * b.params[0].element_size()), device=buf.device)   # CUDA: event times

    def done_callback(self, row):
        if row is None:
            return _nothing

        def done(row=row):
            self.rec.collective_done(row)          # runs when the collective completes
        return done

    def in_bucket(self, index: int):
        # the recorder's convention: collectives issued inside belong to this bucket
        return self.rec.in_bucket(index)


def _backend(engine: DataParallel) -> str:
    from syncviz.kernels import choose_backend
    return choose_backend(engine.buckets[0].buffer.device) if engine.buckets else ""
