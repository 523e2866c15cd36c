"""Cost model: collective formulas, the memory model (derived by hand below), link presets, and the
α-β fit against traces whose timings are known exactly."""
from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

from syncviz import analysis as A
from syncviz.model import costmodel as CM
from syncviz.model import fit as FIT
from syncviz.model import simcore as SC
from syncviz.model import simprofile as SP
from syncviz.model import simtrace as ST
from syncviz.cli import cli
from syncviz.trace import load_run

GB = 1e9


# ------------------------------------------------------------------------------ memory model

def test_memory_70b_on_8_gpus_issue_convention():
    """Ψ = 70e9 parameters, fp16 params (2 B) and grads (2 B), Adam m and v in fp32 (8 B/param,
    K = 8, no fp32 master copy), N = 8 GPUs. Per GPU:
      DDP    2Ψ + 2Ψ + 8Ψ            = 12Ψ      = 840 GB
      ZeRO-1 2Ψ + 2Ψ + 8Ψ/8          =  5Ψ      = 350 GB
      ZeRO-2 2Ψ + 2Ψ/8 + 8Ψ/8        =  3.25Ψ   = 227.5 GB
      ZeRO-3 (2Ψ + 2Ψ + 8Ψ)/8        =  1.5Ψ    = 105 GB"""
    spec = CM.MemorySpec(params=70_000_000_000, param_bytes=2, grad_bytes=2, optimizer_bytes=8)
    got = {s: CM.memory_per_gpu(spec, s, 8) for s in ("ddp", "zero1", "zero2", "zero3")}
    assert got["ddp"].gpu == pytest.approx(840 * GB)
    assert got["zero1"].gpu == pytest.approx(350 * GB)
    assert got["zero2"].gpu == pytest.approx(227.5 * GB)
    assert got["zero3"].gpu == pytest.approx(105 * GB)
    # the parts, not just the totals
    assert (got["zero2"].params, got["zero2"].grads, got["zero2"].optimizer) == pytest.approx(
        (140 * GB, 17.5 * GB, 70 * GB))
    assert all(m.host == 0 for m in got.values())


def test_memory_matches_zero_paper_with_master_weights():
    """The ZeRO paper's Figure 1 (7.5B params, N = 64, K = 12 = fp32 master + m + v):
    120 GB, 31.4 GB, 16.6 GB, 1.9 GB."""
    spec = CM.MemorySpec(params=7_500_000_000, optimizer_bytes=8, master_bytes=4)
    assert spec.k == 12
    gpu = [CM.memory_per_gpu(spec, s, 64).gpu / GB for s in ("ddp", "zero1", "zero2", "zero3")]
    assert gpu == pytest.approx([120.0, 31.4, 16.6, 1.9], abs=0.06)


def test_memory_offload_moves_states_to_host():
    spec = CM.MemorySpec(params=1_000_000_000)
    z2 = CM.memory_per_gpu(spec, "zero2-offload", 4)
    assert z2.gpu == pytest.approx(2 * GB) and z2.host == pytest.approx((2 + 8) * GB / 4)
    z3 = CM.memory_per_gpu(spec, "zero3-offload", 4)
    assert z3.gpu == 0 and z3.host == pytest.approx(12 * GB / 4)


@pytest.mark.parametrize("kwargs,world,match", [
    (dict(params=-5), 8, "parameter count"),
    (dict(params=0), 8, "parameter count"),
    (dict(params=10, grad_bytes=-2), 8, "grad bytes"),
    (dict(params=10), 0, "world size"),
])
def test_memory_rejects_bad_descriptions(kwargs, world, match):
    with pytest.raises(ValueError, match=match):
        CM.memory_per_gpu(CM.MemorySpec(**kwargs), "ddp", world)


def test_comm_bytes_per_step():
    assert CM.comm_bytes_per_step("ddp", 10, 5) == {"all_reduce": 10}
    assert CM.comm_bytes_per_step("zero2", 10, 5) == {"reduce_scatter": 10, "all_gather": 5}
    assert CM.comm_bytes_per_step("zero3", 10, 5) == {"all_gather": 10, "reduce_scatter": 10}


# ------------------------------------------------------------------------------ collectives

LINK = CM.Link("test", busbw_gbps=10.0, latency_us=5.0)   # α = 5 µs, β = 0.1 ns/byte


def test_ring_formulas_by_hand():
    n, p = 1e8, 4
    # all_reduce: 2(p−1)α + 2(p−1)/p·n·β = 6·5 µs + 1.5·1e8·1e-10 s = 30 µs + 15 ms
    assert CM.collective_time("all_reduce", n, p, LINK, "ring") == pytest.approx(30e-6 + 15e-3)
    # reduce_scatter and all_gather: (p−1)α + (p−1)/p·n·β = 15 µs + 7.5 ms
    assert CM.collective_time("reduce_scatter", n, p, LINK, "ring") == pytest.approx(15e-6 + 7.5e-3)
    assert CM.collective_time("all_gather", n, p, LINK, "ring") == pytest.approx(15e-6 + 7.5e-3)
    # tree all_reduce: 2⌈log2 p⌉α + 2nβ = 20 µs + 20 ms
    assert CM.collective_time("all_reduce", n, p, LINK, "tree") == pytest.approx(20e-6 + 20e-3)
    assert CM.collective_time("all_reduce", n, 1, LINK) == 0.0
    assert CM.collective_time("all_reduce", 0, 8, LINK) == 0.0


def test_reduction_cost_gamma():
    link = CM.Link("g", busbw_gbps=10.0, latency_us=0.0, gamma_gbps=20.0)
    n, p = 1e8, 4
    assert CM.collective_time("all_reduce", n, p, link, "ring") == pytest.approx(1.5e8 * 1e-10 + 0.75e8 / 20e9)
    assert CM.collective_time("all_gather", n, p, link, "ring") == pytest.approx(0.75e8 * 1e-10)


def test_busbw_of_a_large_ring_collective_is_the_link_bandwidth():
    """DESIGN's convention: busbw = bytes/time × busbw_factor → 1/β for large messages."""
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        n, p = 1e11, 16
        t = CM.collective_time(op, n, p, LINK, "ring")
        assert n / t * A.busbw_factor(op, p) / GB == pytest.approx(LINK.busbw_gbps, rel=1e-4)


def test_auto_picks_tree_for_small_messages_on_many_ranks():
    ib = CM.LINKS["ib-400"]
    assert CM.choose_algo("all_reduce", 1e6, 1024, ib) == "tree"      # 2046 hops of 6 µs vs 20
    assert CM.choose_algo("all_reduce", 1e10, 8, ib) == "ring"
    arr = CM.collective_time("all_reduce", np.array([1e3, 1e6, 1e9]), 1024, ib)
    assert arr.shape == (3,) and np.all(np.diff(arr) > 0)


def test_links_presets_and_validation():
    assert set(("nvlink", "ib-200", "ethernet-25g", "pcie")) <= set(CM.LINKS)
    for link in CM.LINKS.values():
        link.validate()
    custom = CM.get_link("custom", busbw_gbps=3, latency_us=7)
    assert (custom.busbw_gbps, custom.latency_us) == (3, 7)
    over = CM.get_link("ib-200", busbw_gbps=20)
    assert over.busbw_gbps == 20 and over.latency_us == CM.LINKS["ib-200"].latency_us
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        CM.get_link("custom", busbw_gbps=0, latency_us=5)
    with pytest.raises(ValueError, match="latency must be >= 0"):
        CM.get_link("nvlink", latency_us=-1)
    with pytest.raises(ValueError, match="unknown link"):
        CM.get_link("carrier-pigeon")
    with pytest.raises(ValueError, match="needs both"):
        CM.get_link("custom", busbw_gbps=3)
    with pytest.raises(ValueError, match="world size"):
        CM.collective_time("all_reduce", 10, 0, LINK)


# ------------------------------------------------------------------------------------- fit

def _sim_run(tmp_path, link, world=4):
    """A noise-free simulated DDP run: bucket service times are exactly the cost model's."""
    numel = np.array([300_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000], dtype=np.int64)
    prof = SP.Profile("fit", [f"p{i}" for i in range(5)], numel, ready_ns=np.array([1, 2, 3, 4, 5]) * 1e6,
                      layer=np.arange(5), param_index=np.arange(5)[::-1], forward_ns=5e6, optimizer_ns=1e6,
                      grad_dtype="float32", param_dtype="float32")
    cfg = SC.SimConfig(world_size=world, steps=3, bucket_cap_mb=0.5, first_bucket_cap_mb=0.5, link=link,
                       algo="ring", jitter=SC.Jitter.none())
    tl = SC.Timeline(prof, cfg)
    out = tmp_path / "sim"
    ST.write(out, tl, {"schema": "syncviz-trace/1", "name": "sim", "world_size": world})
    return out


def test_fit_recovers_alpha_beta_of_a_simulated_run(tmp_path):
    link = CM.Link("true", busbw_gbps=2.0, latency_us=40.0)
    run = load_run(_sim_run(tmp_path, link))
    fit, rows = FIT.fit_run(run)
    assert fit.alpha_s == pytest.approx(40e-6, rel=1e-3)
    assert fit.busbw_gbps == pytest.approx(2.0, rel=1e-3)
    assert fit.r2 == pytest.approx(1.0, abs=1e-6) and fit.sizes == 5
    assert np.allclose(rows["pred_s"], rows["t_s"], rtol=1e-3)


def test_comm_service_removes_queueing_and_waiting(ddp_run):
    """tracebuild's step: bucket 0 [16, 26] ms, bucket 1 [30, 40] ms on both ranks; a straggler
    delays rank 1's launch of bucket 1 by 5 ms in make_ddp_run(straggler=1)."""
    from tracebuild import make_ddp_run
    comm = A.comm_metrics(load_run(ddp_run))
    svc = A.comm_service(comm)
    assert np.allclose(svc["service_ns"], 10e6)
    run = load_run(make_ddp_run(ddp_run.parent / "strag", straggler=1, straggle_ms=5.0))
    comm = A.comm_metrics(run)
    # comm_metrics carries the same numbers comm_service gives the fit (one definition)
    assert A.comm_service(comm)["service_ns"].equals(comm["service_ns"])
    assert A.comm_service(comm[["rank", "step", "micro", "kind", "bucket", "name", "launch_ns", "end_ns"]]
                          )["service_ns"].equals(comm["service_ns"])
    svc = comm
    b1 = svc[svc["bucket"] == 1]
    # rank 0 launched at 30 and finished at 40; rank 1 joined at 35: only 5 ms were service
    assert np.allclose(b1[b1["rank"] == 0]["service_ns"], 5e6)
    assert np.allclose(b1[b1["rank"] == 0]["joined_ns"] - b1[b1["rank"] == 0]["launch_ns"], 5e6)


def test_fit_command(tmp_path, ddp_run):
    link = CM.Link("true", busbw_gbps=2.0, latency_us=40.0)
    out = _sim_run(tmp_path, link)
    r = CliRunner().invoke(cli, ["fit", str(out)])
    assert r.exit_code == 0, r.output
    assert "α = 40.0 µs" in r.output and "2.000 GB/s" in r.output and "R² = 1.000" in r.output
    r = CliRunner().invoke(cli, ["fit", str(out), "--json"])
    import json
    assert json.loads(r.output)["busbw_gbps"] == pytest.approx(2.0, rel=1e-3)
    r = CliRunner().invoke(cli, ["fit", str(ddp_run)])        # two sizes (4 MB, 2 MB), both 10 ms
    assert r.exit_code == 0, r.output


def test_fit_command_bad_input(tmp_path):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "syncviz", "fit", str(tmp_path / "nope")],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "no such run directory" in p.stderr


def test_fit_needs_two_events():
    import pandas as pd
    with pytest.raises(ValueError, match="at least 2"):
        FIT.fit_alpha_beta(pd.DataFrame({"step": [1], "bytes": [10], "group_size": [2], "op": ["all_reduce"],
                                        "service_ns": [5.0]}))
    assert math.isfinite(CM.LINKS["nvlink"].beta)


def test_one_optimizer_state_convention():
    """K = 8 (Adam m, v in fp32) by default in the cost model, the simulator's presets and CLIs;
    12 (+ fp32 master copy) only when asked for, and said next to every memory figure."""
    from click.testing import CliRunner as Runner

    from syncviz.model import simulate as SIM
    from syncviz.model.simprofile import MODELS, ModelSpec, profile_from_spec
    assert CM.MemorySpec(params=1).k == CM.DEFAULT_OPTIMIZER_STATE_BYTES == 8
    assert all(m.optimizer_bytes + m.master_bytes == 8 for m in MODELS.values())
    prof = profile_from_spec(ModelSpec("70b", 70_000_000_000, 80, 4096, 400.0))
    assert SIM.memory_for(prof, "zero2", 8).gpu == pytest.approx(227.5e9)
    assert SIM.memory_for(SIM.with_optimizer_state_bytes(prof, 12), "zero2", 8).gpu == pytest.approx(262.5e9)
    assert CM.k_note(12) == "optimizer state K = 12 B/param (Adam m, v and an fp32 master copy (ZeRO paper))"
    for cmd in (["simulate", "--help"], ["advise", "--help"]):
        out = Runner().invoke(cli, cmd, terminal_width=200).output
        assert "--optimizer-state-bytes [8|12]" in out and "default: 8" in out, cmd
