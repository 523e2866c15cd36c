"""The process group DDP's reducer calls, wrapped: how syncviz times DDP's default bucket all-reduce
without a comm hook. Part of syncviz.record (record/ddp.py installs it).

Why: with any comm hook registered, DDP no longer scales gradients by 1/N while copying them into
the bucket (reducer.cpp, mark_variable_ready_dense), so a timing hook has to redo the scaling as a
separate pass over every bucket: ~52 ms a step for GPT-2 small's 500 MB of gradients on this
machine (`Tensor.mul_`, one thread), 3.5 ms for 32 MB, against DDP's fused copy. Without a hook,
the reducer issues each bucket's all-reduce itself, as ``process_group->allreduce({bucket})``, and
a Python subclass of ``ProcessGroup`` receives that call. So the reducer (only: DDP's Python side
and user code keep the real group) gets a group whose ``allreduce`` times the bucket and issues it
on the real group, and whose every other collective (rebuilding buckets broadcasts, the
unused-parameter map) is passed to the real group through its Python binding (_PASSED says why);
the real group's backends are registered on this one as well.

What the reducer's call does not say is the bucket's index: it issues buckets strictly in index
order, 0, 1, …, once per backward pass (``next_bucket_`` in mark_bucket_ready, also in static-graph
and join mode), so the hook numbers the calls it sees and checks each against the bucket's size.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_TYPES = dist.ProcessGroup.BackendType


def _backend_type(name: str):
    return _TYPES.__members__.get(name.upper(), _TYPES.CUSTOM)


class ReducerGroup(dist.ProcessGroup):
    """``inner`` as the reducer sees it: ``allreduce`` goes to ``on_allreduce(tensors, opts)``,
    every other collective straight to inner's backends."""

    def __init__(self, inner: dist.ProcessGroup, on_allreduce):
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self._on_allreduce = on_allreduce
        for device in inner._device_types:
            backend = inner._get_backend(device)
            self._register_backend(device, _backend_type(backend.name()), backend)
        self._set_default_backend(_backend_type(inner._get_backend_name()))

    def getBackendName(self) -> str:      # DDP's logger reads it (the real group's name)
        return self.inner._get_backend_name()

    def allreduce(self, tensors, opts=None):
        if opts is None:
            opts = dist.AllreduceOptions()
        return self._on_allreduce(tensors, opts)


# Every other collective the reducer may issue (rebuilding buckets broadcasts the new bucket order;
# join mode and the unused-parameter map all-reduce) reaches the real group through a Python method
# too. Why: for a Python subclass, the C++ call goes through torch's PyProcessGroup trampoline, which
# holds the GIL; without a Python override it then calls the backend still holding it. Gloo's worker
# thread, meanwhile, frees the previous work under its queue lock, and a work created from Python
# holds Python objects (its thread-local state), so freeing it needs the GIL: the rank deadlocked in
# DDP's bucket rebuild (py-spy --native: the main thread in ProcessGroupGloo::enqueue waiting for the
# queue lock with the GIL, the worker in ~AsyncAllreduceWork waiting for the GIL with the lock), 4
# times in 1,800 rebuilds (tests/scripts/many_rebuilds.py), and twice in the CI suite (Lightning, the
# built-in workload). The inner group's Python bindings release the GIL before they enqueue: none
# in 4,000 rebuilds since.
_PASSED = ("broadcast", "allgather", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced",
           "allreduce_coalesced", "alltoall", "alltoall_base", "barrier", "gather", "scatter", "reduce",
           "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "send", "recv",
           "recv_anysource")


def _passed(name: str):
    def call(self, *args):
        return getattr(self.inner, name)(*args)
    call.__name__ = call.__qualname__ = name
    return call


for _name in _PASSED:
    setattr(ReducerGroup, _name, _passed(_name))


class TimedWork(dist.Work):
    """What the reducer gets back for a timed bucket: its future (``fut``: the all-reduce's, then
    the hook's stamp) completes only once the bucket's done time is stamped. Measured: with the
    stamp as a plain callback on the all-reduce's future, the reducer's wait ran ahead of it (a
    future is marked complete before its callbacks run) and a bucket was written unfinished in
    two runs out of three (tests/scripts/from_code.py); the comm hook path never was, as DDP
    waits on the hook's own future."""

    def __init__(self, work, fut):
        super().__init__()
        self._work, self._fut = work, fut

    def get_future(self):
        return self._fut

    def wait(self, timeout=None):
        return self._work.wait() if timeout is None else self._work.wait(timeout)


def usable(ddp: torch.nn.Module) -> bool:
    """DDP models whose buckets this path times: CPU and CUDA ones without sparse gradients (on CUDA
    the bucket's GPU interval comes from CUDA events, as on the comm hook path; checked on an H200,
    NCCL with one rank and gloo with two: tests/test_cuda_path.py). Sparse gradients
    (``nn.Embedding(sparse=True)``, found as DDP finds them): the reducer's
    ``_get_zeros_like_grad_buckets`` raises on their buckets, so the layouts could not be read."""
    pg = getattr(ddp, "process_group", None)
    return (getattr(ddp, "device_type", None) in ("cpu", "cuda") and pg is not None and hasattr(ddp, "reducer")
            and hasattr(ddp.reducer, "_update_process_group") and hasattr(ddp.reducer, "_get_zeros_like_grad_buckets")
            and not _sparse_gradients(ddp.module))


def _sparse_gradients(module: torch.nn.Module) -> bool:
    return any(isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse for m in module.modules())
