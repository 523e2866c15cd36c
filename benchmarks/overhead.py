"""Tracing overhead on user-style DDP scripts: syncviz, torch.profiler and TraceML, each against
plain torchrun, side by side in one run, with 95% confidence intervals.

    python benchmarks/overhead.py                          # every case, every tool, 6 launches x 4 rounds
    python benchmarks/overhead.py --cases short-steps --rounds 40 --launches 8 --tools syncviz
    python benchmarks/overhead.py --device cuda --cases gpt2-small   # one GPU: 1 rank, NCCL, batch 8x1024
    # where syncviz's cost lies: checkouts with one part switched off each, side by side (ablations)
    PYTHONPATH=$PWD python benchmarks/overhead.py --cases short-steps --tools syncviz \
        --compare /tmp/abl/nowrite --compare /tmp/abl/nogroup --rounds 96 --launches 12 --steps 20

Design, because this 2-core machine is noisy (separate launches, plain against plain, differed by
0.65x to 1.9x under load, and by up to 22% on a quiet machine):
- Every tool's job (and a second plain job) is started, all in parallel, and stays alive for one
  launch; after its warm-up it waits on a FIFO. A round gives each job one block of `--steps` steps,
  in a shuffled order, one job at a time, so the blocks of one round are seconds apart and process
  start-up is never timed. Each launch's first round is dropped.
- A tool's ratio in a round is its block's median step time over the plain job's block of the same
  round: the pairing cancels drift between rounds (other load, frequency changes).
- A process has a speed of its own: with one launch, the A/A ratio of two identical plain jobs
  came out at 1.051 [1.037, 1.066] in one run and 0.980 [0.967, 0.993] in another (CPU time,
  many-params): the intervals over rounds were tight, but around a per-process offset. So the
  rounds are split over `--launches` fresh starts of every job (in a shuffled start order, in
  folders job0, job1, ... whose names have the same length for every tool), and the interval is a
  95% t-interval over the launches' mean log ratios: process-to-process variation is inside it.
- "plain again / plain" is an A/A test: its interval shows the resolution reached. If it does not
  contain 1.000, or is wider than the effect you want to see, run more launches. Measured here:
  `--rounds 320 --launches 16 --steps 20` (short-steps, ~17 min) gave it a half-width of ~1.2%
  (1.010 [0.998, 1.021]); 8 launches of 3 rounds of 10 steps, ~5%.
- Wall time and process CPU time (rank 0, every thread, gloo's included) are both reported: CPU
  time is less disturbed by other processes and shows work added even where it overlaps.
- Caveat: idle jobs are not quite idle (syncviz's watchdog wakes once a second; TraceML's
  aggregator samples every 2 s), which adds the same small noise to every tool's blocks.
TraceML (`pip install traceml-ai`) runs under `traceml run` with its trace_step wrapper; it is
skipped with a note when not installed.
"""
import argparse
import json
import math
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).with_name("overhead_script.py")
CASES = ("many-params", "short-steps", "large-buckets", "accumulation", "gpt2-small")
TOOLS = ("syncviz", "torch.profiler", "traceml")
# two-sided 95% Student t quantiles by degrees of freedom (no scipy needed)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df: int) -> float:
    return T95.get(df) or T95[max(k for k in T95 if k <= df)] if df >= 1 else float("nan")


def ranks(a) -> range:
    """CPU: 2 gloo ranks; cuda: one rank on the one GPU (NCCL), as a single-GPU user runs DDP."""
    return range(1 if a.device == "cuda" else 2)


def label_of(tool: str) -> str:
    """"syncviz@/path/to/checkout" (a --compare) is labelled "syncviz@checkout"."""
    return f"syncviz@{Path(tool.split('@', 1)[1]).name}" if "@" in tool else tool


def command(tool: str, case: str, a, out: Path, work: Path) -> list[str]:
    script = [str(SCRIPT), "--case", case, "--steps", str(a.steps), "--warmup", str(a.warmup), "--out", str(out),
              "--device", a.device]
    n = str(len(ranks(a)))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n]
    if tool in ("plain", "plain again"):
        return torchrun + script
    if tool == "torch.profiler":
        return torchrun + script + ["--torch-profiler"]
    if tool.startswith("syncviz"):         # "syncviz" or "syncviz@<checkout>" (--compare)
        return [sys.executable, "-m", "syncviz", "trace", "--standalone", "--nproc-per-node", n, "--quiet",
                "--overwrite", "--out", str(work / "syncviz-run")] + script
    if tool == "traceml":
        shutil.rmtree(work / "traceml-logs", ignore_errors=True)
        return [shutil.which("traceml") or "traceml", "run", str(SCRIPT), "--nproc-per-node", n, "--mode", "summary",
                "--logs-dir", str(work / "traceml-logs"), "--args", *script[1:], "--traceml"]
    raise ValueError(tool)


class Job:
    """One tool's job on one case, alive for the whole case; it runs a block of steps per "go"."""

    def __init__(self, tool: str, case: str, a, work: Path):
        self.tool = tool
        self.ranks = ranks(a)
        # Every job's folder name has the same length (job0, job1, ...: the start order), so no tool's
        # argv or cwd is longer than another's (a process's layout in memory depends on them).
        self.dir = work
        gate = self.dir / "gate"
        gate.mkdir(parents=True)
        for r in self.ranks:
            os.mkfifo(gate / f"go-{r}")
            os.mkfifo(gate / f"done-{r}")
        self.gate = gate
        self.out = self.dir / "times.json"
        self.log = open(self.dir / "log.txt", "w")
        cmd = command(tool, case, a, self.out, self.dir) + ["--gate", str(gate)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if tool.startswith("syncviz@"):      # another checkout's syncviz, imported first
            env["PYTHONPATH"] = os.pathsep.join([tool.split("@", 1)[1], env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=self.dir)

    def connect(self, timeout: float) -> None:
        """Wait until the job finished its warm-up and opened its gates (jobs start in parallel)."""
        self.done = [os.open(self.gate / f"done-{r}", os.O_RDONLY | os.O_NONBLOCK) for r in self.ranks]
        self.go = [self._open_writer(self.gate / f"go-{r}", timeout) for r in self.ranks]

    def _fail(self, what: str):
        self.proc.kill()
        self.log.flush()
        tail = (self.dir / "log.txt").read_text()[-1500:]
        sys.exit(f"overhead: {self.tool} {what} (exit {self.proc.poll()}):\n{tail}")

    def _open_writer(self, fifo: Path, timeout: float) -> int:
        end = time.monotonic() + timeout
        while True:       # a FIFO opens for writing once the rank opened it for reading
            try:
                return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    self._fail("never reached its first block")
                time.sleep(0.05)

    def block(self, timeout: float) -> None:
        for fd in self.go:
            os.write(fd, b"go\n")
        for fd in self.done:
            end = time.monotonic() + timeout
            while True:
                select.select([fd], [], [], 1.0)
                try:
                    if os.read(fd, 64):
                        break
                    time.sleep(0.001)      # EOF: the rank has not opened its end yet
                except BlockingIOError:
                    pass                   # still running its block
                if self.proc.poll() is not None or time.monotonic() > end:
                    self._fail("did not finish a block")

    def finish(self, timeout: float) -> list:
        for fd in self.go:
            os.close(fd)               # EOF: the script leaves its loop, writes its times, exits
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._fail("did not exit")
        for fd in self.done:
            os.close(fd)
        if not self.out.exists():
            self._fail("wrote no step times")
        return json.loads(self.out.read_text())["blocks"]


def measure(case: str, tools: list[str], a, work: Path, rng) -> dict:
    """tool -> one list per launch of [(median wall s, median CPU s) per round], each launch's first
    (warm-up) round dropped. Every launch starts every job afresh, in a shuffled order."""
    names = ["plain", "plain again", *tools]
    out: dict[str, list] = {t: [] for t in names}
    sizes = [a.rounds // a.launches + (i < a.rounds % a.launches) for i in range(a.launches)]
    done = 0
    for li, n in enumerate(sizes):
        order = list(names)
        rng.shuffle(order)
        jobs = {t: Job(t, case, a, work / case / f"launch{li}" / f"job{k}") for k, t in enumerate(order)}
        for job in jobs.values():
            job.connect(a.timeout)
        for r in range(n + 1):
            rng.shuffle(order)
            for tool in order:
                jobs[tool].block(a.timeout)
            if r:
                done += 1
                print(f"{case:14s} launch {li + 1}/{a.launches} round {done}/{a.rounds}", flush=True)
        for tool, job in jobs.items():
            blocks = job.finish(a.timeout)[1:]
            out[tool].append([(statistics.median(w for w, _ in b), statistics.median(c for _, c in b)) for b in blocks])
    return out


def ratios(per: dict, tool: str, base: str, k: int) -> list[list[float]]:
    """Per launch, the paired ratios tool / base of each round (k: 0 wall, 1 CPU)."""
    return [[x[k] / p[k] for x, p in zip(xs, ps)] for xs, ps in zip(per[tool], per[base])]


def nested_interval(by_launch: list[list[float]]) -> tuple[float, float, float]:
    """Geometric mean and 95% t-interval with the launch as the unit: each launch's mean log ratio,
    then a t-interval over launches. A process has a speed of its own (two launches of the same
    plain script differed by 1-5% in CPU time for their whole life, measured here), so rounds of
    one launch are not independent samples of a tool's cost; only new processes average that out.
    With one launch this is the rounds' interval (per-process bias not covered)."""
    if len(by_launch) == 1:
        return interval(by_launch[0])
    return interval([math.exp(statistics.fmean(math.log(r) for r in rs)) for rs in by_launch])


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """geometric mean and 95% t-interval of paired ratios"""
    logs = [math.log(r) for r in ratios]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(m), float("nan"), float("nan")
    h = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, from {', '.join(TOOLS)}")
    ap.add_argument("--rounds", type=int, default=24, help="measured rounds in all, split over --launches")
    ap.add_argument("--launches", type=int, default=6, help="times every job is started afresh (the interval's unit)")
    ap.add_argument("--steps", type=int, default=10, help="steps per block (gpt2-small on the CPU: a tenth, at least 2)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=900, help="seconds a job may take to start or to run a block")
    ap.add_argument("--compare", metavar="CHECKOUT", action="append", default=[],
                    help="also trace with the syncviz of another checkout (e.g. a `git worktree` of main), side "
                    "by side: shows what a change did to the overhead; repeat it to compare several (each "
                    "labelled by its folder's name)")
    ap.add_argument("--json", help="also write every round's figures here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: 2 gloo ranks, 1 thread each; cuda: 1 rank on the GPU, NCCL, bf16 autocast")
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    tools = [t for t in a.tools.split(",") if t]
    for bad in [c for c in cases if c not in CASES] + [t for t in tools if t not in TOOLS]:
        sys.exit(f"overhead: unknown case or tool {bad!r}")
    if "traceml" in tools and shutil.which("traceml") is None:
        print("overhead: TraceML is not installed (pip install traceml-ai): skipped", flush=True)
        tools.remove("traceml")
    for checkout in a.compare:
        if not (Path(checkout) / "syncviz" / "__init__.py").exists():
            sys.exit(f"overhead: --compare {checkout}: not a syncviz checkout")
        tools.append("syncviz@" + str(Path(checkout).resolve()))
    if len({Path(t.split("@", 1)[1]).name for t in tools if "@" in t}) < len(a.compare):
        sys.exit("overhead: --compare: give each checkout a folder of its own name (it labels the rows)")
    where = "2 gloo ranks, 1 thread each"
    if a.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            sys.exit("overhead: --device cuda: no CUDA GPU here")
        where = f"1 rank on {torch.cuda.get_device_name(0)}, NCCL, bf16 autocast"
    if a.launches < 1 or a.rounds < max(2, a.launches):
        sys.exit("overhead: need --launches >= 1 and --rounds >= max(2, --launches)")
    rng = random.Random(0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            steps = a.steps
            if case == "gpt2-small" and a.device == "cpu":
                a.steps = max(2, steps // 10)
            results[case] = measure(case, tools, a, Path(tmp), rng)
            a.steps = steps
    small = "" if a.device == "cuda" else f" (gpt2-small: {max(2, a.steps // 10)})"
    print(f"\n{where}, {a.launches} launches x {a.rounds // a.launches} rounds x {a.steps} "
          f"measured steps{small}; ratio = tool / plain of the same round, "
          f"geometric mean [95% CI over launches]; load average {os.getloadavg()[0]:.1f}")
    print(f"{'case':14s} {'plain ms':>9s}  {'tool':15s} {'wall ratio':>26s} {'CPU ratio':>26s}")
    for case, per in results.items():
        ms = 1e3 * statistics.median(w for launch in per["plain"] for w, _ in launch)
        for tool in [t for t in per if t != "plain"]:
            w, c = (nested_interval(ratios(per, tool, "plain", k)) for k in (0, 1))
            label = label_of(tool)
            print(f"{case:14s} {ms:9.2f}  {label:15s} {w[0]:8.3f} [{w[1]:.3f}, {w[2]:.3f}]    "
                  f"{c[0]:8.3f} [{c[1]:.3f}, {c[2]:.3f}]")
    for case, per in results.items():
        for old in [t for t in per if "@" in t and "syncviz" in per]:
            w, c = (nested_interval(ratios(per, "syncviz", old, k)) for k in (0, 1))
            print(f"{case:14s} this syncviz / {label_of(old)}: wall {w[0]:.3f} [{w[1]:.3f}, {w[2]:.3f}]   "
                  f"CPU {c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}]")
    if a.json:
        Path(a.json).write_text(json.dumps({"rounds": a.rounds, "launches": a.launches, "steps": a.steps,
                                            "device": a.device, "results": results}, indent=1))


if __name__ == "__main__":
    main()
