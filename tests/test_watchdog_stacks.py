"""The rank side of hang stacks (record/watchdog.py): the stacks signal dumps every thread's Python
stack to stacks-<rank>.txt, a script's own handler for it is never replaced (not at arming, and not
at close, where faulthandler.unregister would restore the action from before), and a dump nobody
asked for leaves no file. Each case runs in a fresh interpreter: a wrongly restored default action
of a real-time signal terminates the process. Also when the in-flight state is written."""
import json
import subprocess
import sys
import textwrap
import types

import pytest

from syncviz.record.watchdog import STACKS_SIGNAL, Watchdog

pytestmark = pytest.mark.skipif(STACKS_SIGNAL is None, reason="no real-time signals on this platform")

PRELUDE = """
import os, signal, sys, time, types
from pathlib import Path
from syncviz.record.watchdog import STACKS_SIGNAL, Watchdog
out = Path(sys.argv[1])
rec = types.SimpleNamespace(run_dir=str(out), rank=3)
"""


def run(tmp_path, body: str) -> subprocess.CompletedProcess:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)


def test_the_signal_dumps_every_thread_and_close_keeps_a_later_handler(tmp_path):
    p = run(tmp_path, """
        w = Watchdog(rec)
        assert w.arm_stacks() and w._static["stacks"] == STACKS_SIGNAL
        def where_the_main_thread_waits():
            os.kill(os.getpid(), STACKS_SIGNAL)
            time.sleep(0.3)
        where_the_main_thread_waits()
        print("DUMP", (out / "stacks-3.txt").read_text().count("most recent call first"))
        got = []
        signal.signal(STACKS_SIGNAL, lambda *a: got.append(1))   # the script's own, after syncviz's
        w._close_stacks()
        os.kill(os.getpid(), STACKS_SIGNAL)
        time.sleep(0.1)
        print("HANDLER", got)
    """)
    assert p.returncode == 0, p.stderr
    assert "HANDLER [1]" in p.stdout
    text = (tmp_path / "stacks-3.txt").read_text()
    assert "where_the_main_thread_waits" in text and "Current thread" in text
    assert (tmp_path / "stacks-3.txt").exists()       # a dump that was asked for is kept


def test_a_script_handler_set_before_is_left_alone(tmp_path):
    p = run(tmp_path, """
        got = []
        signal.signal(STACKS_SIGNAL, lambda *a: got.append(1))
        w = Watchdog(rec)
        print("ARMED", w.arm_stacks())
        os.kill(os.getpid(), STACKS_SIGNAL)
        time.sleep(0.1)
        w._close_stacks()
        print("HANDLER", got, "FILES", sorted(x.name for x in out.iterdir()))
    """)
    assert p.returncode == 0, p.stderr
    assert "ARMED False" in p.stdout and "HANDLER [1] FILES []" in p.stdout


def test_no_dump_asked_leaves_no_file_and_the_default_action(tmp_path):
    p = run(tmp_path, """
        w = Watchdog(rec)
        assert w.arm_stacks()
        w._close_stacks()
        print("FILES", sorted(x.name for x in out.iterdir()), signal.getsignal(STACKS_SIGNAL) == signal.SIG_DFL)
        os.kill(os.getpid(), STACKS_SIGNAL)     # the default action again: this process ends by it
        time.sleep(1)
        print("SURVIVED")
    """)
    assert "FILES [] True" in p.stdout and "SURVIVED" not in p.stdout and p.returncode == -STACKS_SIGNAL


def test_a_moving_state_is_written_now_and_then_and_a_settled_one_at_once(tmp_path, monkeypatch):
    """poll(): the first state at once; while it changes at every poll, at most every MOVING_WRITE_S;
    once it holds for a poll (a stuck rank), at once."""
    from syncviz.record import watchdog
    state = {"step": 0, "micro": 0, "steps_written": 0, "collectives": [], "buckets": [], "now": 0}
    rec = types.SimpleNamespace(run_dir=str(tmp_path), rank=0, inflight=lambda: dict(state))
    w = Watchdog(rec)
    path = tmp_path / watchdog.inflight_file(0)
    assert w.poll() and json.loads(path.read_text())["step"] == 0
    state["step"] = 1
    assert not w.poll()                                      # moving: not yet
    assert w.poll() and json.loads(path.read_text())["step"] == 1   # the same at the next poll: settled
    assert not w.poll()                                      # written already
    for step in (2, 3):
        state["step"] = step
        assert not w.poll()
    monkeypatch.setattr(watchdog, "MOVING_WRITE_S", 0.0)
    state["step"] = 4
    assert w.poll() and json.loads(path.read_text())["step"] == 4   # MOVING_WRITE_S after the last write
