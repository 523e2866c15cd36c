"""Prediction accuracy of the cost model on real CPU runs: fit α, β (and κ) on one run of the
GPT-small workload (2 gloo ranks, DDP, 25 MB buckets), predict step time and exposed comm for bucket
caps 1, 5, 25 and 100 MB, run each cap, and print predicted vs measured side by side.

    python benchmarks/predict.py [--steps 6] [--out traces/bench-predict] [--caps 1,5,25,100]

Takes minutes: every run is 2 ranks of GPT-2 small (124M parameters) on CPU. The machine's load
average is printed before and after, since other work on the cores changes both compute and
gloo timings between runs.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--caps", default="1,5,25,100")
    ap.add_argument("--reference-cap", type=float, default=25.0)
    ap.add_argument("--reference", default=None, help="fit on this existing run instead of recording one")
    ap.add_argument("--out", default="traces/bench-predict")
    ap.add_argument("--reuse", action="store_true", help="keep complete runs already under --out")
    a = ap.parse_args()

    from syncviz.workloads.sweep import print_sweep, sweep
    caps = [float(c) for c in a.caps.split(",")]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    res = sweep(preset=a.preset, caps=caps, steps=a.steps, out=a.out, reference_cap=a.reference_cap,
                reference=a.reference, reuse=a.reuse, log=lambda m: print(m, flush=True))
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    print_sweep(res)
    for stat, label in (("", "medians"), ("mean_", "means")):
        worst_step = max(abs(r[f"{stat}step_err_pct"]) for r in res["rows"])
        worst_exp = max(abs(r[f"{stat}exposed_err_pct"]) for r in res["rows"])
        print(f"worst |error| ({label}): step {worst_step:.1f}%, exposed comm {worst_exp:.1f}% (target 15%)")
    print(f"[{len(caps)} caps, {a.steps} steps each, {wall:.0f} s; load average {load0[0]:.1f} before, "
          f"{load1[0]:.1f} after, on {os.cpu_count()} CPUs]")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "predict.json", "w") as f:
        json.dump(dict(res, wall_s=wall, load_before=load0, load_after=load1), f, indent=1, default=float)


if __name__ == "__main__":
    main()
