"""Checks "kernel" and "cuda_tests": the Triton flatten_scale against copy / foreach / naive in
GB/s with a BLOCK sweep, and the CUDA test suite."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .common import ROOT, Result, have_cuda, run, skipped, tail

TARGET_BW = "kernel ≥ 0.85 × copy GB/s (fp32, bf16, fp16)"


def kernel_gpu(o, log) -> list[Result]:
    bw_id, bw_title = "kernel_bandwidth", "flatten_scale (Triton) vs copy / foreach+cat / cat*s, GPT-2 124M, 25 MB buckets"
    sw_id, sw_title = "kernel_block_sweep", "flatten_scale BLOCK sweep (fp32), GPT-2 124M, 25 MB buckets"
    if not have_cuda():
        return [skipped(bw_id, bw_title, TARGET_BW), skipped(sw_id, sw_title, "correct at every BLOCK; best BLOCK reported")]
    import torch

    from . import kernel_bench as kb
    dev, reps = torch.device("cuda"), (5 if o.quick else 15)
    out = []
    try:
        bw = kb.bandwidth(dev, reps=reps)
        worst = min(v["fraction_of_copy"]["kernel"] for v in bw.values())
        bw["kernel_fraction_of_copy_min"] = worst
        out.append(Result(bw_id, bw_title, "gpu", "pass" if worst >= 0.85 else "fail",
                          "" if worst >= 0.85 else f"kernel at {worst:.2f} of copy", TARGET_BW, bw))
    except Exception as e:   # noqa: BLE001 - reported as a failed check
        out.append(Result(bw_id, bw_title, "gpu", "fail", f"{type(e).__name__}: {e}"[:500], TARGET_BW))
    try:
        sw = kb.sweep(dev, reps=reps)
        out.append(Result(sw_id, sw_title, "gpu", "pass" if sw["correct"] else "fail",
                          "" if sw["correct"] else "wrong output at some BLOCK", "correct at every BLOCK; best reported", sw))
    except Exception as e:   # noqa: BLE001
        out.append(Result(sw_id, sw_title, "gpu", "fail", f"{type(e).__name__}: {e}"[:500], "correct at every BLOCK"))
    return out


def kernel_cpu(o, log) -> list[Result]:
    """The sweep and bandwidth code under the Triton interpreter, tiny sizes: correctness only."""
    id_ = "kernel_interpret"
    title = "self-check: kernel sweep + bandwidth harness under TRITON_INTERPRET=1 (tiny sizes, all dtypes)"
    target = "kernel output = reference at every swept BLOCK (fp32/fp16 bitwise, bf16 ≤ 1 ulp)"
    p = run([sys.executable, "-m", "gpu_checks.kernel_bench", "--self-check"], timeout=600, log=log,
            TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "benchmarks") + ":" + str(ROOT))
    if p.returncode:
        return [Result(id_, title, "cpu", "fail", tail(p), target)]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    figs = {"blocks_checked": sorted({int(b) for s in res["sweep"].values() for b in s["gbps_by_block"]}),
            "dtypes": list(res["sweep"]), "correct": res["correct"],
            "bandwidth_methods_ran": sorted(next(iter(res["bandwidth"].values()))["gbps"])}
    return [Result(id_, title, "cpu", "pass" if res["correct"] else "fail",
                   "" if res["correct"] else "kernel output differs from the reference", target, figs)]


def _cuda_test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "mark.cuda" in p.read_text())


def _pytest_counts(text: str) -> dict:
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text)}


def skips_allowed(pytest_stdout: str, gpus: int) -> tuple[list[str], int]:
    """(every skip reason pytest -rs printed, how many skipped tests a GPU run may have): with one
    GPU, the tests that need two (real DataParallel) skip and say so; no other skip is allowed."""
    skips = re.findall(r"^SKIPPED \[(\d+)\] (\S+?): (.*)$", pytest_stdout, re.M)   # "[count] where: why"
    allowed = sum(int(n) for n, _, why in skips if gpus < 2 and "needs 2 or more CUDA GPUs" in why)
    return sorted({f"{where} {why}" for _, where, why in skips}), allowed


def cuda_tests(o, log) -> list[Result]:
    """`pytest -m cuda` on the files that have CUDA tests. With a GPU: all pass, none skipped.
    Without: the self-check that every one of them skips cleanly (collects, no error)."""
    import torch
    files = _cuda_test_files()
    # the whole pytest output beside the report, written as it runs (-v: a line per test; a run cut
    # off by a device lease still says which tests passed): a failure's traceback is what the next fix needs
    log_path = Path(o.out) / "cuda_tests.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    p = run([sys.executable, "-m", "pytest", "-v", "-m", "cuda", "-rfEs", "--durations=15", "-p", "no:cacheprovider",
             *files], timeout=900, log=log, stdout_to=log_path)
    counts = _pytest_counts(p.stdout.splitlines()[-1] if p.stdout.strip() else "")
    figs = {"files": files, **counts,
            "failed_tests": re.findall(r"^(?:FAILED|ERROR) (.*)$", p.stdout, re.M)[:20], "log": str(log_path)}
    if have_cuda():
        # With one GPU, the tests that need two (real DataParallel) skip, and say so: the only skip allowed
        figs["skip_reasons"], allowed = skips_allowed(p.stdout, torch.cuda.device_count())
        ok = p.returncode == 0 and counts.get("passed", 0) > 0 and counts.get("skipped", 0) == allowed
        return [Result("cuda_tests", "pytest -m cuda: every CUDA test passes, none skipped", "gpu",
                       "pass" if ok else "fail", "" if ok else tail(p, 6),
                       "all passed, 0 skipped (with one GPU: only the 2-GPU tests skip)", figs)]
    ok = p.returncode == 0 and counts.get("skipped", 0) > 0 and not counts.get("passed") \
        and not counts.get("failed") and not counts.get("error") and not counts.get("errors")
    return [skipped("cuda_tests", "pytest -m cuda: every CUDA test passes, none skipped", "all passed, 0 skipped"),
            Result("cuda_tests_skip_cleanly", "self-check: without a GPU every CUDA test skips cleanly", "cpu",
                   "pass" if ok else "fail", "" if ok else tail(p, 6), "all skipped, no errors", figs)]
