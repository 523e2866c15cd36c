"""GB/s of flattening GPT-2 (124M) gradients into DDP-sized buckets, times 1/world size.

Methods, measured interleaved in one run (bucket by bucket, every method back to back in rotating
order; a repetition is one pass over all buckets; we report the median and best repetition):
  naive    torch.cat(grads) * scale                     as usually written: 2 passes + 2 allocations
  naive_ip torch.cat(grads).mul_(scale)                 _flatten_dense_tensors + div_: 2 passes + 1 alloc
  foreach  torch.cat(torch._foreach_mul(grads, scale), out=bucket)   2 passes
  kernel   syncviz.kernels.flatten_scale (CPU: the single-pass torch path; CUDA: the Triton kernel)
  copy     bucket.copy_(flat source of the same bytes)   the practical limit: read N + write N bytes

GB/s = (gradient bytes read + bucket bytes written) / time, the same byte count for every method,
so ratios of GB/s are ratios of speed. The machine may be shared: we print the median and the best
of the repetitions, and ratios as the median of per-repetition ratios. Usage: python benchmarks/flatten_scale.py [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from syncviz.kernels import flatten_scale


def gpt2_shapes(n_layer=12, d=768, vocab=50257, ctx=1024) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter shapes of GPT-2 small (124M), in model.parameters() order (HF/nanoGPT naming)."""
    shapes = [("wte", (vocab, d)), ("wpe", (ctx, d))]
    for i in range(n_layer):
        shapes += [(f"h{i}.ln_1.w", (d,)), (f"h{i}.ln_1.b", (d,)),
                   (f"h{i}.attn.c_attn.w", (d, 3 * d)), (f"h{i}.attn.c_attn.b", (3 * d,)),
                   (f"h{i}.attn.c_proj.w", (d, d)), (f"h{i}.attn.c_proj.b", (d,)),
                   (f"h{i}.ln_2.w", (d,)), (f"h{i}.ln_2.b", (d,)),
                   (f"h{i}.mlp.c_fc.w", (d, 4 * d)), (f"h{i}.mlp.c_fc.b", (4 * d,)),
                   (f"h{i}.mlp.c_proj.w", (4 * d, d)), (f"h{i}.mlp.c_proj.b", (d,))]
    return shapes + [("ln_f.w", (d,)), ("ln_f.b", (d,))]


def buckets_like_ddp(grads: list[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Reverse parameter order (gradients become ready from the output back), cut at the cap."""
    out, cur, size = [], [], 0
    for g in reversed(grads):
        cur.append(g)
        size += g.numel() * g.element_size()
        if size >= cap_bytes:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's default bucket cap")
    ap.add_argument("--out-dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--evict-mb", type=float, default=64, help="cache-evicting write before each timed call")
    ap.add_argument("--world-size", type=int, default=2, help="scale = 1/world size")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, out_dtype = torch.device(args.device), getattr(torch, args.out_dtype)
    scale = 1.0 / args.world_size

    load_before = os.getloadavg()[0]     # other processes' load: a shared CPU skews every figure
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(s, generator=gen).to(device) for _, s in gpt2_shapes()]
    groups = buckets_like_ddp(grads, int(args.bucket_mb * 2**20))
    sizes = [sum(g.numel() for g in grp) for grp in groups]
    buckets = [torch.empty(n, dtype=out_dtype, device=device) for n in sizes]
    sources = [torch.randn(n, generator=gen).to(device=device, dtype=out_dtype) for n in sizes]
    flats = [[g.reshape(-1) for g in grp] for grp in groups]
    moved = sum(g.numel() * g.element_size() for g in grads) + sum(b.numel() * b.element_size() for b in buckets)

    # Each method handles one bucket; a repetition times every method on bucket 0, then on
    # bucket 1, ... (rotating the order), so the methods compared are measured milliseconds apart
    # and a burst of load from other processes hits all of them alike. Before each timed call we
    # write a buffer of twice the L3 size (this CPU: 32 MiB) so no method finds another's data cached.
    scratch = torch.empty(int(args.evict_mb * 2**20) // 4, device=device)
    def naive(i):
        (torch.cat(flats[i]) * scale).to(out_dtype)

    def naive_ip(i):
        torch.cat(flats[i]).mul_(scale).to(out_dtype)

    def foreach(i):
        torch.cat([t.to(out_dtype) for t in torch._foreach_mul(flats[i], scale)], out=buckets[i])

    def kernel(i):
        flatten_scale(groups[i], buckets[i], scale)

    def copy(i):
        buckets[i].copy_(sources[i])

    methods = {"naive": naive, "naive_ip": naive_ip, "foreach": foreach, "kernel": kernel, "copy": copy}
    names = list(methods)
    times = {m: [0.0] * args.reps for m in methods}
    for fn in methods.values():   # warm up: fault in buffers, load kernels
        for i in range(len(groups)):
            fn(i)
    sync(device)
    for rep in range(args.reps):
        for i in range(len(groups)):
            k = (rep + i) % len(names)
            for name in names[k:] + names[:k]:
                scratch.fill_(rep)
                sync(device)
                t0 = time.perf_counter()
                methods[name](i)
                sync(device)
                times[name][rep] += time.perf_counter() - t0

    backend = "triton" if device.type == "cuda" else "torch (single pass)"
    print(f"GPT-2 124M gradients: {len(grads)} tensors, {sum(g.numel() for g in grads) / 1e6:.1f}M fp32 elements "
          f"-> {len(groups)} buckets of <= {args.bucket_mb:g} MB ({args.out_dtype}), scale 1/{args.world_size}, "
          f"device {device}, torch threads {torch.get_num_threads()}, kernel backend: {backend}")
    print(f"bytes per pass (read + write): {moved / 1e9:.3f} GB; median of {args.reps} interleaved reps; "
          f"load average before/after: {load_before:.1f}/{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  {'method':8s} {'GB/s med':>9s} {'GB/s best':>10s} {'ms med':>8s} {'ms best':>8s}")
    for m in names:
        med, best = statistics.median(times[m]), min(times[m])
        print(f"  {m:8s} {moved / med / 1e9:9.2f} {moved / best / 1e9:10.2f} {med * 1e3:8.1f} {best * 1e3:8.1f}")

    def speedup(other):  # median over repetitions of time(other) / time(kernel); and best/best
        paired = statistics.median(o / k for o, k in zip(times[other], times["kernel"]))
        return paired, min(times[other]) / min(times["kernel"])
    print("kernel speed relative to (median of per-rep ratios | best vs best):")
    for other, target in (("naive", "target >= 3x on CPU"), ("naive_ip", ""), ("foreach", ""),
                          ("copy", "target >= 0.85")):
        paired, best = speedup(other)
        print(f"  vs {other:8s} {paired:5.2f}x | {best:5.2f}x   {target}")


if __name__ == "__main__":
    main()
