"""Triton kernel: many gradient tensors <-> one flat bucket, times a scale, in ONE launch.

How one launch covers any number of tensors (the multi-tensor-apply idea of apex / torch's
``_foreach`` kernels, written as a pointer table + block map):

    meta (int64, one H2D copy)  = [ addr[T] | numel[T] | offset[T] | block_tensor[B] | block_start[B] ]

Each tensor is cut into ceil(numel / BLOCK) blocks; program ``pid`` handles block ``pid``: it looks
up which tensor it belongs to and where in that tensor it starts, turns the tensor's address
(an int64) back into a typed pointer and moves BLOCK elements between the tensor and its slot in
the bucket. All offsets are int64, so buckets and tensors past 2**31 elements are fine.

Math: load, convert to fp32, multiply by ``scale`` (fp32), convert to the destination dtype with
round-to-nearest-even (Triton's default for fp downcasts). Under ``TRITON_INTERPRET=1`` (set it
before this module is imported) the same kernel runs on CPU tensors through Triton's interpreter;
note that the interpreter's fp32->bf16 conversion does not round to nearest even (see
triton/runtime/interpreter.py, ``_convert_float``), so there bf16 outputs may differ from torch by
one bf16 ulp; fp32 and fp16 outputs are exact.

The launchers here assume validated input (see dispatch.py): one device, contiguous tensors that
share one dtype, a contiguous 1-D bucket large enough for all of them.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Sequence

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# Elements per program. 1024 is the Triton tutorials' vector-add choice; NOT tuned on a GPU yet
# (none was available while this was written), so it is a launcher argument. The sweep that should
# pick it: `python benchmarks/gpu_check.py --only kernel` (check kernel_block_sweep: GB/s at BLOCK
# 256..8192 on GPT-2 124M gradients in 25 MB buckets, fp32). Cite its figures and GPU here once run.
BLOCK = 1024


@triton.jit
def _bucket_copy_kernel(meta_ptr, n_tensors, n_blocks, bucket_ptr, dtype_ptr, scale,
                        BLOCK: tl.constexpr, TO_BUCKET: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    t = tl.load(meta_ptr + 3 * n_tensors + pid)                  # which tensor this block is in
    start = tl.load(meta_ptr + 3 * n_tensors + n_blocks + pid)   # first element of the block
    addr = tl.load(meta_ptr + t)
    numel = tl.load(meta_ptr + n_tensors + t)
    offset = tl.load(meta_ptr + 2 * n_tensors + t)               # tensor's slot in the bucket
    # dtype_ptr is any tensor of the gradients' dtype: its pointer type types the raw address.
    tensor_ptr = addr.to(tl.pointer_type(dtype_ptr.dtype.element_ty))
    idx = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = idx < numel
    if TO_BUCKET:
        x = tl.load(tensor_ptr + idx, mask=mask)
        y = (x.to(tl.float32) * scale).to(bucket_ptr.dtype.element_ty)
        tl.store(bucket_ptr + offset + idx, y, mask=mask)
    else:
        x = tl.load(bucket_ptr + offset + idx, mask=mask)
        y = (x.to(tl.float32) * scale).to(dtype_ptr.dtype.element_ty)
        tl.store(tensor_ptr + idx, y, mask=mask)


# Built tables keyed by their full content (addresses, sizes, offsets, device), so a hit is always
# correct even if an address was freed and reused; a bucketed training loop hits every step.
_META_CACHE: "OrderedDict[tuple, tuple[torch.Tensor, int]]" = OrderedDict()
_META_CACHE_SIZE = 256


def _meta(tensors: Sequence[torch.Tensor], offsets: Sequence[int], device: torch.device,
          block: int) -> tuple[torch.Tensor, int]:
    """The packed int64 pointer table + block map for ``tensors`` (see module docstring)."""
    addrs = [t.data_ptr() for t in tensors]
    numels = [t.numel() for t in tensors]
    key = (str(device), block, tuple(addrs), tuple(numels), tuple(offsets))
    hit = _META_CACHE.get(key)
    if hit is not None:
        _META_CACHE.move_to_end(key)
        return hit
    numel_t = torch.tensor(numels, dtype=torch.int64)
    blocks_per = (numel_t + block - 1) // block
    n_blocks = int(blocks_per.sum())
    block_tensor = torch.repeat_interleave(torch.arange(len(tensors), dtype=torch.int64), blocks_per)
    first_block = torch.cumsum(blocks_per, 0) - blocks_per           # exclusive prefix sum
    block_start = (torch.arange(n_blocks, dtype=torch.int64) - first_block[block_tensor]) * block
    meta = torch.cat([torch.tensor(addrs, dtype=torch.int64), numel_t,
                      torch.tensor(list(offsets), dtype=torch.int64), block_tensor, block_start])
    if device.type == "cuda":
        # Pinned + non_blocking: a pageable copy would synchronize the stream inside a backward
        # hook (the caching host allocator keeps the pinned block alive until the copy is done).
        meta = meta.pin_memory().to(device, non_blocking=True)
    _META_CACHE[key] = (meta, n_blocks)
    if len(_META_CACHE) > _META_CACHE_SIZE:
        _META_CACHE.popitem(last=False)
    return meta, n_blocks


def _launch(tensors, offsets, bucket, scale, to_bucket: bool, block: int) -> None:
    keep = [i for i, t in enumerate(tensors) if t.numel()]
    if not keep:
        return
    tensors = [tensors[i] for i in keep]
    offsets = [offsets[i] for i in keep]
    if INTERPRET != (bucket.device.type == "cpu"):
        raise ValueError(f"the Triton kernel got {bucket.device} tensors with TRITON_INTERPRET="
                         f"{int(INTERPRET)} at import: CPU tensors need the interpreter (set "
                         "TRITON_INTERPRET=1 before importing), GPU tensors need it unset")
    meta, n_blocks = _meta(tensors, offsets, bucket.device, block)
    _bucket_copy_kernel[(n_blocks,)](meta, len(tensors), n_blocks, bucket, tensors[0], float(scale),
                                     BLOCK=block, TO_BUCKET=to_bucket)


def flatten_scale_triton(grads: Sequence[torch.Tensor], bucket: torch.Tensor, scale: float,
                         offsets: Sequence[int], block: int = BLOCK) -> torch.Tensor:
    """bucket[offsets[i] : offsets[i] + numel_i] = grads[i] * scale, one launch."""
    _launch(grads, offsets, bucket, scale, True, block)
    return bucket


def unflatten_triton(bucket: torch.Tensor, grads: Sequence[torch.Tensor], scale: float,
                     offsets: Sequence[int], block: int = BLOCK) -> None:
    """grads[i] = bucket[offsets[i] : offsets[i] + numel_i] * scale, one launch."""
    _launch(grads, offsets, bucket, scale, False, block)
