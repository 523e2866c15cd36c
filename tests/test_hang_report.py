"""The launcher's hang report built from hand-made rank states and stack dumps (record/hangs.py):
which frames are printed, and what it says when no rank is inside a collective."""
from syncviz.record.hangs import add_stacks, lines, main_frames, report

MAIN = "0x00007fa72f67eb80"
DUMP = f"""Thread 0x00007fa701aad6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/site/syncviz/record/watchdog.py", line 122 in _loop

Current thread {MAIN} (most recent call first):
  File "/site/torch/nn/parallel/distributed.py", line 1775 in _pre_forward
  File "/site/syncviz/record/phases.py", line 120 in forward_pre
  File "/site/torch/nn/modules/module.py", line 1884 in _call_impl
  File "/home/me/train.py", line 150 in train
  File "<frozen runpy>", line 88 in _run_code
"""


def test_main_thread_frames_come_from_its_own_block():
    assert main_frames(DUMP, MAIN)[0] == "/site/torch/nn/parallel/distributed.py:1775 in _pre_forward"
    assert main_frames(DUMP, "0x00007fa701aad6c0") == ["/usr/lib/python3.11/threading.py:331 in wait",
                                                       "/site/syncviz/record/watchdog.py:122 in _loop"]
    assert main_frames(DUMP, None) == main_frames(DUMP, MAIN)     # no ident: the dump's current thread
    assert main_frames(DUMP, "0x0000000000000001") == []


def test_report_with_no_rank_in_a_collective():
    states = {r: {"rank": r, "pid": 100 + r, "step": 1 - r, "steps_written": 1, "main_thread": MAIN, "inflight": []}
              for r in (0, 1)}
    rep = report(states, 2, now=1000.0)
    add_stacks(rep, states, {0: DUMP, 1: DUMP})
    text = "\n".join(lines(rep, 60))
    assert "no rank is inside a collective" in text
    assert "rank 1: last seen at step 0, in no collective" in text      # the watchdog's view, maybe behind
    assert "/site/torch/nn/parallel/distributed.py:1775 in _pre_forward" in text
    assert "/home/me/train.py:150 in train" in text
    assert "syncviz/record/phases.py" not in text and "<frozen runpy>" not in text   # our wrappers, runpy
    assert "py-spy dump --native --pid PID (rank 0: 100, rank 1: 101)" in text
    assert rep["stacks"]["1"] == DUMP


def test_no_py_spy_hint_when_a_rank_waits_in_a_collective():
    st = {"rank": 0, "pid": 100, "step": 3, "steps_written": 3,
          "inflight": [{"op": "all_reduce", "name": "all_reduce", "bytes": 4096, "bucket": -1, "launch_ns": 0,
                        "state": "in call", "age_s": 5.0}]}
    text = "\n".join(lines(report({0: st}, 2, now=1000.0), 5))
    assert "ranks 1 never launched it" in text and "py-spy" not in text
