"""Step time traced vs untraced (and vs torch.profiler), 2 CPU ranks, GPT-2 small shapes.

Runs plain torchrun, `syncviz trace` and torchrun with torch.profiler on, interleaved (A B C A B C
...) so machine noise hits all three alike, and prints the ratio of median step times.

    python benchmarks/overhead.py [--preset small] [--rounds 3] [--steps 6]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

STEP = re.compile(r"^step\s+(\d+)\s+loss\s+\S+\s+([\d.]+) ms", re.M)


def run(kind, args, out):
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    if kind == "syncviz":
        base = [sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--quiet", "--overwrite",
                "--out", out]
    cmd = base + ["-m", "syncviz.workloads", *args] + (["--torch-profiler"] if kind == "profiler" else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode != 0:
        sys.exit(f"{kind} run failed:\n{p.stderr[-2000:]}")
    return [(int(s), float(ms)) for s, ms in STEP.findall(p.stdout)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped from each run")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    a = ap.parse_args()
    args = ["--preset", a.preset, "--steps", str(a.steps), "--batch", str(a.batch), "--seq", str(a.seq)]
    times = {"plain": [], "syncviz": [], "profiler": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for kind in times:
                steps = run(kind, args, os.path.join(tmp, "run"))
                times[kind] += [ms for s, ms in steps if s >= a.warmup]
                print(f"round {r + 1}/{a.rounds} {kind:9s} median step {statistics.median(times[kind]):9.1f} ms",
                      flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\npreset {a.preset}, 2 ranks (gloo), batch {a.batch}x{a.seq} tokens, {a.rounds} interleaved rounds "
          f"x {a.steps - a.warmup} measured steps")
    for k, v in med.items():
        print(f"  {k:9s} median step {v:9.1f} ms   ratio to plain {v / med['plain']:.3f}")
    print(f"syncviz overhead ratio: {med['syncviz'] / med['plain']:.3f} (target <= 1.02); "
          f"torch.profiler: {med['profiler'] / med['plain']:.3f}")


if __name__ == "__main__":
    main()
