"""Asynchronous (stale) gradient averaging on 2 gloo ranks (manual_ddp --stale S, workloads/stale.py):
S = 0 equals synchronous DDP bit for bit; S >= 1 trains something else, and the drift it prints
equals an independent computation from the parameters each rank saved; traced like any run, its
async all-reduces recorded even when they complete after their step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from syncviz.trace import load_run

pytestmark = pytest.mark.slow
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
NPARAMS = 141_056          # the tiny GPT's parameters (28 tensors)


def _torchrun(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "syncviz.workloads.manual_ddp", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def test_stale_zero_is_synchronous_ddp_bit_for_bit(tmp_path):
    p = _torchrun("--stale", "0", "--steps", "3", "--data", "counting", "--save-params", str(tmp_path))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "28/28 parameters equal to synchronous DDP's (bit for bit)" in p.stdout
    log = json.loads((tmp_path / "drift.json").read_text())
    assert [r["drift_max"] for r in log] == [0.0, 0.0, 0.0]          # every rank took the same step
    a, b = (torch.load(tmp_path / f"params-rank{r}.pt") for r in (0, 1))
    assert torch.equal(a, b)


def test_stale_updates_differ_and_drift_equals_saved_parameters(tmp_path):
    steps = 4
    p = _torchrun("--stale", "2", "--steps", str(steps), "--data", "counting", "--save-params", str(tmp_path))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "28/28" not in p.stdout and "rank 0's replica has" in p.stdout   # not the synchronous update
    a, b = (torch.load(tmp_path / f"params-rank{r}.pt").double() for r in (0, 1))
    assert a.shape == (steps, NPARAMS)
    mean = (a + b) / 2
    want_max = torch.maximum((a - mean).abs().amax(1), (b - mean).abs().amax(1))
    want_rel = torch.maximum((a - mean).norm(dim=1), (b - mean).norm(dim=1)) / mean.norm(dim=1)
    log = json.loads((tmp_path / "drift.json").read_text())
    assert [r["step"] for r in log] == list(range(steps))
    assert torch.allclose(torch.tensor([r["drift_max"] for r in log], dtype=torch.float64), want_max, rtol=1e-12)
    assert torch.allclose(torch.tensor([r["drift_rel"] for r in log], dtype=torch.float64), want_rel, rtol=1e-9)
    assert (want_max > 0).all()                                       # the replicas really drift apart
    printed = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    assert len(printed) == steps
    for line, m, r in zip(printed, want_max.tolist(), want_rel.tolist()):
        got_m = float(line.split("max|θ_r-θ̄| ")[1].split(",")[0])
        got_r = float(line.split("‖θ_r-θ̄‖/‖θ̄‖ ")[1])
        assert got_m == pytest.approx(m, rel=1e-5) and got_r == pytest.approx(r, rel=1e-5)
    table = p.stdout.split("loss stale   loss sync")[1].splitlines()[1:steps + 1]
    assert float(table[0].split()[3]) == 0.0          # step 0: same weights, same batch, same loss
    assert any(float(row.split()[3]) != 0.0 for row in table[1:])
    assert [f"{r['loss_sync']:10.6f}".strip() for r in log] == [row.split()[2] for row in table]


def test_stale_run_is_traced_with_its_async_all_reduces(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--out", str(out), "--quiet",
                        "-m", "syncviz.workloads.manual_ddp", "--stale", "2", "--steps", "4"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "invalid rows" not in p.stderr
    run = load_run(out)
    assert run.meta["strategy"] == "manual-stale" and sorted(run.events["step"].unique()) == [0, 1, 2, 3]
    ev = run.events
    grads = ev[(ev["kind"] == "collective") & (ev["op"] == "all_reduce")]
    assert len(grads) == 2 * 4 and (grads["bytes"] == 4 * NPARAMS).all()   # one flattened gradient per rank-step
    assert (grads["end_ns"] > grads["start_ns"]).all()     # each stamped, also those finishing after their step


@pytest.mark.parametrize("args, msg", [(["--stale", "-1"], "S >= 0"), (["--stale", "1", "--overlap"], "--overlap"),
                                       (["--save-params", "x"], "goes with --stale")])
def test_bad_stale_arguments_are_one_line(args, msg):
    p = subprocess.run([sys.executable, "-m", "syncviz.workloads.manual_ddp", *args], capture_output=True, text=True,
                       env=ENV, timeout=120)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr
