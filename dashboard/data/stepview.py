"""The tables the Replay page draws for one step, from two equivalent sources.

Every replay table is an analysis function of the events (ANALYSES). Each metric of a step depends
only on that step's rows, so a step can be analysed alone, or many steps at once and then sliced
by step: same numbers (tests check it). Alone is what the first drawn step of a freshly loaded run
gets, but pandas' fixed cost per call makes that ~0.1-0.4 s per step whatever its size, while a
block of ~40,000 rows costs ~0.25 s and then each of its steps is a slice (a few ms). So after
the first draw a background thread analyses the run block by block, the block of the step on
screen first and then outwards; once a step's block is done, it is a slice.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable

import numpy as np
import pandas as pd

from syncviz import analysis as A
from syncviz.trace import schema as S
from syncviz.views.timeline import step_origin

from syncviz.dashboard.data.keptstep import KEPT, SPREAD_COLUMNS, Drawn, KeptStep, only_ranks

log = logging.getLogger("syncviz.dashboard")

# name -> analysis of an events table; ``get`` returns another entry of the same source.
ANALYSES: dict[str, Callable] = {
    "compute": lambda ev, get: A.compute_intervals(ev),
    "comm": lambda ev, get: A.comm_metrics(ev, kinds=S.COMM_KINDS),
    "exposed": lambda ev, get: A.exposed_intervals(ev),
    "steps": lambda ev, get: A.step_metrics(ev),
    "step_spread": lambda ev, get: A.rank_spread(get("steps"), SPREAD_COLUMNS),
    "lateness": lambda ev, get: A.sync_lateness(ev),
}
WHOLE_RUN = ("compute", "comm", "exposed", "steps", "step_spread", "lateness")
# The step tables the Replay draws in each lane mode: every rank, or the representative ranks ("drawn").
STEP_TABLES = {"ranks": ("compute", "comm", "exposed", "step_spread"),
               "spread": ("steps", "step_spread", "lateness", "drawn")}


class Analysed:
    """Lazily computed ANALYSES of one events table, each computed at most once."""

    def __init__(self, events: Callable[[], pd.DataFrame]):
        self._events = events
        self._ev = None
        self._out: dict[str, pd.DataFrame] = {}
        self._lock = threading.RLock()

    def events(self) -> pd.DataFrame:
        with self._lock:
            if self._ev is None:
                self._ev = self._events()
            return self._ev

    def get(self, key: str) -> pd.DataFrame:
        with self._lock:
            if key not in self._out:
                self._out[key] = ANALYSES[key](self.events(), self.get)
            return self._out[key]


class ByStep:
    """A table sorted by step, with one step's rows as a slice (no copy, no search over rows)."""

    def __init__(self, table: pd.DataFrame):
        if "step" not in table.columns:
            table = table.assign(step=pd.Series(dtype=np.int64))
        self.table = table.sort_values("step", kind="stable").reset_index(drop=True)
        steps = self.table["step"].to_numpy()
        self.keys = np.unique(steps)
        self.lo = np.searchsorted(steps, self.keys, side="left")
        self.hi = np.searchsorted(steps, self.keys, side="right")

    def get(self, step: int) -> pd.DataFrame:
        i = int(np.searchsorted(self.keys, step))
        if i < len(self.keys) and self.keys[i] == step:
            return self.table.iloc[self.lo[i]:self.hi[i]]
        return self.table.iloc[0:0]


class StepView:
    """One step's replay tables: sliced from its block's tables when given, else analysed alone;
    for a run read one step at a time whose summary kept the Replay's tables (``kept``:
    keptstep.KeptStep), the every-rank tables KEPT come from those, and "drawn" from the drawn
    ranks' events alone. Keys: ANALYSES' and "drawn" (keptstep.Drawn: the ranks a step with many
    ranks draws, and their tables)."""

    def __init__(self, step: int, events: Callable[[], pd.DataFrame], block: dict[str, ByStep] | None,
                 kept: KeptStep | None = None):
        self.step = step
        self._kept = kept if block is None else None
        self.source = ("block tables" if block is not None else
                       "kept tables and the drawn ranks" if self._kept is not None else "step analysed alone")
        self._block = block
        self._alone = Analysed(events)
        self._out: dict[str, object] = {}
        self._lock = threading.RLock()

    def get(self, key: str):
        if key == "drawn":
            return self._own(key, self._drawn)
        if self._block is not None and key in self._block:
            return self._block[key].get(self.step)
        if self._kept is not None and key in KEPT:
            return self._own(key, lambda: self._kept.get(key, self.get))
        return self._alone.get(key)

    def _own(self, key: str, fn: Callable):
        with self._lock:
            if key not in self._out:
                self._out[key] = fn()
            return self._out[key]

    def _drawn(self) -> Drawn:
        """The representative ranks of the step (fastest, median, slowest, launches last) and their
        tables: from their own events when the step's kept tables give every rank's numbers (and
        nothing has read every rank of it yet), else from the every-rank tables."""
        if self._kept is not None and not all(k in self._alone._out for k in ("compute", "comm", "exposed")):
            known, latest = self._kept.replay.latest(self.step)     # the step's lateness rows only without the map
            picks = A.representative_ranks(self.get("steps"), None if known else self.get("lateness"), latest=latest)
            return self._kept.drawn(picks)
        picks = A.representative_ranks(self.get("steps"), self.get("lateness"))
        ranks = [r for r, _ in picks]
        compute, comm = self.get("compute"), self.get("comm")
        return Drawn(picks, only_ranks(compute, ranks), only_ranks(comm, ranks), only_ranks(self.get("exposed"), ranks),
                     step_origin(compute, comm))

    @property
    def rows(self) -> int:
        """Rows this view holds of its own (events read alone, kept lateness rows; a block's slice
        holds none)."""
        ev = self._alone._ev
        return (0 if ev is None else len(ev)) + (self._kept.rows if self._kept is not None else 0)

    def has(self, keys) -> bool:
        """Whether the tables ``keys`` are ready (no analysis needed to get them)."""
        return self._block is not None or all(k in self._alone._out or k in self._out for k in keys)

    @property
    def compute(self):
        return self.get("compute")

    @property
    def comm(self):
        return self.get("comm")

    @property
    def exposed(self):
        return self.get("exposed")

    @property
    def steps(self):
        return self.get("steps")

    @property
    def step_spread(self):
        return self.get("step_spread")

    @property
    def lateness(self):
        return self.get("lateness")


def evict_oldest(views: "OrderedDict[int, StepView]", max_views: int, max_rows: int) -> None:
    """Drop the oldest views until at most ``max_views`` remain and they hold at most ``max_rows``
    rows of their own (StepView.rows); the newest is always kept (caller holds the run's lock)."""
    rows = sum(v.rows for v in views.values())
    while len(views) > 1 and (len(views) > max_views or rows > max_rows):
        _, old = views.popitem(last=False)
        rows -= old.rows


def analyse_block(events: pd.DataFrame) -> dict[str, ByStep]:
    """All replay tables of a set of whole steps, indexed by step."""
    analysed = Analysed(lambda: events)
    return {key: ByStep(analysed.get(key)) for key in WHOLE_RUN}


class Foreground:
    """Requests being served right now. Background analysis waits for none before each block, so
    that on a 2-core machine a slider move does not share the CPU (and the GIL) with it."""

    def __init__(self):
        self._n = 0
        self._cv = threading.Condition()

    def __enter__(self):
        with self._cv:
            self._n += 1

    def __exit__(self, *exc):
        with self._cv:
            self._n -= 1
            self._cv.notify_all()

    def wait_idle(self, timeout: float) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self._n == 0, timeout=timeout)


FOREGROUND = Foreground()
# Rows per block. Measured on the 1M-event run (2 shared cores): 20k rows 0.19 s a block (12 s for
# the run), 40k 0.25 s (7.4 s), 60k 0.33 s (6.4 s), 100k 0.43 s (5.0 s). A slider move may wait for
# the block in progress, so the block time bounds that wait; 40k keeps it well under 200 ms + draw.
BLOCK_ROWS = 40_000
WAIT_S = 10.0          # longest wait for a block that is being analysed


class Blocks:
    """A run's steps cut into blocks, analysed in a background thread, nearest to the focus first.
    A page that needs the whole run (Ratios, Buckets) analyses the remaining blocks itself."""

    def __init__(self, steps: list[int], rows_per_step: float, events_of: Callable[[list[int]], pd.DataFrame],
                 name: str = ""):
        per = max(1, int(BLOCK_ROWS // max(1.0, rows_per_step)))
        self.blocks = [steps[i:i + per] for i in range(0, len(steps), per)]
        self.block_of = {s: i for i, blk in enumerate(self.blocks) for s in blk}
        self._events_of, self.name = events_of, name
        self._tables: dict[int, dict[str, ByStep]] = {}
        self._claimed: set[int] = set()    # blocks being analysed right now (by any thread)
        self._cv = threading.Condition()
        self._focus, self._thread, self.error = 0, None, None
        self._cancelled = False
        self.analysed_in_s: float | None = None

    @property
    def done(self) -> bool:
        return len(self._tables) == len(self.blocks)

    def tables_for(self, step: int, wait: bool = True) -> dict[str, ByStep] | None:
        """The block tables holding ``step``: ready, or (``wait``) waited for when being analysed
        right now; None when the caller should analyse the step alone."""
        b = self.block_of.get(step)
        if b is None:
            return None
        with self._cv:
            self._focus = b
            if wait and b not in self._tables and b in self._claimed:
                self._cv.wait_for(lambda: b in self._tables or b not in self._claimed, timeout=WAIT_S)
            return self._tables.get(b)

    def start(self, delay_s: float = 0.0) -> None:
        """Start the background analysis (once), after ``delay_s``."""
        with self._cv:
            if self._thread is None and not self.done:
                self._thread = threading.Timer(delay_s, self._work)
                self._thread.name, self._thread.daemon = f"syncviz-analyse-{self.name}", True
                self._thread.start()

    def cancel(self) -> None:
        """Stop after the block in progress (the run was re-read: a newer Blocks replaces this)."""
        with self._cv:
            self._cancelled = True

    def _claim(self, nearest: bool) -> int | None:
        """Pick a block nobody has done or is doing (caller holds the lock)."""
        free = [i for i in range(len(self.blocks)) if i not in self._tables and i not in self._claimed]
        if not free:
            return None
        # nearest to the step on screen; at equal distance the later block (playing goes forward)
        b = min(free, key=lambda i: (abs(i - self._focus), i < self._focus)) if nearest else free[0]
        self._claimed.add(b)
        return b

    def _analyse(self, b: int) -> None:
        try:
            tables = analyse_block(self._events_of(self.blocks[b]))
        except Exception as e:   # pages that need the tables report it; single steps still work
            log.exception("%s: analysing steps %s failed", self.name, self.blocks[b][:1])
            with self._cv:
                self.error = e
                self._claimed.discard(b)
                self._cv.notify_all()
            raise
        with self._cv:
            self._tables[b] = tables
            self._claimed.discard(b)
            self._cv.notify_all()

    def _work(self) -> None:
        t = time.perf_counter()
        while True:
            FOREGROUND.wait_idle(timeout=5.0)   # yield to requests (bounded: never starve)
            with self._cv:
                b = None if self._cancelled or self.error is not None else self._claim(nearest=True)
            if b is None:
                break
            try:
                self._analyse(b)
            except Exception:
                return
        if self.done:
            self.analysed_in_s = time.perf_counter() - t
            log.info("%s: %d blocks analysed in %.1f s", self.name, len(self.blocks), self.analysed_in_s)

    def table(self, key: str) -> pd.DataFrame:
        """One replay table for the whole run: from the blocks already analysed, and for the others
        only this table (and what it needs), in the caller's thread. A page that needs the step
        table no longer waits for all six tables of every block: measured on the 1M-event run,
        the Ratios page's first open went from the 6 tables to 2 (see benchmarks/dashboard.py)."""
        parts = []
        for b, steps in enumerate(self.blocks):
            with self._cv:
                if self.error is not None:
                    raise self.error
                done = self._tables.get(b)
            if done is not None:
                parts.append(done[key].table)
                continue
            parts.append(ByStep(Analysed(lambda steps=steps: self._events_of(steps)).get(key)).table)
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
