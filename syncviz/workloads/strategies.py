"""Data-parallel strategies for the built-in workload, each torch's own implementation:

    ddp        DistributedDataParallel (all-reduce of gradient buckets)
    ddp-fp16   DDP + torch's fp16_compress_hook (buckets all-reduced in float16)
    ddp-bf16   DDP + torch's bf16_compress_hook (buckets all-reduced in bfloat16)
    powersgd   DDP + torch's PowerSGD hook (rank-1 low-rank gradients, error feedback)
    zero1      DDP + torch.distributed.optim.ZeroRedundancyOptimizer (sharded AdamW states)
    zero2      FSDP2 fully_shard(reshard_after_forward=False) per block and root (ZeRO-2-like)
    zero3      FSDP2 fully_shard(reshard_after_forward=True) per block and root (ZeRO-3-like)

``wrap(model, cfg)`` returns (model, optimizer). While tracing it also writes to run.json what
the comparison needs: the parameter shapes and strategy settings ("strategy_config", for
syncviz.model.theory), the memory each rank really holds ("memory", measured after the first optimizer
step) and a backend probe ("backend_probe": reduce_scatter and all_gather timed against an
all_reduce of the same bytes, to see whether the backend implements them as the textbook says).
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from syncviz.model.theory import STRATEGIES, check_strategy

__all__ = ["STRATEGIES", "wrap", "full_state_dict", "held_bytes", "probe_backend"]

POWERSGD = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2, "min_compression_rate": 2.0}
PROBE_BYTES = 4 * 1024 * 1024


def wrap(model: torch.nn.Module, cfg):
    """Wrap ``model`` for ``cfg.strategy`` and build its AdamW (lr ``cfg.lr``)."""
    strategy = check_strategy(cfg.strategy)
    from syncviz.record.api import get_recorder
    rec = get_recorder()
    shapes = {n: list(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    config = {"name": strategy, "param_shapes": shapes, "accum": int(getattr(cfg, "accum", 1))}
    if strategy in ("zero2", "zero3"):
        model, opt = _fsdp(model, cfg, reshard_after_forward=strategy == "zero3")
        # An explicit reshard_after_forward applies to the root too (torch 2.13 skips resharding
        # the root only when the argument is left at None), so no parameter stays gathered.
        config["fsdp"] = {"reshard_after_forward": strategy == "zero3", "root_params": []}
    else:
        model, opt, extra = _ddp_family(model, cfg, strategy)
        config.update(extra)
    if rec is not None:
        rec.set_strategy(strategy)
        probe = None
        if dist.is_initialized() and dist.get_world_size() > 1:
            with rec.own_collectives():
                probe = probe_backend()
        _measure_memory_after_first_step(model, opt, rec)
        rec.annotate(strategy_config=config, **({"backend_probe": probe} if probe else {}))
    return model, opt


# ----------------------------------------------------------------------------- the strategies

def _ddp_family(model, cfg, strategy):
    from torch.nn.parallel import DistributedDataParallel as DDP
    extra = {}
    cap = cfg.bucket_cap_mb
    if strategy == "powersgd" and dist.get_backend() == "gloo":
        # torch's PowerSGD hook issues each bucket's P and Q all-reduces from future callbacks on
        # gloo's worker threads; with several buckets their order differs between ranks and gloo
        # aborts ("Received data size doesn't match expected size"), untraced too (GPT-small,
        # 25 MB buckets, step 2). One bucket keeps the order.
        grads_mb = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
        if grads_mb > cap:
            cap = float(math.ceil(grads_mb) + 1)
            extra["one_bucket_mb"] = cap
    ddp = DDP(model, bucket_cap_mb=cap, process_group=dist.group.WORLD)
    if strategy in ("ddp-fp16", "ddp-bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = default_hooks.fp16_compress_hook if strategy == "ddp-fp16" else _bf16_compress_hook
        ddp.register_comm_hook(state=None, hook=hook)
    elif strategy == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None, **POWERSGD)
        ddp.register_comm_hook(state=state, hook=powersgd.powerSGD_hook)
        ddp._syncviz_powersgd_state = state      # its error-feedback memory is counted as held
        extra["powersgd"] = dict(POWERSGD, **({"one_bucket_mb": extra.pop("one_bucket_mb")}
                                              if "one_bucket_mb" in extra else {}))
    if strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=cfg.lr)
        extra["zero1"] = {"parameters_as_bucket_view": False}
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=cfg.lr)
    return ddp, opt, extra


def _bf16_compress_hook(process_group, bucket):
    """torch's bf16_compress_hook, under another name: DDP refuses that name unless CUDA and NCCL
    are present, but gloo all-reduces bfloat16 on CPU (tests/test_strategies.py checks it)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks.bf16_compress_hook(process_group, bucket)


def _fsdp(model, cfg, *, reshard_after_forward: bool):
    """FSDP2: one group per transformer block, the rest (embeddings, final norm, head) in the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model, torch.optim.AdamW(model.parameters(), lr=cfg.lr)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Plain full tensors of the model's state (collective for FSDP2: every rank must call it)."""
    sd = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in sd.items()}


# ------------------------------------------------------------------------------------ memory

def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def held_bytes(tensors, seen: set | None = None) -> int:
    """Bytes of the storages behind ``tensors`` (DTensors: their local shard), each storage once:
    what a rank really holds, padding and shared views included."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        st = _local(t).untyped_storage()
        key = (st.data_ptr(), st.device.type)
        if st.nbytes() and key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total


def _state_tensors(opt) -> list:
    inner = getattr(opt, "optim", opt)         # ZeroRedundancyOptimizer keeps its shard's AdamW here
    return [v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def _fsdp_params_held(model) -> int | None:
    """Parameter bytes an FSDP2 model holds right now: every sharded parameter plus the unsharded
    copies not freed yet (ZeRO-2 keeps them from forward to backward; ZeRO-3 frees them)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    tensors = []
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        group = m._get_fsdp_state()._fsdp_param_group
        for fp in (group.fsdp_params if group is not None else []):
            tensors.append(fp.sharded_param)
            tensors.extend(fp.all_gather_outputs)
    return held_bytes(tensors) if tensors else None


def measure_memory(model, opt, params_after_forward: int | None = None) -> dict:
    """This rank's parameters, gradients and optimizer state (bytes actually held)."""
    module = model.module if hasattr(model, "module") else model
    params = list(module.parameters())
    out = {"rank": dist.get_rank() if dist.is_initialized() else 0,
           "params_bytes": held_bytes(params),
           "grads_bytes": held_bytes(p.grad for p in params),
           "optimizer_bytes": held_bytes(_state_tensors(opt)),
           "params_after_forward_bytes": params_after_forward,
           "peak_allocated_bytes": None}
    state = getattr(model, "_syncviz_powersgd_state", None)
    if state is not None:
        out["comm_state_bytes"] = held_bytes([*state.error_dict.values(), *state.p_memory_dict.values(),
                                              *state.q_memory_dict.values()])
    if params and params[0].is_cuda:
        out["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(params[0].device))
    return out


def _measure_memory_after_first_step(model, opt, rec) -> None:
    """Once, after the first optimizer step (states exist, gradients not yet cleared): measure on
    every rank and gather to rank 0's run.json. The parameters held at the end of the first
    forward are measured too (where ZeRO-2 and ZeRO-3 differ)."""
    seen = {}

    def after_forward(module, args, output):
        held = _fsdp_params_held(model)
        seen["fwd"] = held if held is not None else held_bytes(module.parameters())
        fwd_handle.remove()

    def after_step(optimizer, args, kwargs):
        step_handle.remove()
        mine = measure_memory(model, opt, seen.get("fwd"))
        ranks = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            ranks = [None] * dist.get_world_size()
            with rec.own_collectives():
                dist.all_gather_object(ranks, mine)
        rec.annotate(memory=ranks)

    fwd_handle = model.register_forward_hook(after_forward)
    step_handle = opt.register_step_post_hook(after_step)


# ------------------------------------------------------------------------------ backend probe

def probe_backend(nbytes: int = PROBE_BYTES, reps: int = 5) -> dict:
    """Time all_reduce, reduce_scatter and all_gather of the same ``nbytes`` (whole array) on the
    default group, median of ``reps`` after a warm-up, each started together after a barrier.
    A textbook ring reduce_scatter or all_gather moves half the bytes of an all_reduce (ratio ~0.5
    for large arrays); a ratio near 1 says the backend runs an all_reduce underneath. Uses no
    random numbers (the training RNG stays untouched)."""
    n = dist.get_world_size()
    numel = max(n, nbytes // 4 // n * n)
    full = torch.ones(numel)
    shard = torch.ones(numel // n)
    ops = {"all_reduce": lambda: dist.all_reduce(full),
           "reduce_scatter": lambda: dist.reduce_scatter_single(shard, full),
           "all_gather": lambda: dist.all_gather_single(full, shard)}
    times: dict[str, list[float]] = {name: [] for name in ops}
    for fn in ops.values():
        fn()                                   # warm-up (connections, buffers)
    for _ in range(reps):                      # interleaved, so a noisy neighbour hits all three
        for name, fn in ops.items():
            dist.barrier()
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    return {"bytes": numel * 4, "world_size": n, "backend": str(dist.get_backend()), "reps": reps,
            "ms": ms, "reduce_scatter_vs_all_reduce": ms["reduce_scatter"] / ms["all_reduce"],
            "all_gather_vs_all_reduce": ms["all_gather"] / ms["all_reduce"]}
