"""What touching memory costs on this machine: pages used again at once, against pages the system
has held free for a while (and so, on a VM with free page reporting, given back to the host).

    python benchmarks/fresh_memory.py                 # 800 MB, 10 s idle, three rounds
    python benchmarks/fresh_memory.py --mb 2000 --idle 5

Why: the big-run benchmarks (scale.py, partition_size.py) time summaries whose system CPU time was a
quarter of their CPU on these machines (README "Timing on these machines"). This says how much of a
run's time can depend on what the machine did in the seconds before it, not on syncviz: it times,
side by side in one run, filling an array (numpy) and writing a new file of that size (page cache),
each at once after the same amount was freed and again after ``--idle`` seconds, and prints the ratio.
"""
import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def timed(fn) -> tuple[float, float]:
    """(wall, system CPU) seconds of fn()."""
    t0, c0 = time.perf_counter(), os.times()
    fn()
    return time.perf_counter() - t0, os.times().system - c0.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=800, help="megabytes touched each time [800]")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds the freed memory stays free [10]")
    ap.add_argument("--rounds", type=int, default=3, help="rounds [3]")
    args = ap.parse_args()
    if args.mb < 1 or args.rounds < 1 or not 0 <= args.idle < float("inf"):
        ap.error("--mb and --rounds must be at least 1, --idle a number of seconds >= 0")
    n = args.mb * (1 << 20) // 8
    src = np.arange(n, dtype=np.float64)          # the bytes written to files, touched once here
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def fill():
            np.ones(n)

        def write():
            path = Path(tmp) / "piece.bin"
            src.tofile(path)
            path.unlink()       # the page cache's pages freed as the array's are

        for r in range(args.rounds):
            for what, fn in (("array", fill), ("file", write)):
                fn()                                        # leaves `mb` freed just now
                rows.setdefault(f"{what}, at once", []).append(timed(fn))
                time.sleep(args.idle)
                rows.setdefault(f"{what}, after {args.idle:g} s idle", []).append(timed(fn))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    print(f"\n{args.mb:,} MB each time, {args.rounds} rounds (medians):")
    print(f"{'':>26} {'wall':>8} {'system':>8} {'s/GB':>6}")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(s for _, s in v)) for k, v in rows.items()}
    for k, (w, s) in med.items():
        print(f"{k:>26} {w:>7.2f}s {s:>7.2f}s {w / (args.mb / 1024):>6.2f}")
    for what in ("array", "file"):
        late, soon = med[f"{what}, after {args.idle:g} s idle"][0], med[f"{what}, at once"][0]
        print(f"{what}: after {args.idle:g} s idle / at once = {late / max(soon, 1e-9):.1f}x")


if __name__ == "__main__":
    main()
