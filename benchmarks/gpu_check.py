"""One command that proves syncviz's CUDA/NCCL path on a GPU, and self-checks it without one.

    python benchmarks/gpu_check.py [--out gpu-check] [--quick] [--only GROUP,GROUP]
    make gpu-check

On one GPU it checks, and writes <out>/report.md and <out>/report.json:
  cuda_tests                 `pytest -m cuda`: every CUDA test passes, none skipped
  crosscheck_nccl_ws1        DDP + NCCL, world size 1, traced: bucket times from CUDA events vs
                             the NCCL kernels of a torch.profiler trace of the same steps
  crosscheck_gloo_cuda_ws2   the same, 2 ranks on the one GPU with gloo on CUDA tensors
  sync_debug                 no host-device sync inside syncviz's hooks (set_sync_debug_mode("error"))
  overhead_gpt2_gpu          GPT-2 small: plain vs traced vs torch.profiler, benchmarks/overhead.py
                             --device cuda (jobs take turns block by block; ≤ 1.01)
  kernel_bandwidth           Triton flatten_scale vs copy / foreach+cat / cat*s, fp32 bf16 fp16 (≥ 0.85 of copy)
  kernel_block_sweep         the kernel's BLOCK sweep
  engine_nccl_ws1, engine_gloo_cuda_ws2   syncviz.sync (all_reduce, reduce_scatter) vs DDP: equal
Without a GPU each of those is "skipped: no CUDA device", and self-checks of the same machinery run
on the CPU instead (part "cpu" in the report): the cross-check on 2 gloo CPU ranks, the overhead
harness on a tiny GPT, the kernel and its sweep under the Triton interpreter, the engine vs DDP on
gloo, and the CUDA tests skipping cleanly. Installs nothing. Exit status 1 if any check failed.
The report is rewritten after every group, so a run cut off midway keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import syncviz.kernels  # noqa: F401  (installed package: the kernels live in syncviz.kernels)
except ImportError as _e:
    sys.exit(f"gpu_check: syncviz is not installed ({_e}); run `pip install -e .[kernels]` or `make gpu-check`")

from gpu_checks import checks_ddp, checks_engine, checks_kernel, checks_overhead  # noqa: E402
from gpu_checks.common import NO_CUDA, STATUSES, Result, gpu_name, have_cuda  # noqa: E402

# (group, runs on a GPU, runs without one): each returns Results; order = report order
GROUPS = [
    ("cuda_tests", checks_kernel.cuda_tests, None),
    ("crosscheck", checks_ddp.crosscheck_gpu, checks_ddp.crosscheck_cpu),
    ("sync_debug", checks_ddp.sync_debug, None),
    ("overhead", checks_overhead.overhead_gpu, checks_overhead.overhead_cpu),
    ("kernel", checks_kernel.kernel_gpu, checks_kernel.kernel_cpu),
    ("engine", checks_engine.engine_gpu, checks_engine.engine_cpu),
]


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu-check", help="report folder (default: ./gpu-check)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer steps, rounds and repetitions (CPU self-check: a few minutes on 2 cores)")
    ap.add_argument("--only", default="", help=f"comma-separated groups: {', '.join(g for g, *_ in GROUPS)}")
    ap.add_argument("--overhead-tools", default="syncviz,torch.profiler",
                    help="tools the GPU overhead check runs beside plain (benchmarks/overhead.py --tools)")
    ap.add_argument("--cpu-self-checks", choices=("auto", "always", "never"), default="auto",
                    help="run the CPU self-checks: auto = only when there is no GPU")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    o = parse(argv)
    names = [g for g, *_ in GROUPS]
    only = [s.strip() for s in o.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in names]
    if unknown:
        print(f"gpu_check: unknown group {', '.join(unknown)}; choose from {', '.join(names)}", file=sys.stderr)
        return 2
    cpu_too = o.cpu_self_checks == "always" or (o.cpu_self_checks == "auto" and not have_cuda())
    out = Path(o.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    t_all = time.perf_counter()
    print(f"gpu_check: GPU {gpu_name()}; report in {out}/", flush=True)
    for name, gpu, cpu in GROUPS:
        if only and name not in only:
            continue
        for fn in [gpu] + ([cpu] if cpu is not None and cpu_too else []):
            t0 = time.perf_counter()
            print(f"[{name}] {fn.__name__} ...", flush=True)
            try:
                rs = fn(o, print)
            except Exception as e:   # noqa: BLE001 - one broken check must not hide the others
                rs = [Result(f"{name}:{fn.__name__}", fn.__name__, "gpu" if fn is gpu else "cpu", "fail",
                             f"{type(e).__name__}: {e}"[:500])]
            dt = time.perf_counter() - t0
            for r in rs:
                r.seconds = round(dt / max(len(rs), 1), 1)
                print(f"  {r.status.upper():4s} {r.id}: {r.reason or _headline(r)}", flush=True)
            results += rs
            # written after every group: a run cut off (a lent machine's time limit) keeps what it measured
            _write(out, _report(results, o, time.perf_counter() - t_all))
    failed = [r.id for r in results if r.status == "fail"]
    print(f"gpu_check: {len(results)} checks: " + ", ".join(
        f"{sum(r.status == s for r in results)} {s}" for s in STATUSES) + f"; report: {out / 'report.md'}")
    return 1 if failed else 0


def _write(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(_markdown(report))


def _headline(r: Result) -> str:
    f = r.figures
    for k in ("ratio_syncviz", "kernel_fraction_of_copy_min", "start_rel_median", "best_block"):
        if k in f:
            return f"{k} = {f[k]}"
    return ""


def _report(results, o, seconds) -> dict:
    import torch
    env = {"gpu": gpu_name(), "cuda": torch.version.cuda, "torch": torch.__version__,
           "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if have_cuda() else None}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": o.quick,
            "seconds": round(seconds, 1), "environment": env,
            "summary": {s: sum(r.status == s for r in results) for s in STATUSES},
            "checks": [r.as_dict() for r in results]}


def _markdown(rep: dict) -> str:
    env = rep["environment"]
    lines = [f"# syncviz gpu-check — {rep['created']}", "",
             f"GPU: **{env['gpu']}** · CUDA {env['cuda']} · NCCL {env['nccl']} · torch {env['torch']} · "
             f"triton {env['triton']} · {env['cpus']} CPUs · {'--quick · ' if rep['quick'] else ''}"
             f"{rep['seconds']} s", "",
             "Summary: " + ", ".join(f"{n} {s}" for s, n in rep["summary"].items()), ""]
    for part, head in (("gpu", "## On the GPU (what the issue asks for)"),
                       ("cpu", "## CPU self-checks (the same machinery, run without a GPU)")):
        rows = [c for c in rep["checks"] if c["part"] == part]
        if not rows:
            continue
        lines += [head, "", "| check | status | target | result |", "|---|---|---|---|"]
        for c in rows:
            res = c["reason"] if c["status"] != "pass" else _headline(Result(**c)) or "ok"
            cells = [f"`{c['id']}` {c['title']}", f"**{c['status']}**", c["target"], res]
            lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
        lines.append("")
    if any(c["reason"] == NO_CUDA for c in rep["checks"]):
        lines += ["GPU checks marked *" + NO_CUDA + "* did not run: their figures are still to be measured "
                  "on a machine with a CUDA GPU (`make gpu-check`).", ""]
    lines += ["## Figures", ""]
    for c in rep["checks"]:
        if c["figures"]:
            lines += [f"### {c['id']}", "", "```json", json.dumps(c["figures"], indent=1, default=str), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
