"""Simulator throughput: 1,024 ranks × 1,000 steps × 100 buckets (DDP) simulated and written as a
syncviz trace (target: 5 s). Prints the time and events/s, the bytes written, the CPU seconds the
writer processes used, and the same run encoded but sent to /dev/null (the cost without the OS
copying gigabytes into files); then reads one rank back with trace.load_run.

    python benchmarks/simulate.py [--out DIR] [--grad-ready none|bucket|param] [--workers N]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

import numpy as np


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--buckets", type=int, default=100)
    ap.add_argument("--grad-ready", default="none", choices=("none", "bucket", "param"),
                    help="grad_ready rows (none: bucket rows carry each bucket's ready time)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", default=None, help="parent directory for the run [a temporary one under /tmp]")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-dry-run", action="store_true", help="skip the /dev/null pass")
    a = ap.parse_args()

    from syncviz.model import costmodel as CM
    from syncviz.model import simcore as SC
    from syncviz.model import simprofile as SP
    from syncviz.model import simtrace as ST
    from syncviz.model.simulate import run_meta
    from syncviz.trace import load_run

    # 100 tensors of 25 MiB (bf16 gradients), cap 25 MiB -> exactly one tensor per bucket.
    k, mib = a.buckets, 1024 * 1024
    numel = np.full(k, 25 * mib // 2, dtype=np.int64)
    prof = SP.Profile("bench-1.3B", [f"layers.{i}.weight" for i in range(k)], numel,
                      ready_ns=np.linspace(1, k, k) * 0.6e6, layer=np.arange(k), param_index=np.arange(k)[::-1],
                      forward_ns=30e6, optimizer_ns=5e6, gap_ns=0.2e6, grad_dtype="bfloat16",
                      param_dtype="bfloat16")
    cfg = SC.SimConfig(world_size=a.ranks, steps=a.steps, strategy="ddp", bucket_cap_mb=25,
                       first_bucket_cap_mb=1, link=CM.LINKS["ib-400"])
    parent = a.out or tempfile.mkdtemp(prefix="syncviz-bench-")
    out = os.path.join(parent, "sim-bench")
    shutil.rmtree(out, ignore_errors=True)
    load0 = os.getloadavg()[0]
    try:
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        tl = SC.Timeline(prof, cfg)
        t1 = time.perf_counter()
        rows = ST.write(out, tl, run_meta("sim-bench", tl), grad_ready=a.grad_ready, workers=a.workers)
        t2 = time.perf_counter()
        cpu = cpu_seconds() - cpu0
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        total = t2 - t0
        print(f"{a.ranks} ranks × {a.steps} steps × {len(tl.x)} buckets (grad_ready rows: {a.grad_ready}) "
              f"-> {out}")
        print(f"  simulate (timeline)   {t1 - t0:7.3f} s")
        print(f"  build + write trace   {t2 - t1:7.3f} s   {size / 1e9:.2f} GB, {size / rows:.1f} bytes/event")
        print(f"  total                 {total:7.3f} s   {rows:,} events = {rows / total / 1e6:.1f} M events/s "
              f"(bucket rows: {a.ranks * a.steps * len(tl.x):,}); {cpu:.1f} CPU-s on {os.cpu_count()} CPUs, "
              f"load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after")
        if not a.no_dry_run:
            t3 = time.perf_counter()
            tl = SC.Timeline(prof, cfg)
            ST.write(out + "-dry", tl, run_meta("sim-bench", tl), grad_ready=a.grad_ready, workers=a.workers,
                     dry_run=True)
            dry = time.perf_counter() - t3
            print(f"  same, bytes to /dev/null {dry:6.3f} s   {rows / dry / 1e6:.1f} M events/s")
        t4 = time.perf_counter()
        run = load_run(out, ranks=[a.ranks - 1])
        ev = run.events
        assert len(ev) == rows // a.ranks and ev["step"].max() == a.steps - 1
        assert ev[ev["kind"] == "bucket"]["bucket"].nunique() == len(tl.x)
        print(f"  read back rank {a.ranks - 1}: {len(ev):,} events in {time.perf_counter() - t4:.2f} s (load_run)")
    finally:
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out + "-dry", ignore_errors=True)
        if a.out is None and not a.keep:
            shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
