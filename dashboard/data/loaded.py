"""One run loaded for the dashboard: read with the trace reader (syncviz.trace.open_run), its Arrow
table kept and sliced per step, whole-run tables computed lazily and cached in memory and on disk
beside the run (views/runcache.py). When the disk cache holds the run's facts, the events are read
only when a page needs them (the Replay page: its first step alone, the rest in a thread)."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from syncviz import analysis as A
from syncviz.analysis import distributed as D
from syncviz.analysis.tables import BUCKET_DISTRIBUTIONS
from syncviz.trace import schema as S
from syncviz.trace import spans as SP
from syncviz import trace as T
from syncviz.trace import TraceError
from syncviz.views import runcache as RC
from syncviz.views.timeline import bucket_param_labels

from syncviz.dashboard.data.keptstep import KeptReplay, KeptStep, read_step
from syncviz.dashboard.data.stepindex import StepIndex
from syncviz.dashboard.data.readahead import ReadAhead
from syncviz.dashboard.data.stepview import Blocks, StepView, evict_oldest

log = logging.getLogger("syncviz.dashboard")

STEP_CACHE = 128          # per-step views kept per run (play loops stay in cache)
# ... and at most this many event rows held by views analysed alone (a view sliced from its block
# holds nothing of its own). Measured on the 1,024-rank run: ~150 MB per 416,768-row step with its
# six tables, so 128 such steps would take ~19 GB; 2M rows keep it near 0.7 GB (benchmarks/scale.py).
STEP_CACHE_ROWS = 2_000_000
BACKGROUND_DELAY_S = 1.5  # after the first draw, before the block analysis starts
OPEN_DELAY_S = 0.8        # after the first draw, before its events are read (facts cached): see _open_in_background

# Whole-run tables kept on disk beside the run (views/runcache.py): 4-5 s of CPU to compute at 1M events,
# ~0.3 s to read back. "facts": what the reader found; with them, whole-run pages never read events.
PERSISTED = ("facts", "summary", "steps", "bucket_stats", "rank_skew", "time_split", "op_bytes", "comparison",
             "distributed")
# Set when the events are read (_open): on first use, not at load, when the disk cache has the facts
# (which give the step list, extents and ranks; the table, its index and the blocks wait for the events).
_LAZY = frozenset({"table", "_batches", "_by_step", "_mixed", "step_list", "_step_set", "_extents", "n_buckets",
                   "ranks", "blocks"})


class LoadedRun:
    """One run read from disk: metadata, the Arrow event table and lazily computed tables."""

    def __init__(self, name: str, path: Path, sig: tuple, partial: str | None = None):
        """``partial``: the run is too big to read whole (store._check_size says why, and that line
        is what a table needing every event raises): its facts come from the disk cache and its
        events are only ever read one step at a time."""
        self.name, self.path, self.sig, self.partial = name, path, sig, partial
        self._lock = threading.RLock()
        self._opened = False                  # the events read (else only the cached facts)
        self._opening = self._analyse_asked = False
        self._opened_event = threading.Event()
        self._write_async = True
        self._cache: dict[str, Any] = {}
        self._key_locks: dict[str, threading.Lock] = {}
        self._steps_cache: OrderedDict[int, StepView] = OrderedDict()
        self.read_ahead = ReadAhead(self)
        self.disk = RC.RunCache(path, sig)
        self._open_lock = threading.Lock()
        facts = self.disk.get("facts")
        if facts is None:
            if partial:
                raise TraceError(partial)
            self._open()
        else:   # what the reader found and the step index, from the cache: the events are read on first use
            self.meta, (self.layouts, _) = T.read_meta(path), T.load_layouts(path, lowest=True)  # bucket_map's (_open: all)
            self.problems, self.incomplete_ranks = facts["problems"], facts["incomplete_ranks"]
            self.ranks, self.n_buckets = facts["ranks"], facts["n_buckets"]
            self.step_list = np.array(facts["steps"], dtype=np.int64)
            self._step_set = set(facts["steps"])
            self._extents = dict(zip(facts["extent_steps"], facts["extent_ms"]))

    def __getattr__(self, name: str):
        # Only reached for attributes not set yet: the event table and its index, read on first use.
        if name in _LAZY and "_lock" in self.__dict__:
            self._open()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def _open(self) -> None:
        """Read the events (the trace reader, syncviz.trace.open_run; the table stays Arrow and is
        sliced by step) and index them by step. Its own lock: the per-step path (which reads a
        step from disk meanwhile, step_events) never waits for it."""
        with self._open_lock:
            if self._opened:
                return
            if self.partial:
                raise TraceError(self.partial)
            files = T.open_run(self.path)
            self.meta, self.layouts = files.meta, files.layouts
            self.problems, self.incomplete_ranks = files.problems, files.incomplete_ranks
            self.table = files.table
            ix = StepIndex(self.table)
            self._batches, self._by_step, self._mixed = ix.batches, ix.by_step, ix.mixed
            self.step_list, self._step_set, self._extents, self.n_buckets = ix.step_list, ix.step_set, ix.extents, ix.n_buckets
            self.ranks = sorted(int(r) for r in pc.unique(self.table.column("rank")).to_pylist())
            self.blocks = Blocks(self.step_list.tolist(), self.table.num_rows / max(1, len(self.step_list)),
                                 self.events_of, self.name)
            self._opened = True
            self._opened_event.set()
            if not self.recording:
                self._persist("facts", self._facts())

    def _facts(self) -> dict:
        steps = sorted(self._extents)
        return {"problems": list(self.problems), "incomplete_ranks": list(self.incomplete_ranks),
                "ranks": list(self.ranks), "n_buckets": int(self.n_buckets), "steps": self.step_list.tolist(),
                "extent_steps": [int(k) for k in steps], "extent_ms": [float(self._extents[k]) for k in steps]}

    # ----------------------------------------------------------------------- run-level facts
    @property
    def world_size(self) -> int:
        return int(self.meta.get("world_size") or len(self.ranks))

    @property
    def recording(self) -> bool:
        """Still being written: run.json not marked finished, a rank stream not closed yet, and a
        file changed in the last STALE_S seconds (else the run stopped: it is just incomplete)."""
        return RC.is_recording(self.meta, self.incomplete_ranks, self.sig)

    def step_range_ms(self, step: int | None = None) -> float:
        """Time axis length for ``step``: the longest step after the first (step 0 includes warm-up
        and can be many times longer), or ``step``'s own extent when it is longer. The same axis
        for every step makes playing show change instead of rescaling."""
        steady = [v for k, v in self._extents.items() if k != self.first_step] or list(self._extents.values())
        return max([max(steady, default=1.0), self._extents.get(step, 0.0)])

    # ------------------------------------------------------------------ whole-run tables (lazy)
    def _cached(self, key: str, fn: Callable[[], Any]) -> Any:
        """fn() computed once per key; a slow key (the whole-run analysis) blocks only callers of
        that key, never the per-step path. PERSISTED keys are read from the run's disk cache when
        it holds them for these exact files, and written there once computed (finished runs)."""
        if key in self._cache:
            return self._cache[key]
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self._cache:
                value = self.disk.get(key) if key in PERSISTED else None
                if value is None:
                    value = fn()
                    if key in PERSISTED and not self.recording:
                        self._persist(key, value)
                self._cache[key] = value
            return self._cache[key]

    def _persist(self, key: str, value: Any) -> None:
        # In a thread (writing and reading back to check takes time the page should not wait for); warm() writes in place.
        if self._write_async:
            threading.Thread(target=self.disk.put, args=(key, value), name="syncviz-cache-write", daemon=True).start()
        else:
            self.disk.put(key, value)

    def warm(self, say: Callable[[str], None] | None = None) -> list[str]:
        """Compute every PERSISTED table now (each written to the disk cache): what ``syncviz
        trace`` does when a run ends, so the dashboard's first open reads instead of analysing.
        Returns the tables that could not be computed (their pages will show why)."""
        failed, self._write_async = [], False
        for key, fn in (("summary", self.summary), ("steps", self.step_table), ("bucket_stats", self.bucket_stats),
                        ("rank_skew", self.rank_skew), ("time_split", self.time_split), ("op_bytes", self.op_bytes),
                        ("comparison", self.comparison), ("distributed", self.distributed)):
            try:
                fn()
            except Exception as e:     # the page that needs it computes it again and reports it
                log.info("%s: %s not precomputed (%s)", self.name, key, e)
                failed.append(key)
            if say is not None:
                say(key)
        if not self.recording and self._opened:   # written in a thread at load: again here, before the process ends
            self.disk.put("facts", self._facts())
        return failed

    def run(self) -> T.Run:
        def build():
            events = T.events_frame(self.table)
            return T.Run(path=self.path, meta=self.meta, events=events, layouts=self.layouts,
                         problems=list(self.problems), incomplete_ranks=list(self.incomplete_ranks))
        return self._cached("run", build)

    def analyse_in_background(self) -> None:
        """Start analysing the run block by block (see stepview.py); a no-op once started. It
        starts a moment after the first step is drawn: on two cores, starting at once took the
        CPU the browser needed to render that step (first paint 3 s later, measured). Events not
        read yet (facts from the cache) are read first (_open_in_background)."""
        if self._opened:
            self.blocks.start(delay_s=BACKGROUND_DELAY_S)
            return
        with self._lock:
            if self._analyse_asked or self.partial:    # partial: every step is read alone
                return
            self._analyse_asked = True
        self._open_in_background()
        t0 = time.monotonic()

        def after_open():
            self._opened_event.wait()
            if self._opened:
                self.blocks.start(delay_s=max(0.0, BACKGROUND_DELAY_S - (time.monotonic() - t0)))
        threading.Thread(target=after_open, name=f"syncviz-analyse-wait-{self.name}", daemon=True).start()

    def _open_in_background(self, delay: bool = True) -> None:
        """Read the events in a thread (once), OPEN_DELAY_S after the replay has drawn its first step,
        so that slider moves a second later find them in memory: a step read alone costs more the
        later it is (an Arrow stream is read from its start) and shares the CPU with this thread
        (first moves 257-391 ms of server time when the read waited for the blocks' 1.5 s; 0.8 s:
        every move from the blocks, <= 67 ms). At once, it took the CPU the browser was drawing with
        (first step drawn 2.8 s after navigation against 2.4 s, benchmarks/dashboard.py)."""
        with self._lock:
            if self._opened or self._opening:
                return
            self._opening = True

        def work():
            time.sleep(OPEN_DELAY_S if delay else 0.0)
            try:
                self._open()
            except Exception:      # the pages that need the events read them again and report it
                log.exception("%s: reading the events in the background failed", self.name)
            finally:
                self._opened_event.set()
        threading.Thread(target=work, name=f"syncviz-open-{self.name}", daemon=True).start()

    @property
    def analysed(self) -> bool:
        return self._opened and self.blocks.done

    def cancel(self) -> None:
        """Stop the background analysis (the run was re-read or dropped from memory)."""
        if self._opened:
            self.blocks.cancel()

    def whole_steps(self) -> pd.DataFrame:
        """step_metrics of the whole run, once (run summary, Strategies, Distributed share it)."""
        return self._cached("whole_steps", lambda: A.step_metrics(self.run().events))

    def whole_comm(self) -> pd.DataFrame:
        """comm_metrics (all comm kinds) of the whole run, once."""
        return self._cached("whole_comm", lambda: A.comm_metrics(self.run().events, kinds=S.COMM_KINDS))

    def summary(self) -> dict:
        return self._cached("summary", lambda: A.run_summary(self.run(), self.whole_steps(), self.whole_comm()))

    def comparison(self) -> dict:
        """What `syncviz compare` shows for this run (views.compare.run_comparison), once."""
        from syncviz.views import compare as CMP
        return self._cached("comparison", lambda: CMP.run_comparison(self.run(), self.whole_steps()))

    # The replay tables of the whole run, in step order: slices of the analysed blocks once the
    # background analysis has done them all, else the whole-run analysis at once. Same rows and
    # numbers either way (every metric of a step depends on that step's rows only; tests check it),
    # but at 1.15M events one whole-run call costs a third to a half of analysing its 30 blocks
    # (steps 0.33 s against 1.6 s, bucket rows 1.35 s against 2.9 s, lateness 0.25 s against
    # 0.96 s of CPU, measured): a page opened before the blocks are done takes the whole-run path.
    def _step_ordered(self, key: str, whole: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        if self._opened and self.blocks.done:
            return self.blocks.table(key)
        return whole().sort_values("step", kind="stable").reset_index(drop=True)

    def step_table(self) -> pd.DataFrame:
        return self._cached("steps", lambda: self._step_ordered("steps", self.whole_steps))

    def step_columns(self, columns: list[str]) -> pd.DataFrame:
        """step_table()[columns], from those columns of the kept table alone where it is not in memory."""
        kept = None if "steps" in self._cache else self.disk.get_columns("steps", columns)
        return kept if kept is not None else self.step_table()[columns]

    def bucket_table(self) -> pd.DataFrame:
        def build():   # comm_metrics of whole steps (queue and exposed depend only on the step): the bucket rows
            comm = self._step_ordered("comm", self.whole_comm)
            return comm[comm["kind"] == S.BUCKET].reset_index(drop=True)
        return self._cached("buckets", build)

    def bucket_stats(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, int]:
        """What the Buckets page draws of the bucket rows: quantiles of duration, bus bandwidth and
        launch delay per bucket (analysis.quantiles), and how many rows there are. Cached on disk
        instead of the rows themselves (1M rows: 1.3 s to read back and summarize, measured)."""
        def build():
            bm = self.bucket_table()
            return (*(A.quantiles(bm, "bucket", c) for c in BUCKET_DISTRIBUTIONS), pd.DataFrame({"rows": [len(bm)]}))
        dur, bw, delay, n = self._cached("bucket_stats", build)
        return dur, bw, delay, int(n["rows"].iloc[0])

    def rank_skew(self) -> pd.DataFrame:
        return self._cached("rank_skew", lambda: A.lateness_matrix(
            self._step_ordered("lateness", lambda: A.sync_lateness(self.run().events))))

    def time_split(self) -> dict:
        # the same numbers from either step table; the whole-run one when a page already made it
        return self._cached("time_split", lambda: A.time_split(
            self.whole_steps() if "whole_steps" in self._cache else self.step_table()))

    def op_bytes(self) -> pd.DataFrame:
        return self._cached("op_bytes", lambda: A.op_bytes_per_step(self.run()))

    def distributed(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The Distributed page's (rank_breakdown, collective_kinds), sharing one step_metrics and
        one comm_metrics of the run (each function alone computes both)."""
        def build():
            ev, steps, comm = self.run().events, self.whole_steps(), self.whole_comm()
            return D.rank_breakdown(ev, steps, comm), D.collective_kinds(ev, steps, comm)
        return self._cached("distributed", build)

    def bucket_map(self) -> pd.DataFrame:
        return self._cached("bucket_map", lambda: A.bucket_map(self.layouts))

    def bucket_params(self) -> dict:
        """(layout, bucket) -> "N params: a, b, …" for hover text; layout -1 (not recorded on the
        event) means the latest layout."""
        return self._cached("bucket_params", lambda: bucket_param_labels(self.bucket_map()))

    # ------------------------------------------------------------------------- one step
    def events_of(self, steps: list[int]) -> pd.DataFrame:
        """Events of whole steps (all ranks) as a DataFrame, from the step -> batches index."""
        parts = [self._batches[j] for s in steps for j in self._by_step.get(s, [])]
        for s in steps:
            for j in self._mixed.get(s, []):
                b = self._batches[j]
                parts.append(b.filter(pc.equal(b.column("step"), s)))
        return T.events_frame(pa.Table.from_batches(parts, schema=self.table.schema))

    def _check_step(self, step: int) -> None:
        if step not in self._step_set:
            raise TraceError(f"{self.name}: no step {step} (steps {self.first_step}..{self.last_step})")

    def step_events(self, step: int) -> pd.DataFrame:
        self._check_step(step)
        if not self._opened:    # one step read from each rank file: 0.09 s against 1.0 s for all (1M events)
            return read_step(self.path, step, self._spans())
        return self.events_of([step])

    def _spans(self) -> dict | None:
        """rank -> where its file's batches lie (trace.spans), when `syncviz summary` kept them: a step
        is then read from its own bytes, not from the start of each stream."""
        return self._cached("spans", lambda: SP.by_rank(self.disk.get("spans")))

    def step_view(self, step: int) -> StepView:
        """One step's replay tables: a slice of its analysed block, else the step alone."""
        self._check_step(step)
        with self._lock:
            view = self._steps_cache.get(step)
        # A step already analysed alone is not worth waiting for its block.
        block = self.blocks.tables_for(step, wait=view is None) if self._opened else None
        with self._lock:
            if view is not None and (block is None or view.source == "block tables"):
                self._steps_cache.move_to_end(step)
                return view
            view = StepView(step, lambda: self.step_events(step), block, self._kept_step(step) if block is None else None)
            self._steps_cache[step] = view
            evict_oldest(self._steps_cache, STEP_CACHE, STEP_CACHE_ROWS)
        return view

    def _kept_step(self, step: int) -> KeptStep | None:
        """A run read one step at a time: ``step`` drawn from what the summary kept (keptstep.py), if it did."""
        kept = self.partial and self._cached("kept_replay", lambda: KeptReplay.load(self.disk, self.step_table) or False)
        return kept.at(step, self.path, self._spans()) if kept else None

    def prefetch_neighbours(self, step: int, keys: tuple[str, ...]) -> None:
        """A run read one step at a time: read the steps beside ``step`` ahead (readahead.py)."""
        if self.partial:
            self.read_ahead.around(step, keys)

    def step_ready(self, step: int, keys) -> bool:
        """Whether ``step``'s tables ``keys`` are in memory (no read, no analysis needed)."""
        with self._lock:
            view = self._steps_cache.get(step)
        return view is not None and view.has(keys)

    def nearest_step(self, step) -> int:
        """``step`` if the run has it, else the closest earlier one (the first when none)."""
        if step is None or not len(self.step_list):
            return self.first_step
        i = int(np.searchsorted(self.step_list, int(step), side="right")) - 1
        return int(self.step_list[max(i, 0)])

    @property
    def start_step(self) -> int:
        """Where the replay opens: the second step when there is one (step 0 includes warm-up and
        DDP's bucket rebuild, as in analysis.headline_steps), else the first."""
        return int(self.step_list[1]) if len(self.step_list) > 1 else self.first_step

    @property
    def first_step(self) -> int:
        return int(self.step_list[0]) if len(self.step_list) else 0

    @property
    def last_step(self) -> int:
        return int(self.step_list[-1]) if len(self.step_list) else 0
