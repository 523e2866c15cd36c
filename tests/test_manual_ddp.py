"""The hand-written data parallelism (syncviz.workloads.manual_ddp) equals torch's DDP bit for bit on 2 gloo
ranks, naive and overlapped, and is traced like any run: its all-reduces after backward (naive)
or inside it (--overlap)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from syncviz import analysis as A
from syncviz.trace import load_run

pytestmark = pytest.mark.slow
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("overlap", [False, True])
def test_manual_equals_ddp_and_is_traced(tmp_path, overlap):
    out = tmp_path / "run"
    extra = ["--overlap"] if overlap else []
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--out", str(out),
                        "--quiet", "-m", "syncviz.workloads.manual_ddp", "--steps", "3", "--check", *extra],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "broadcast: weights differed by up to" in p.stdout and "now by 0" in p.stdout
    assert "28/28 parameters equal DDP's (bit for bit)" in p.stdout
    run = load_run(out)
    assert run.meta["strategy"] == ("manual-overlap" if overlap else "manual") and "ddp" not in run.meta
    ev = run.events
    assert sorted(ev["step"].unique()) == [0, 1, 2]             # the DDP reference is not recorded
    assert {"forward", "backward", "optimizer"} <= set(ev["kind"])
    coll = ev[(ev["kind"] == "collective") & (ev["op"] == "all_reduce") & (ev["step"] > 0)]
    assert len(coll) == 2 * 2 * 28                             # one per parameter, per rank and step
    phases = set(coll["phase"])
    assert phases == ({"backward"} if overlap else {"other"})
    steps = A.step_metrics(run)
    if not overlap:        # nothing hides a blocking all-reduce issued after backward
        assert (steps[steps["step"] > 0]["overlap_pct"] == 0).all()


def test_local_sgd_replicas_drift_and_snap_back():
    """--sync-every 2: without gradient averaging the replicas drift apart; averaging the weights
    makes them equal again (0 difference)."""
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                        "syncviz.workloads.manual_ddp", "--steps", "4", "--sync-every", "2"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    assert len(lines) == 4
    drift = [float(l.split("differ by up to ")[1].split(",")[0]) for l in lines]
    assert all(d > 0 for d in drift)                     # each rank stepped on its own gradients
    assert lines[1].endswith("averaged -> 0") and lines[3].endswith("averaged -> 0")
    assert "averaged" not in lines[0] and "averaged" not in lines[2]
