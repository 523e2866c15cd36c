"""Shared pieces of gpu_check: the result record, subprocess launching, and the few syncviz
imports whose module paths differ between layouts."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NO_CUDA = "skipped: no CUDA device"
STATUSES = ("pass", "fail", "skip")


@dataclass
class Result:
    """One line of the report. ``part`` is "gpu" (the measurement the issue asks for) or "cpu"
    (a self-check of the same machinery that runs without a GPU)."""
    id: str
    title: str
    part: str
    status: str
    reason: str = ""
    target: str = ""
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def have_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def gpu_name() -> str:
    return torch.cuda.get_device_name(0) if have_cuda() else "none"


def skipped(id_: str, title: str, target: str = "") -> Result:
    return Result(id_, title, "gpu", "skip", NO_CUDA, target)


def env(**extra) -> dict:
    """Child environment: this checkout importable first, 1 OpenMP thread per CPU rank."""
    e = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **extra}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [e.get("PYTHONPATH")] if p])
    return {k: v for k, v in e.items() if v is not None}


def run(cmd: list, *, timeout: float, log=None, stdout_to: Path | None = None, **extra_env) -> subprocess.CompletedProcess:
    """Run a child, capture its output; on timeout return rc 124 with what it printed.
    ``stdout_to``: the child writes its stdout and stderr to that file as it runs (kept if this
    process is killed), and the result carries the file's text as stdout."""
    t0 = time.perf_counter()
    args = [str(c) for c in cmd]
    if stdout_to is not None:
        p = _run_into(args, stdout_to, timeout, env(**extra_env))
    else:
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env(**extra_env), cwd=ROOT)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            p = subprocess.CompletedProcess(cmd, 124, out, err + f"\n[timed out after {timeout:.0f} s]")
    if log is not None:
        log(f"    ({time.perf_counter() - t0:.1f} s) {' '.join(args[:8])}{' ...' if len(args) > 8 else ''}")
    return p


def _run_into(args: list, path: Path, timeout: float, child_env: dict) -> subprocess.CompletedProcess:
    """run(stdout_to=path): the child's output goes to the file; its text comes back as stdout."""
    with open(path, "w") as f:
        try:
            rc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=child_env,
                                cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    text = Path(path).read_text(errors="replace")
    return subprocess.CompletedProcess(args, rc, text, f"[timed out after {timeout:.0f} s]" if rc == 124 else "")


def syncviz_trace(nproc: int, out, script_and_args: list) -> list:
    """The `syncviz trace` command line (torchrun underneath) for a rank script. --standalone: a
    free port each time, so checks can run side by side (the default 29500 collided on the GPU
    machine when two groups ran at once)."""
    return [sys.executable, "-m", "syncviz", "trace", "--standalone", "--nproc-per-node", str(nproc), "--quiet",
            "--overwrite", "--out", str(out), *script_and_args]


def torchrun(nproc: int, script_and_args: list) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *script_and_args]


def tail(p: subprocess.CompletedProcess, n: int = 3) -> str:
    """The last lines a failed child printed, for the report's reason column."""
    lines = [ln for ln in (p.stderr + "\n" + p.stdout).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-600:] or f"exit {p.returncode}"


def load_benchmark(name: str):
    """A sibling benchmark module (benchmarks/<name>.py) loaded by path, without putting benchmarks/
    on sys.path: there it would shadow same-named modules (tests/crosscheck.py) in a test session."""
    import importlib.util
    key = f"_syncviz_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def load_run(path):
    from syncviz.trace import load_run as _load
    return _load(path)
