"""Real training code nobody here wrote the engine of, traced with ``syncviz trace`` on 2 gloo ranks
(slow): a PyTorch Lightning ``Trainer`` (DDP, ``optimizer.step(closure)``), a Hugging Face
``accelerate`` loop with gradient accumulation, a nanoGPT-style loop evaluating under ``no_grad``
inside the step, a hand-written per-parameter all_reduce loop, and FSDP2. For each: forward,
backward and optimizer time per (rank, step) from the raw events (engines_check.check_phases),
against a torch.profiler trace of steps 2–3 of the same run, and the strategy and model named in
run.json from what ran."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engines_check import buckets_match_across_ranks, check_against_profiler, check_phases
from syncviz.trace import load_run
from syncviz.trace import schema as S

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
STEPS = 5
PROFILED = [2, 3]


def trace(tmp_path, script, *args, name="run"):
    out = tmp_path / name
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--standalone", "--nproc-per-node", "2", "--quiet",
                        "--profile", "--profile-steps", "2:4", "--out", str(out), str(SCRIPTS / script), *map(str, args)],
                       capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    run = load_run(out)
    assert run.problems == [] and run.meta["finished"] is True
    return run


def kinds(run, rank, kind):
    ev = run.events
    return ev[(ev["rank"] == rank) & (ev["kind"] == kind)]


def test_lightning_trainer_ddp(tmp_path):
    pytest.importorskip("lightning")
    run = trace(tmp_path, "lightning_train.py", "--steps", STEPS)
    assert run.meta["strategy"] == "ddp" and "DDP" in run.meta["strategy_detail"]
    assert run.meta["model"]["name"] == "Net" and run.meta["model"]["params"] == 64 * 256 + 256 + 256 * 256 + 256 + 256 * 4 + 4
    sums = check_phases(run, micros=1, steps=STEPS)
    buckets_match_across_ranks(run)
    for rank in range(2):
        # the sanity check's and the validation's forwards (no_grad): evaluation, not micro-steps
        ev = kinds(run, rank, S.EVAL_FORWARD)
        assert set(ev["step"]) == {0, 2, 4}
        # step(closure): the optimizer row comes in two pieces, before and after the closure
        opt = kinds(run, rank, S.OPTIMIZER)
        assert (opt.groupby("step").size() == 2).all()
    worst = check_against_profiler(run, PROFILED, forward_annotation="DistributedDataParallel.forward", closure=True)
    print("lightning", sums, worst)


def test_accelerate_gradient_accumulation(tmp_path):
    pytest.importorskip("accelerate")
    run = trace(tmp_path, "accelerate_train.py", "--steps", STEPS, "--accum", 2)
    assert run.meta["strategy"] == "ddp" and run.meta["model"]["name"] == "Sequential"
    sums = check_phases(run, micros=2, steps=STEPS)
    buckets_match_across_ranks(run)
    b = run.events[run.events["kind"] == S.BUCKET]
    assert set(b["micro"]) == {1}          # accelerate.accumulate: no_sync on the first micro-step
    # one optimizer step per accumulated step, not per batch (AcceleratedOptimizer skips the rest)
    assert (run.events[run.events["kind"] == S.OPTIMIZER].groupby(["rank", "step"]).size() == 1).all()
    worst = check_against_profiler(run, PROFILED, forward_annotation="DistributedDataParallel.forward")
    print("accelerate", sums, worst)


def test_eval_under_no_grad_inside_the_step(tmp_path):
    run = trace(tmp_path, "eval_in_step.py", "--steps", STEPS, "--accum", 2, "--evals", 3)
    assert run.meta["strategy"] == "ddp"
    sums = check_phases(run, micros=2, steps=STEPS)
    # rank 0 evaluated 3 times per step, rank 1 never; the micro-steps agree across ranks anyway
    assert (kinds(run, 0, S.EVAL_FORWARD).groupby("step").size() == 3).all()
    assert len(kinds(run, 0, S.EVAL_FORWARD)["step"].unique()) == STEPS
    assert kinds(run, 1, S.EVAL_FORWARD).empty
    buckets_match_across_ranks(run)
    assert set(run.events[run.events["kind"] == S.BUCKET]["micro"]) == {1}
    worst = check_against_profiler(run, PROFILED, forward_annotation="DistributedDataParallel.forward")
    print("eval-in-step", sums, worst)


def test_handwritten_per_parameter_all_reduce(tmp_path):
    run = trace(tmp_path, "handwritten_allreduce.py", "--steps", STEPS, "--probe", "--save", tmp_path / "traced.pt")
    assert run.meta["strategy"] == "hand-written"
    assert "all_reduce" in run.meta["strategy_detail"] and "broadcast" in run.meta["strategy_detail"]
    model = run.meta["model"]
    assert model["name"] == "Sequential" and model["params"] == 128 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert model["grad_bytes"] == 4 * model["params"]
    sums = check_phases(run, micros=1, steps=STEPS)
    ev = run.events
    # gradient-ready times for every parameter, every step (no DDP: hooks on the discovered root)
    ready = ev[ev["kind"] == S.GRAD_READY].groupby(["rank", "step"]).size()
    assert len(ready) == 2 * STEPS and (ready == 6).all()
    # the probe forward (grad enabled, never backpropagated) is evaluation; rank 1 ran none
    assert (kinds(run, 0, S.EVAL_FORWARD).groupby("step").size() == 1).all()
    assert kinds(run, 1, S.EVAL_FORWARD).empty
    # each parameter's all_reduce is a collective of the backward's aftermath, not a bucket
    coll = ev[(ev["kind"] == S.COLLECTIVE) & (ev["op"] == "all_reduce")]
    assert (coll.groupby(["rank", "step"]).size() == 6).all()
    worst = check_against_profiler(run, PROFILED)
    print("hand-written", sums, worst)
    # tracing changed no bit of the training
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(SCRIPTS / "handwritten_allreduce.py"), "--steps", str(STEPS), "--probe", "--save",
                        str(tmp_path / "plain.pt")], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    traced, plain = torch.load(tmp_path / "traced.pt"), torch.load(tmp_path / "plain.pt")
    assert all(torch.equal(traced[k], plain[k]) for k in plain)


def test_fsdp2_fully_shard(tmp_path):
    run = trace(tmp_path, "fsdp2_train.py", "--steps", STEPS, "--reshard", 1)
    assert run.meta["strategy"] == "fsdp2" and "True" in run.meta["strategy_detail"]
    assert run.meta["model"]["name"] == "Sequential"
    assert run.meta["model"]["params"] == 3 * (128 * 256 + 256 + 256 * 128 + 128) + 128 * 10 + 10
    sums = check_phases(run, micros=1, steps=STEPS)
    for rank in range(2):   # inference_mode forwards after steps 1 and 3 land in steps 2 and 4
        assert set(kinds(run, rank, S.EVAL_FORWARD)["step"]) == {2, 4}
    worst = check_against_profiler(run, PROFILED)
    print("fsdp2", sums, worst)


def test_fsdp1_wrapper(tmp_path):
    run = trace(tmp_path, "fsdp1_train.py", "--steps", STEPS, "--sharding", "SHARD_GRAD_OP")
    assert run.meta["strategy"] == "fsdp1" and "SHARD_GRAD_OP" in run.meta["strategy_detail"]
    # unsharded counts, although each rank's FlatParameters hold half
    assert run.meta["model"]["name"] == "Sequential"
    assert run.meta["model"]["params"] == 3 * (128 * 256 + 256 + 256 * 128 + 128) + 128 * 10 + 10
    sums = check_phases(run, micros=1, steps=STEPS)
    ev = run.events
    ops = set(ev[ev["kind"] == S.COLLECTIVE]["op"])
    assert {"all_gather", "reduce_scatter"} <= ops
    worst = check_against_profiler(run, PROFILED)
    print("fsdp1", sums, worst)


@pytest.mark.parametrize("hook", ["none", "mine"])
def test_bucket_launch_is_the_collective_call(tmp_path, hook):
    """Bucket rows: start_ns = comm-hook entry, launch_ns = the all_reduce call (DDP's default path
    on CPU has no hook: both are the reducer's own all_reduce call, after DDP's fused ×1/N; a
    user's hook: its first collective inside the bucket)."""
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--standalone", "--nproc-per-node", "2", "--quiet",
                        "--out", str(out), str(SCRIPTS / "user_train.py"), "--steps", "3", "--accum", "1", "--hook", hook],
                       capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    ev = load_run(out).events
    b = ev[ev["kind"] == S.BUCKET]
    c = ev[(ev["kind"] == S.COLLECTIVE) & (ev["bucket"] >= 0)]
    assert len(b) and len(b) == len(c)
    m = b.merge(c, on=["rank", "step", "micro", "bucket"], suffixes=("", "_c"))
    assert len(m) == len(b)
    assert (m["launch_ns"] >= m["start_ns"]).all() and (m["launch_ns"] <= m["end_ns"]).all()
    if hook == "mine":
        assert (m["launch_ns"] == m["launch_ns_c"]).all()
    else:   # the reducer's call, stamped once for the bucket; its all_reduce row is stamped just after
        assert (m["launch_ns"] <= m["launch_ns_c"]).all() and (m["launch_ns"] == m["start_ns"]).all()
