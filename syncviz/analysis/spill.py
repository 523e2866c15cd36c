"""Exact medians over a run too big to hold: each partition writes the values it owns to a
scratch file, sorted by group, and the combine step reads one group's values from every
partition at a time (memory-mapped), so memory holds one group of one column, not the run.

Medians are exact and equal to pandas' (``Series.median`` / ``groupby(...).median()``: NaN
skipped, the mean of the two middle values for an even count), not estimates: the summary must
print the same numbers whichever path computed them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass
class Piece:
    """One partition's values of one table: ``groups`` (list of key tuples, sorted), ``counts``
    per group and the .npy file (columns × rows, rows sorted by group)."""
    groups: list
    counts: np.ndarray
    path: str


def write_piece(directory: str | Path, tag: str, frame: pd.DataFrame, keys: list[str], cols) -> Piece | None:
    """Spill ``frame[cols]`` (as float64) grouped by ``keys`` (none: one group)."""
    if not len(frame):
        return None
    if keys:
        g = frame.groupby(keys, sort=True, observed=True)
        codes = g.ngroup().to_numpy()
        groups = [k if isinstance(k, tuple) else (k,) for k in g.size().index]
    else:
        codes = np.zeros(len(frame), dtype=np.int64)
        groups = [()]
    return write_groups(directory, tag, groups, codes, [frame[c].to_numpy(dtype=float) for c in cols])


def write_groups(directory: str | Path, tag: str, groups: list, codes: np.ndarray, columns: list) -> Piece | None:
    """write_piece on arrays: ``groups`` (key tuples, sorted), each row's group number in them, and
    the columns' values."""
    if not len(codes):
        return None
    if len(groups) == 1:          # one group: the rows as they are
        values = np.vstack([np.asarray(c, dtype=float) for c in columns])
    else:
        order = np.argsort(codes, kind="stable")
        values = np.vstack([np.asarray(c, dtype=float)[order] for c in columns])
    path = str(Path(directory) / f"{tag}.npy")
    np.save(path, values)
    return Piece(groups, np.bincount(codes, minlength=len(groups)), path)


def median(x: np.ndarray) -> float:
    """pandas' median: NaN skipped; NaN when nothing is left."""
    x = x[~np.isnan(x)]
    if not len(x):
        return float("nan")
    return float(np.median(x, overwrite_input=True))


def group_medians(pieces: list[Piece | None], keys: list[str], cols) -> pd.DataFrame:
    """Median of every column per group over all partitions' pieces (index: the keys, sorted)."""
    cols = list(cols)
    groups, rows = [], []
    for k, values in group_values(pieces):
        groups.append(k)
        rows.append([median(values[ci]) for ci in range(len(cols))])
    out = np.array(rows, dtype=float).reshape(len(groups), len(cols))
    if keys:
        index = pd.MultiIndex.from_tuples(groups, names=keys) if len(keys) > 1 else \
            pd.Index([g[0] for g in groups], name=keys[0])
    else:
        index = pd.RangeIndex(len(groups))
    return pd.DataFrame(out, index=index, columns=cols)


def group_values(pieces: list[Piece | None]):
    """(group key, values: columns × rows) for every group over all partitions' pieces, groups in
    sorted order, each group's rows in piece order (a partition of lower ranks first: the row order
    of the whole run's table), one group in memory at a time."""
    pieces = [p for p in pieces if p is not None]
    where: dict[tuple, list[tuple[int, int, int]]] = {}
    arrays = []
    for i, p in enumerate(pieces):
        arrays.append(np.load(p.path, mmap_mode="r"))
        ends = np.cumsum(p.counts)
        for k, a, b in zip(p.groups, ends - p.counts, ends):
            where.setdefault(k, []).append((i, int(a), int(b)))
    for k in sorted(where):
        yield k, np.concatenate([arrays[i][:, a:b] for i, a, b in where[k]], axis=1)
