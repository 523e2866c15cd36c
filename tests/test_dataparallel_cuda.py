"""A real torch.nn.DataParallel step traced phase by phase (syncviz/workloads/dataparallel_trace.py):
on 2+ GPUs every exchange is timed and the bytes it moved through GPU 0, counted from the tensors
torch passed to torch.nn.parallel.comm, equal syncviz.model.dataparallel's formulas. Without
GPUs: the CUDA test skips, the script says so in one line, and the formula bridge is checked."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from syncviz.workloads import dataparallel_trace as T
from syncviz.workloads.gpt import GPT, preset

TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more CUDA GPUs")


@pytest.mark.cuda
@TWO_GPUS
@pytest.mark.parametrize("outputs", ["logits", "loss"])
def test_real_dataparallel_step_phases_and_bytes(tmp_path, outputs):
    args = T.parse_args(["--preset", "tiny", "--steps", "3", "--batch", "2", "--seq", "32", "--outputs", outputs,
                         "--out", str(tmp_path)])
    res = T.run(args)
    n = res["gpus"]
    assert n == torch.cuda.device_count() and len(res["steps"]) == 3
    last = res["steps"][-1]
    for name in T.PHASES:
        assert last["seconds"][name] >= 0, name
    for name, want in res["formula_gpu0_bytes"].items():
        got = last["gpu0_bytes"][name]
        if outputs == "loss" and "output" in name:
            assert got == (n - 1) * 4            # the model counts the N loss scalars as 0 bytes
        else:
            assert got == want, (name, got, want)
    names = {e.get("name") for e in json.loads((tmp_path / "profile.json").read_text())["traceEvents"]}
    assert {"syncviz.dp.replicate", "syncviz.dp.parallel apply", "syncviz.dp.backward: reduce gradients"} <= names


def test_without_two_gpus_it_says_so_in_one_line():
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs")
    p = subprocess.run([sys.executable, "-m", "syncviz.workloads.dataparallel_trace", "--steps", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "needs 2 or more CUDA devices" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_formula_bridge_matches_hand_values():
    cfg = preset("tiny")
    model = GPT(cfg)
    psize = sum(p.numel() for p in model.parameters()) * 4
    for outputs in ("logits", "loss"):
        args = argparse.Namespace(batch=2, seq=32, outputs=outputs)
        f = T.formula_bytes(model, cfg, args, 4)
        ids = 2 * 32 * 8 * (2 if outputs == "loss" else 1)
        out = 2 * 32 * cfg.vocab_size * 4 if outputs == "logits" else 0
        assert f["scatter inputs"] == pytest.approx(3 * ids)
        assert f["replicate"] == 3 * psize and f["backward: reduce gradients"] == 3 * psize
        assert f["gather outputs"] == pytest.approx(3 * out) and f["backward: scatter output grads"] == f["gather outputs"]
