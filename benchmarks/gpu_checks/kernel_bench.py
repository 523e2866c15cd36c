"""flatten_scale (the Triton kernel) against a device-to-device copy of the same bytes, the
``torch._foreach_mul`` + ``torch.cat`` pair and the naive ``cat(g) * s``, on GPT-2 124M gradients in
DDP-sized buckets; and a BLOCK sweep of the kernel.

GPU timing: every timed call is queued behind ``torch.cuda._sleep`` (a spin kernel of ~0.3 ms), so
the host's launch overhead (Python dispatch and checks, ~tens of µs) is hidden and the CUDA events
around the call time the GPU work alone: bandwidth, the figure the issue asks for. The host cost
per call is reported apart (``host_us``). Before each call a scratch buffer larger than L2 is
written, so no method finds another's bytes in cache. GB/s = (gradient bytes read + bucket bytes
written) / time: the same byte count for every method, so GB/s ratios are speed ratios.

    python -m gpu_checks.kernel_bench --self-check    # under TRITON_INTERPRET=1: correctness of the
                                                      # kernel at every swept BLOCK, on tiny sizes
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from .common import load_benchmark

_fs = load_benchmark("flatten_scale")           # the CPU benchmark's GPT-2 shapes and DDP bucketing
buckets_like_ddp, gpt2_shapes = _fs.buckets_like_ddp, _fs.gpt2_shapes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SWEEP_BLOCKS = (256, 512, 1024, 2048, 4096, 8192)
TINY = dict(n_layer=1, d=24, vocab=97, ctx=16)       # ~8k parameters: the interpreter's scale


def make_buckets(device, dtype, cap_mb=25.0, shape_kw=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(s, generator=gen).to(device=device, dtype=dtype) for _, s in gpt2_shapes(**(shape_kw or {}))]
    groups = buckets_like_ddp(grads, int(cap_mb * 2**20))
    return grads, groups


def _kernel_module():
    from syncviz.kernels import flatten_scale_triton as k
    return k


def methods(groups, dtype, device, scale):
    """name → fn(i) for bucket i; every method writes cat(groups[i]) * scale (or copies as many bytes)."""
    from syncviz.kernels import flatten_scale
    sizes = [sum(g.numel() for g in grp) for grp in groups]
    buckets = [torch.empty(n, dtype=dtype, device=device) for n in sizes]
    sources = [torch.randn(n, device=device).to(dtype) for n in sizes]
    flats = [[g.reshape(-1) for g in grp] for grp in groups]
    return buckets, {
        "copy": lambda i: buckets[i].copy_(sources[i]),
        "kernel": lambda i: flatten_scale(groups[i], buckets[i], scale),
        "foreach": lambda i: torch.cat(torch._foreach_mul(flats[i], scale), out=buckets[i]),
        "naive": lambda i: torch.cat(flats[i]) * scale,
    }


def time_methods(fns: dict, n_buckets: int, device, reps: int) -> dict[str, list[float]]:
    """Seconds per repetition (one pass over all buckets) for each method, interleaved bucket by
    bucket in rotating order. CUDA: GPU time from events behind a spin kernel (see docstring)."""
    cuda = device.type == "cuda"
    scratch = torch.empty((256 if cuda else 8) * 2**20 // 4, device=device)
    names = list(fns)
    for fn in fns.values():                       # warm up: compile, fault in, fill the table cache
        for i in range(n_buckets):
            fn(i)
    if cuda:
        torch.cuda.synchronize()
    times = {m: [0.0] * reps for m in names}
    for rep in range(reps):
        pending = []
        for i in range(n_buckets):
            k = (rep + i) % len(names)
            for name in names[k:] + names[:k]:
                scratch.fill_(rep)
                if cuda:
                    torch.cuda._sleep(500_000)     # ~0.3 ms: the host queues the call meanwhile
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fns[name](i)
                    e.record()
                    pending.append((name, s, e))
                else:
                    t0 = time.perf_counter()
                    fns[name](i)
                    times[name][rep] += time.perf_counter() - t0
        if cuda:
            torch.cuda.synchronize()
            for name, s, e in pending:
                times[name][rep] += s.elapsed_time(e) / 1e3
    return times


def host_us(fn, n_buckets: int, device, calls: int = 20) -> float:
    """Host time per call (what a backward hook pays on the CPU side), µs."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for c in range(calls):
        fn(c % n_buckets)
    t = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 1e6 * t / calls


def bandwidth(device, dtype_names=("fp32", "bf16", "fp16"), reps=9, cap_mb=25.0, shape_kw=None,
              world_size=2) -> dict:
    out = {}
    for dn in dtype_names:
        dtype = DTYPES[dn]
        grads, groups = make_buckets(device, dtype, cap_mb, shape_kw)
        _, fns = methods(groups, dtype, device, 1.0 / world_size)
        times = time_methods(fns, len(groups), device, reps)
        moved = 2 * sum(g.numel() * g.element_size() for g in grads)
        gbs = {m: moved / statistics.median(t) / 1e9 for m, t in times.items()}
        out[dn] = {"buckets": len(groups), "bytes_moved": moved,
                   "gbps": {m: round(v, 1) for m, v in gbs.items()},
                   "fraction_of_copy": {m: round(v / gbs["copy"], 3) for m, v in gbs.items() if m != "copy"},
                   "kernel_host_us": round(host_us(fns["kernel"], len(groups), device), 1)}
    return out


def sweep(device, blocks=SWEEP_BLOCKS, dtype_name="fp32", reps=9, cap_mb=25.0, shape_kw=None,
          world_size=2) -> dict:
    """The kernel at each BLOCK, checked against the reference first, then timed interleaved.
    Correctness: fp32/fp16 bitwise; bf16 within one bf16 ulp (the interpreter rounds bf16
    differently, see flatten_scale_triton's docstring)."""
    from syncviz.kernels import flatten_scale_reference
    k = _kernel_module()
    dtype = DTYPES[dtype_name]
    grads, groups = make_buckets(device, dtype, cap_mb, shape_kw)
    scale = 1.0 / world_size
    offsets = [[sum(g.numel() for g in grp[:j]) for j in range(len(grp))] for grp in groups]
    buckets = [torch.empty(sum(g.numel() for g in grp), dtype=dtype, device=device) for grp in groups]
    fns, errors = {}, {}
    for b in blocks:
        def fn(i, b=b):
            k.flatten_scale_triton(groups[i], buckets[i], scale, offsets[i], block=b)
        worst = 0.0
        for i, grp in enumerate(groups):
            buckets[i].fill_(float("nan"))
            fn(i)
            want = flatten_scale_reference(grp, torch.empty_like(buckets[i]), scale)
            diff = (buckets[i].float() - want.float()).abs()
            ulp = want.float().abs() * (2.0 ** -7 if dtype == torch.bfloat16 else 0.0)
            if bool(torch.isnan(buckets[i]).any()):
                worst = float("inf")
            else:
                worst = max(worst, float((diff - ulp).max()))
        errors[b] = worst
        fns[f"block {b}"] = fn
    times = time_methods(fns, len(groups), device, reps)
    moved = 2 * sum(g.numel() * g.element_size() for g in grads)
    gbs = {int(n.split()[1]): round(moved / statistics.median(t) / 1e9, 1) for n, t in times.items()}
    return {"dtype": dtype_name, "gbps_by_block": gbs, "best_block": max(gbs, key=gbs.get),
            "current_block": k.BLOCK, "correct": all(e <= 0 for e in errors.values()),
            "excess_error_by_block": {b: e for b, e in errors.items()}}


def self_check(blocks=(64, 128, 256)) -> dict:
    """Under TRITON_INTERPRET=1 on CPU: the sweep (correctness at each BLOCK, every dtype) and the
    bandwidth harness, on the tiny shapes with 4 KB buckets; times here mean nothing."""
    res = {"sweep": {dn: sweep(torch.device("cpu"), blocks, dn, reps=1, cap_mb=4 / 1024, shape_kw=TINY)
                     for dn in DTYPES},
           "bandwidth": bandwidth(torch.device("cpu"), reps=1, cap_mb=4 / 1024, shape_kw=TINY)}
    res["correct"] = all(s["correct"] for s in res["sweep"].values())
    return res


if __name__ == "__main__":
    if "--self-check" in sys.argv:
        import os
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("kernel_bench --self-check needs TRITON_INTERPRET=1 (set before Python starts)")
        print(json.dumps(self_check()))
    else:
        sys.exit(__doc__)
