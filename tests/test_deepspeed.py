"""DeepSpeed's ZeRO stages 1-3, ZeRO-Offload and ZeRO-Infinity on the built-in GPT, 2 gloo ranks,
traced by ``syncviz trace`` and untraced (slow): recorded as DeepSpeed runs (strategy, stage,
offload devices), bytes per step and op equal syncviz.ds_theory, memory per rank equal to it
(device / host / NVMe), DeepSpeed's gradient buckets as bucket rows with their parameters,
forward / backward / optimizer / offload phases present and nested, and training bitwise the same
traced and untraced. Skipped (with the reason) where DeepSpeed is not importable; CI installs it.

Infinity runs the "mini" GPT: DeepSpeed swaps a tensor to NVMe only from 1 MiB up, and every
partition of "tiny" is smaller (it would run Infinity without touching NVMe).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from syncviz.model import theory as T
from syncviz.trace import load_run
from syncviz.trace import schema as S
from syncviz.views.compare import run_comparison
from syncviz.workloads import ds_build

WHY = ds_build.available()
needs_deepspeed = pytest.mark.skipif(WHY is not None, reason=f"{WHY} (install: DS_BUILD_OPS=0 pip install "
                                                             "'syncviz[deepspeed]')")

STAGE = {"ds-zero1": 1, "ds-zero2": 2, "ds-zero3": 3, "ds-offload": 2, "ds-infinity": 3}
OFFLOAD = {"ds-offload": ("cpu", "none"), "ds-infinity": ("nvme", "nvme")}
PRESET = {"ds-infinity": "mini"}


def _workload(strategy):
    return ["--preset", PRESET.get(strategy, "tiny"), "--steps", "4", "--batch", "2", "--seq", "16",
            "--bucket-cap-mb", "0.05", "--strategy", strategy]


def _run(args, cwd):
    p = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """strategy → (run, traced params, untraced params), run on first use."""
    root = tmp_path_factory.mktemp("deepspeed")
    cache = {}

    def get(strategy):
        if strategy not in cache:
            t = time.monotonic()
            ds_build.ensure_ops(strategy, echo=print)   # sets TORCH_EXTENSIONS_DIR for the ranks too
            d = root / strategy
            d.mkdir()
            _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                  "-m", "syncviz.workloads", *_workload(strategy), "--save-params", str(d / "plain.pt")], d)
            _run(["-m", "syncviz", "trace", "--standalone", "--nproc-per-node", "2", "--quiet",
                  "--out", str(d / "run"), "-m", "syncviz.workloads", *_workload(strategy),
                  "--save-params", str(d / "traced.pt")], d)
            print(f"{strategy}: built, ran untraced and traced in {time.monotonic() - t:.0f} s")
            cache[strategy] = (load_run(d / "run"), torch.load(d / "traced.pt"), torch.load(d / "plain.pt"))
        return cache[strategy]
    return get


@pytest.mark.parametrize("strategy", T.DS_STRATEGIES)
@pytest.mark.slow
@needs_deepspeed
def test_recorded_as_deepspeed(runs, strategy):
    run, _, _ = runs(strategy)
    m = run.meta
    assert m["strategy"] == strategy and m["engine"] == "deepspeed"
    ds = m["deepspeed"]
    assert ds["stage"] == STAGE[strategy]
    assert (ds["offload_optimizer"], ds["offload_param"]) == OFFLOAD.get(strategy, ("none", "none"))
    assert ds["reduce_bucket_size"] == int(0.05 * 2**20 / 4) // 2 * 2
    assert ds["precision"] == "fp32"
    assert m["model"]["name"] == "GPT" and m["model"]["params"] == sum(
        torch.Size(s).numel() for s in m["strategy_config"]["param_shapes"].values())


@pytest.mark.parametrize("strategy", T.DS_STRATEGIES)
@pytest.mark.slow
@needs_deepspeed
def test_bytes_per_op_equal_theory(runs, strategy):
    run, _, _ = runs(strategy)
    c = run_comparison(run)
    ops = {o["op"]: o for o in c["ops"] if o["expected_bytes"] is not None}
    expected = {"all_reduce", "all_gather"} | ({"reduce_scatter"} if STAGE[strategy] == 3 else set())
    assert set(ops) == expected
    for op, o in ops.items():
        assert o["measured_bytes"] == o["expected_bytes"], (op, o)
    # stage 1/2: DeepSpeed all-reduces the gradients (the textbook reduce-scatters them)
    if STAGE[strategy] in (1, 2):
        grads = run.meta["model"]["grad_bytes"]
        assert ops["all_reduce"]["measured_bytes"] >= grads and "reduce_scatter" not in ops


@pytest.mark.parametrize("strategy", T.DS_STRATEGIES)
@pytest.mark.slow
@needs_deepspeed
def test_memory_equal_theory(runs, strategy):
    run, _, _ = runs(strategy)
    sc = run.meta["strategy_config"]
    keys = ("params_bytes", "grads_bytes", "master_params_bytes", "optimizer_states_bytes",
            "device_bytes", "host_bytes", "nvme_bytes")
    for r, measured in enumerate(run.meta["memory"]):
        expected = T.memory_per_rank(strategy, sc["param_shapes"], run.world_size, r,
                                     group_numels=sc["group_numels"], param_order=sc["param_order"],
                                     nvme_gradients=sc["nvme_gradients"],
                                     nvme_param_itemsize=sc["nvme_param_itemsize"])
        assert {k: measured[k] for k in keys} == {k: expected[k] for k in keys}, r
    if strategy == "ds-infinity":
        assert run.meta["memory"][0]["nvme_bytes"] > 0 and sc["nvme_param_itemsize"] in (2, 4)
    else:
        assert sc["nvme_param_itemsize"] is None
    if strategy == "ds-offload":
        assert run.meta["memory"][0]["host_bytes"] > run.meta["memory"][0]["device_bytes"] > 0


@pytest.mark.parametrize("strategy", T.DS_STRATEGIES)
@pytest.mark.slow
@needs_deepspeed
def test_buckets_with_parameters(runs, strategy):
    run, _, _ = runs(strategy)
    ev, lay = run.events, run.layouts
    buckets = ev[ev["kind"] == S.BUCKET]
    assert len(buckets) and len(lay)
    shapes = run.meta["strategy_config"]["param_shapes"]
    for (rank, layout, b), rows in buckets.groupby(["rank", "layout", "bucket"]):
        params = lay[(lay["rank"] == rank) & (lay["layout"] == layout) & (lay["bucket"] == b)]
        assert len(params), (rank, layout, b)
        assert set(params["param"]) <= set(shapes)
        # the bucket's logical bytes are its parameters' gradients
        assert (rows["logical_bytes"] == int(params["numel"].sum()) * 4).all()
        assert (rows["ready_ns"] <= rows["launch_ns"]).all() and (rows["ready_ns"] > 0).all()
    op = "reduce_scatter" if STAGE[strategy] == 3 else "all_reduce"
    assert set(buckets["op"]) == {op}
    # the collectives a bucket launched are attributed to it
    coll = ev[(ev["kind"] == S.COLLECTIVE) & (ev["bucket"] >= 0)]
    assert set(coll["op"]) == {op}


def _inside(inner, outer) -> bool:
    return any(o.start_ns <= inner.start_ns and inner.end_ns <= o.end_ns for o in outer.itertuples())


@pytest.mark.parametrize("strategy", T.DS_STRATEGIES)
@pytest.mark.slow
@needs_deepspeed
def test_phases_nested(runs, strategy):
    run, _, _ = runs(strategy)
    ev = run.events
    for (rank, step), e in ev[ev["step"] >= 0].groupby(["rank", "step"]):
        f, b = e[e["kind"] == S.FORWARD], e[e["kind"] == S.BACKWARD]
        o = e[e["kind"] == S.OPTIMIZER]
        assert len(f) == len(b) == 1 and (f["end_ns"] > f["start_ns"]).all() and (b["end_ns"] > b["start_ns"]).all()
        assert f["end_ns"].iloc[0] <= b["start_ns"].iloc[0]
        outer, inner = o[o["layout"] == 0], o[o["layout"] == 1]
        assert len(outer) == 1 and len(inner) >= 1 and outer["start_ns"].iloc[0] >= b["end_ns"].iloc[0]
        assert all(_inside(r, outer) for r in inner.itertuples())
        for r in e[e["kind"] == S.BUCKET].itertuples():
            assert _inside(r, b), (rank, step, r)
        off = e[e["kind"] == S.OFFLOAD]
        assert all(_inside(r, f) or _inside(r, b) or _inside(r, outer) for r in off.itertuples())
        if strategy in OFFLOAD:
            host_step = off[off["name"].str.startswith("optimizer step on host")]
            assert len(host_step) == 1 and _inside(host_step.iloc[0], inner)
        else:
            assert not len(off)
        if strategy == "ds-infinity":
            assert off["name"].str.contains("NVMe").any()
        st = e[e["kind"] == S.STEP]
        assert st["start_ns"].iloc[0] <= f["start_ns"].iloc[0] and outer["end_ns"].iloc[0] <= st["end_ns"].iloc[0]


@pytest.mark.parametrize("strategy", T.DS_STRATEGIES)
@pytest.mark.slow
@needs_deepspeed
def test_training_unchanged_by_tracing(runs, strategy):
    _, traced, plain = runs(strategy)
    assert traced.keys() == plain.keys()
    for k in plain:
        assert torch.equal(traced[k], plain[k]), f"{strategy}: {k} differs traced vs untraced"


# ------------------------------------------------------------------------- fast, no ranks

def test_stale_lock_removed_live_build_kept(tmp_path):
    old = time.time() - 2 * ds_build.STALE_AFTER_S
    for name in ("killed", "building", "fresh"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lock").touch()
    os.utime(tmp_path / "killed" / "lock", (old, old))
    os.utime(tmp_path / "building" / "lock", (old, old))
    builder = subprocess.Popen(["sleep", "30"], cwd=tmp_path / "building")   # stands for ninja
    try:
        removed = ds_build.clean_stale_locks(tmp_path)
    finally:
        builder.kill()
        builder.wait()
    assert removed == [tmp_path / "killed" / "lock"]
    assert (tmp_path / "building" / "lock").exists() and (tmp_path / "fresh" / "lock").exists()


def test_theory_pads_and_counts_module_uses():
    shapes = {"a": [5, 3], "b": [7]}                      # 15 + 7 = 22 elements
    # stage 1/2: one flat group padded to 2N = 4 elements (24), gradients all-reduced unpadded
    assert T.comm_per_step("ds-zero2", shapes, 2) == {"all_reduce": 22 * 4 + 4, "all_gather": 24 * 4}
    assert T.comm_per_step("ds-zero2", shapes, 2, accum=3)["all_reduce"] == 3 * 22 * 4 + 4
    assert T.comm_per_step("ds-zero1", shapes, 2, accum=3)["all_reduce"] == 22 * 4 + 4
    # stage 3: each parameter padded to N; "a" used by two modules is gathered twice, per pass
    z3 = T.comm_per_step("ds-zero3", shapes, 2, module_params=[["a"], ["b"], ["a"]])
    assert z3 == {"all_gather": 2 * (16 + 8 + 16) * 4, "reduce_scatter": (16 + 8) * 4, "all_reduce": 8}
    assert T.textbook_comm_per_step("ds-zero2", 88, 88) == {"reduce_scatter": 88, "all_gather": 88}


def test_theory_nvme_files_with_and_without_gradient_swaps():
    """ZeRO-Infinity on NVMe: the optimizer's partition (master and both moments, each padded to
    1 KiB), each parameter partition of 1 MiB or more, and, where the DeepSpeed that ran swaps
    boundary gradients (nvme_gradients), each fp32 gradient partition of 1 MiB or more cut to a
    multiple of 1 KiB (its remainder stays in memory)."""
    mib = 1024 ** 2
    shapes = {"emb": [1024, 768], "w": [300, 300], "odd": [2 * 262_400 + 6]}   # per rank: 393,216 / 45,000 / 262,403
    part = 393_216 + 45_000 + 262_403
    optimizer = 3 * (-(-part * 4 // 1024) * 1024)
    params = 393_216 * 4 + (-(-262_403 * 4 // 1024) * 1024)        # partitions of 1 MiB or more, padded
    before = T.memory_per_rank("ds-infinity", shapes, 2, 0)["nvme_bytes"]
    assert before == optimizer + params
    grads = 393_216 * 4 + 262_400 * 4                                # the odd one cut at 262,400 (a 1 KiB multiple)
    assert T.memory_per_rank("ds-infinity", shapes, 2, 0, nvme_gradients=True)["nvme_bytes"] == before + grads
    assert 262_403 * 4 >= mib
    # a parameter swapper that counts in 2-byte elements (DeepSpeed's CPU accelerator picks fp16 or
    # bf16 when the config names no precision): neither partition reaches 1 MiB in it, so no file
    assert T.memory_per_rank("ds-infinity", shapes, 2, 0, nvme_param_itemsize=2)["nvme_bytes"] == optimizer
    assert T.memory_per_rank("ds-infinity", shapes, 2, 0, nvme_param_itemsize=4)["nvme_bytes"] == before
    # an optimizer partition under 1 MiB stays in memory, and so do the gradients
    small = {"w": [300, 300]}
    assert T.memory_per_rank("ds-infinity", small, 2, 0, nvme_gradients=True)["nvme_bytes"] == 0
