"""``flatten_scale`` / ``unflatten``: check the input once, then pick a backend.

Backends (``backend="auto"`` picks by device):
- ``"triton"``: the one-launch kernel in flatten_scale_triton.py. Used for CUDA tensors, and for CPU
  tensors when ``TRITON_INTERPRET=1`` was set before the kernel module was imported (the Triton
  interpreter: how the kernel itself is tested without a GPU).
- ``"torch"``: torch_path.py, one pass per gradient straight into the bucket. Used on CPU (and
  on CUDA if Triton is not installed).
- ``"reference"``: reference.py, for tests.

Input that would give silent garbage is refused with a ValueError/TypeError that says what is wrong:
gradients on another device than the bucket, dtypes other than fp32/fp16/bf16, a bucket that is
too small, not 1-D or not contiguous, a gradient that overlaps the bucket somewhere other than
its own slot. Input the kernel cannot take directly gets a correct fallback: empty tensors are
skipped, non-contiguous gradients go through a contiguous staging copy, and gradients of mixed
dtypes get one launch per dtype.
"""
from __future__ import annotations

import numbers
import os
import warnings
from typing import Sequence

import torch

from syncviz.kernels import reference, torch_path

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("auto", "triton", "torch", "reference")


def _interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _triton():
    """The kernel module, imported on first use (importing triton costs ~1 s)."""
    from syncviz.kernels import flatten_scale_triton as kernel_module
    return kernel_module


def choose_backend(device: torch.device) -> str:
    """Which backend ``"auto"`` uses for tensors on ``device``."""
    if device.type == "cuda" or (device.type == "cpu" and _interpret_requested()):
        try:
            _triton()
            return "triton"
        except ImportError as e:
            if device.type == "cpu":
                raise
            warnings.warn(f"syncviz.kernels: Triton unavailable ({e}); using the torch path", stacklevel=3)
    return "torch"


def _check(grads: Sequence[torch.Tensor], bucket: torch.Tensor, scale) -> list[int]:
    """Validate; return each gradient's element offset in the bucket."""
    if not isinstance(bucket, torch.Tensor):
        raise TypeError(f"bucket must be a torch.Tensor, got {type(bucket).__name__}")
    if bucket.dim() != 1 or not bucket.is_contiguous():
        raise ValueError(f"bucket must be a contiguous 1-D tensor (got shape {tuple(bucket.shape)}, "
                         f"contiguous={bucket.is_contiguous()})")
    if bucket.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"bucket dtype {bucket.dtype} is not supported (float32, float16, bfloat16)")
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    for i, g in enumerate(grads):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"grads[{i}] is a {type(g).__name__}, not a tensor")
        if g.device != bucket.device:
            raise ValueError(f"grads[{i}] is on {g.device} but the bucket is on {bucket.device}; "
                             "a bucket holds tensors of one device")
        if g.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"grads[{i}] has dtype {g.dtype}; supported: float32, float16, bfloat16")
    offsets = reference.bucket_offsets(grads)
    total = offsets[-1] + grads[-1].numel() if grads else 0
    if total > bucket.numel():
        raise ValueError(f"bucket has {bucket.numel()} elements but the gradients need {total}")
    _check_aliasing(grads, bucket, offsets)
    return offsets


def _check_aliasing(grads, bucket, offsets) -> None:
    # A gradient may BE its own bucket slot (DDP's gradient_as_bucket_view): element-wise in
    # place is safe. Overlapping any other part of the bucket would read data already overwritten.
    storage = bucket.untyped_storage().data_ptr()
    for i, (g, off) in enumerate(zip(grads, offsets)):
        if g.numel() == 0 or g.untyped_storage().data_ptr() != storage:
            continue
        own_slot = (g.dtype == bucket.dtype and g.is_contiguous()
                    and g.data_ptr() == bucket.data_ptr() + off * bucket.element_size())
        if not own_slot:
            raise ValueError(f"grads[{i}] shares memory with the bucket but is not a view of its own "
                             f"slot (elements {off}..{off + g.numel()}); the result would be garbage")


def flatten_scale(grads: Sequence[torch.Tensor], bucket: torch.Tensor | None = None, scale: float = 1.0,
                  out_dtype: torch.dtype | None = None, *, backend: str = "auto") -> torch.Tensor:
    """Write ``grads`` back to back into ``bucket`` multiplied by ``scale``; return the bucket.

    ``bucket=None`` allocates one of exactly the needed size, of ``out_dtype`` (default: the
    first gradient's dtype). ``out_dtype`` with a given bucket must equal its dtype. Values are
    computed in fp32 and rounded once to the bucket's dtype (so a bf16/fp16 bucket is a cast).
    Elements after the last gradient are left as they were (padding).
    """
    grads = list(grads)
    if bucket is None:
        if not grads:
            raise ValueError("flatten_scale needs a bucket or at least one gradient to size one")
        dtype = out_dtype or grads[0].dtype
        bucket = torch.empty(sum(g.numel() for g in grads), dtype=dtype, device=grads[0].device)
    elif out_dtype is not None and out_dtype != bucket.dtype:
        raise ValueError(f"out_dtype={out_dtype} but the bucket is {bucket.dtype}; "
                         "pass a bucket of the dtype you want (or bucket=None)")
    offsets = _check(grads, bucket, scale)
    backend = _resolve(backend, bucket.device)
    if backend == "reference":
        return reference.flatten_scale_reference(grads, bucket, scale)
    if backend == "torch":
        return torch_path.flatten_scale_torch(grads, bucket, scale, offsets)
    kernel = _triton()
    with torch.no_grad():
        for idx in _by_dtype(grads):
            group = [grads[i] if grads[i].is_contiguous() else grads[i].contiguous() for i in idx]
            kernel.flatten_scale_triton(group, bucket, scale, [offsets[i] for i in idx])
    return bucket


def unflatten(bucket: torch.Tensor, grads: Sequence[torch.Tensor], scale: float = 1.0,
              *, backend: str = "auto") -> None:
    """Inverse of :func:`flatten_scale`: ``grads[i] = bucket slot i * scale`` (in place)."""
    grads = list(grads)
    offsets = _check(grads, bucket, scale)
    backend = _resolve(backend, bucket.device)
    if backend == "reference":
        return reference.unflatten_reference(bucket, grads, scale)
    if backend == "torch":
        return torch_path.unflatten_torch(bucket, grads, scale, offsets)
    kernel = _triton()
    with torch.no_grad():
        for idx in _by_dtype(grads):
            targets = [grads[i] if grads[i].is_contiguous()
                       else torch.empty_like(grads[i], memory_format=torch.contiguous_format) for i in idx]
            kernel.unflatten_triton(bucket, targets, scale, [offsets[i] for i in idx])
            for i, t in zip(idx, targets):
                if t is not grads[i]:
                    grads[i].copy_(t)                 # staged: write back through the strides


def _resolve(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return choose_backend(device)
    if backend == "triton" and device.type == "cpu" and not _interpret_requested():
        raise ValueError("the Triton kernel runs on CUDA tensors, or on CPU tensors under "
                         "TRITON_INTERPRET=1 (set before importing syncviz.kernels.flatten_scale_triton)")
    return backend


def _by_dtype(grads: Sequence[torch.Tensor]) -> list[list[int]]:
    """Indices of non-empty gradients grouped by dtype: one launch per group (usually one)."""
    groups: dict[torch.dtype, list[int]] = {}
    for i, g in enumerate(grads):
        if g.numel():
            groups.setdefault(g.dtype, []).append(i)
    return list(groups.values())
