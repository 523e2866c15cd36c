"""Where each step's rows are in a run's Arrow table (LoadedRun reads a step by slicing it), the
steps there are, how long each is and how many buckets the run has."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa


class StepIndex:
    """step -> record batches of the table, the step list, per-step extents (ms) and bucket count."""

    def __init__(self, table: pa.Table):
        """Map step -> record batches. Writers flush one batch per step, so a step's rows are whole
        batches (found without copying); a batch holding several steps is filtered row by row.
        Sorting or concatenating the 32,000 batches of a 1M-event run instead costs ~0.5 s."""
        batches = [b for b in table.to_batches() if b.num_rows]
        self.batches = batches
        steps = table.column("step").to_numpy()
        lengths = np.fromiter((b.num_rows for b in batches), dtype=np.int64, count=len(batches))
        starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
        lo = np.minimum.reduceat(steps, starts) if len(batches) else np.zeros(0, np.int64)
        hi = np.maximum.reduceat(steps, starts) if len(batches) else np.zeros(0, np.int64)
        self.by_step: dict[int, list[int]] = {}
        self.mixed: dict[int, list[int]] = {}
        pure = np.flatnonzero(lo == hi)
        for step, idx in pd.Series(pure).groupby(lo[pure]):
            self.by_step[int(step)] = idx.tolist()
        for i in np.flatnonzero(lo != hi):
            for step in np.unique(steps[starts[i]:starts[i] + lengths[i]]):
                self.mixed.setdefault(int(step), []).append(int(i))
        self.step_list = np.array(sorted(k for k in set(self.by_step) | set(self.mixed) if k >= 0),
                                  dtype=np.int64)
        self.step_set = set(self.step_list.tolist())
        # Longest step extent (first event start to last end, all ranks) for a time axis that stays
        # put while stepping, from per-batch minima/maxima: a groupby over all rows costs ~0.3 s.
        start, end = (table.column(c).to_numpy() for c in ("start_ns", "end_ns"))
        valid = (start >= 0) & (end >= start) & (steps >= 0)
        big = np.iinfo(np.int64).max
        self.extents: dict[int, float] = {}
        if len(batches) and valid.any():
            bstart = np.minimum.reduceat(np.where(valid, start, big), starts)
            bend = np.maximum.reduceat(np.where(valid, end, -1), starts)
            keep = (lo == hi) & (lo >= 0) & (bend >= 0)
            first, last = {}, {}
            for k, a, b in zip(lo[keep].tolist(), bstart[keep].tolist(), bend[keep].tolist()):
                first[k], last[k] = min(first.get(k, a), a), max(last.get(k, b), b)
            mixed = np.isin(steps, list(self.mixed)) & valid if self.mixed else np.zeros(0, bool)
            if mixed.any():
                g = pd.DataFrame({"k": steps[mixed], "s": start[mixed], "e": end[mixed]}).groupby("k")
                for k, a, b in zip(g["s"].min().index, g["s"].min(), g["e"].max()):
                    first[k], last[k] = min(first.get(k, a), a), max(last.get(k, b), b)
            self.extents = {k: (last[k] - first[k]) / 1e6 for k in first}
        top = int(table.column("bucket").to_numpy().max()) if table.num_rows else -1
        self.n_buckets = max(1, top + 1)   # bucket indices seen: one colour scale for every step


