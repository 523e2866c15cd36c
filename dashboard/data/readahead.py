"""Steps analysed before they are asked for. ``prepare``: the step a page is about to draw. ``ReadAhead``:
for a run read one step at a time (LoadedRun ``partial``: over --max-run-gb, opened
from what `syncviz summary` kept): after the Replay draws a step, the step after it and then the one
before it are read and analysed in a thread, so that Play and the slider's next move find them done.
Runs read whole have their blocks instead (stepview.Blocks).

Measured on the 10^8-event run (1,024 ranks, benchmarks/scale.py): a step read and analysed alone
takes ~1.3 s; read ahead, the next step came back in 0.1 ms, 3.6 s after the draw.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from syncviz.dashboard.data.stepview import FOREGROUND

log = logging.getLogger("syncviz.dashboard")

DELAY_S = 0.8    # after a draw, before the next step is read: the browser is drawing (as OPEN_DELAY_S)


def prepare(run, step: int, keys: tuple[str, ...]) -> None:
    """Analyse ``step`` of ``run`` (a LoadedRun; the tables ``keys``) in a thread now, so that the
    draw request that follows finds it done: the browser spends ~0.5 s between the slider being set
    and asking for the figure, and the server would otherwise sit idle through it."""
    def work():
        try:
            view = run.step_view(step)
            for key in keys:
                view.get(key)
        except Exception:   # the draw callback computes (and reports) it again
            log.exception("%s: preparing step %s failed", run.name, step)
    threading.Thread(target=work, name=f"syncviz-prepare-{run.name}", daemon=True).start()


class ReadAhead:
    """One thread at a time per run, working around the last step asked for (``around``)."""

    def __init__(self, run):
        self._run = run
        self._lock = threading.Lock()
        self._at: tuple | None = None     # (step, keys) the thread works around
        self.busy = False

    def around(self, step: int, keys: tuple[str, ...]) -> None:
        """Read the steps beside ``step`` (the tables ``keys``) in a thread, DELAY_S from now;
        a later call moves the focus of the thread already running."""
        with self._lock:
            self._at = (int(step), tuple(keys))
            if self.busy:
                return
            self.busy = True
        threading.Thread(target=self._work, name=f"syncviz-read-ahead-{self._run.name}", daemon=True).start()

    def _next(self) -> tuple[int, tuple] | None:
        """The nearest neighbour not analysed yet (the next step first: playing goes forward)."""
        at, keys = self._at
        steps = self._run.step_list
        i = int(np.searchsorted(steps, at))
        for j in (i + 1, i - 1):
            if 0 <= j < len(steps) and not self._run.step_ready(int(steps[j]), keys):
                return int(steps[j]), keys
        return None

    def _work(self) -> None:
        time.sleep(DELAY_S)
        try:
            while True:
                FOREGROUND.wait_idle(timeout=5.0)      # yield to requests being served
                with self._lock:
                    todo = self._next()
                    if todo is None:
                        self.busy = False
                        return
                step, keys = todo
                view = self._run.step_view(step)
                for key in keys:
                    view.get(key)
        except Exception:     # the draw callback computes (and reports) it again
            log.exception("%s: reading the steps around %s failed", self._run.name, self._at)
            with self._lock:
                self.busy = False
