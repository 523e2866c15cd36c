"""DDP instrumentation: one comm hook, registered when the DDP model is built, that times every
gradient bucket's communication (launch when DDP calls the hook, done when its future completes,
GPU-side times from CUDA events on CUDA) whatever hook is in force: DDP's default all-reduce,
reproduced bit for bit, the user's own hook, or a built-in one. Part of syncviz.record."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from . import schema as S
from .record import _dt

if TYPE_CHECKING:
    from .record import Recorder


class _BucketHook:
    """DDP comm hook that times whatever hook is in force (torch's default all-reduce until the
    user registers one). It is registered once, at DDP construction; a user's later
    register_comm_hook swaps the target, so the user's hook, or a built-in one, is timed too."""

    def __init__(self, rec: "Recorder", ddp: torch.nn.Module, name: str = "allreduce"):
        # Weak: DDP's reducer holds this hook, so a strong reference back would make a cycle
        # through C++ that Python's GC cannot see, keeping DDP and its process group alive until
        # interpreter teardown (where gloo's threads then abort the process now and then).
        self.rec, self._ddp = rec, weakref.ref(ddp)
        self.pg = ddp.process_group
        self.target: Callable | None = None
        self.state: Any = None
        self.name = name
        self.user_registered = False

    def __call__(self, state, bucket):  # DDP requires the parameter to be named `bucket`
        rec = self.rec
        launch = rec.now()
        buf = bucket.buffer()
        index = bucket.index()
        layout = 1 if getattr(self._ddp(), "_has_rebuilt_buckets", False) else 0
        if (layout, index) not in rec._layouts_seen:
            note_layout(rec, layout, index, bucket.parameters())
        record = [index, layout, launch, -1, buf.numel() * buf.element_size(), buf.dtype, self.name,
                  rec.micro, len(rec._collectives), None]
        if buf.is_cuda:   # GPU-side interval from CUDA events, resolved a step later (never blocks)
            start_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
            record[9] = [start_ev, None]
        rec._buckets.append(record)
        rec._in_bucket = index
        try:
            with rec.profile_range(index, buf):
                if self.target is None:
                    # DDP's C++ default, bit for bit: it multiplies by the reciprocal of the world
                    # size (at::mul_out with 1/N) while copying into the bucket, then all-reduces a
                    # sum. (Dividing by N instead differs in the last bit for N=3: tested.)
                    pg = self.pg
                    buf.mul_(1.0 / pg.size())
                    fut = dist.all_reduce(buf, group=pg, async_op=True).get_future()
                    unwrap = True
                else:
                    fut = self.target(self.state, bucket)
                    unwrap = False
        finally:
            rec._in_bucket = -1

        def done(f, record=record, unwrap=unwrap):
            record[3] = rec.now()
            if record[9] is not None:
                # the callback's current stream waits for the collective: this marks its GPU end
                end_ev = torch.cuda.Event(enable_timing=True)
                end_ev.record()
                record[9][1] = end_ev
            v = f.value()
            return v[0] if unwrap else v

        return fut.then(done)


def instrument_ddp(rec, ddp: torch.nn.Module) -> torch.nn.Module:
    """Forward/backward/grad-ready hooks plus one comm hook timing every bucket. The comm hook is
    registered at construction; a user's later register_comm_hook swaps its target."""
    if getattr(ddp, "_syncviz_hook", None) is not None:
        return ddp
    rec._index_params(ddp.module)
    rec._hook_handles.append(ddp.register_forward_pre_hook(rec._forward_pre))
    rec._hook_handles.append(ddp.register_forward_hook(rec._forward_post))
    hook = _BucketHook(rec, ddp)
    ddp._syncviz_hook = hook

    def syncviz_timed_hook(state, bucket):   # DDP checks the name `bucket` and __name__
        return hook(state, bucket)

    ddp.register_comm_hook(state=None, hook=syncviz_timed_hook)

    ref = weakref.ref(ddp)   # no cycle through the instance's own attributes (see _BucketHook)

    def register_comm_hook(state, hook):   # torch's signature, keyword names included
        # the user's hook becomes the target of ours; DDP's "only once" rule still holds
        _ddp = ref()
        h = _ddp._syncviz_hook
        if h.user_registered:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        _ddp._check_comm_hook(hook)
        h.target, h.state, h.user_registered = hook, state, True
        h.name = getattr(hook, "__qualname__", getattr(hook, "__name__", "hook"))
        _ddp.logger._set_comm_hook_name(h.name)
        _ddp._comm_hooks[-1] = (hook, state)
        ddp_meta(rec, _ddp)

    def register_builtin_comm_hook(comm_hook_type):
        # torch's C++ built-ins cannot be wrapped: time their Python twins instead
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
        kind = str(comm_hook_type).split(".")[-1]
        fn = {"ALLREDUCE": dh.allreduce_hook, "FP16_COMPRESS": dh.fp16_compress_hook}.get(kind)
        if fn is None:
            raise RuntimeError(f"syncviz cannot time built-in comm hook {comm_hook_type}")
        register_comm_hook(ref().process_group, fn)

    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = register_builtin_comm_hook
    ddp_meta(rec, ddp)
    return ddp


def ddp_meta(rec, ddp) -> None:
    rec._module_meta(ddp.module)
    hook = ddp._syncviz_hook
    rec.meta_extra["ddp"] = {
        "bucket_cap_mb": getattr(ddp, "bucket_bytes_cap", 0) / (1024 * 1024),
        "first_bucket_cap_mb": _first_bucket_mb(ddp),
        "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
        "comm_hook": hook.name if hook.user_registered else "default (allreduce, 1/N)"}
    rec.write_meta()


def note_layout(rec, layout: int, index: int, params) -> None:
    """First sight of a bucket in a layout version: remember which parameters it holds."""
    rec._layouts_seen.add((layout, index))
    rows = rec._layout_rows.setdefault(layout, {c: [] for c in S.LAYOUT_COLUMNS})
    offset = 0
    for p in params:
        i, name = rec._param_index.get(id(p), (-1, "?"))
        for c, v in zip(S.LAYOUT_COLUMNS, (layout, index, name, i, p.numel(), offset, _dt(p.dtype))):
            rows[c].append(v)
        offset += p.numel()


def _first_bucket_mb(ddp) -> float:
    cfg = getattr(ddp, "_bucket_config", None)
    nbytes = getattr(cfg, "first_bucket_bytes_cap", None)
    if nbytes is None:
        nbytes = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024)
    return float(nbytes) / (1024 * 1024)


def apply_cuda_times(cols: dict[str, list], cuda: list[list], anchor) -> None:
    """Replace host done-times of CUDA bucket rows by GPU-side start/end (see _write_ready_steps)."""
    if not anchor:
        return
    t_anchor, ev_anchor = anchor
    by_key = {(max(b[7], 0), b[0], b[2]): b[9] for b in cuda}   # (micro, bucket, launch) → [start, end]
    for i, kind in enumerate(cols["kind"]):
        if kind != S.BUCKET:
            continue
        evs = by_key.get((cols["micro"][i], cols["bucket"][i], cols["launch_ns"][i]))
        if evs and evs[1] is not None:
            cols["start_ns"][i] = t_anchor + int(ev_anchor.elapsed_time(evs[0]) * 1e6)
            cols["end_ns"][i] = t_anchor + int(ev_anchor.elapsed_time(evs[1]) * 1e6)
