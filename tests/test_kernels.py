"""syncviz.kernels: the CPU torch path against the reference, input checks, and (with a GPU) the
Triton kernel on CUDA. The kernel under the Triton interpreter is tested in
test_kernels_interpret_cases.py (run in its own TRITON_INTERPRET=1 process)."""
import pytest
import torch

from syncviz.kernels import flatten_scale, flatten_scale_reference, unflatten, unflatten_reference

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (1, 3, 1023, 1025, 65537)


def _grads(sizes, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen).mul_(4).to(dtype) for n in sizes]


@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("scale", (1.0, 0.5, 1 / 3))
def test_cpu_path_matches_reference_exactly(in_dtype, out_dtype, scale):
    grads = _grads(SIZES, in_dtype) + [torch.randn(37, 29).to(in_dtype)]
    got = flatten_scale(grads, None, scale, out_dtype, backend="torch")
    want = flatten_scale_reference(grads, torch.empty_like(got), scale)
    assert torch.equal(got, want)
    back, back_ref = [torch.empty_like(g) for g in grads], [torch.empty_like(g) for g in grads]
    unflatten(got, back, 1 / scale, backend="torch")
    unflatten_reference(got, back_ref, 1 / scale)
    assert all(torch.equal(a, b) for a, b in zip(back, back_ref))


def test_auto_backend_on_cpu_is_the_torch_path(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from syncviz.kernels import choose_backend
    assert choose_backend(torch.device("cpu")) == "torch"


def test_round_trip_many_small_and_one_large():
    sizes = [i % 17 for i in range(500)] + [1 << 20]
    grads = _grads(sizes, torch.float32, seed=1)
    bucket = flatten_scale(grads, None, 0.25)
    back = [torch.empty_like(g) for g in grads]
    unflatten(bucket, back, 4.0)
    assert all(torch.equal(a, b) for a, b in zip(back, grads))


def test_padding_untouched_and_bucket_returned():
    grads = _grads((5, 3), torch.float32)
    bucket = torch.full((12,), 7.0)
    assert flatten_scale(grads, bucket, 2.0) is bucket
    assert torch.equal(bucket[8:], torch.full((4,), 7.0))
    assert torch.equal(bucket[:8], torch.cat(grads) * 2)


def test_non_contiguous_and_empty_gradients():
    grads = [torch.randn(6, 4).t(), torch.randn(0), torch.randn(3, 8)[:, ::2]]
    bucket = flatten_scale(grads, None, 3.0)
    assert torch.equal(bucket, torch.cat([g.reshape(-1) for g in grads]) * 3.0)
    outs = [torch.empty(6, 4).t(), torch.empty(0), torch.empty(3, 8)[:, ::2]]
    unflatten(bucket, outs, 1 / 3.0)
    for o, g in zip(outs, grads):
        torch.testing.assert_close(o, g)


def test_gradient_as_bucket_view_is_allowed_in_place():
    bucket = torch.arange(10, dtype=torch.float32)
    views = [bucket[0:4].view(2, 2), bucket[4:10]]
    flatten_scale(views, bucket, 0.5)
    assert torch.equal(bucket, torch.arange(10, dtype=torch.float32) * 0.5)


@pytest.mark.parametrize("case, error", [
    ("device", ValueError), ("dtype", TypeError), ("small", ValueError), ("2d", ValueError),
    ("noncontig_bucket", ValueError), ("alias", ValueError), ("out_dtype", ValueError),
    ("scale", TypeError), ("not_tensor", TypeError), ("backend", ValueError),
])
def test_bad_input_is_a_clear_error(case, error):
    g, b = torch.randn(8), torch.empty(16)
    calls = {
        "device": lambda: flatten_scale([g, torch.empty(4, device="meta")], b, 1.0),
        "dtype": lambda: flatten_scale([g.double()], b, 1.0),
        "small": lambda: flatten_scale([g, g, g], b, 1.0),
        "2d": lambda: flatten_scale([g], torch.empty(4, 4), 1.0),
        "noncontig_bucket": lambda: flatten_scale([g], torch.empty(32)[::2], 1.0),
        "alias": lambda: flatten_scale([b[8:16]], b, 1.0),
        "out_dtype": lambda: flatten_scale([g], b, 1.0, torch.bfloat16),
        "scale": lambda: flatten_scale([g], b, torch.tensor(0.5)),
        "not_tensor": lambda: unflatten(b, [g.numpy()]),
        "backend": lambda: flatten_scale([g], b, 1.0, backend="cuda"),
    }
    with pytest.raises(error) as info:
        calls[case]()
    assert str(info.value)  # a message that says what is wrong


def test_triton_backend_on_cpu_without_interpreter_says_how(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        flatten_scale([torch.randn(4)], torch.empty(4), 1.0, backend="triton")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("in_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_triton_on_cuda_matches_reference(in_dtype, out_dtype):
    grads = [g.cuda() for g in _grads(SIZES + (1 << 22,), in_dtype)]
    grads.append(torch.randn(64, 3, device="cuda").t().to(in_dtype))      # non-contiguous
    got = flatten_scale(grads, None, 1 / 3, out_dtype, backend="triton")
    want = flatten_scale_reference(grads, torch.empty_like(got), 1 / 3)
    assert torch.equal(got, want)  # GPU conversions round to nearest even, like torch
    back, back_ref = [torch.empty_like(g) for g in grads], [torch.empty_like(g) for g in grads]
    unflatten(got, back, 3.0, backend="triton")
    unflatten_reference(got, back_ref, 3.0)
    assert all(torch.equal(a, b) for a, b in zip(back, back_ref))


@pytest.mark.cuda
@cuda
def test_auto_backend_on_cuda_is_triton():
    from syncviz.kernels import choose_backend
    assert choose_backend(torch.device("cuda")) == "triton"
