"""DataParallel vs DDP model (syncviz/model/dataparallel.py): the table equals the formulas on hand
values, DataParallel falls behind DDP as N grows, bad input is one line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from syncviz.model import costmodel as CM
from syncviz.model import dataparallel as DP
from syncviz.model import dpvsddp as V
from syncviz.model.simprofile import ModelSpec, profile_from_spec

# round numbers: 1e6 fp32 parameters (P = G = 4 MB), 1000 tokens per GPU, vocab 100 (O = 400 kB per GPU)
SPEC = ModelSpec("hand", 1_000_000, 4, 1000, 1.0, param_dtype="float32", grad_dtype="float32", hbm_gbps=100.0)
LINK = CM.get_link(None, busbw_gbps=10.0, latency_us=2.0)
X = DP.DPInputs(SPEC, LINK, vocab=100, python_us_per_layer=50.0)
P = G = 4e6
I1, O1 = 1000 * 8, 1000 * 100 * 4


@pytest.mark.parametrize("n", [2, 4, 8])
def test_exchange_bytes_and_times_equal_the_formulas(n):
    ex = {e.name: e for e in DP.exchanges(X, n)}
    a, b = 2e-6, 1 / 10e9
    scatter, rep, apply, gather, red = (ex[k] for k in DP.EXCHANGES)
    assert scatter.gpu0_bytes == pytest.approx((n - 1) / n * n * I1) and scatter.other_bytes == pytest.approx(I1)
    assert rep.gpu0_bytes == (n - 1) * P and rep.other_bytes == P          # GPU 0 is the source of every replica
    assert red.gpu0_bytes == (n - 1) * G and red.other_bytes == G
    assert gather.gpu0_bytes == pytest.approx(2 * (n - 1) * O1) and gather.other_bytes == pytest.approx(2 * O1)
    assert apply.gpu0_bytes == 0
    assert scatter.seconds == pytest.approx((n - 1) * a + (n - 1) / n * n * I1 * b)
    assert rep.seconds == pytest.approx((n - 1) * a + P * b)               # NCCL's pipelined chain
    assert red.seconds == pytest.approx((n - 1) * a + G * b)
    assert gather.seconds == pytest.approx(2 * ((n - 1) * a + (n - 1) * O1 * b))
    fwd = 2 * 1e6 * 1000 / 1e12                                            # 2·P·T FLOPs at 1 TFLOP/s
    assert apply.seconds == pytest.approx(max(fwd, n * 4 * 50e-6))         # GIL: N threads × L layers × h


def test_row_step_share_and_ddp_bytes():
    prof = profile_from_spec(SPEC)
    f, bwd, opt = prof.forward_ns * 1e-9, prof.backward_ns * 1e-9, prof.optimizer_ns * 1e-9
    for n in (2, 4, 8):
        r = DP.row(X, n)
        loss = 3 * n * O1 / 100e9
        assert r.loss_s == pytest.approx(loss)
        assert r.dp_step_s == pytest.approx(sum(e.seconds for e in r.exchanges) + loss + bwd + opt)
        assert r.dp_gpu0_share == pytest.approx((f + bwd + loss + opt) / (n * (f + bwd) + loss + opt))
        assert r.ddp_bytes == pytest.approx(2 * 2 * (n - 1) / n * G)
        assert r.dp_gpu0_bytes == pytest.approx((n - 1) * I1 + (n - 1) * P + 2 * (n - 1) * O1 + (n - 1) * G)
        assert r.dp_gpu0_share > 1 / n                                     # GPU 0 does more than its share


def test_dataparallel_falls_behind_ddp_as_gpus_grow():
    rows = V.table(DP.inputs())                    # the default: GPT-2 medium on PCIe, logits gathered
    ratios = [r.dp_step_s / r.ddp_step_s for r in rows]
    assert [r.gpus for r in rows] == [2, 4, 8]
    assert all(x > 1 for x in ratios) and ratios == sorted(ratios) and ratios[-1] > ratios[0] * 1.2
    gpu0 = [r.dp_gpu0_bytes for r in rows]
    assert gpu0 == sorted(gpu0) and rows[-1].dp_other_bytes == pytest.approx(rows[0].dp_other_bytes)


def test_cli_prints_the_table_of_the_formulas():
    p = subprocess.run([sys.executable, "-m", "syncviz", "dataparallel", "--gpus", "2,8"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = V.table(DP.inputs(), (2, 8))
    for r in rows:
        line = next(l for l in p.stdout.splitlines() if l.startswith(f"{r.gpus} "))
        assert f"{r.dp_gpu0_bytes / 1e6:,.0f}" in line and f"{r.dp_step_s * 1e3:,.1f}" in line
        assert f"{r.ddp_step_s * 1e3:,.1f}" in line and f"{100 * r.dp_gpu0_share:.0f}%" in line
    assert "replicate (broadcast params)" in p.stdout and "GIL" in p.stdout


@pytest.mark.parametrize("args, msg", [(["--gpus", "1,2"], "at least 2 GPUs"), (["--gpus", "x"], "whole numbers"),
                                       (["--tokens", "0"], "tokens per GPU"), (["--link", "warp"], "warp"),
                                       (["--python-us-per-layer", "-1"], "Python time per layer")])
def test_bad_input_is_one_line(args, msg):
    p = subprocess.run([sys.executable, "-m", "syncviz", "dataparallel", *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr
