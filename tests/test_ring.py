"""Ring all-reduce with send/recv on real gloo ranks (syncviz.workloads.ring): each rank sends exactly
2(N−1)/N·D payload bytes (the kernel's own count agrees up to gloo's message headers), the naive
schemes (N−1)·D, and every scheme produces dist.all_reduce's sum."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from syncviz.analysis import ring as R

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_formulas():
    f = R.formulas(4, 1000.0)
    assert f["ring"] == 1500.0 and f["all_to_all"] == 3000.0 and f["parameter_server"] == 3000.0
    assert R.formulas(2, 10.0)["ring"] == 10.0
    assert R.formulas(1000, 1.0)["ring"] < 2.0          # bounded, whatever N


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_ring_bytes_and_sum(tmp_path, n):
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "-m", "syncviz.workloads.ring",
                        "--mb", "0.012", "--out", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp_path / f"ring-N{n}.json").read_text())
    d = res["bytes"]
    assert d == 12000 and res["world_size"] == n
    for r in res["ranks"]:
        ring = r["ring"]
        assert ring["payload_bytes"] == 2 * (n - 1) * d // n                 # 2(N−1)/N·D exactly
        # the kernel saw the same bytes leave this process, plus gloo's small per-message header
        assert ring["payload_bytes"] <= ring["kernel_bytes"] <= ring["payload_bytes"] + 2 * (n - 1) * 1024
        assert r["all_to_all"]["payload_bytes"] == (n - 1) * d
        assert r["parameter_server"]["payload_bytes"] == ((n - 1) * d if r["rank"] == 0 else d)
        for scheme in ("ring", "all_to_all", "parameter_server", "torch_all_reduce"):
            assert r[scheme]["same_as_all_reduce"], scheme
        assert r["float_max_abs_diff"] < 1e-4
    # the schedule: 2(N−1) steps per rank, each to the right neighbour; in every step the ranks
    # send N different chunks; every chunk's reduce-scatter ends at the rank that owns it
    t = res["transfers"]
    assert len(t) == n * 2 * (n - 1)
    assert all(x["dst"] == (x["src"] + 1) % n for x in t)
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            chunks = sorted(x["chunk"] for x in t if x["phase"] == phase and x["step"] == s)
            assert chunks == list(range(n)), (phase, s)
    assert "2(N-1)/N*D" in p.stdout and "bit for bit: yes" in p.stdout


def _schedule(n):
    """The transfers ring_all_reduce makes (same index rules), without ranks."""
    t = []
    for r in range(n):
        for s in range(n - 1):
            t.append({"phase": "reduce-scatter", "step": s, "chunk": (r - s) % n, "src": r, "dst": (r + 1) % n})
            t.append({"phase": "all-gather", "step": s, "chunk": (r + 1 - s) % n, "src": r, "dst": (r + 1) % n})
    return t


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_states_end_fully_summed(n):
    states = R.ring_states(_schedule(n), n)
    assert len(states) == 1 + 2 * (n - 1)
    rs_end = states[n - 1]["counts"]
    # after reduce-scatter rank r holds chunk r+1 summed over all N ranks
    assert all(rs_end[r][(r + 1) % n] == n for r in range(n))
    assert states[-1]["counts"] == [[n] * n for _ in range(n)]
