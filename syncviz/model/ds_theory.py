"""What DeepSpeed 0.19's ZeRO sends per optimizer step and holds per rank, derived from the
model's shapes, as syncviz.theory does for torch's strategies (pure functions, no torch).

Read from DeepSpeed 0.19.8's source and checked against traced runs (tests/test_deepspeed.py),
for the built-in configuration (syncviz.workloads.deepspeed_workload: fp32, overlap_comm off, contiguous
gradients, stage 3 without prefetch, persistence or reuse) on N ranks, A micro-steps:

- stage 1 and 2 (``ds-zero1``, ``ds-zero2``, ``ds-offload``): gradients are reduced bucket by
  bucket with ``all_reduce``, not ``reduce_scatter``: with the default
  ``use_multi_rank_bucket_allreduce=True`` ``average_tensor`` all-reduces every slice of the
  bucket and each rank keeps the slice of its own partition (``allreduce_and_scatter``). Stage 2
  reduces in every micro-step (A·G), stage 1 only at the accumulation boundary (G). After the
  optimizer, one ``all_gather_into_tensor`` per parameter group of the flat group padded to a
  multiple of 2·N elements (``nccl_start_alignment_factor`` 2), whatever ``allgather_bucket_size``
  says (it only applies where all_gather_into_tensor is missing). Plus one 1-element
  ``all_reduce`` of the global gradient norm (4 bytes in fp32). The textbook ZeRO-1/2
  reduce-scatters G instead: DeepSpeed sends 2× the textbook's gradient traffic in bus bytes.
- stage 3 (``ds-zero3``, ``ds-infinity``): each module's own parameters are all-gathered before
  its forward and again before its backward (a parameter shared by two modules, as GPT's tied
  embedding and head, once per module), each padded to a multiple of N elements; gradients are
  ``reduce_scatter``-ed bucket by bucket (each padded to N); one 8-byte all_reduce for the norm
  (4 bytes when the optimizer is offloaded). Steps 0 and 1 also broadcast DeepSpeed's module-trace checks (a few hundred
  bytes): the steady state starts at step 2.
- Offload and Infinity send what their stage sends: offloading moves bytes between device, host
  and NVMe, not between ranks.

Memory per rank after step 0 (fp32, Adam: two moments per element plus a 4-byte step per group),
E elements, partition p = ceil(E / (2N))·2 elements (stage 1/2; stage 3 per parameter):
working parameters E (stage 3: their partitions), an fp32 master copy of the partition (DeepSpeed
keeps it even in fp32), moments 2·p. Offload puts master and moments on the host, Infinity on NVMe
(and the parameters too).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from syncviz.trace import schema as S

DS_STRATEGIES = S.DS_STRATEGIES
STAGE = {"ds-zero1": 1, "ds-zero2": 2, "ds-zero3": 3, "ds-offload": 2, "ds-infinity": 3}
TORCH_TWIN = {"ds-zero1": "zero1", "ds-zero2": "zero2", "ds-zero3": "zero3", "ds-offload": "zero2",
              "ds-infinity": "zero3"}      # torch's implementation of the same stage (compare)
# the global-norm all_reduce per step: 1 fp32 element (stage 1/2, and stage 3 offloading the
# optimizer: complete_grad_norm_calculation_for_cpu_offload); stage 3 on the device: 2 (measured)
MIN_AIO_BYTES, AIO_ALIGNED_BYTES = 1024**2, 1024      # deepspeed.runtime.swap_tensor.utils
FP32 = 4                 # gradients are swapped in the master dtype (fp32)
NORM_BYTES = {"ds-zero1": 4, "ds-zero2": 4, "ds-offload": 4, "ds-zero3": 8, "ds-infinity": 4}

Shapes = Mapping[str, Sequence[int]]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape) if len(shape) else 1


def _pad(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def comm_per_step(strategy: str, shapes: Shapes, world_size: int, *, itemsize: int = 4, accum: int = 1,
                  module_params: Sequence[Sequence[str]] = (),
                  group_numels: Sequence[int] | None = None) -> dict[str, int]:
    """Bytes per rank and optimizer step by op (nccl-tests convention), as DeepSpeed 0.19 does it.
    ``module_params``: per module, the names of its own parameters (stage 3 gathers per module);
    ``group_numels``: elements per optimizer parameter group (stage 1/2 gather per group)."""
    n = world_size
    stage = STAGE[strategy]
    elems = sum(_numel(s) for s in shapes.values())
    if stage in (1, 2):
        groups = list(group_numels) if group_numels else [elems]
        reduces = accum if stage == 2 else 1
        return {"all_reduce": reduces * elems * itemsize + NORM_BYTES[strategy],
                "all_gather": sum(_pad(g, 2 * n) for g in groups) * itemsize}
    uses = module_params or [[k] for k in shapes]
    gathered = sum(_pad(_numel(shapes[k]), n) for names in uses for k in names if k in shapes)
    scattered = sum(_pad(_numel(s), n) for s in shapes.values())
    return {"all_gather": accum * 2 * gathered * itemsize, "reduce_scatter": accum * scattered * itemsize,
            "all_reduce": NORM_BYTES[strategy]}


def _overlapping(shapes: Shapes, n: int, rank: int, part: int) -> int:
    """Elements of the parameters (in model order, one flat group) overlapping partition ``rank``."""
    lo, hi, start, total = rank * part, (rank + 1) * part, 0, 0
    for s in shapes.values():
        k = _numel(s)
        if start < hi and start + k > lo:
            total += k
        start += k
    return total


def textbook_comm_per_step(strategy: str, grad_bytes: float, param_bytes: float) -> dict[str, float]:
    """The textbook ZeRO stage DeepSpeed implements (offloading sends nothing more)."""
    stage = STAGE[strategy]
    if stage == 3:
        return {"all_gather": 2 * param_bytes, "reduce_scatter": grad_bytes}
    return {"reduce_scatter": grad_bytes, "all_gather": param_bytes}


def memory_per_rank(strategy: str, shapes: Shapes, world_size: int, rank: int, *, itemsize: int = 4,
                    group_numels: Sequence[int] | None = None,
                    param_order: Sequence[str] | None = None, nvme_gradients: bool = False,
                    nvme_param_itemsize: int | None = None) -> dict[str, int]:
    """Bytes held by rank ``rank`` after optimizer step 0, by what and where. ``param_order``:
    the parameters in model order (run.json's shapes are a sorted mapping). ``nvme_gradients``:
    the DeepSpeed that ran swaps each parameter's fp32 gradient partition to NVMe at the
    accumulation boundary (deepspeed_engine records it: ``nvme_gradients`` in strategy_config).
    ``nvme_param_itemsize``: the element size DeepSpeed's parameter swapper counts in (recorded as
    ``nvme_param_itemsize``; None: ``itemsize``, as runs recorded before it)."""
    if param_order:
        shapes = {k: shapes[k] for k in param_order if k in shapes}
    n = world_size
    stage = STAGE[strategy]
    elems = sum(_numel(s) for s in shapes.values())
    groups = list(group_numels) if group_numels else [elems]
    if stage in (1, 2):
        part = sum(_pad(g, 2 * n) // n for g in groups)
        params = elems * itemsize
        # after the reduction both stages keep, in one buffer, the whole gradient of every parameter
        # that overlaps the rank's partition (copy_grads_in_partition); Offload keeps the fp32
        # partition's .grad on the host instead
        grads = (part if strategy == "ds-offload" else _overlapping(shapes, n, rank, part)) * itemsize
    else:
        part = sum(_pad(_numel(s), n) // n for s in shapes.values())
        params = part * itemsize
        grads = part * itemsize
    master = part * itemsize
    # torch's AdamW keeps a 4-byte step tensor per group; DeepSpeedCPUAdam counts steps in C++
    moments = 2 * part * itemsize + (4 * len(groups) if strategy in ("ds-zero1", "ds-zero2", "ds-zero3") else 0)
    out = {"params_bytes": params, "grads_bytes": grads, "master_params_bytes": master,
           "optimizer_states_bytes": moments, "optimizer_bytes": master + moments}
    # in memory: on the accelerator unless offloaded; gradients live with the optimizer
    host_opt = strategy in ("ds-offload", "ds-infinity")
    split = {"device": 0, "host": 0, "nvme": 0}
    split["host" if strategy == "ds-infinity" else "device"] += params
    split["host" if host_opt else "device"] += master + moments + grads
    if strategy == "ds-infinity":
        # DeepSpeed swaps a tensor to NVMe only from MIN_AIO_BYTES (1 MiB) up: the optimizer's
        # partition (fp32 master and both moments) and each parameter partition that large; the
        # optimizer's then leave memory, the parameters' flat partition stays in host memory
        # each swap file is padded to AIO_ALIGNED_BYTES (1 KiB; measured on mini: 3 × 768 B)
        shards = [_pad(_numel(s), n) // n for s in shapes.values()]     # each parameter's partition (elements)
        if part * itemsize >= MIN_AIO_BYTES:
            split["nvme"] += 3 * _pad(part * itemsize, AIO_ALIGNED_BYTES)
            out["master_params_bytes"] = out["optimizer_states_bytes"] = out["optimizer_bytes"] = 0
            split["host"] -= master + moments
        # a parameter partition's file: its elements in the swapper's dtype, from 1 MiB in that dtype up
        pis = nvme_param_itemsize or itemsize
        split["nvme"] += sum(_pad(g * pis, AIO_ALIGNED_BYTES) for g in shards if g * pis >= MIN_AIO_BYTES)
        if nvme_gradients and part * itemsize >= MIN_AIO_BYTES:
            # DeepSpeed with the deferred boundary path (stage3's _finalize_offload_gradient_accumulation,
            # DeepSpeed PR #8225, in 0.19.8) swaps each parameter's fp32 gradient partition of 1 MiB or
            # more to a file of its own, split at a multiple of AIO_ALIGNED_BYTES (the remainder, under
            # 1 KiB, stays in memory): measured on mini, 2 ranks, a 1,572,864-byte file for the
            # embedding's 393,216-element partition, nothing for the rest
            split["nvme"] += sum(g * FP32 // AIO_ALIGNED_BYTES * AIO_ALIGNED_BYTES for g in shards
                                 if g * FP32 >= MIN_AIO_BYTES)
    out.update({f"{k}_bytes": v for k, v in split.items()})
    return out
