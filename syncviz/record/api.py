"""Starting a recorder and hooking torch: ``syncviz.instrument``, ``syncviz.tracing`` and what the
bootstrap of ``syncviz trace`` calls. One recorder per process.

Use from code (ranks launched yourself)::

    with syncviz.tracing("traces/myrun"):      # every DDP model built inside is instrumented
        ...
    # or
    model = syncviz.instrument(DDP(net))       # starts a recorder in ./traces/<auto> if none
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import os
import time

import torch
import torch.distributed as dist

from syncviz.record.ddp import instrument_ddp
from syncviz.record.recorder import Recorder

_ACTIVE: Recorder | None = None
_BACKEND_DEFAULT = ""      # backend for init_process_group calls that name none (syncviz trace --backend)


def get_recorder() -> Recorder | None:
    """The recorder of this process while tracing is on (None otherwise)."""
    return _ACTIVE if _ACTIVE is not None and not _ACTIVE.closed else None


def start(run_dir: str | os.PathLike, *, backend: str = "", **kwargs) -> Recorder:
    """Start this process's recorder (one per process) and hook torch so that DDP models, FSDP2
    modules and process groups created from now on are instrumented."""
    global _ACTIVE, _BACKEND_DEFAULT
    if get_recorder() is not None:
        return _ACTIVE
    _ACTIVE = Recorder(run_dir, **kwargs)
    _ACTIVE.on_close(_forget)
    _BACKEND_DEFAULT = backend
    _patch_torch()
    atexit.register(_close_at_exit)
    if dist.is_available() and dist.is_initialized():
        _ACTIVE.attach_process_group()
    return _ACTIVE


def _forget(rec: Recorder) -> None:
    global _ACTIVE
    if _ACTIVE is rec:
        _ACTIVE = None


def _close_at_exit():
    if _ACTIVE is not None:
        _ACTIVE.close(finished=True)


def instrument(model: torch.nn.Module, out: str | os.PathLike | None = None, **kwargs) -> torch.nn.Module:
    """Instrument an existing DDP model (or any module) and start a recorder if none is active."""
    rec = get_recorder() or start(out or _default_out(), **kwargs)
    from torch.nn.parallel import DistributedDataParallel as DDP
    if isinstance(model, DDP):
        instrument_ddp(rec, model)
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
    return os.path.join("traces", time.strftime("run-%Y%m%d-%H%M%S"))


# ------------------------------------------------------------------------------- torch patches

_PATCHED = False


def _patch_torch() -> None:
    """Instrument DDP at construction and align clocks when the process group comes up."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    from torch.nn.parallel import DistributedDataParallel as DDP
    orig_init = DDP.__init__

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        rec = get_recorder()
        if rec is not None:
            instrument_ddp(rec, self)

    DDP.__init__ = __init__
    _patch_fully_shard()
    from syncviz.record import deepspeed_engine    # DeepSpeed engines, patched when deepspeed is imported
    deepspeed_engine.install(get_recorder)
    orig_ipg = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if kwargs.get("backend") is None and not args and _BACKEND_DEFAULT:
            kwargs["backend"] = _BACKEND_DEFAULT
        out = orig_ipg(*args, **kwargs)
        rec = get_recorder()
        if rec is not None:
            rec.attach_process_group()
        return out

    dist.init_process_group = init_process_group
    torch.distributed.distributed_c10d.init_process_group = init_process_group
    orig_destroy = dist.destroy_process_group

    def destroy_process_group(group=None):
        rec = get_recorder()
        if rec is not None and group is None:
            rec.measure_drift()
            rec.close(finished=True)
        return orig_destroy(group)

    dist.destroy_process_group = destroy_process_group


def _patch_fully_shard() -> None:
    """FSDP2: every module passed to ``fully_shard`` while tracing gets forward/backward hooks
    (the nested ones defer to the outermost). Patched where users import it from."""
    try:
        impl = importlib.import_module("torch.distributed.fsdp._fully_shard._fully_shard")
        orig = impl.fully_shard
    except (ImportError, AttributeError):
        return

    @functools.wraps(orig)    # keeps contract's `fully_shard.state`, which torch itself calls
    def fully_shard(module, *args, **kwargs):
        out = orig(module, *args, **kwargs)
        rec = get_recorder()
        if rec is not None:
            rec.observe(fsdp2=True, reshard_after_forward=str(kwargs.get("reshard_after_forward", "default")))
            for m in (out if isinstance(out, (list, tuple)) else [out]):
                rec.instrument_module(m)
        return out

    # the public names only: torch's implementation module refers to its own fully_shard
    for name in ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                 "torch.distributed._composable.fsdp"):
        with contextlib.suppress(ImportError, AttributeError):
            mod = importlib.import_module(name)
            if getattr(mod, "fully_shard", None) is orig:
                mod.fully_shard = fully_shard
