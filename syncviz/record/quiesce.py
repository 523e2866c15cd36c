"""Let torch's communication threads finish with Python objects before the interpreter shuts down.

A gloo worker thread completes a collective, marks its future done (which wakes the training loop)
and only then releases what the work held: tensors and, for comm hooks such as PowerSGD, the Python
callbacks of the future chain. Each release takes the GIL. If the main thread reaches interpreter
finalization first, the worker cannot take the GIL, exits inside a C++ destructor and the process
aborts with "terminate called without an active exception" after a perfectly good run. A core dump
of one such abort (PowerSGD on 2 gloo ranks, tiny GPT) shows exactly this: thread in
ProcessGroupGloo::runLoop → finishWorkGloo → Future::markCompleted → PythonFunctionGuard dispose →
THPVariable_clear → take_gil → pthread_exit, while the main thread is in Py_FinalizeEx.
Neither destroy_process_group nor gc.collect prevents it: DDP keeps its process group alive, so
the group's destructor (which would join the workers) never runs before finalization.

Measured with 3 busy loops on the 2 cores (the CI machine's load while the suite runs): the plain
PowerSGD workload aborted at exit in 3 of 15 runs; with a barrier before exit 2 of 25; with gc.collect
7 of 15; with quiesce() 0 of 40. Recorder.close() calls it, so every traced process gets it (a
user-launched rank traced with syncviz.instrument() aborted this way once in a full test run).
"""
from __future__ import annotations

import os
import threading
import time


def _runnable_threads() -> int:
    """Threads of this process, other than the caller, that the kernel reports running or runnable."""
    me = threading.get_native_id()
    n = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue       # the thread ended
        if stat[stat.rfind(b")") + 2:][:1] == b"R":
            n += 1
    return n


def quiesce(min_s: float = 0.2, max_s: float = 2.0) -> None:
    """Release the GIL for ``min_s`` so any thread waiting for it can finish, then keep waiting while
    another thread is still runnable, up to ``max_s`` in all. Costs ``min_s`` at exit on an idle
    process; never raises."""
    deadline = time.monotonic() + max_s
    time.sleep(min_s)
    while _runnable_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
