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
