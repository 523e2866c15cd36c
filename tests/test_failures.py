"""Which rank failed first, from torchrun's per-rank failures (ProcessFailure-like records)."""
from types import SimpleNamespace as F

from syncviz.record.failures import failure_line, first_failure
from tracebuild import make_ddp_run


def test_a_killed_rank_is_the_cause_not_its_peers_connection_error():
    f = {0: F(exitcode=1, timestamp=100, message="RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
         1: F(exitcode=-9, timestamp=100, message="<N/A>")}
    assert first_failure(f)[0] == 1


def test_ranks_terminated_by_torchrun_are_not_the_cause():
    f = {0: F(exitcode=-15, timestamp=100, message=""),
         1: F(exitcode=1, timestamp=101, message={"message": "SyntaxError: invalid syntax (bad.py, line 2)"})}
    assert first_failure(f)[0] == 1


def test_a_rank_recording_its_sigterm_is_not_the_cause():
    f = {0: F(exitcode=1, timestamp=100, message="Signal 15 (SIGTERM) received by PID 6395"),
         1: F(exitcode=-9, timestamp=100, message="<N/A>")}
    assert first_failure(f)[0] == 1


def test_earliest_own_exception_wins():
    f = {0: F(exitcode=1, timestamp=105, message="ValueError: late"),
         1: F(exitcode=1, timestamp=101, message="KeyError: 'x'")}
    assert first_failure(f)[0] == 1


def test_line_offers_summary_only_with_complete_steps(tmp_path):
    f = {1: F(exitcode=1, timestamp=1, message="ValueError: boom")}
    empty = tmp_path / "empty"
    empty.mkdir()
    line = failure_line(f, "", empty)
    assert "rank 1 failed first: ValueError: boom" in line and "No complete step" in line and "syncviz summary" not in line
    run = make_ddp_run(tmp_path / "r")
    assert "3 complete steps kept" in failure_line(f, "", run) and f"syncviz summary {run}" in failure_line(f, "", run)
