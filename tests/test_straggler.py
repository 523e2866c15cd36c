"""A rank slowed on purpose (a 100 ms sleep before each forward, real 2-rank gloo DDP under `syncviz
trace`) is named the run's straggler in 10 of 10 runs, for each rank in turn (issue 11). The runs
go two at a time (each a torchrun with its own --standalone rendezvous port)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncviz import analysis as A
from syncviz.trace import load_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SCRIPT = Path(__file__).parent / "scripts" / "straggler_train.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
RUNS, SLEEP_MS, STEPS, PARALLEL = 10, 100, 6, 2


def start(out: Path, slow: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "syncviz", "trace", "--standalone", "--nproc-per-node", "2",
                             "--quiet", "--out", str(out), str(SCRIPT), str(slow), str(SLEEP_MS), str(STEPS)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)


def test_slowed_rank_is_named_in_every_run(tmp_path):
    jobs = [(slow, i) for i in range(RUNS) for slow in (0, 1)]
    named = {0: [], 1: []}
    for k in range(0, len(jobs), PARALLEL):
        batch = [(slow, i, tmp_path / f"slow{slow}-{i}") for slow, i in jobs[k:k + PARALLEL]]
        procs = [(slow, out, start(out, slow)) for slow, i, out in batch]
        for slow, out, p in procs:
            output, _ = p.communicate(timeout=600)
            assert p.returncode == 0, output[-3000:]
            s = A.run_summary(load_run(out))
            named[slow].append(s["straggler"])
            if s["straggler"] == slow:
                st = s["straggler_detail"]
                assert st["mean_late_ms"] > 0.5 * SLEEP_MS and f"rank {slow} is the straggler" in s["verdict"]
    assert named == {0: [0] * RUNS, 1: [1] * RUNS}
