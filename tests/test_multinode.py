"""Two launchers on loopback as two "nodes" (torch's c10d rendezvous), one with a clock that is
3 s off: alignment must recover it."""
import os
import socket
import subprocess
import sys
import time

import pytest

from syncviz.trace import load_run

pytestmark = pytest.mark.slow
SKEW = 3_000_000_000


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_two_nodes_with_a_skewed_clock(tmp_path):
    port = _free_port()
    out = tmp_path / "run"
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "mn-test", "--out", str(out), "--quiet"]
    work = ["-m", "syncviz.workloads", "--preset", "tiny", "--steps", "4", "--bucket-cap-mb", "0.05"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        e = dict(env, SYNCVIZ_CLOCK_SKEW_NS=str(SKEW if node == 1 else 0))
        procs.append(subprocess.Popen([sys.executable, "-m", "syncviz", "trace", "--node-rank", str(node), *common, *work],
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(1.0)
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    run = load_run(out)
    assert run.meta["nodes"] == 2 and run.world_size == 2 and run.problems == []
    r1 = [r for r in run.meta["ranks"] if r["rank"] == 1][0]
    assert r1["node"] == 1
    # rank 1's clock reads 3 s ahead: the estimated offset undoes it, within its error bound
    assert abs(r1["clock_offset_ns"] + SKEW) <= r1["clock_error_ns"] + 5_000_000
    # an all-reduce ends at about the same moment on every rank: on the aligned clock the two
    # ranks' done times of each bucket agree to milliseconds, not seconds
    b = run.events[run.events["kind"] == "bucket"]
    spread = b.groupby(["step", "bucket"])["end_ns"].agg(lambda s: s.max() - s.min())
    assert len(spread) >= 4 and spread.max() < 100_000_000
    assert spread.median() < 10_000_000


def test_two_nodes_with_their_own_out_directories_read_as_one_run(tmp_path):
    # no shared filesystem: node 1's rank sends its files to rank 0 through torchrun's store
    port = _free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "mn-gather", "--quiet"]
    work = ["-m", "syncviz.workloads", "--preset", "tiny", "--steps", "4", "--bucket-cap-mb", "0.05"]
    procs = []
    for node in (0, 1):
        e = dict(os.environ, OMP_NUM_THREADS="1", SYNCVIZ_CLOCK_SKEW_NS=str(SKEW if node == 1 else 0))
        procs.append(subprocess.Popen([sys.executable, "-m", "syncviz", "trace", "--node-rank", str(node), *common,
                                       "--out", str(tmp_path / f"node{node}"), *work],
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(1.0)
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    run = load_run(tmp_path / "node0")
    assert run.ranks == [0, 1] and run.problems == [] and run.meta["gathered_ranks"] == [1]
    assert sorted(p.name for p in (tmp_path / "node0").iterdir()) == [   # + the dashboard's tables (runcache)
        ".syncviz-cache", "layout-0.arrow", "layout-1.arrow", "rank-0.arrow", "rank-1.arrow", "run.json"]
    r1 = [r for r in run.meta["ranks"] if r["rank"] == 1][0]
    assert r1["node"] == 1 and abs(r1["clock_offset_ns"] + SKEW) <= r1["clock_error_ns"] + 5_000_000
    assert sorted(run.events.loc[run.events["rank"] == 1, "step"].unique()) == [0, 1, 2, 3]
    b = run.events[run.events["kind"] == "bucket"]
    spread = b.groupby(["step", "bucket"])["end_ns"].agg(lambda s: s.max() - s.min())
    assert spread.median() < 10_000_000      # aligned: milliseconds, not the 3 s skew
