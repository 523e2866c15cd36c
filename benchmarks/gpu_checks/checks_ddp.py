"""Checks on traced DDP runs: bucket times against torch.profiler ("crosscheck") and no
host-device synchronization inside syncviz's hooks ("sync_debug")."""
from __future__ import annotations

import tempfile

from . import match
from .common import HERE, Result, have_cuda, load_run, run, skipped, syncviz_trace, tail, torchrun

SCRIPT = HERE / "ddp_train.py"
TARGET = "median |Δstart|, |Δend| ≤ 5% of the bucket's duration (1 µs floor)"


def _traced_profile(tmp, nproc, device, backend, steps, log, extra=()):
    cmd = syncviz_trace(nproc, f"{tmp}/run", [SCRIPT, tmp, "--device", device, "--steps", steps,
                                               "--profile-from", 2, *extra])
    return run(cmd, timeout=600, log=log, SYNCVIZ_BACKEND=backend)


def crosscheck_gpu(o, log) -> list[Result]:
    cases = [("crosscheck_nccl_ws1", "DDP NCCL, world size 1: CUDA-event bucket times vs NCCL kernels",
              1, "nccl", "nccl"),
             ("crosscheck_gloo_cuda_ws2", "DDP gloo on CUDA tensors, 2 ranks on one GPU: bucket times vs "
              "gloo's device copies", 2, "gloo", "gloo-cuda")]
    if not have_cuda():
        return [skipped(i, t, TARGET) for i, t, *_ in cases]
    out = []
    steps = 6 if o.quick else 10
    for id_, title, nproc, backend, mode in cases:
        with tempfile.TemporaryDirectory() as tmp:
            p = _traced_profile(tmp, nproc, "cuda", backend, steps, log)
            if p.returncode:
                out.append(Result(id_, title, "gpu", "fail", tail(p), TARGET))
                continue
            r = load_run(f"{tmp}/run")
            m = match.compare(r, tmp, mode, first_step=2)
            if r.meta.get("device") != "cuda":
                m.update(ok=False, why=f"run.json says device {r.meta.get('device')!r}, not cuda")
            out.append(Result(id_, title, "gpu", "pass" if m["ok"] else "fail", m.get("why", ""), TARGET, m))
    return out


def crosscheck_cpu(o, log) -> list[Result]:
    """Self-check without a GPU: the same launch, conversion and matching code on 2 gloo CPU
    ranks (start = c10d enqueue, end = gloo work end, as tests/crosscheck.py)."""
    id_, title = "crosscheck_cpu", "self-check: the cross-check machinery on 2 gloo CPU ranks (tiny model)"
    target = "every bucket matched; |median Δ| < 1 ms (the CPU cross-check's bound)"
    with tempfile.TemporaryDirectory() as tmp:
        p = _traced_profile(tmp, 2, "cpu", "gloo", 5, log,
                            ["--width", 512, "--layers", 4, "--bucket-cap-mb", 1])
        if p.returncode:
            return [Result(id_, title, "cpu", "fail", tail(p), target)]
        m = match.compare(load_run(f"{tmp}/run"), tmp, "cpu", first_step=2)
    ok = (m["matched"] == m["buckets"] > 0 and abs(m["start_diff_us_median"]) < 1000
          and abs(m["end_diff_us_median"]) < 1000)
    why = "" if ok else m.get("why") or "medians above 1 ms or buckets unmatched"
    return [Result(id_, title, "cpu", "pass" if ok else "fail", why, target, m)]


def sync_debug(o, log) -> list[Result]:
    """Steps 2.. of a traced NCCL run under set_sync_debug_mode("error"); the same script untraced
    is the control (if it fails too, the synchronization is not syncviz's)."""
    id_ = "sync_debug"
    title = 'no host-device sync inside any hook: traced NCCL steps under set_sync_debug_mode("error")'
    target = "traced run finishes (control: the untraced run finishes)"
    if not have_cuda():
        return [skipped(id_, title, target)]
    steps = 5 if o.quick else 8
    with tempfile.TemporaryDirectory() as tmp:
        args = [SCRIPT, tmp, "--device", "cuda", "--steps", steps, "--sync-debug-from", 2]
        plain = run(torchrun(1, args), timeout=600, log=log, SYNCVIZ_BACKEND="nccl")
        traced = run(syncviz_trace(1, f"{tmp}/run", args), timeout=600, log=log, SYNCVIZ_BACKEND="nccl")
        figs = {"control_rc": plain.returncode, "traced_rc": traced.returncode}
        if traced.returncode == 0:
            r = load_run(f"{tmp}/run")
            b = r.events[r.events["kind"] == "bucket"]
            figs["steps_recorded"] = int(r.events["step"].nunique())
            figs["bucket_rows_with_gpu_times"] = int(((b["end_ns"] >= b["start_ns"]) & (b["start_ns"] > 0)).sum())
    if plain.returncode:
        return [Result(id_, title, "gpu", "fail", "control (untraced) failed: " + tail(plain), target, figs)]
    if traced.returncode:
        return [Result(id_, title, "gpu", "fail", tail(traced), target, figs)]
    return [Result(id_, title, "gpu", "pass", "", target, figs)]




