"""The Triton kernel itself, run on CPU by Triton's interpreter, against the torch reference.

Collected only inside the TRITON_INTERPRET=1 process started by test_kernels_interpret.py.
Tolerance: fp32 and fp16 outputs must match exactly; bf16 outputs within one bf16 ulp (rtol 2**-7),
because the interpreter's fp32->bf16 conversion does not round to nearest even
(triton/runtime/interpreter.py, _convert_float) while torch and the GPU do.
"""
import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("runs in test_kernels_interpret.py's TRITON_INTERPRET=1 subprocess", allow_module_level=True)

import torch  # noqa: E402

from syncviz.kernels import (dispatch, flatten_scale, flatten_scale_reference, unflatten,  # noqa: E402
                             unflatten_reference)
from syncviz.kernels import flatten_scale_triton as kernel_module  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (1, 3, 1023, 1025, 65537)


def _grads(sizes, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen).mul_(4).to(dtype) for n in sizes]


def _close(got, want):
    if got.dtype == torch.bfloat16:
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-6)
    else:
        assert torch.equal(got, want), (got - want).abs().max()


@pytest.fixture
def launches(monkeypatch):
    """Counts real kernel launches (the real kernel still runs)."""
    count = [0]
    real = kernel_module._bucket_copy_kernel

    class Counting:
        def __getitem__(self, grid):
            count[0] += 1
            return real[grid]
    monkeypatch.setattr(kernel_module, "_bucket_copy_kernel", Counting())
    return count


def test_auto_backend_is_the_kernel():
    assert dispatch.choose_backend(torch.device("cpu")) == "triton"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("in_dtype, out_dtype", [
    (torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.float32, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
])
def test_odd_sizes_dtypes_scale(size, in_dtype, out_dtype, launches):
    grads = _grads((size, 7), in_dtype, seed=size)
    for scale in (1.0, 1 / 3):
        got = flatten_scale(grads, None, scale, out_dtype)
        _close(got, flatten_scale_reference(grads, torch.empty_like(got), scale))
        back, want = [torch.empty_like(g) for g in grads], [torch.empty_like(g) for g in grads]
        unflatten(got, back, 1 / scale)
        unflatten_reference(got, want, 1 / scale)
        for a, b in zip(back, want):
            _close(a, b)
    assert launches[0] == 4  # one per call, whatever the number of tensors


def test_many_small_tensors_one_launch(launches):
    sizes = [(i * 7) % 41 for i in range(400)]          # includes empty tensors
    grads = _grads(sizes, torch.float32, seed=3)
    bucket = torch.full((sum(sizes) + 5,), -1.0)
    flatten_scale(grads, bucket, 0.125)
    assert launches[0] == 1
    assert torch.equal(bucket[:-5], torch.cat(grads) * 0.125)
    assert torch.equal(bucket[-5:], torch.full((5,), -1.0))  # padding untouched


def test_one_huge_tensor_round_trip():
    grads = _grads(((1 << 20) + 7, 5), torch.float32, seed=4)
    bucket = flatten_scale(grads, None, 0.5)
    assert torch.equal(bucket, torch.cat(grads) * 0.5)
    back = [torch.empty_like(g) for g in grads]
    unflatten(bucket, back, 2.0)
    assert all(torch.equal(a, b) for a, b in zip(back, grads))


def test_big_block_launcher_int64_offsets():
    # Offsets and block starts are int64 in the table; a larger BLOCK takes fewer programs.
    grads = _grads((100_000, 3, 70_001), torch.float16, seed=5)
    bucket = torch.empty(170_004, dtype=torch.float16)
    kernel_module.flatten_scale_triton(grads, bucket, 0.5, [0, 100_000, 100_003], block=16384)
    assert torch.equal(bucket, flatten_scale_reference(grads, torch.empty_like(bucket), 0.5))


@pytest.mark.parametrize("bucket_dtype", DTYPES)
def test_round_trip(bucket_dtype):
    grads = _grads((1025, 3, 1), torch.float32, seed=6)
    bucket = flatten_scale(grads, None, 0.25, bucket_dtype)
    back = [torch.empty_like(g) for g in grads]
    unflatten(bucket, back, 4.0)
    for a, g in zip(back, grads):
        if bucket_dtype == torch.float32:
            assert torch.equal(a, g)
        else:  # one rounding to the bucket dtype on the way in
            torch.testing.assert_close(a, g, rtol=2 ** -7 if bucket_dtype == torch.bfloat16 else 2 ** -10, atol=1e-4)


def test_fallbacks_non_contiguous_mixed_dtypes_empty(launches):
    grads = [torch.randn(6, 4).t(), torch.randn(0), torch.randn(9).to(torch.bfloat16), torch.randn(3, 8)[:, ::2]]
    bucket = flatten_scale(grads, None, 3.0)
    assert launches[0] == 2  # one per dtype
    _close(bucket, flatten_scale_reference(grads, torch.empty_like(bucket), 3.0))
    outs = [torch.empty(6, 4).t(), torch.empty(0), torch.empty(9, dtype=torch.bfloat16), torch.empty(3, 8)[:, ::2]]
    want = [torch.empty_like(o) for o in outs]
    unflatten(bucket, outs, 0.5)
    unflatten_reference(bucket, want, 0.5)
    for o, w in zip(outs, want):
        _close(o, w)


def test_mixed_devices_refused():
    with pytest.raises(ValueError, match="device"):
        flatten_scale([torch.randn(3), torch.empty(3, device="meta")], torch.empty(6), 1.0)
