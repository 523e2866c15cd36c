"""Check "overhead": step time of GPT-2 small on the GPU, plain vs `syncviz trace` vs
torch.profiler, interleaved (A B C A B C ...) in one run, so a change in the machine's state hits
all three alike. Ratio of median step times. (benchmarks/overhead.py is the finer CPU harness: jobs
kept alive and gated block by block, paired ratios with intervals.)"""
from __future__ import annotations

import re
import statistics
import tempfile

from .common import HERE, Result, have_cuda, run, skipped, syncviz_trace, tail, torchrun

STEP = re.compile(r"^step\s+(\d+)\s+loss\s+\S+\s+([\d.]+) ms", re.M)   # gpt_train.py's "step N loss L T ms"

SCRIPT = HERE / "gpt_train.py"
TARGET = "syncviz / plain ≤ 1.02"


def interleaved(nproc, args, rounds, warmup, log, backend) -> dict:
    times = {"plain": [], "syncviz": [], "profiler": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for kind in times:
                a = [SCRIPT, *args] + (["--torch-profiler"] if kind == "profiler" else [])
                cmd = syncviz_trace(nproc, f"{tmp}/run", a) if kind == "syncviz" else torchrun(nproc, a)
                p = run(cmd, timeout=600, log=log, SYNCVIZ_BACKEND=backend)
                if p.returncode:
                    raise RuntimeError(f"{kind} run failed: {tail(p)}")
                times[kind] += [float(ms) for s, ms in STEP.findall(p.stdout) if int(s) >= warmup]
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_step_ms": {k: round(v, 2) for k, v in med.items()},
            "steps_measured": {k: len(v) for k, v in times.items()}, "rounds": rounds,
            "ratio_syncviz": round(med["syncviz"] / med["plain"], 4),
            "ratio_profiler": round(med["profiler"] / med["plain"], 4)}


def overhead_gpu(o, log) -> list[Result]:
    id_, title = "overhead_gpt2_gpu", "tracing overhead, GPT-2 small (124M) on the GPU, NCCL world size 1"
    if not have_cuda():
        return [skipped(id_, title, TARGET)]
    rounds, steps = (1, 8) if o.quick else (3, 16)
    args = ["--preset", "small", "--steps", steps, "--batch", 8, "--seq", 1024, "--device", "cuda"]
    try:
        f = interleaved(1, args, rounds, 3, log, "nccl")
    except RuntimeError as e:
        return [Result(id_, title, "gpu", "fail", str(e), TARGET)]
    ok = f["ratio_syncviz"] <= 1.02
    return [Result(id_, title, "gpu", "pass" if ok else "fail",
                   "" if ok else f"ratio {f['ratio_syncviz']:.3f} above target", TARGET, f)]


def overhead_cpu(o, log) -> list[Result]:
    """Self-check: the same script and interleaving on 2 gloo CPU ranks, tiny GPT, 1 round. Its
    ratio is printed, not judged: a 1-round tiny run on a shared CPU says nothing about overhead."""
    id_, title = "overhead_cpu", "self-check: the overhead harness on 2 gloo CPU ranks (tiny GPT, 1 round)"
    target = "all three runs complete and report steps (ratio not judged)"
    args = ["--preset", "tiny", "--steps", 4, "--batch", 2, "--seq", 32, "--device", "cpu"]
    try:
        f = interleaved(2, args, 1, 1, log, "gloo")
    except RuntimeError as e:
        return [Result(id_, title, "cpu", "fail", str(e), target)]
    ok = all(n == 3 for n in f["steps_measured"].values())
    return [Result(id_, title, "cpu", "pass" if ok else "fail", "" if ok else "steps missing", target, f)]
