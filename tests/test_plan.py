"""``syncviz plan``: the table is the memory and collective model's formulas, the classic 70B/8-GPU
figures come out, the recommendation follows the fit, and bad input is one line + non-zero exit."""
from __future__ import annotations

import subprocess
import sys

import pytest

from syncviz.model import costmodel as CM
from syncviz.model import plan as P

GB = 1e9


def _rows(plan):
    return {r.strategy: r for r in plan.rows}


def test_classic_70b_8gpu_k8():
    """Ψ = 70e9, N = 8, K = 8: DDP (2+2+8)Ψ = 840, ZeRO-1 4Ψ + 8Ψ/8 = 350,
    ZeRO-2 2Ψ + 10Ψ/8 = 227.5, ZeRO-3 12Ψ/8 = 105 GB per GPU."""
    rows = _rows(P.make_plan("70e9", 8, 80, 8))
    got = {s: rows[s].memory.gpu / GB for s in ("ddp", "zero1", "zero2", "zero3")}
    assert got == pytest.approx({"ddp": 840, "zero1": 350, "zero2": 227.5, "zero3": 105})
    assert rows["zero2"].memory.grads / GB == pytest.approx(17.5)      # the term "210 GB" tables drop
    assert not any(rows[s].fits for s in ("ddp", "zero1", "zero2", "zero3"))   # 105 > 80
    assert rows["zero3"].min_gpus == 11                                 # 840/N <= 80 -> N >= 10.5
    assert rows["ddp"].min_gpus is None and rows["zero1"].min_gpus is None   # 4Ψ = 280 GB unsharded


def test_k12_adds_fp32_master_copy():
    rows = _rows(P.make_plan("70B", 8, 80, 12))
    assert {s: rows[s].memory.gpu / GB for s in ("ddp", "zero1", "zero2", "zero3")} == pytest.approx(
        {"ddp": 1120, "zero1": 385, "zero2": 262.5, "zero3": 140})


@pytest.mark.parametrize("params,n,k", [(70e9, 8, 8), (7.5e9, 64, 12), (1.3e9, 3, 8), (125e6, 2, 12)])
def test_table_equals_formulas(params, n, k):
    plan = P.make_plan(params, n, 80, k, offload="cpu")
    psi, K = params, k
    expect = {"ddp": (2 * psi, 2 * psi, K * psi), "zero1": (2 * psi, 2 * psi, K * psi / n),
              "zero2": (2 * psi, 2 * psi / n, K * psi / n), "zero3": (2 * psi / n, 2 * psi / n, K * psi / n),
              "zero2-offload": (2 * psi, 0, 0), "zero3-offload": (0, 0, 0)}
    host = {"zero2-offload": (2 + K) * psi / n, "zero3-offload": (4 + K) * psi / n}
    ring = 2 * (n - 1) / n
    sent = {"ddp": ring * 2 * psi, "zero1": ring * 2 * psi, "zero2": ring * 2 * psi,
            "zero3": 1.5 * ring * 2 * psi, "zero2-offload": ring * 2 * psi, "zero3-offload": 1.5 * ring * 2 * psi}
    for r in plan.rows:
        m = r.memory
        assert (m.params, m.grads, m.optimizer) == pytest.approx(expect[r.strategy])
        assert m.host == pytest.approx(host.get(r.strategy, 0))
        assert r.wire_bytes == pytest.approx(sent[r.strategy])
        assert r.fits == (m.gpu <= 80 * GB)
    link = CM.get_link("nvlink")
    ddp = _rows(plan)["ddp"]
    assert ddp.wire_seconds == pytest.approx(float(CM.collective_time("all_reduce", 2 * psi, n, link, "ring")))
    assert _rows(plan)["zero2-offload"].pcie_bytes == pytest.approx(4 * psi / n)


def test_min_gpus_is_the_smallest_that_fits():
    spec = P.memory_spec(int(70e9), 8)
    for s in ("zero1", "zero2", "zero3"):
        n = P.min_gpus(spec, s, 80 * GB)
        if n is None:
            continue
        assert CM.memory_per_gpu(spec, s, n).gpu <= 80 * GB
        assert n == 1 or CM.memory_per_gpu(spec, s, n - 1).gpu > 80 * GB


def test_recommendation():
    assert P.make_plan("1.3B", 8).choice == "ddp"
    p = P.make_plan("7B", 8)                    # DDP 84 GB > 80; ZeRO-1 35 GB fits
    assert p.choice == "zero1" and "DDP does not fit" in p.reason
    assert P.make_plan("70B", 16, optimizer_bytes=12).choice == "zero3"
    p = P.make_plan("70B", 8)                   # ZeRO-3 105 GB > 80 and no offload allowed
    assert p.choice is None and "11 GPUs" in p.reason and "--offload" in p.reason
    assert P.make_plan("70B", 8, offload="nvme").choice == "zero3-offload"


@pytest.mark.parametrize("text,value", [("70e9", 70_000_000_000), ("70B", 70_000_000_000), ("7.5b", 7_500_000_000),
                                        ("125M", 125_000_000), ("1_000", 1000)])
def test_parse_count(text, value):
    assert P.parse_count(text) == value


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "syncviz", "plan", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli_prints_table_and_convention():
    p = _cli("--params", "70e9", "--gpus", "8", "--optimizer-bytes", "8")
    assert p.returncode == 0, p.stderr
    assert "K = 8 (Adam m and v in fp32)" in p.stdout
    for line, gb in (("DDP", "840"), ("ZeRO-1", "350"), ("ZeRO-2", "227.5"), ("ZeRO-3", "105")):
        row = next(r for r in p.stdout.splitlines() if r.startswith(line + " "))
        assert row.split()[4] == gb
    assert "recommendation:" in p.stdout


@pytest.mark.parametrize("args,msg", [
    (("--params", "abc"), "cannot read a parameter count"),
    (("--params", "70B", "--gpus", "0"), "--gpus must be"),
    (("--params", "70B", "--optimizer-bytes", "9"), "optimizer bytes must be 8"),
    (("--params", "70B", "--offload", "disk"), "--offload must be cpu or nvme"),
    (("--params", "70B", "--gpu-mem-gb", "-1"), "--gpu-mem-gb must be > 0"),
    (("--params", "70B", "--link", "carrier-pigeon"), "unknown link"),
])
def test_cli_bad_input_is_one_line(args, msg):
    p = _cli(*args)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert msg in p.stderr and len(p.stderr.strip().splitlines()) == 1
