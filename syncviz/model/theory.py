"""What each data-parallel strategy should send per optimizer step and hold per rank, derived from
the model's parameter shapes: the textbook (syncviz.model.costmodel) and what torch's implementation of
the strategy really does. Pure functions, no torch; compare, tests and the cost model use them.

Bytes follow nccl-tests' busbw convention (DESIGN.md): all_reduce and broadcast count the array
once; reduce_scatter and all_gather count the whole, unsharded array.

Derivations, per rank and optimizer step, for G gradient bytes and P parameter bytes on N ranks
(fp32, 4 bytes per element) and A micro-steps of gradient accumulation:

- ddp: one all_reduce of every gradient, G (DDP's no_sync skips the first A−1 micro-steps).
- ddp-fp16 / ddp-bf16: torch's compress hooks cast the bucket to 16 bits before the all_reduce: G/2.
- powersgd (rank r): per gradient viewed as an n×m matrix (n = shape[0]), torch compresses it when
  (n+m)·r' · min_compression_rate < n·m with r' = min(n, m, r); a compressed matrix sends P (n·r')
  and Q (m·r') in two all_reduces, the others go uncompressed in a third: 4·Σ … bytes. Torch runs a
  plain all_reduce (G) for the first ``start_powerSGD_iter`` steps.
- zero1 (torch ZeroRedundancyOptimizer): DDP's all_reduce (G), then every parameter is broadcast
  from the rank that owns it (P in all). The textbook ZeRO-1 reduce-scatters G and all-gathers P.
- zero2 / zero3 (FSDP2 fully_shard): per micro-step one reduce_scatter of the gradients and
  all_gathers of the parameters, each parameter padded to a multiple of N rows (dim 0) first.
  zero2 (reshard_after_forward=False) gathers once per micro-step (forward; kept for backward);
  zero3 gathers again in backward, except the root module's own parameters, which FSDP2 keeps
  unsharded from forward to backward. Textbook: ZeRO-3 gathers 2P.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from syncviz.model import costmodel, ds_theory
from syncviz.trace import schema as S

STRATEGIES, DDP_FAMILY, FSDP = S.TORCH_STRATEGIES, S.DDP_FAMILY, S.FSDP_STRATEGIES
DS_STRATEGIES = S.DS_STRATEGIES          # DeepSpeed's ZeRO: syncviz.model.ds_theory derives them
ALL_STRATEGIES = S.WORKLOAD_STRATEGIES

Shapes = Mapping[str, Sequence[int]]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape) if len(shape) else 1


def padded_numel(shape: Sequence[int], world_size: int) -> int:
    """Elements FSDP2 moves for a parameter: dim 0 padded up to a multiple of the world size."""
    if not len(shape):
        return world_size          # a scalar is sharded as a 1-element row per rank
    rows = -(-int(shape[0]) // world_size) * world_size
    return rows * _numel(shape[1:])


def check_strategy(strategy: str) -> str:
    if strategy not in ALL_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(ALL_STRATEGIES)}")
    return strategy


def powersgd_elements(shapes: Shapes, rank: int = 1, min_compression_rate: float = 2.0) -> dict[str, int]:
    """Elements PowerSGD all-reduces per step once compression is on: uncompressed tensors, P, Q."""
    out = {"uncompressed": 0, "p": 0, "q": 0}
    for shape in shapes.values():
        n = int(shape[0]) if len(shape) else 1
        m = _numel(shape) // n if n else 0
        r = min(n, m, rank)
        if (n + m) * r * min_compression_rate < n * m:
            out["p"] += n * r
            out["q"] += m * r
        else:
            out["uncompressed"] += n * m
    return out


def comm_per_step(strategy: str, shapes: Shapes, world_size: int, *, itemsize: int = 4, accum: int = 1,
                  root_params: Sequence[str] = (), powersgd_rank: int = 1,
                  min_compression_rate: float = 2.0, compressed: bool = True,
                  module_params=(), group_numels=None) -> dict[str, int]:
    """Bytes per rank and optimizer step by collective op, as torch implements ``strategy``.
    ``shapes``: trainable parameters (name → shape, tied parameters once). ``root_params``: the
    parameters FSDP2 keeps unsharded between forward and backward (the root module's own).
    ``compressed``: PowerSGD has started compressing (step >= start_powerSGD_iter). ``module_params``,
    ``group_numels``: DeepSpeed's per-module gathers and parameter groups (ds_theory)."""
    check_strategy(strategy)
    if strategy in DS_STRATEGIES:
        return ds_theory.comm_per_step(strategy, shapes, world_size, itemsize=itemsize, accum=accum,
                                       module_params=module_params, group_numels=group_numels)
    n = world_size
    elems = sum(_numel(s) for s in shapes.values())
    grads = elems * itemsize
    if strategy == "ddp":
        return {"all_reduce": grads}
    if strategy in ("ddp-fp16", "ddp-bf16"):
        return {"all_reduce": elems * 2}
    if strategy == "powersgd":
        if not compressed:
            return {"all_reduce": grads}
        e = powersgd_elements(shapes, powersgd_rank, min_compression_rate)
        return {"all_reduce": (e["uncompressed"] + e["p"] + e["q"]) * itemsize}
    if strategy == "zero1":
        return {"all_reduce": grads, "broadcast": grads}
    padded = sum(padded_numel(s, n) for s in shapes.values()) * itemsize
    kept = sum(padded_numel(shapes[k], n) for k in root_params if k in shapes) * itemsize
    gathers = padded if strategy == "zero2" else 2 * padded - kept
    return {"all_gather": accum * gathers, "reduce_scatter": accum * padded}


def textbook_comm_per_step(strategy: str, grad_bytes: float, param_bytes: float) -> dict[str, float]:
    """The textbook collectives of DESIGN.md's table (costmodel's), compression hooks added."""
    check_strategy(strategy)
    if strategy in DS_STRATEGIES:
        return ds_theory.textbook_comm_per_step(strategy, grad_bytes, param_bytes)
    if strategy in ("ddp-fp16", "ddp-bf16"):
        return {"all_reduce": grad_bytes / 2}
    if strategy == "powersgd":
        return {}   # depends on shapes and rank: comm_per_step is the derivation
    return costmodel.comm_bytes_per_step("ddp" if strategy.startswith("ddp") else strategy,
                                         grad_bytes, param_bytes)


def memory_per_rank(strategy: str, shapes: Shapes, world_size: int, rank: int, *, itemsize: int = 4,
                    adam_states: int = 2, group_numels=None, param_order=None,
                    nvme_gradients: bool = False, nvme_param_itemsize: int | None = None) -> dict[str, int]:
    """Bytes a rank holds after an optimizer step, as torch implements ``strategy`` with AdamW in
    fp32: parameters, gradients and optimizer state (two moments per element plus one 4-byte
    ``step`` tensor per parameter). FSDP2 stores each shard padded (dim 0 rounded up to N rows)
    and its optimizer moments unpadded."""
    check_strategy(strategy)
    if strategy in DS_STRATEGIES:
        return ds_theory.memory_per_rank(strategy, shapes, world_size, rank, itemsize=itemsize,
                                         group_numels=group_numels, param_order=param_order,
                                         nvme_gradients=nvme_gradients, nvme_param_itemsize=nvme_param_itemsize)
    n = world_size
    elems = sum(_numel(s) for s in shapes.values())
    steps = 4 * len(shapes)
    if strategy in DDP_FAMILY:
        params = grads = elems * itemsize
        if strategy == "zero1":
            # each rank's AdamW sees only its parameters (the step tensors of those too)
            owned = _zero1_owned(shapes, n)[rank]
            opt = adam_states * sum(_numel(shapes[k]) for k in owned) * itemsize + 4 * len(owned)
        else:
            opt = adam_states * elems * itemsize + steps
        return {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": opt}
    shard = sum(padded_numel(s, n) for s in shapes.values()) // n * itemsize
    local = sum(_local_rows(s, n, rank) * _numel(s[1:]) for s in shapes.values() if len(s)) * itemsize
    return {"params_bytes": shard, "grads_bytes": shard, "optimizer_bytes": adam_states * local + steps}


def textbook_memory(strategy: str, params: int, world_size: int, itemsize: int = 4) -> dict[str, float]:
    """costmodel.memory_per_gpu in fp32 with Adam (K = 8 bytes per parameter)."""
    base = {"ddp-fp16": "ddp", "ddp-bf16": "ddp", "powersgd": "ddp",
            **ds_theory.TORCH_TWIN}.get(check_strategy(strategy), strategy)
    m = costmodel.memory_per_gpu(costmodel.MemorySpec(params=params, param_bytes=itemsize,
                                                      grad_bytes=itemsize, optimizer_bytes=2 * itemsize),
                                 base, world_size)
    return {"params_bytes": m.params, "grads_bytes": m.grads, "optimizer_bytes": m.optimizer}


def _local_rows(shape: Sequence[int], n: int, rank: int) -> int:
    rows = int(shape[0])
    chunk = -(-rows // n)
    return max(0, min(chunk, rows - rank * chunk))


def _zero1_owned(shapes: Shapes, n: int) -> list[list[str]]:
    sizes = [0] * n
    owned: list[list[str]] = [[] for _ in range(n)]
    for name in sorted(shapes, key=lambda k: _numel(shapes[k]), reverse=True):
        r = sizes.index(min(sizes))
        owned[r].append(name)
        sizes[r] += _numel(shapes[name])
    return owned
