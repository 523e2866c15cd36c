"""One run loaded for the dashboard: read once with the trace reader (syncviz.trace.open_run), its
Arrow table kept and sliced per step, whole-run tables computed lazily and cached (see store.py)."""
from __future__ import annotations

import logging
import os
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
from syncviz.trace import schema as S
from syncviz import trace as T
from syncviz.trace import TraceError

from syncviz.dashboard.data.stepview import Blocks, StepView

log = logging.getLogger("syncviz.dashboard")

STEP_CACHE = 128          # per-step views kept per run (play loops stay in cache)
STALE_S = 300.0           # an unfinished run untouched this long is shown as stopped, not recording
BACKGROUND_DELAY_S = 1.5  # after the first draw, before the block analysis starts


def inside_root(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def signature(run_dir: Path, root: Path) -> tuple:
    """(file name, size, mtime_ns) of every file the run is read from; refuses links out of root.
    One scandir, and a resolve() only for symlinks: this runs on every callback (Live)."""
    sig = []
    with os.scandir(run_dir) as it:
        for entry in it:
            if entry.name == S.RUN_FILE or entry.name.endswith(".arrow"):
                if entry.is_symlink() and not inside_root(Path(entry.path), root):
                    raise TraceError(f"{run_dir.name}/{entry.name}: links outside the served directory; not read")
                st = entry.stat()
                sig.append((entry.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(sig))


class LoadedRun:
    """One run read from disk: metadata, the Arrow event table and lazily computed tables."""

    def __init__(self, name: str, path: Path, sig: tuple):
        self.name, self.path, self.sig = name, path, sig
        files = T.open_run(path)          # the trace reader; the table stays Arrow (sliced by step)
        self.meta, self.table, self.layouts = files.meta, files.table, files.layouts
        self.problems, self.incomplete_ranks = files.problems, files.incomplete_ranks
        self._index_steps()
        self.ranks = sorted(int(r) for r in pc.unique(self.table.column("rank")).to_pylist())
        self._lock = threading.RLock()
        self._cache: dict[str, Any] = {}
        self._key_locks: dict[str, threading.Lock] = {}
        self._steps_cache: OrderedDict[int, StepView] = OrderedDict()
        self.blocks = Blocks(self.step_list.tolist(), self.table.num_rows / max(1, len(self.step_list)),
                             self.events_of, name)

    def _index_steps(self) -> None:
        """Map step -> record batches. Writers flush one batch per step, so a step's rows are whole
        batches (found without copying); a batch holding several steps is filtered row by row.
        Sorting or concatenating the 32,000 batches of a 1M-event run instead costs ~0.5 s."""
        batches = [b for b in self.table.to_batches() if b.num_rows]
        self._batches = batches
        steps = self.table.column("step").to_numpy()
        lengths = np.fromiter((b.num_rows for b in batches), dtype=np.int64, count=len(batches))
        starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
        lo = np.minimum.reduceat(steps, starts) if len(batches) else np.zeros(0, np.int64)
        hi = np.maximum.reduceat(steps, starts) if len(batches) else np.zeros(0, np.int64)
        self._by_step: dict[int, list[int]] = {}
        self._mixed: dict[int, list[int]] = {}
        pure = np.flatnonzero(lo == hi)
        for step, idx in pd.Series(pure).groupby(lo[pure]):
            self._by_step[int(step)] = idx.tolist()
        for i in np.flatnonzero(lo != hi):
            for step in np.unique(steps[starts[i]:starts[i] + lengths[i]]):
                self._mixed.setdefault(int(step), []).append(int(i))
        self.step_list = np.array(sorted(k for k in set(self._by_step) | set(self._mixed) if k >= 0),
                                  dtype=np.int64)
        self._step_set = set(self.step_list.tolist())
        # Longest step extent (first event start to last end, all ranks) for a time axis that stays
        # put while stepping, from per-batch minima/maxima: a groupby over all rows costs ~0.3 s.
        start, end = (self.table.column(c).to_numpy() for c in ("start_ns", "end_ns"))
        valid = (start >= 0) & (end >= start) & (steps >= 0)
        big = np.iinfo(np.int64).max
        self._extents: dict[int, float] = {}
        if len(batches) and valid.any():
            bstart = np.minimum.reduceat(np.where(valid, start, big), starts)
            bend = np.maximum.reduceat(np.where(valid, end, -1), starts)
            keep = (lo == hi) & (lo >= 0) & (bend >= 0)
            first, last = {}, {}
            for k, a, b in zip(lo[keep].tolist(), bstart[keep].tolist(), bend[keep].tolist()):
                first[k], last[k] = min(first.get(k, a), a), max(last.get(k, b), b)
            mixed = np.isin(steps, list(self._mixed)) & valid if self._mixed else np.zeros(0, bool)
            if mixed.any():
                g = pd.DataFrame({"k": steps[mixed], "s": start[mixed], "e": end[mixed]}).groupby("k")
                for k, a, b in zip(g["s"].min().index, g["s"].min(), g["e"].max()):
                    first[k], last[k] = min(first.get(k, a), a), max(last.get(k, b), b)
            self._extents = {k: (last[k] - first[k]) / 1e6 for k in first}
        top = int(self.table.column("bucket").to_numpy().max()) if self.table.num_rows else -1
        self.n_buckets = max(1, top + 1)   # bucket indices seen: one colour scale for every step

    # ----------------------------------------------------------------------- run-level facts
    @property
    def world_size(self) -> int:
        return int(self.meta.get("world_size") or len(self.ranks))

    @property
    def recording(self) -> bool:
        """Still being written: run.json not marked finished, a rank stream not closed yet, and a
        file changed in the last STALE_S seconds (else the run stopped: it is just incomplete)."""
        if self.meta.get("finished", False) or not self.incomplete_ranks:
            return False
        newest = max((mtime for _, _, mtime in self.sig), default=0)
        return time.time() - newest / 1e9 < STALE_S

    def step_range_ms(self, step: int | None = None) -> float:
        """Time axis length for ``step``: the longest step after the first (step 0 includes warm-up
        and can be many times longer), or ``step``'s own extent when it is longer. The same axis
        for every step makes playing show change instead of rescaling."""
        steady = [v for k, v in self._extents.items() if k != self.first_step] or list(self._extents.values())
        return max([max(steady, default=1.0), self._extents.get(step, 0.0)])

    # ------------------------------------------------------------------ whole-run tables (lazy)
    def _cached(self, key: str, fn: Callable[[], Any]) -> Any:
        """fn() computed once per key; a slow key (the whole-run analysis) blocks only callers of
        that key, never the per-step path."""
        if key in self._cache:
            return self._cache[key]
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self._cache:
                self._cache[key] = fn()
            return self._cache[key]

    def run(self) -> T.Run:
        def build():
            events = T.events_frame(self.table)
            return T.Run(path=self.path, meta=self.meta, events=events, layouts=self.layouts,
                         problems=list(self.problems), incomplete_ranks=list(self.incomplete_ranks))
        return self._cached("run", build)

    def analyse_in_background(self) -> None:
        """Start analysing the run block by block (see stepview.py); a no-op once started. It
        starts a moment after the first step is drawn: on two cores, starting at once took the
        CPU the browser needed to render that step (first paint 3 s later, measured)."""
        self.blocks.start(delay_s=BACKGROUND_DELAY_S)

    @property
    def analysed(self) -> bool:
        return self.blocks.done

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
        if self.blocks.done:
            return self.blocks.table(key)
        return whole().sort_values("step", kind="stable").reset_index(drop=True)

    def step_table(self) -> pd.DataFrame:
        return self._cached("steps", lambda: self._step_ordered("steps", self.whole_steps))

    def bucket_table(self) -> pd.DataFrame:
        def build():   # comm_metrics of whole steps (queue and exposed depend only on the step): the bucket rows
            comm = self._step_ordered("comm", self.whole_comm)
            return comm[comm["kind"] == S.BUCKET].reset_index(drop=True)
        return self._cached("buckets", build)

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
        def build():
            from syncviz.views.timeline import bucket_param_labels
            return bucket_param_labels(self.bucket_map())
        return self._cached("bucket_params", build)

    # ------------------------------------------------------------------------- one step
    def events_of(self, steps: list[int]) -> pd.DataFrame:
        """Events of whole steps (all ranks) as a DataFrame, from the step -> batches index."""
        parts = [self._batches[j] for s in steps for j in self._by_step.get(s, [])]
        for s in steps:
            for j in self._mixed.get(s, []):
                b = self._batches[j]
                parts.append(b.filter(pc.equal(b.column("step"), s)))
        ev = T.events_frame(pa.Table.from_batches(parts, schema=self.table.schema))
        return ev

    def step_events(self, step: int) -> pd.DataFrame:
        if step not in self._step_set:
            raise TraceError(f"{self.name}: no step {step} (steps {self.first_step}..{self.last_step})")
        return self.events_of([step])

    def prepare(self, step: int, keys: tuple[str, ...]) -> None:
        """Analyse ``step`` (the tables ``keys``) in a thread now, so that the draw request that
        follows finds it done: the browser spends ~0.5 s between the slider being set and asking
        for the figure, and the server would otherwise sit idle through it."""
        def work():
            try:
                view = self.step_view(step)
                for key in keys:
                    view.get(key)
            except Exception:   # the draw callback computes (and reports) it again
                log.exception("%s: preparing step %s failed", self.name, step)
        threading.Thread(target=work, name=f"syncviz-prepare-{self.name}", daemon=True).start()

    def step_view(self, step: int) -> StepView:
        """One step's replay tables: a slice of its analysed block, else the step alone."""
        if step not in self._step_set:
            raise TraceError(f"{self.name}: no step {step} (steps {self.first_step}..{self.last_step})")
        with self._lock:
            view = self._steps_cache.get(step)
        # A step already analysed alone is not worth waiting for its block.
        block = self.blocks.tables_for(step, wait=view is None)
        with self._lock:
            if view is not None and (block is None or view.source == "block tables"):
                self._steps_cache.move_to_end(step)
                return view
            view = StepView(step, lambda: self.step_events(step), block)
            self._steps_cache[step] = view
            while len(self._steps_cache) > STEP_CACHE:
                self._steps_cache.popitem(last=False)
        return view

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
