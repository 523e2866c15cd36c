"""Single-pass torch path for CPU tensors: each gradient is read once and written once, straight
into its slot of the bucket (no ``torch.cat`` temporary, no second pass over the bucket).

``torch.mul(g, scale, out=slot)`` computes in the promoted dtype of its inputs and rounds once
into ``out``. That is the fp32-math-then-round contract of reference.py whenever the source is
fp32 or source and destination share a dtype (torch's CPU kernels do bf16/fp16 math in fp32);
for the rare other pairs (half -> fp32, fp16 <-> bf16) we upcast first so rounding happens once.
Non-contiguous gradients are fine here: torch reads/writes them through their strides.
"""
from __future__ import annotations

from typing import Sequence

import torch


def _scaled_copy(src: torch.Tensor, dst: torch.Tensor, scale: float) -> None:
    if scale == 1.0:
        dst.copy_(src)                       # copy_ rounds to nearest even on downcasts
    elif src.dtype == dst.dtype or src.dtype == torch.float32:
        torch.mul(src, scale, out=dst)
    elif dst.dtype == torch.float32:
        dst.copy_(src)                       # exact upcast, then fp32 math in place
        dst.mul_(scale)
    else:                                    # fp16 <-> bf16 with a scale: one fp32 temporary
        torch.mul(src.to(torch.float32), scale, out=dst)


@torch.no_grad()
def flatten_scale_torch(grads: Sequence[torch.Tensor], bucket: torch.Tensor, scale: float,
                        offsets: Sequence[int]) -> torch.Tensor:
    for g, off in zip(grads, offsets):
        if g.numel():
            _scaled_copy(g, bucket[off: off + g.numel()].view(g.shape), scale)
    return bucket


@torch.no_grad()
def unflatten_torch(bucket: torch.Tensor, grads: Sequence[torch.Tensor], scale: float,
                    offsets: Sequence[int]) -> None:
    for g, off in zip(grads, offsets):
        if g.numel():
            _scaled_copy(bucket[off: off + g.numel()].view(g.shape), g, scale)
