"""syncviz's timings next to independent measurements of the same steps: DDP's own
runtime-logging timers, the gloo collective events of torch.profiler, exposed comm rebuilt from
the profiler trace alone, and a standalone all_reduce of the buckets' size timed in the same job.

    python benchmarks/crosscheck.py [--steps 8]

Runs tests/scripts/crosscheck_train.py (2 gloo ranks, 4 x 4 MB buckets) under `syncviz trace`
and prints the agreement (differences in ms and relative differences). Targets (issue 11):
exposed comm per step within 10% (median) of the profiler's; busbw on service time within 25%
of the standalone all_reduce.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--keep", metavar="DIR", help="Keep the run, profiler traces and probes in DIR.")
    a = ap.parse_args()
    from crosscheck import compare_busbw, compare_ddp_timers, compare_exposed, compare_profiler

    from syncviz.trace import load_run
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.keep or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--quiet",
                            "--out", f"{tmp}/run", str(ROOT / "tests/scripts/crosscheck_train.py"), tmp, str(a.steps)],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode:
            sys.exit(p.stderr[-2000:])
        run = load_run(f"{tmp}/run")
        prof = compare_profiler(run, tmp)
        ddp = compare_ddp_timers(run, tmp)
        exposed = compare_exposed(run, tmp)
        bw = compare_busbw(run, tmp)

    def q(x):
        return f"median {np.median(x):+.3f}, p10 {np.percentile(x, 10):+.3f}, p90 {np.percentile(x, 90):+.3f}"
    print(f"torch.profiler, {prof['matched']} bucket collectives (steps 2..{a.steps - 1}, 2 ranks), syncviz − profiler in ms:")
    print(f"  launch vs c10d::allreduce_ start : {q(prof['launch_diff_ms'])}")
    print(f"  done   vs gloo:all_reduce end    : {q(prof['done_diff_ms'])}")
    print(f"DDP runtime-logging timers, {ddp['n']} (rank, step) pairs, (syncviz − DDP) / DDP:")
    print(f"  forward (the forward row)         : {q(ddp['forward_rel'])}")
    print(f"  backward compute                   : {q(ddp['backward_rel'])}  (DDP's starts at forward end)")
    print(f"  backward comm (first launch → last done): {q(ddp['comm_rel'])}")
    rel = exposed["rel"][np.isfinite(exposed["rel"])]
    print(f"exposed comm per (rank, step), {exposed['n']} pairs: syncviz median {np.median(exposed['syncviz_ms']):.2f} ms, "
          f"profiler-derived median {np.median(exposed['profiler_ms']):.2f} ms")
    print(f"  (syncviz − profiler) / profiler   : {q(rel)}  -> {'within' if abs(np.median(rel)) <= 0.10 else 'OUTSIDE'} 10%")
    ref = ", ".join(f"{b / 1e6:.2f} MB {g:.3f} GB/s" for b, g in bw["standalone_gbps"].items())
    print(f"busbw, standalone all_reduce in the same job: {ref}")
    for key, what in (("all", "all buckets"), ("idle", "buckets whose service ran while no rank computed"),
                      ("isolated", "of those, buckets with no other collective in flight")):
        r = bw[key][np.isfinite(bw[key])]
        if len(r):
            med = np.median(r)
            print(f"  {what} ({bw['n_' + key]}): busbw on service time / standalone: median {med:.2f}, "
                  f"p10 {np.percentile(r, 10):.2f}, p90 {np.percentile(r, 90):.2f}"
                  f" -> {'within' if abs(med - 1) <= 0.25 else 'OUTSIDE'} 25%")
        else:
            print(f"  {what}: none")
    print(f"  (busbw on launch → done instead: median {np.median(bw['span_busbw_all']):.3f} GB/s, "
          f"on service time {np.nanmedian(bw['busbw_all']):.3f} GB/s)")


if __name__ == "__main__":
    main()
