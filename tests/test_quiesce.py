"""quiesce() tells runnable threads from waiting ones by the kernel's view of each thread."""
import sys
import threading
import time

import pytest

from syncviz.record import quiesce as Q

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def _eventually(cond, within_s=5.0):
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.001)          # releases the GIL, as quiesce does
    return False


def test_a_waiting_thread_is_quiet_and_a_spinning_one_is_not():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    waiting = threading.Thread(target=stop.wait, daemon=True)
    waiting.start()
    spinner = threading.Thread(target=spin, daemon=True)
    try:
        assert _eventually(lambda: Q._runnable_threads() == 0), "a thread blocked on an Event counted as runnable"
        spinner.start()
        assert _eventually(lambda: Q._runnable_threads() >= 1), "a spinning thread never seen runnable"
    finally:
        stop.set()
    spinner.join()
    waiting.join()
    Q.quiesce(min_s=0.0, max_s=1.0)           # returns, never raises
