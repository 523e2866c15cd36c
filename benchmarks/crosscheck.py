"""syncviz's timings next to two independent measurements of the same steps: DDP's own
runtime-logging timers and the gloo collective events of torch.profiler.

    python benchmarks/crosscheck.py [--steps 8]

Runs tests/scripts/crosscheck_train.py (2 gloo ranks, 4 x 4 MB buckets) under `syncviz trace`
and prints the agreement (differences in ms and relative differences).
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
    a = ap.parse_args()
    from crosscheck import compare_ddp_timers, compare_profiler

    from syncviz.trace import load_run
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--quiet",
                            "--out", f"{tmp}/run", str(ROOT / "tests/scripts/crosscheck_train.py"), tmp, str(a.steps)],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode:
            sys.exit(p.stderr[-2000:])
        run = load_run(f"{tmp}/run")
        prof = compare_profiler(run, tmp)
        ddp = compare_ddp_timers(run, tmp)

    def q(x):
        return f"median {np.median(x):+.3f}, p10 {np.percentile(x, 10):+.3f}, p90 {np.percentile(x, 90):+.3f}"
    print(f"torch.profiler, {prof['matched']} bucket collectives (steps 2..{a.steps - 1}, 2 ranks), syncviz − profiler in ms:")
    print(f"  launch vs c10d::allreduce_ start : {q(prof['launch_diff_ms'])}")
    print(f"  done   vs gloo:all_reduce end    : {q(prof['done_diff_ms'])}")
    print(f"DDP runtime-logging timers, {ddp['n']} (rank, step) pairs, (syncviz − DDP) / DDP:")
    print(f"  forward (fwd start → bwd start)   : {q(ddp['forward_rel'])}")
    print(f"  backward compute                   : {q(ddp['backward_rel'])}  (DDP's starts at forward end)")
    print(f"  backward comm (first launch → last done): {q(ddp['comm_rel'])}")


if __name__ == "__main__":
    main()
