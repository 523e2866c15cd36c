"""The partitioned summary at several partition sizes, alternated in one run: wall, CPU and peak
memory (process tree) of `analysis.partitioned.summarize` as `syncviz summary` calls it
(`views.runcache.summarize_to_keep`: with what `compare` measures and the Replay's pieces), a fresh
process each time.

    python benchmarks/scale.py --sizes 1e8 --skip-views --kind ddp --dir /tmp/runs   # makes the run
    python benchmarks/partition_size.py /tmp/runs/ddp70b-1024x781-b1 --sizes 7.5e5,1.5e6 --rounds 3

Why: partitioned.PARTITION_EVENTS was chosen with it (its comment has the figures). This machine's
runs of the same summary differ by 10% and more from minute to minute, so the sizes take turns in a
shuffled order each round, and the ratio printed is of each size's median over the first size's.
"""
import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scale import measure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Through views.runcache.summarize_to_keep, the one place that says what `syncviz summary` asks of the
# partitioned summary, so this follows it if that changes. It writes no cache itself.
ONE = """
import sys, tempfile
from syncviz.views.runcache import summarize_to_keep
if __name__ == "__main__":
    summarize_to_keep(sys.argv[1], tempfile.mkdtemp(), target_events=int(float(sys.argv[2])))
"""


def _events(text: str) -> float | None:
    """A --sizes entry as the number of events it says, or None where it says none."""
    try:
        n = float(text)
    except ValueError:
        return None
    return n if 1 <= n < float("inf") else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run folder (big enough for several partitions)")
    ap.add_argument("--sizes", default="7.5e5,1.5e6", help="events per partition, comma separated [7.5e5,1.5e6]")
    ap.add_argument("--rounds", type=int, default=3, help="turns each size takes [3]")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per summary [900]")
    args = ap.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if not sizes or any(_events(s) is None for s in sizes):
        ap.error(f"--sizes {args.sizes!r}: event counts of at least 1, comma separated (7.5e5,1.5e6)")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not (Path(args.run) / "run.json").exists():
        sys.exit(f"{args.run}: not a run folder (no run.json)")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "one.py"        # a file, not -c: the workers are spawned and re-import it
        script.write_text(ONE)
        got: dict[str, list[dict]] = {s: [] for s in sizes}
        for r in range(args.rounds):
            for s in random.sample(sizes, len(sizes)):
                m = measure([sys.executable, str(script), args.run, s], args.timeout, cwd=str(ROOT))
                got[s].append(m)
                print(f"round {r + 1}/{args.rounds}, {float(s):,.0f} events a partition: {m['wall_s']:.1f} s wall, "
                      f"{m['cpu_s']:.1f} s CPU ({m['sys_s']:.1f} s system), peak {m['peak_gb']:.2f} GB ({m['status']})", flush=True)
    base = statistics.median(m["wall_s"] for m in got[sizes[0]])
    print(f"\n{'events a partition':>20} {'wall (each round)':>26} {'median':>8} {'ratio':>6} {'CPU median':>11} {'peak':>8}")
    for s in sizes:
        walls = [m["wall_s"] for m in got[s]]
        med = statistics.median(walls)
        print(f"{float(s):>20,.0f} {', '.join(f'{w:.1f}' for w in walls):>26} {med:>7.1f}s {med / base:>6.3f} "
              f"{statistics.median(m['cpu_s'] for m in got[s]):>10.1f}s {max(m['peak_gb'] for m in got[s]):>6.2f}GB")


if __name__ == "__main__":
    main()
