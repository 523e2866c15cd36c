"""The rank's trace stream, written off the training thread.

At each step boundary the recorder hands the step's columns to a queue (about a microsecond) and
a daemon thread turns them into an Arrow record batch and writes it. Building and writing the
batch on the training thread cost about 0.5 ms a step (cProfile of `syncviz trace` on
benchmarks/overhead_script.py --case short-steps, 305 steps of 22 ms: trace/write.py write_step
0.153 s cumulative, of which events_to_batch 0.124 s), the largest single cost syncviz added to a
short step. Steps are written in order, one at a time, and flushed to the OS as before, so a
killed rank loses at most the steps still queued (typically none: a step takes far longer to
train than to write). Layout versions go to their own file from the training thread as before.
"""
from __future__ import annotations

import queue
import threading

from syncviz.trace import RankWriter

_STOP = object()


class StreamWriter:
    """RankWriter's interface (write_step, write_layout, steps_written, close), with write_step
    queued to a background thread. An error in that thread is raised by close()."""

    def __init__(self, writer: RankWriter):
        self._w = writer
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="syncviz-stream", daemon=True)
        self._thread.start()

    @property
    def path(self):
        return self._w.path

    @property
    def steps_written(self) -> int:
        return self._w.steps_written

    def write_step(self, columns) -> None:
        self._q.put(columns)

    def write_layout(self, rows) -> None:
        self._w.write_layout(rows)

    def _run(self) -> None:
        while True:
            cols = self._q.get()
            if cols is _STOP:
                return
            if isinstance(cols, threading.Event):     # flush(): everything before it is written
                cols.set()
                continue
            if self._error is not None:
                continue           # keep draining: the training thread never blocks on us
            try:
                self._w.write_step(cols)
            except BaseException as e:   # disk full, file removed: reported at close
                self._error = e

    def flush(self) -> None:
        """Wait until every queued step is written (close does this too)."""
        if self._thread.is_alive():
            done = threading.Event()
            self._q.put(done)
            while not done.is_set() and self._thread.is_alive():
                done.wait(0.05)

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join()
        self._w.close()
        if self._error is not None:
            raise self._error
