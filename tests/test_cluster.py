"""`syncviz summary --dask`: the partitioned summary on a real distributed.LocalCluster (2 worker
processes) prints exactly what the default path (local processes) and --whole print; a bad
scheduler address is one line and a non-zero exit, within the connect timeout."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from syncviz.cli import cli

pytest.importorskip("distributed")

from syncviz.analysis.cluster import ClusterError, dask_executor  # noqa: E402
from syncviz.analysis.partitioned import summarize  # noqa: E402

DATA = Path(__file__).parent / "data"


def _simulate(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    r = CliRunner().invoke(cli, ["simulate", *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.slow
def test_local_cluster_same_tables_as_default(tmp_path):
    """ZeRO-3 with a straggler, one rank per partition: every cross-rank combination goes through
    the cluster's workers (pass 1 on one worker, pass 2 of the same partition possibly on another)."""
    from test_partitioned import _frame, _same, _text
    run = _simulate(tmp_path, "z3", "--model", "gpt2-medium", "--world-size", "4", "--steps", "3",
                    "--strategy", "zero3", "--straggler", "1:0.3", "--seed", "5")
    ref = summarize(run, jobs=1, target_events=1)
    with dask_executor("local", jobs=2) as (ex, where):
        assert "2 workers" in where
        got = summarize(run, executor=ex, target_events=1, scratch=str(tmp_path))
    assert not _same(got.summary, ref.summary)
    for a, b, what in ((got.steps, ref.steps, "steps"), (got.step_table, ref.step_table, "step_table"),
                       (got.bucket_table, ref.bucket_table, "buckets"),
                       (got.collective_table, ref.collective_table, "collectives")):
        _frame(a, b, what)
    assert len(ref.collective_table) and ref.summary["straggler"] == 1
    assert _text(got) == _text(ref)
    assert not list(tmp_path.glob("syncviz-summary-*"))          # scratch cleaned up


@pytest.mark.slow
def test_cli_dask_local_prints_the_same(tmp_path):
    run = DATA / "straggler"
    cmd = [sys.executable, "-m", "syncviz", "summary", str(run)]
    a = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    b = subprocess.run(cmd + ["--dask", "local", "--jobs", "2"], capture_output=True, text=True, timeout=300)
    c = subprocess.run(cmd + ["--whole"], capture_output=True, text=True, timeout=300)
    assert a.returncode == b.returncode == c.returncode == 0, b.stderr
    assert a.stdout == b.stdout == c.stdout and "Verdict" in b.stdout


@pytest.mark.slow
def test_bad_scheduler_address_one_line_quickly():
    # the subprocess timeout only guards against a hang (the connect timeout is 10 s)
    p = subprocess.run([sys.executable, "-m", "syncviz", "summary", str(DATA / "straggler"), "--dask", "tcp://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'" in lines[0], p.stderr


def test_bad_address_raises_cluster_error():
    with pytest.raises(ClusterError, match="unknown address scheme"):
        with dask_executor("nosuchscheme://x", timeout=1):
            pass
