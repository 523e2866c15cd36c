"""The Replay's lateness heatmap of a drawn step, on the server: made ahead while the page paints
the step's timeline, and answered before the step after it is drawn ahead.

The page asks for a step's heatmap only once its timeline is painted (replay.draw: the timeline
first), and soon after also for the step after it (draw_ahead). Before session 49 the server
made the heatmap only when asked, side by side with draw_ahead's whole next step: on 2 cores and
one GIL the heatmap on screen waited for both. Now:
- ``start``: once draw() (or pick_run()) has answered with the timeline, the heatmap is made in a
  thread that first waits for the requests being served to end (stepview.FOREGROUND), so that it
  runs while the response travels and the page paints it (~18 ms of server time on the 10^8-event
  DDP run: its lateness rows ~10 ms, the figure ~7 ms);
- ``take``: heatmap_after_paint's answer is that figure (or made then, if none was started);
- ``wait``: draw_ahead waits until the painted step's heatmap was answered (at most WAIT_S).
Measured in session 49 on benchmarks/scale.py's 10^8-event runs (`benchmarks/dashboard.py --moves 24
--root /tmp/syncviz-scale --run <run>`, this code alternated with the former, two rounds each), a jump,
key press -> heatmap painted, median of 12 jumps: DDP 212, 212 -> 171, 194 ms; ZeRO-3 313, 304 -> 255,
243 ms; the timeline itself painted as before (DDP 99-114 ms, ZeRO-3 123-129 ms). Holding draw_ahead
back a further 150 ms after the heatmap was answered changed nothing (ZeRO-3: 243 ms). The heatmap's
request now takes 2-3 ms of server time; what remained was the page: on ZeRO-3 it asked ~60 ms after
the timeline's paint, once idle, and the browser rasterized the timeline in between (Chromium's own
trace, session 50: ~50 ms of software raster on its worker thread, the page's thread idle). Since
session 50 the page asks right after the frame that paints the timeline (replay_browser.py), not once
idle after it, and draw_ahead still waits for the idle.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable

from syncviz.dashboard.data.stepview import FOREGROUND

WAIT_S = 1.0        # draw_ahead's longest wait for the heatmap before it (a request lost: not forever)
IDLE_S = 0.5        # the longest a heatmap made ahead waits for the requests in flight to end
KEEP = 32           # steps remembered; each is asked for once, so older ones are only dropped


class _Ahead:
    """One drawn step's heatmap: the figure being made (None once taken) and whether it was answered."""
    __slots__ = ("fig", "answered")

    def __init__(self):
        self.fig: Future | None = Future()
        self.answered = threading.Event()


class HeatmapsAhead:
    """Heatmap figures by key ([run, step, lane mode], as the page asks the heatmap route for it: replay.add_routes)."""

    def __init__(self):
        self._ahead: OrderedDict[tuple, _Ahead] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, key, make: Callable[[], object]) -> None:
        """Make ``make()`` for ``key`` in a thread, once the requests being served have ended (a
        step drawn again, a run recording: a new one, not the one made before)."""
        key, entry = tuple(key), _Ahead()
        fut = entry.fig
        with self._lock:
            self._ahead.pop(key, None)
            self._ahead[key] = entry
            while len(self._ahead) > KEEP:
                self._ahead.popitem(last=False)

        def run():
            FOREGROUND.wait_idle(timeout=IDLE_S)
            try:
                fut.set_result(make())
            except BaseException as e:      # re-raised by take(), where the caller handles it
                fut.set_exception(e)

        threading.Thread(target=run, name="syncviz-heatmap-ahead", daemon=True).start()

    def take(self, key, make: Callable[[], object]):
        """The figure made ahead for ``key`` (waiting for it if it is being made), else ``make()``."""
        with self._lock:
            entry = self._ahead.get(tuple(key))
            fut = entry.fig if entry is not None else None
            if entry is not None:
                entry.fig = None            # taken: a second ask makes its own
        return make() if fut is None else fut.result()

    def answered(self, key) -> None:
        """heatmap_after_paint has answered for ``key``."""
        with self._lock:
            entry = self._ahead.get(tuple(key))
        if entry is not None:
            entry.answered.set()

    def wait(self, key) -> bool:
        """Until ``key``'s heatmap was answered, at most WAIT_S, where it was started here (a step
        draw() drew; not one drawn by another server process, or before a restart); whether it was."""
        with self._lock:
            entry = self._ahead.get(tuple(key))
        return entry is not None and entry.answered.wait(WAIT_S)
