"""Each strategy of the built-in workload on 2 gloo ranks, traced and untraced (slow): the
collectives captured have the ops and bytes syncviz.model.theory derives for torch's implementation,
step by step and rank by rank; memory in run.json is what theory says each rank holds; and
tracing does not change a bit of the trained parameters."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from syncviz.trace import schema as S
from syncviz.model import theory as T
from syncviz.views.compare import steady_steps
from syncviz.trace import load_run

pytestmark = pytest.mark.slow

WORKLOAD = ["--preset", "tiny", "--steps", "4", "--batch", "2", "--seq", "16"]
OPS = {"ddp": {"all_reduce"}, "ddp-fp16": {"all_reduce"}, "ddp-bf16": {"all_reduce"},
       "powersgd": {"all_reduce"}, "zero1": {"all_reduce", "broadcast"},
       "zero2": {"all_gather", "reduce_scatter"}, "zero3": {"all_gather", "reduce_scatter"}}
WIRE_DTYPE = {"ddp": "float32", "ddp-fp16": "float16", "ddp-bf16": "bfloat16", "powersgd": "float32",
              "zero1": "float32", "zero2": "float32", "zero3": "float32"}


def _run(args, cwd):
    p = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """strategy → (run dir, traced params, untraced params), run on first use."""
    root = tmp_path_factory.mktemp("strategies")
    cache = {}

    def get(strategy):
        if strategy not in cache:
            d = root / strategy
            d.mkdir(exist_ok=True)    # a failed first attempt must fail again with its own error
            args = [*WORKLOAD, "--strategy", strategy]
            _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                  "-m", "syncviz.workloads", *args, "--save-params", str(d / "plain.pt")], d)
            _run(["-m", "syncviz", "trace", "--standalone", "--nproc-per-node", "2", "--quiet",
                  "--out", str(d / "run"), "-m", "syncviz.workloads", *args,
                  "--save-params", str(d / "traced.pt")], d)
            cache[strategy] = (d / "run", torch.load(d / "traced.pt"), torch.load(d / "plain.pt"))
        return cache[strategy]
    return get


@pytest.mark.parametrize("strategy", T.STRATEGIES)
def test_training_unchanged_by_tracing(runs, strategy):
    _, traced, plain = runs(strategy)
    assert traced.keys() == plain.keys()
    for k in plain:
        assert torch.equal(traced[k], plain[k]), f"{strategy}: {k} differs traced vs untraced"


@pytest.mark.parametrize("strategy", T.STRATEGIES)
def test_bytes_per_step_equal_theory(runs, strategy):
    run = load_run(runs(strategy)[0])
    config = run.meta["strategy_config"]
    assert run.meta["strategy"] == strategy and config["name"] == strategy
    ev = run.events
    comm = ev[ev["kind"].isin(S.COMM_KINDS)]
    assert (comm["end_ns"] >= comm["start_ns"]).all()
    wire = comm[(comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)]
    assert set(wire["op"]) == OPS[strategy]
    start = (config.get("powersgd") or {}).get("start_powerSGD_iter", 0)
    for (rank, step), rows in wire.groupby(["rank", "step"]):
        measured = rows.groupby("op")["bytes"].sum().to_dict()
        expected = T.comm_per_step(strategy, config["param_shapes"], 2, compressed=step >= start)
        assert measured == expected, f"{strategy} rank {rank} step {step}"
    assert len(wire.groupby(["rank", "step"])) == 2 * 4


@pytest.mark.parametrize("strategy", ["ddp", "ddp-fp16", "ddp-bf16", "powersgd", "zero1"])
def test_bucket_rows_record_compression(runs, strategy):
    run = load_run(runs(strategy)[0])
    steps = steady_steps(run)
    b = run.events[(run.events["kind"] == S.BUCKET) & run.events["step"].isin(steps)]
    grads = run.meta["model"]["grad_bytes"]
    assert b.groupby(["rank", "step"])["logical_bytes"].sum().eq(grads).all()    # uncompressed bucket bytes
    assert set(b["dtype"]) == {WIRE_DTYPE[strategy]}
    ratio = b["logical_bytes"].sum() / b["bytes"].sum()
    shapes = run.meta["strategy_config"]["param_shapes"]
    sent = T.comm_per_step(strategy, shapes, 2)["all_reduce"]
    assert ratio == pytest.approx(grads / sent)
    if strategy == "powersgd":
        assert ratio > 10


@pytest.mark.parametrize("strategy", T.STRATEGIES)
def test_memory_per_rank_equals_theory(runs, strategy):
    run = load_run(runs(strategy)[0])
    shapes = run.meta["strategy_config"]["param_shapes"]
    memory = {m["rank"]: m for m in run.meta["memory"]}
    assert sorted(memory) == [0, 1]
    for rank, m in memory.items():
        expected = T.memory_per_rank(strategy, shapes, 2, rank)
        assert {k: m[k] for k in expected} == expected, f"{strategy} rank {rank}"
    fwd = memory[0]["params_after_forward_bytes"]
    if strategy == "zero2":     # shard + every gathered parameter, kept from forward to backward
        assert fwd == memory[0]["params_bytes"] + sum(T.padded_numel(s, 2) for s in shapes.values()) * 4
    elif strategy == "zero3":   # resharded after forward
        assert fwd == memory[0]["params_bytes"]


def test_fsdp_collectives_block_and_count_as_exposed(runs):
    """FSDP2 on gloo: synchronous collectives, cut from compute, so none of them is 'overlapped'."""
    from syncviz import analysis as A
    run = load_run(runs("zero3")[0])
    coll = run.events[run.events["kind"] == S.COLLECTIVE]
    assert coll["name"].str.endswith(A.BLOCKING).all()
    assert set(coll["phase"]) <= {"forward", "backward"}
    steps = A.step_metrics(run)
    assert (steps["overlapped_ns"] == 0).all()
    assert (steps["exposed_ns"] == steps["comm_busy_ns"]).all()


def test_zero1_broadcasts_are_not_optimizer_compute(runs):
    """The ZeRO row wraps the inner AdamW and the broadcasts; only AdamW counts as compute."""
    from syncviz import analysis as A
    run = load_run(runs("zero1")[0])
    opt = run.events[run.events["kind"] == S.OPTIMIZER]
    assert set(opt["name"]) == {"ZeroRedundancyOptimizer", "AdamW"}
    comp = A.compute_intervals(run.events)
    inner = opt[opt["name"] == "AdamW"]
    assert len(comp[comp["kind"] == S.OPTIMIZER]) == len(inner)
    bc = run.events[(run.events["op"] == "broadcast")]
    assert set(bc["phase"]) == {"optimizer"}
