"""Hang forensics and failure attribution with real `syncviz trace` runs (2 CPU ranks, gloo)."""
import json
import os
import signal
import subprocess
import time
import sys
from pathlib import Path

import pytest

from syncviz.trace import load_run

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.slow


def syncviz(*args, cwd=None, timeout=400, entry=None):
    cmd = [entry] if entry else [sys.executable, "-m", "syncviz"]
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_rank_skipping_a_collective_is_reported_and_stopped(tmp_path):
    # rank 1 never launches step 3's all_reduce; rank 0 waits in it (gloo would wait 30 minutes)
    p = syncviz("trace", "--nproc-per-node", 2, "--hang-timeout", 5, "--out", tmp_path / "run",
                SCRIPTS / "hang_skip.py", "--steps", 6, "--skip", 3)
    print(p.stderr)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    assert "[syncviz] hang: no rank completed a step for 5 s" in p.stderr
    assert "step 3: all_reduce" in p.stderr and "ranks 1 never launched it" in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: hang: ranks 0 stuck in all_reduce") and "hang.json" in last
    rep = json.loads((tmp_path / "run" / "hang.json").read_text())
    stuck = rep["stuck"][0]
    assert stuck["op"] == "all_reduce" and stuck["step"] == 3 and list(stuck["ranks"]) == ["0"]
    assert stuck["never_launched_by"] == [1] and stuck["bytes"] > 0
    run = load_run(tmp_path / "run")            # the run is kept: steps 0-2 on both ranks
    assert sorted(run.events.loc[run.events["kind"] == "step", "step"].unique()) == [0, 1, 2]
    assert any("did not finish" in x for x in run.problems)
    assert not list((tmp_path / "run").glob("inflight-*.json"))
    # where each rank's main thread was when the hang was declared (faulthandler, SIGUSR2):
    # rank 1 in the script's sleep, rank 0 inside the all_reduce it launched
    main = rep["main_thread"]
    assert main["1"][0].startswith("/") and "in sleep" not in main["1"][0]   # time.sleep is C: no frame
    assert any(f.endswith("hang_skip.py:41 in <module>") for f in main["1"][:2]), main["1"]
    assert any("all_reduce" in f for f in main["0"][:3]), main["0"]
    assert any(f.endswith("hang_skip.py:42 in <module>") for f in main["0"]), main["0"]
    assert "Thread 0x" in rep["stacks"]["0"] and "watchdog.py" in rep["stacks"]["0"]   # every thread
    assert "rank 1's main thread" in p.stderr and "hang_skip.py:41 in <module>" in p.stderr
    assert "hang_skip.py:42 in <module>" in p.stderr and "syncviz/record/collectives.py" not in p.stderr


def test_a_rank_skipping_a_ddp_backward_leaves_the_other_in_its_bucket(tmp_path):
    """DDP's buckets are timed in C++ (record/timed_group.py): a bucket launched and not done is
    still seen by the watchdog's thread (TimedGroup.inflight), so the report names it."""
    p = syncviz("trace", "--nproc-per-node", 2, "--hang-timeout", 5, "--out", tmp_path / "run",
                SCRIPTS / "hang_skip.py", "--steps", 6, "--skip", 3, "--ddp")
    print(p.stderr)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "step 3: all_reduce 'bucket 0 (allreduce)'" in p.stderr and "ranks 1 never launched it" in p.stderr
    stuck = json.loads((tmp_path / "run" / "hang.json").read_text())["stuck"][0]
    assert stuck["op"] == "all_reduce" and stuck["step"] == 3 and stuck["bucket"] == 0
    assert stuck["ranks"]["0"]["state"] == "bucket launched, not done" and stuck["never_launched_by"] == [1]
    run = load_run(tmp_path / "run")
    assert run.meta["ddp_bucket_timing"] == "c++"
    b = run.events[run.events["kind"] == "bucket"]
    assert sorted(b["step"].unique()) == [0, 1, 2] and (b["bytes"] == stuck["bytes"]).all()


def test_syntax_error_names_the_first_rank_and_its_reason(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef broken(:\n    pass\n")
    p = syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", bad)
    print(p.stderr)
    # the ranks print their own traceback (the user's error, as torchrun shows it); syncviz's
    # launcher adds one line naming the first failure, and no traceback of its own
    assert p.returncode != 0 and "syncviz/record/launch.py" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "failed first: SyntaxError: invalid syntax (bad.py, line 2)" in last, last
    assert "No complete step was recorded" in last and "syncviz summary" not in last


def test_trace_from_a_directory_holding_a_syncviz_folder(tmp_path):
    (tmp_path / "syncviz").mkdir()
    (tmp_path / "syncviz" / "__init__.py").write_text("raise ImportError('the wrong syncviz')\n")
    # the console script, as a user runs it (python -m would itself put the folder first)
    entry = Path(sys.executable).parent / "syncviz"
    if not entry.exists():
        pytest.skip("no syncviz console script next to this Python")
    p = syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet",
                SCRIPTS / "hang_skip.py", "--steps", 3, "--skip", -1, cwd=tmp_path, entry=entry)
    assert p.returncode == 0, p.stderr[-2000:]
    assert load_run(tmp_path / "run").events["step"].max() == 2


def test_ctrl_c_stops_cleanly_with_one_line_and_keeps_the_run(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--out", str(out),
                          "--quiet", str(SCRIPTS / "hang_skip.py"), "--steps", "1000", "--skip", "-1",
                          "--step-sleep", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if json.loads((out / "run.json").read_text()).get("steps_recorded", 0) >= 2:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)        # what a terminal's Ctrl-C does: every process of the group
    _, err = p.communicate(timeout=120)
    print(err)
    assert p.returncode == 130
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("[syncviz] stopped by SIGINT: ranks stopped; completed steps kept")
    run = load_run(out)
    assert run.events.loc[run.events["kind"] == "step", "step"].nunique() >= 2
