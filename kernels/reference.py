"""Torch reference for the bucket kernels: the obvious, slow, obviously-right version.

Semantics shared by every backend (Triton kernel, CPU torch path, this reference):
- gradients are packed back to back in list order, starting at element 0 of the bucket
  (offset of tensor i = sum of numel of tensors before it), as DDP lays out its buckets;
- the product ``value * scale`` is computed in fp32 and rounded once to the destination dtype
  (round-to-nearest-even), whatever the source and destination dtypes are;
- bucket elements after the last gradient are left untouched (padding stays what it was).
"""
from __future__ import annotations

from typing import Sequence

import torch


def bucket_offsets(grads: Sequence[torch.Tensor]) -> list[int]:
    """Element offset of each gradient inside the bucket (back to back, in list order)."""
    offsets, off = [], 0
    for g in grads:
        offsets.append(off)
        off += g.numel()
    return offsets


@torch.no_grad()
def flatten_scale_reference(grads: Sequence[torch.Tensor], bucket: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """bucket[:total] = cat(grads) * scale, computed in fp32 then cast to bucket.dtype."""
    grads = [g for g in grads if g.numel()]
    if grads:
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads]) * scale
        bucket[: flat.numel()].copy_(flat)
    return bucket


@torch.no_grad()
def unflatten_reference(bucket: torch.Tensor, grads: Sequence[torch.Tensor], scale: float = 1.0) -> None:
    """grads[i] = bucket[off_i : off_i + numel_i].view_as(grads[i]) * scale, in fp32 then cast."""
    for g, off in zip(grads, bucket_offsets(grads)):
        if g.numel():
            g.copy_((bucket[off: off + g.numel()].to(torch.float32) * scale).view(g.shape))
