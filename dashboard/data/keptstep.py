"""One step of a run read one step at a time (LoadedRun ``partial``), drawn from what `syncviz
summary` kept and the drawn ranks' own events, instead of every rank's events.

What the Replay draws of a step with many ranks, and where each part comes from here:
- the per-rank step numbers (cards, and which ranks are fastest, median, slowest): the kept step
  table (step_metrics of the whole run), sliced;
- the rank × collective lateness heatmap (and the rank that launches last): analysis.steplateness,
  one row group per partition;
- the timeline of the four ranks drawn: their events of that step alone, analysed with every
  collective's last launch over all ranks (``joined``, as analysis.partitioned's second pass
  computes a partition's comm_metrics), on arrays (analysis.drawn_ranks), from the timeline origin
  kept for the step.
Each equals the whole read's table (tests/test_dashboard.py compares them, and the figures).

Measured on the 1,024-rank 10^8-event run (benchmarks/scale.py): a step read and analysed for every
rank took ~1.6 s (read 0.6 s, comm_metrics 0.4 s, lateness 0.4 s); see the README for this path.
"""
from __future__ import annotations

import threading
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz import analysis as A
from syncviz.analysis import drawn_ranks as DR
from syncviz.analysis import queueing as Q
from syncviz.analysis.steplateness import KeptLateness
from syncviz import trace as T
from syncviz.views.runcache import REPLAY_KEYS

SPREAD_COLUMNS = ("step_ns", "comm_busy_ns", "exposed_ns", "overlap_pct", "compute_comm_ratio", "bytes")
KEPT = ("steps", "step_spread", "lateness")       # the StepView tables a kept step gives for every rank


class Drawn(NamedTuple):
    """The ranks a step's timeline draws and their tables: ``picks`` [(rank, roles)]
    (analysis.representative_ranks), compute_intervals / comm_metrics / exposed_intervals rows of
    those ranks, and ``t0``: the step's timeline origin over every rank (views.timeline.step_origin)."""
    picks: list
    compute: pd.DataFrame
    comm: pd.DataFrame
    exposed: pd.DataFrame
    t0: int


def read_step(run_dir, step: int, spans: dict | None, ranks: list[int] | None = None) -> pd.DataFrame:
    """The events of ``step`` read from the rank files (``ranks``: only those), each file from the
    step's own bytes when ``spans`` (trace.spans, kept by the summary) locates them."""
    return T.events_frame(read_step_table(run_dir, step, spans, ranks))


def read_step_table(run_dir, step: int, spans: dict | None, ranks: list[int] | None = None) -> pa.Table:
    """read_step's events as the validated Arrow table (what analysis.drawn_ranks takes)."""
    table, _, _ = T.load_events(run_dir, ranks=ranks, steps=(step, step + 1), spans=spans)
    return table


class KeptReplay:
    """What the summary kept for the Replay of one run (views.runcache.put_replay), loaded once."""

    def __init__(self, joined: pd.DataFrame, origin: pd.DataFrame, lateness: dict, steps: Callable[[], pd.DataFrame],
                 skew: Callable[[], pd.DataFrame | None] = lambda: None,
                 rows: Callable[[int], pd.DataFrame | None] = lambda step: None):
        self.joined = joined.set_index(Q.EVENT_KEY)["last"].astype(float)
        self._joined = DR.Joined(self.joined)      # looked up a step at a time (analysis.drawn_ranks)
        self._origin = dict(zip(origin["step"].tolist(), origin["start_ns"].tolist()))
        self._lateness = KeptLateness(lateness["folder"], lateness["items"])
        self._steps_of, self._rows_of = steps, rows
        self._by_step = None
        self._skew_of, self._skew = skew, None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, disk, steps: Callable[[], pd.DataFrame]) -> "KeptReplay | None":
        """From the run's disk cache (views.runcache.RunCache); None unless all of it is there."""
        kept = [disk.get(k) for k in REPLAY_KEYS]
        return None if any(v is None for v in kept) else cls(*kept, steps=steps, skew=lambda: disk.get("rank_skew"),
                                                             rows=lambda step: disk.get_rows("steps", "step", step))

    def latest(self, step: int) -> tuple[bool, int | None]:
        """(known, rank): the rank that launches last in ``step`` (analysis.latest_launcher), from the
        rank × step lateness map the summary kept (latest_in_matrix), so that drawing a step needs
        none of its ~250,000 lateness rows (~12 ms of a jump on the 10^8-event ZeRO-3 run, session
        42); known False when the summary kept no map."""
        with self._lock:
            if self._skew is None:
                skew = self._skew_of()
                self._skew = skew if isinstance(skew, pd.DataFrame) else False
        if self._skew is False:
            return False, None
        return True, A.latest_in_matrix(self._skew, step)

    def steps(self, step: int) -> pd.DataFrame:
        """step_metrics rows of ``step`` (every rank), from the kept step table (in step order): that
        step's rows alone (RunCache.get_rows); from a table kept in one piece (an older syncviz's
        cache), the whole table read once, and a slice of it."""
        if self._by_step is None:
            rows = self._rows_of(step)
            if rows is not None:
                return rows
        with self._lock:
            if self._by_step is None:
                table = self._steps_of()
                self._by_step = (table, table["step"].to_numpy())
        table, steps = self._by_step
        lo, hi = np.searchsorted(steps, step, side="left"), np.searchsorted(steps, step, side="right")
        return table.iloc[lo:hi].reset_index(drop=True)

    def at(self, step: int, run_dir, spans: dict | None) -> "KeptStep":
        """``step`` of the run in ``run_dir`` (``spans``: trace.spans of its files, for reading a step alone)."""
        return KeptStep(self, step, lambda ranks: read_step_table(run_dir, step, spans, ranks))

    def lateness(self, step: int) -> pd.DataFrame:
        """tables.sync_lateness rows of ``step`` (every rank; less launch_ns, which nothing drawn uses)."""
        return self._lateness.step(step)

    def analyse(self, table: pa.Table) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """analyse_ranks of the drawn ranks' events (``table``: one step's), on arrays (analysis.drawn_ranks)."""
        return DR.analyse(table, self._joined)

    def origin(self, step: int) -> int:
        return int(self._origin.get(step, 0))


class KeptStep:
    """One step of a KeptReplay: ``read(ranks)`` gives those ranks' events of the step (read_step_table)."""

    def __init__(self, replay: KeptReplay, step: int, read: Callable[[list[int]], pa.Table]):
        self.replay, self.step, self._read = replay, step, read
        self.rows = 0          # event rows read (the drawn ranks')

    def get(self, key: str, get: Callable[[str], pd.DataFrame]) -> pd.DataFrame:
        if key == "steps":
            return self.replay.steps(self.step)
        if key == "step_spread":
            return A.rank_spread(get("steps"), SPREAD_COLUMNS)
        late = self.replay.lateness(self.step)
        self.rows += len(late)
        return late

    def drawn(self, picks: list) -> Drawn:
        ranks = [int(r) for r, _ in picks]
        table = self._read(ranks)
        self.rows += table.num_rows
        return Drawn(picks, *self.replay.analyse(table), self.replay.origin(self.step))


def only_ranks(table: pd.DataFrame, ranks) -> pd.DataFrame:
    return table[np.isin(table["rank"].to_numpy(), list(ranks))] if len(table) else table
