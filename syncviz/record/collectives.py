"""Time every torch.distributed collective a rank issues: one "collective" row per call, with its
op, bytes (nccl-tests' busbw convention: the whole, unsharded array for reduce_scatter and
all_gather), dtype, group size, launch and completion time.

``install(rec)`` patches the public functions of torch.distributed (and the same names in
distributed_c10d, which torch's own wrappers call: ``all_gather_into_tensor`` →
``all_gather_single``). What the strategies really call, read from torch 2.13's source:
DDP comm hooks (default, fp16/bf16 compress, PowerSGD) → ``all_reduce(async_op=True)``;
FSDP2 ``fully_shard`` → ``all_gather_single`` and ``reduce_scatter_single`` (synchronous on CPU);
``ZeroRedundancyOptimizer`` → ``broadcast(async_op=True)`` per parameter (or per bucket), waited.

Rules (DESIGN.md): the wrapper never blocks and never synchronizes a device; it appends one list
record (``Recorder.add_collective``) and stamps completion from the work's future (``add_done_callback``) or,
for a backend whose work has no future (gloo's reduce_scatter), when the caller waits on it.
On CUDA tensors the same points record CUDA events (start just before the call), resolved to GPU
times a step later as DDP's buckets are (an NCCL call returns at enqueue).
A collective torch implements by calling another public one is recorded once (the outer call).
Collectives syncviz runs for itself (clock alignment, rank info) are not recorded
(``Recorder.own_collectives``).

A synchronous call on host memory blocks the calling thread until the data has moved: no compute
can hide it. Its row's name ends with BLOCKING (" (blocking)"), and syncviz.analysis removes those
intervals from the compute intervals, so exposed communication stays honest for FSDP on gloo.
"""
from __future__ import annotations

import contextlib
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from syncviz.record.cudaclock import timing_event
from syncviz.record.events import CollectiveCall
from syncviz.trace import schema as S

BLOCKING = S.BLOCKING

_REC = None                 # the recorder rows go to (None: every wrapper is a pass-through)
_ORIG: dict[tuple[object, str], object] = {}
_TLS = threading.local()    # .busy: inside a recorded call (nested public calls are not recorded)
_IN_CALL: dict[int, tuple] = {}   # thread id → the collective it is calling (see in_call)
_PENDING: dict[int, tuple[object, list[CollectiveCall]]] = {}    # id(work) → (work, its rows) for works without a future


# ---------------------------------------------------------------- what each API moves (bytes)
# Each describer has the signature of the torch function it describes, so Python binds the call's
# arguments for us (fast, no inspect), and returns (op, bytes, tensor, group, async_op).

def tensor_bytes(t) -> int:
    """Bytes of a tensor as a collective moves it. A sparse (COO) tensor, e.g. the gradient of an
    ``nn.Embedding(sparse=True)``, moves its indices and values, not its dense size: gloo all-gathers
    them (numel() would count every row of the table: 7.8x the payload in tests/test_reducer_group.py)."""
    if t.layout == torch.sparse_coo:
        return t._values().numel() * t.element_size() + t._indices().numel() * t._indices().element_size()
    return t.numel() * t.element_size()


_nb = tensor_bytes


def _all_reduce(tensor, op=None, group=None, async_op=False):
    return "all_reduce", _nb(tensor), tensor, group, async_op


def _all_reduce_coalesced(tensors, op=None, group=None, async_op=False):
    return "all_reduce", sum(_nb(t) for t in tensors), tensors[0], group, async_op


def _reduce_scatter_single(output, input, op=None, group=None, async_op=False):
    return "reduce_scatter", _nb(input), input, group, async_op


def _reduce_scatter(output, input_list, op=None, group=None, async_op=False):
    return "reduce_scatter", sum(_nb(t) for t in input_list), output, group, async_op


def _all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
    return "all_gather", _nb(output_tensor), input_tensor, group, async_op


def _all_gather(tensor_list, tensor, group=None, async_op=False):
    return "all_gather", sum(_nb(t) for t in tensor_list), tensor, group, async_op


def _all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False):
    return ("all_gather", sum(_nb(t) for ts in output_tensor_lists for t in ts), input_tensor_list[0],
            group, async_op)


def _broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    return "broadcast", _nb(tensor), tensor, group, async_op


def _reduce(tensor, dst=None, op=None, group=None, async_op=False, group_dst=None):
    return "reduce", _nb(tensor), tensor, group, async_op


def _all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                       async_op=False):
    return "all_to_all", _nb(input), input, group, async_op


def _all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    return "all_to_all", sum(_nb(t) for t in input_tensor_list), input_tensor_list[0], group, async_op


def _barrier(group=None, async_op=False, device_ids=None, timeout=None):
    return "barrier", 0, None, group, async_op


def _gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    return "gather", _nb(tensor), tensor, group, async_op


def _scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    return "scatter", _nb(tensor), tensor, group, async_op


APIS = {
    "all_reduce": _all_reduce,
    "all_reduce_coalesced": _all_reduce_coalesced,
    "reduce_scatter_single": _reduce_scatter_single,
    "reduce_scatter_tensor": _reduce_scatter_single,
    "_reduce_scatter_base": _reduce_scatter_single,
    "reduce_scatter": _reduce_scatter,
    "all_gather_single": _all_gather_single,
    "all_gather_into_tensor": _all_gather_single,
    "_all_gather_base": _all_gather_single,
    "all_gather": _all_gather,
    "all_gather_coalesced": _all_gather_coalesced,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_to_all_single": _all_to_all_single,
    "all_to_all": _all_to_all,
    "barrier": _barrier,
    "gather": _gather,
    "scatter": _scatter,
}


# ------------------------------------------------------------------------------- the wrapper

def _wrap(name: str, orig, describe):
    def collective(*args, **kwargs):
        rec = _REC
        if rec is None or rec.quiet or getattr(_TLS, "busy", False) or rec.closed:
            return orig(*args, **kwargs)
        try:
            op, nbytes, tensor, group, async_op = describe(*args, **kwargs)
        except (TypeError, AttributeError, IndexError):   # a call torch will reject: let torch say why
            return orig(*args, **kwargs)
        launch = rec.now()
        bucket = rec.current_bucket
        resolved = group or c10d._get_default_group()
        coalesced = resolved in c10d._world.pg_coalesce_state
        # On CUDA the host times would be the enqueue (an NCCL call returns, and its future completes,
        # once the kernel is queued): the interval comes from CUDA events, as for DDP's buckets. The
        # start goes on the current stream just before the call, which the collective's stream waits for.
        start_ev = timing_event(tensor.device) if tensor is not None and tensor.is_cuda and not coalesced else None
        _TLS.busy = True
        me = threading.get_ident()
        _IN_CALL[me] = (op, name, nbytes, bucket, launch)   # what the hang watchdog sees while we wait
        try:
            work = orig(*args, **kwargs)
            returned = rec.now()
        finally:
            _TLS.busy = False
            _IN_CALL.pop(me, None)
        size = resolved.size()
        label = name
        if coalesced:
            label += " (coalesced)"
        elif not async_op and (tensor is None or not tensor.is_cuda):
            label += BLOCKING    # the host waited until the data had moved
        # the step and (phase "") the compute phase it fell in are set at the step boundary
        row = CollectiveCall(S.COLLECTIVE, label, op, max(rec.micro, 0), launch, nbytes,
                             S.dtype_name(None if tensor is None else tensor.dtype), size,
                             bucket=bucket)
        if start_ev is not None:
            row.cuda = [start_ev, None, tensor.device]
        if coalesced:
            _COALESCED.setdefault(id(resolved), []).append(row)
        elif async_op and work is not None:
            _on_completion(work, [row], rec)
        else:
            row.done = returned
            if row.cuda is not None:   # a synchronous call made the current stream wait for the collective
                row.cuda[1] = timing_event(row.cuda[2])
        rec.add_collective(row)
        return work

    collective.__name__ = getattr(orig, "__name__", name)
    collective.__qualname__ = getattr(orig, "__qualname__", name)
    collective.__doc__ = getattr(orig, "__doc__", None)
    collective.__wrapped__ = orig
    return collective


def bucket_all_reduce(rec, tensor, group, bucket: int, opts=None):
    """DDP's default bucket all-reduce, issued by syncviz's comm hook (record/ddp.py): the same
    "all_reduce" row the wrapper above would record, without its own completion callback. Returns
    (work, row): the hook's one callback stamps ``row.done`` with the bucket's done time (row is
    None when collectives are not being recorded). One Python callback per bucket on the backend's
    thread instead of two: each needs the GIL, which the training thread then waits for.
    ``opts``: see _issue_all_reduce."""
    if _REC is not rec or rec.quiet or rec.closed:
        return _issue_all_reduce(tensor, group, opts), None
    # Bytes are read before the call: gloo's sparse all-reduce replaces a COO tensor with the
    # coalesced sum of every rank's rows, and when it finished first the row counted those
    # (30,872 bytes instead of 17,408: test_sparse_embedding failed once in CI).
    nbytes = _nb(tensor)
    launch = rec.now()
    work = _issue_all_reduce(tensor, group, opts)
    row = CollectiveCall(S.COLLECTIVE, "all_reduce", "all_reduce", max(rec.micro, 0), launch, nbytes,
                         S.dtype_name(tensor.dtype), group.size(), bucket=bucket)
    row.work = work
    rec.add_collective(row)
    return work, row


def _issue_all_reduce(tensor, group, opts=None):
    """A sum all-reduce of a bucket, issued as DDP's C++ default hook issues it: straight to the
    process group (``group.allreduce([tensor], opts)``), not through ``dist.all_reduce``'s Python
    checks (~20-40 µs a call in a traced short-steps run). dist.all_reduce itself (torch's, not
    our wrapper) handles what the direct call would not: a tensor subclass with
    ``__torch_function__``, a complex tensor, a coalescing block. ``opts``: the reducer's own
    options for its bucket (record/reducer_group.py), issued as given."""
    if opts is not None:
        return group.allreduce([tensor], opts)
    if (group is None or type(tensor) is not torch.Tensor or tensor.is_complex()
            or group in c10d._world.pg_coalesce_state):
        return _ORIG.get((dist, "all_reduce"), dist.all_reduce)(tensor, group=group, async_op=True)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.asyncOp = True
    return group.allreduce([tensor], opts)


def in_call() -> list[tuple]:
    """(op, name, bytes, bucket, launch ns) of the collectives being called right now, any thread
    (a blocking call returns only once every rank joined it): for the hang watchdog."""
    return list(_IN_CALL.values())


def _on_completion(work, rows: list[CollectiveCall], rec) -> None:
    """Stamp ``rows`` (one collective's, or a coalesced block's) done when ``work`` completes: from
    its future's callback, or, for a work without a future, when someone waits on it."""
    for r in rows:
        r.work = work
    try:
        fut = work.get_future()
    except RuntimeError:   # e.g. gloo's reduce_scatter_single: "Work::getFuture not implemented"
        if len(_PENDING) > 4096:     # works nobody waited on: forget them
            _PENDING.clear()
        _PENDING[id(work)] = (work, rows)
        return
    # on CUDA collective_done also records the end event: the callback's streams wait for the collective
    fut.add_done_callback(lambda _fut, rows=rows: _completed(rows, rec))


def _completed(rows: list[CollectiveCall], rec) -> None:
    for r in rows:
        rec.collective_done(r)
        r.work = None


def settle(rows: list[CollectiveCall]) -> None:
    """At a step boundary (the recorder's flush): rows of finished works whose completion
    callback has not run yet. The callback needs the GIL, and a waiter (PowerSGD's ``.wait()`` on
    its Q all-reduce) can run ahead of it: yield the GIL briefly so queued callbacks stamp their
    rows; a finished work still unstamped gets the flush time (an upper bound)."""
    waiting = [r for r in rows if r.done < 0 and r.work is not None]
    for _ in range(20):
        if not any(r.done < 0 for r in waiting):
            return
        time.sleep(0.0001)
    now = _REC.now() if _REC is not None else -1
    for r in waiting:
        if r.done < 0 and r.work.is_completed():
            r.done = now
        r.work = None


# ------------------------------------------- completion of future-less works, coalesced blocks

_COALESCED: dict[int, list] = {}


def _patched_wait(orig_wait):
    def wait(self, *args, **kwargs):
        out = orig_wait(self, *args, **kwargs)
        if _PENDING:
            entry = _PENDING.pop(id(self), None)
            if entry is not None and entry[0] is self and _REC is not None:
                _completed(entry[1], _REC)      # on CUDA: wait() made the current stream wait for it
        return out
    return wait


def _patched_coalescing_manager(orig_cm):
    @contextlib.contextmanager
    def _coalescing_manager(group=None, device=None, async_ops=False):
        with orig_cm(group, device, async_ops) as cm:
            yield cm
        # The batch was issued when the block closed; a blocking block also completed then. An
        # async one (Megatron-style: ``cm.wait()`` later) completes with the work it appended.
        rows = _COALESCED.pop(id(group or c10d._get_default_group()), [])
        if _REC is None or not rows:
            return
        works = getattr(cm, "works", None)
        if async_ops and works:
            _on_completion(works[-1], rows, _REC)
        else:
            t = _REC.now()
            for row in rows:
                row.done = t
    _coalescing_manager.__wrapped__ = orig_cm
    return _coalescing_manager


def _patched_then(orig_then):
    def then(self, callback):
        # A comm hook's continuation (PowerSGD's P → Q all-reduces) runs later on the backend's
        # thread: carry the bucket index there so its collectives are attributed to the bucket.
        rec = _REC
        bucket = rec.current_bucket if rec is not None else -1
        if bucket >= 0:
            inner = callback

            def callback(fut, _inner=inner, _bucket=bucket, _rec=rec):
                with _rec.in_bucket(_bucket):
                    return _inner(fut)
        return orig_then(self, callback)
    return then


# ------------------------------------------------------------------------------ install

def install(rec) -> None:
    """Record the collectives of this process into ``rec`` (idempotent; a later call switches the
    recorder). Patches torch.distributed in place; ``uninstall()`` restores it."""
    global _REC
    _REC = rec
    rec.settle_collectives = settle
    if _ORIG:
        return
    for name, describe in APIS.items():
        for mod in (dist, c10d):
            orig = getattr(mod, name, None)
            if orig is None:
                continue
            _ORIG[(mod, name)] = orig
            setattr(mod, name, _wrap(name, orig, describe))
    _ORIG[(c10d.Work, "wait")] = c10d.Work.wait
    c10d.Work.wait = _patched_wait(c10d.Work.wait)
    _ORIG[(torch._C.Future, "then")] = torch._C.Future.then
    torch._C.Future.then = _patched_then(torch._C.Future.then)
    # torch.distributed re-exports it (Megatron's DDP imports it from there): both names patched
    for mod in (c10d, dist):
        orig = getattr(mod, "_coalescing_manager", None)
        if orig is not None:
            _ORIG[(mod, "_coalescing_manager")] = orig
            setattr(mod, "_coalescing_manager", _patched_coalescing_manager(orig))


def uninstall() -> None:
    """Undo install(): torch.distributed as it was."""
    global _REC
    _REC = None
    for (owner, name), orig in _ORIG.items():
        setattr(owner, name, orig)
    _ORIG.clear()
    _PENDING.clear()
    _COALESCED.clear()


def installed() -> bool:
    return bool(_ORIG)


def recording(rec) -> bool:
    """Whether ``rec``'s collectives are being recorded (bucket_all_reduce's all_reduce rows)."""
    return _REC is rec and not rec.quiet and not rec.closed
