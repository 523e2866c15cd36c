"""Check "engine": syncviz.sync (all_reduce, reduce_scatter) against DDP, equal results."""
from __future__ import annotations

import json
import tempfile

from .common import HERE, Result, have_cuda, run, skipped, tail, torchrun

SCRIPT = HERE / "engine_train.py"
TARGET = "all_reduce bitwise = DDP; reduce_scatter within rtol 1e-5/atol 1e-6; replicas agree"


def _one(id_, title, part, nproc, device, backend, steps, log) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        p = run(torchrun(nproc, [SCRIPT, f"{tmp}/engine.json", "--device", device, "--steps", steps]),
                timeout=600, log=log, SYNCVIZ_BACKEND=backend)
        if p.returncode:
            return Result(id_, title, part, "fail", tail(p), TARGET)
        res = json.loads(open(f"{tmp}/engine.json").read())
    bad = []
    if res["ddp_moved_from_init"] <= 0:
        bad.append("DDP's parameters did not move: the comparison would be vacuous")
    for s, want in (("all_reduce", "bitwise"), ("reduce_scatter", "close")):
        r = res[s]
        if "error" in r:
            bad.append(f"{s}: {r['error']}")
        elif not r[want] or not r["replicas_agree"]:
            bad.append(f"{s}: max |diff| {r['max_abs_diff']:.3g}, {want}={r[want]}, replicas agree={r['replicas_agree']}")
    return Result(id_, title, part, "fail" if bad else "pass", "; ".join(bad), TARGET, res)


def engine_gpu(o, log) -> list[Result]:
    cases = [("engine_nccl_ws1", "syncviz engine vs DDP on CUDA, NCCL, world size 1", 1, "nccl"),
             ("engine_gloo_cuda_ws2", "syncviz engine vs DDP on CUDA, gloo, 2 ranks on one GPU", 2, "gloo")]
    if not have_cuda():
        return [skipped(i, t, TARGET) for i, t, *_ in cases]
    steps = 3 if o.quick else 5
    return [_one(i, t, "gpu", n, "cuda", b, steps, log) for i, t, n, b in cases]


def engine_cpu(o, log) -> list[Result]:
    return [_one("engine_cpu", "self-check: syncviz engine vs DDP on 2 gloo CPU ranks (tiny GPT)", "cpu",
                 2, "cpu", "gloo", 3, log)]
