"""One value's rows of a frame kept in a run's cache (views/runcache.py, ``RunCache.get_rows``), read
from the Parquet row groups that may hold it, not the whole file.

Why: the Replay of a big run needs one step's rows of the kept step table (1,024 of the 10^8-event
DDP run's 800,000); reading the table whole was 0.16 s of a first open, 0.39 s with the file out of
the page cache (session 43). The file is opened once, each row group's statistics of the column are
taken once, and the last few groups read stay decoded: the steps beside one (the page's next step,
the read-ahead) share its group. Measured on that table (98 groups of 8,192 rows): a group read and
decoded in ~2-3 ms without Arrow's thread pool, against ~20 ms with it while the machine was busy.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

KEEP_GROUPS = 4     # decoded row groups kept per file: 32 steps of a 1,024-rank step table, ~4 MB


def labelled(df: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """A frame read from its Parquet file, with the column labels its spec keeps."""
    if spec.get("columns_range") is not None:
        return df.set_axis(pd.RangeIndex(*spec["columns_range"], name=spec["columns_name"]), axis=1)
    cols = pd.Index(spec["columns"], name=spec["columns_name"])
    if len(cols) and str(cols.dtype) != spec["columns_dtype"]:
        cols = cols.astype(spec["columns_dtype"])
    return df.set_axis(cols, axis=1)


class RowGroups:
    """A kept frame's file (``spec``: its entry in the cache) opened for reading the rows of one
    value of ``column``. Not thread-safe: RunCache reads under its lock."""

    def __init__(self, path: Path, spec: dict, column: str):
        self.spec, self.column = spec, column
        self.file = pq.ParquetFile(path)
        at = self.file.schema_arrow.get_field_index(f"c{spec['columns'].index(column)}")
        meta = self.file.metadata
        self.groups = []                 # (rows, min, max) per row group; min None: no statistics
        for i in range(meta.num_row_groups):
            g = meta.row_group(i)
            st = g.column(at).statistics
            known = st is not None and st.has_min_max
            self.groups.append((g.num_rows, st.min if known else None, st.max if known else None))
        self.decoded: OrderedDict[int, pd.DataFrame] = OrderedDict()

    def rows(self, value, most: int) -> pd.DataFrame | None:
        """The rows where ``column`` equals ``value``, in the frame's order, with a fresh RangeIndex;
        None where the groups that may hold it hold more than ``most`` rows (read the file whole)."""
        hold = [i for i, (_, lo, hi) in enumerate(self.groups) if lo is None or lo <= value <= hi]
        if sum(self.groups[i][0] for i in hold) > most:
            return None
        parts = [self._group(i) for i in hold]
        if not parts:
            return labelled(self.file.schema_arrow.empty_table().to_pandas(), self.spec)
        df = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
        return df[df[self.column].to_numpy() == value].reset_index(drop=True)

    def _group(self, i: int) -> pd.DataFrame:
        if i in self.decoded:
            self.decoded.move_to_end(i)
            return self.decoded[i]
        df = labelled(self.file.read_row_group(i, use_threads=False).to_pandas(use_threads=False), self.spec)
        self.decoded[i] = df
        while len(self.decoded) > KEEP_GROUPS:
            self.decoded.popitem(last=False)
        return df
