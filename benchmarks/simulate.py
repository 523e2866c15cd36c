"""Simulator throughput: 1,024 ranks × 1,000 steps × 100 buckets (DDP), simulated and written as a
syncviz trace. Prints the time and events/s of each stage, and checks a rank reads back.

    python benchmarks/simulate.py [--out DIR] [--grad-ready none|bucket|param] [--workers N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--buckets", type=int, default=100)
    ap.add_argument("--grad-ready", default="none", choices=("none", "bucket", "param"))
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", default=None, help="parent directory for the run [a temporary one under /tmp]")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()

    t_import = time.perf_counter()
    from syncviz import costmodel as CM
    from syncviz import simcore as SC
    from syncviz import simtrace as ST
    from syncviz.simulate import run_meta
    from syncviz.trace import load_run
    t_import = time.perf_counter() - t_import

    # 100 tensors of 25 MiB (bf16 gradients), cap 25 MiB -> exactly one tensor per bucket.
    k, mib = a.buckets, 1024 * 1024
    numel = np.full(k, 25 * mib // 2, dtype=np.int64)
    prof = SC.Profile("bench-1.3B", [f"layers.{i}.weight" for i in range(k)], numel,
                      ready_ns=np.linspace(1, k, k) * 0.6e6, layer=np.arange(k), param_index=np.arange(k)[::-1],
                      forward_ns=30e6, optimizer_ns=5e6, gap_ns=0.2e6, grad_dtype="bfloat16",
                      param_dtype="bfloat16")
    cfg = SC.SimConfig(world_size=a.ranks, steps=a.steps, strategy="ddp", bucket_cap_mb=25,
                       first_bucket_cap_mb=1, link=CM.LINKS["ib-400"])
    parent = a.out or tempfile.mkdtemp(prefix="syncviz-bench-")
    out = os.path.join(parent, "sim-bench")
    shutil.rmtree(out, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        tl = SC.Timeline(prof, cfg)
        t1 = time.perf_counter()
        rows = ST.write(out, tl, run_meta("sim-bench", tl), grad_ready=a.grad_ready, workers=a.workers)
        t2 = time.perf_counter()
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        total = t2 - t0
        print(f"{a.ranks} ranks × {a.steps} steps × {len(tl.x)} buckets (grad_ready rows: {a.grad_ready}), "
              f"{os.cpu_count()} CPUs, output {out}")
        print(f"  simulate (timeline)   {t1 - t0:7.3f} s")
        print(f"  build + write trace   {t2 - t1:7.3f} s   {size / 1e9:.2f} GB, {size / rows:.1f} bytes/event")
        print(f"  total                 {total:7.3f} s   {rows:,} events = {rows / total / 1e6:.1f} M events/s "
              f"(bucket rows: {a.ranks * a.steps * len(tl.x):,})   [imports {t_import:.2f} s not counted]")
        t3 = time.perf_counter()
        run = load_run(out, ranks=[a.ranks - 1])
        ev = run.events
        assert len(ev) == rows // a.ranks and ev["step"].max() == a.steps - 1
        assert (ev[ev["kind"] == "bucket"]["bucket"].nunique()) == len(tl.x)
        print(f"  read back rank {a.ranks - 1}: {len(ev):,} events in {time.perf_counter() - t3:.2f} s (load_run)")
    finally:
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
            if a.out is None:
                shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
