"""Advisor: the recommended cap is the best of the candidates the model predicts, its predictions
agree with simulated runs written at those caps, and bad inputs are one-line errors. The sweep
(real CPU runs) is marked slow."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from syncviz import analysis as A
from syncviz.model import costmodel as CM
from syncviz.model import fit as FIT
from syncviz.model import simcore as SC
from syncviz.model import simprofile as SP
from syncviz.model import simtrace as ST
from syncviz.model.advise import advise
from syncviz.workloads.sweep import sweep
from syncviz.cli import cli
from syncviz.model.simulate import run_meta
from syncviz.trace import load_run

MS = 1e6
LINK = CM.Link("test", busbw_gbps=0.5, latency_us=300.0)


def profile() -> SP.Profile:
    """Twelve 2 MB gradients ready every 2 ms of a 24 ms backward, then a 20 MB one at the end
    (a tied embedding): small caps pay latency, big caps wait for the last gradients."""
    numel = np.r_[np.full(12, 500_000), 5_000_000].astype(np.int64)
    ready = np.r_[np.arange(1, 13) * 2 * MS, 24 * MS]
    return SP.Profile("adv", [f"blocks.{i}.w" for i in range(12)] + ["wte"], numel, ready,
                      layer=np.r_[np.arange(12)[::-1], -1], param_index=np.arange(13)[::-1],
                      forward_ns=10 * MS, optimizer_ns=3 * MS, hook_ns=50_000.0, grad_dtype="float32",
                      param_dtype="float32", device="cpu", backend="gloo")


def recorded(tmp_path, cap=1.0, name="run"):
    """A simulated 'recording' (exact α-β timings plus mild jitter) the advisor can fit: at a
    1 MiB cap its buckets have two sizes, some under backward and some after it, enough to tell
    α, β and κ apart."""
    cfg = SC.SimConfig(world_size=2, steps=5, bucket_cap_mb=cap, first_bucket_cap_mb=cap, link=LINK,
                       algo="ring", jitter=SC.Jitter(compute_cv=0.002, rank_cv=0, start_frac=0, comm_cv=0.0))
    tl = SC.Timeline(profile(), cfg)
    meta = run_meta(name, tl)
    meta["strategy"] = "ddp"
    ST.write(tmp_path / name, tl, meta)
    return load_run(tmp_path / name)


def test_advice_picks_the_best_candidate_and_predicts_each_cap(tmp_path):
    run = recorded(tmp_path)
    fit, _ = FIT.fit_run(run)
    assert fit.alpha_s == pytest.approx(300e-6, rel=0.05) and fit.busbw_gbps == pytest.approx(0.5, rel=0.05)
    adv = advise(run, caps=(1, 4, 8, 25, 100))
    steps = {(r["cap_mb"], r["first_mb"]): r["step_ms"] for r in adv["candidates"]}
    assert adv["best"]["step_ms"] == min(steps.values())
    assert adv["current"]["cap_mb"] == 1 and adv["measured"]["step_ms"] > 0
    # the model replays the recorded run closely (it was made by the same model, plus jitter)
    assert adv["current"]["step_ms"] == pytest.approx(adv["measured"]["step_ms"], rel=0.02)
    # predicted at another cap == measured on a run recorded at that cap
    other = A.run_summary(recorded(tmp_path, cap=4, name="cap4"))
    assert steps[(4, 4)] == pytest.approx(other["step_ms"], rel=0.02)
    opts = {r["option"] for r in adv["options"]}
    assert {"ddp + fp16 hook", "zero1", "zero2", "zero3"} <= opts
    z3 = next(r for r in adv["options"] if r["option"] == "zero3")
    assert z3["memory_gb"] < adv["memory_gb"]["ddp"]


def test_advise_command(tmp_path):
    recorded(tmp_path)
    r = CliRunner().invoke(cli, ["advise", str(tmp_path / "run"), "--caps", "1,8,25"])
    assert r.exit_code == 0, r.output
    assert "Bucket caps" in r.output and "Advice:" in r.output and "←best" in r.output
    r = CliRunner().invoke(cli, ["advise", str(tmp_path / "run"), "--json", "--world-size", "64",
                                 "--link", "ib-200"])
    assert r.exit_code == 0, r.output
    adv = json.loads(r.output)
    assert adv["world_size"] == 64 and adv["link"] == "ib-200"


@pytest.mark.parametrize("args,message", [
    (["--caps", "1,x"], "comma-separated"),
    (["--caps", "0,5"], "must be > 0"),
    (["--world-size", "0"], "world size must be >= 1"),
])
def test_advise_bad_arguments(tmp_path, args, message):
    recorded(tmp_path)
    p = subprocess.run([sys.executable, "-m", "syncviz", "advise", str(tmp_path / "run"), *args],
                       capture_output=True, text=True)
    assert p.returncode != 0 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_advise_missing_run(tmp_path):
    p = subprocess.run([sys.executable, "-m", "syncviz", "advise", str(tmp_path / "nope")],
                       capture_output=True, text=True)
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


@pytest.mark.slow
def test_sweep_runs_the_workload(tmp_path):
    """Two real 2-rank gloo runs of the tiny GPT: the sweep fits on one and reports both."""
    res = sweep(preset="tiny", caps=(0.05, 0.2), steps=3, out=str(tmp_path / "sw"), reference_cap=0.2,
                log=lambda m: None)
    assert [r["cap_mb"] for r in res["rows"]] == [0.05, 0.2]
    for r in res["rows"]:
        assert r["pred_step_ms"] > 0 and r["meas_step_ms"] > 0 and load_run(r["run"]).world_size == 2
    assert res["rows"][0]["buckets"] > res["rows"][1]["buckets"]
