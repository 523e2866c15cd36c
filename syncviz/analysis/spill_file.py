"""The scratch files of analysis.spill: one partition's values of one table, written sorted by group
(write_groups) and read back a slice of rows at a time (_Layout.read).

A column whose values are all whole numbers that fit in 32 bits (the nanosecond durations: 8 of
the summary's 11 spilled columns on the 10^8-event DDP run) is written as int32, NaN as INT32_MIN,
not as float64: half the bytes to write, read back and select in. Every value converts back to the
same float64 exactly, so medians and quantiles are the same numbers (``narrow``).

A bandwidth column (algbw, busbw) is a ratio of the service time beside it: where service > 0,
bytes / service × factor (comm_times). Where every group's rows (a bucket's) share their bytes and
factor, the column is not written: reading computes it from the service time and the group's two
numbers (``Ratio``), the same float64. The bucket rows' spill then writes 24 bytes a row, not 40:
this VM pays ~2.4 s a GiB for the first touch of memory it got back (README, session 34), and the
10^8-event DDP summary wrote 3.9 GB of bucket rows. Measured there (`/usr/bin/time` of
partitioned.summarize, two runs each, one session): 37.7 s (18.4 s system) before, 34.3 and 34.3 s
(11.3 and 10.8 s system) with this and RatioValues' medians; every table the same.

A column whose rows share one value through each group (``CONST``: a bucket's launch delay where no
gradient-ready time was recorded, NaN; its hook-to-launch time where an engine launches in the hook,
0) is not written either: the group's value is kept once, in the header, and reading repeats it. On
the 10^8-event DDP run two of the bucket spill's six written columns are so (24 → 16 bytes a row).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from syncviz.analysis.metrics import algbw_gbps


@dataclass
class Piece:
    """One partition's values of one table: ``groups`` (list of key tuples, sorted), ``counts``
    per group and the file (``write_groups``: a header, then each column's rows sorted by group).
    ``names``: the columns' names, where several medians read one piece, each picking its columns by
    name and its groups (group_medians_many's ``select``)."""
    groups: list
    counts: np.ndarray
    path: str
    names: tuple = ()


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


@dataclass
class Ratio:
    """A column computed from another of its piece: where ``source`` > 0, ``num`` / source × ``fac``,
    else NaN (``num``, ``fac``: a number, or one a row). comm_times' algbw is Ratio(service, bytes, 1.0)
    and its busbw Ratio(service, bytes, busbw factor): the column given to write_groups must be these
    values (ratio_values)."""
    source: str
    num: np.ndarray | float
    fac: np.ndarray | float


def ratio_values(source: np.ndarray, num, fac) -> np.ndarray:
    """A Ratio's values of float64 ``source``: metrics.algbw_gbps (``fac`` 1.0: x × 1.0 is x) and busbw."""
    return algbw_gbps(num, source) * fac


def write_groups(directory: str | Path, tag: str, groups: list, codes: np.ndarray, columns: list,
                 names: tuple = (), ratios: dict[str, Ratio] | None = None) -> Piece | None:
    """write_piece on arrays: ``groups`` (key tuples, sorted), each row's group number in them, and
    the columns' values (``names``: theirs, see Piece). ``ratios``: columns (by name) not written
    where their Ratio's num and fac are the same through each group. The file: ``_MAGIC``; the
    column count, row count, a kind a column (0 float64, 1 int32 as ``narrow``, 2 a Ratio), a
    parameter a column (a Ratio's source column) and the group count where a column is a Ratio,
    else 0 (uint64 each); then each group's end row, and each Ratio column's num and fac a group
    (float64); then each written column's rows in group order."""
    if not len(codes):
        return None
    order = None                            # one group: rows as they are
    if len(groups) > 1:                     # numpy's stable sort of 16-bit keys is a radix sort: a bucket
        small = len(groups) <= 1 << 16      # spill's 660,000 interleaved codes in 2.2 ms, not 5.1 (int64)
        order = np.argsort(codes.astype(np.uint16) if small else codes, kind="stable")
    counts = np.bincount(codes, minlength=len(groups))
    params, tables = [0] * len(columns), {}
    per_group: dict[int, np.ndarray | None] = {}         # by id: algbw and busbw share their bytes
    for name, r in (ratios or {}).items():
        for v in (r.num, r.fac):
            if id(v) not in per_group:
                per_group[id(v)] = _per_group(v, codes, len(groups))
        num, fac = per_group[id(r.num)], per_group[id(r.fac)]
        if num is not None and fac is not None:
            tables[names.index(name)] = (num, fac)
            params[names.index(name)] = names.index(r.source)
    stored = [None if ci in tables else narrow(np.asarray(c)) for ci, c in enumerate(columns)]
    kinds = [RATIO if c is None else _CODES[c.dtype] for c in stored]
    for ci, c in enumerate(stored):
        if c is not None and (value := _constant(c, codes, len(groups))) is not None:
            tables[ci], params[ci], kinds[ci], stored[ci] = (value,), _CODES[c.dtype], CONST, None
    path = str(Path(directory) / f"{tag}.spill")
    ends = np.cumsum(counts) if tables else np.zeros(0, dtype=np.int64)
    head = np.array([len(stored), len(codes)] + kinds + params + [len(ends)], dtype=np.uint64)
    with open(path, "wb") as f:
        f.write(_MAGIC)
        head.tofile(f)
        ends.astype(np.uint64).tofile(f)
        for ci in sorted(tables):
            for v in tables[ci]:
                v.tofile(f)
        for c in stored:
            if c is not None:
                (c if order is None else np.take(c, order)).tofile(f)
    return Piece(groups, counts, path, tuple(names))


def _constant(c: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray | None:
    """A stored column's value a group, as float64 (an int32 one's NAN32 as that number), where every
    row of each group holds its group's value bit for bit; else None. The first rows are looked at
    first: a column that varies within a group (a duration) is most often told from them alone."""
    bits = c.view(np.int64 if c.dtype == np.float64 else np.int32)     # NaN == NaN, -0.0 != 0.0
    for m in (min(len(c), 4096), len(c)):
        first = np.zeros(n, dtype=bits.dtype)
        first[codes[:m]] = bits[:m]
        if not np.array_equal(first[codes[:m]], bits[:m]):
            return None
    return first.view(c.dtype).astype(np.float64)


def _per_group(v, codes: np.ndarray, n: int) -> np.ndarray | None:
    """The value each group's rows share (float64), or None where a group's rows differ."""
    if np.ndim(v) == 0:
        return np.full(n, float(v))
    v = np.asarray(v, dtype=np.float64)
    out = np.zeros(n)
    out[codes] = v                          # some row's value a group; all of them if they agree
    return out if np.array_equal(out[codes], v) else None


_MAGIC = b"syncviz spill 4\n"
NAN32 = np.iinfo(np.int32).min          # NaN in an int32 column (never a value: narrow keeps those as float64)
RATIO = 2                               # a column's kind: computed on reading (Ratio)
CONST = 3                               # a column's kind: one value a group (its parameter: the value's kind)
_CODES = {np.dtype(np.float64): 0, np.dtype(np.int32): 1}
_DTYPES = {0: np.dtype(np.float64), 1: np.dtype(np.int32), RATIO: np.dtype(np.float64)}


def narrow(c: np.ndarray) -> np.ndarray:
    """The column as it is spilled: int32 (NaN as NAN32) when every value that is not NaN is a whole
    number in (NAN32, 2^31) and none is -0.0, so each converts back to the same float64; else float64."""
    if c.dtype.kind in "iub":
        if not len(c) or (c.min() > NAN32 and c.max() <= np.iinfo(np.int32).max):
            return c.astype(np.int32)
        return c.astype(np.float64)
    c = c.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        i = c.astype(np.int32)                       # NaN and values out of range: anything; caught below
    nan = np.isnan(c)
    same = i == c
    if not (same | nan).all() or (same & (i == NAN32)).any() or np.signbit(c[same & (i == 0)]).any():
        return c
    if nan.any():
        i[nan] = NAN32
    return i


@dataclass
class _Layout:
    """Where a piece file's columns are (write_groups): each column's kind and dtype as read, where
    its rows start (a Ratio: none), its parameter, and each group's end row and Ratio table."""
    kinds: list[int]
    dtypes: list[np.dtype]
    starts: list[int | None]
    params: list[int]
    rows: int
    ends: np.ndarray
    tables: dict

    def read(self, f, ci: int, a: int, b: int) -> np.ndarray:
        """Rows a..b of column ``ci`` from the open file ``f``: as stored (one value a group: as it
        would have been stored), a Ratio as float64."""
        if self.kinds[ci] == CONST:
            return self._repeated(self.tables[ci][0], a, b).astype(self.dtypes[ci], copy=False)
        if self.kinds[ci] != RATIO:
            f.seek(self.starts[ci] + self.dtypes[ci].itemsize * a)
            return np.fromfile(f, dtype=self.dtypes[ci], count=b - a)
        num, fac = self.tables[ci]
        source = _floats(self.read(f, self.params[ci], a, b))
        g0, g1 = np.searchsorted(self.ends, [a, max(a, b - 1)], side="right").tolist()
        if g0 == g1:                    # one group (the usual slice): its num and fac
            return ratio_values(source, num[g0], fac[g0])
        return ratio_values(source, self._repeated(num, a, b), self._repeated(fac, a, b))

    def _repeated(self, per_group: np.ndarray, a: int, b: int) -> np.ndarray:
        """Rows a..b of a column holding its group's value of ``per_group`` on every row."""
        if b <= a:
            return per_group[:0]
        g0, g1 = np.searchsorted(self.ends, [a, b - 1], side="right").tolist()
        if g0 == g1:
            return np.full(b - a, per_group[g0])
        bounds = np.clip(self.ends[g0:g1 + 1], a, b)
        return np.repeat(per_group[g0:g1 + 1], np.diff(bounds, prepend=a))

    def ratio_of(self, ci: int, a: int, b: int) -> tuple[float, float] | None:
        """The (num, fac) that rows a..b of Ratio column ``ci`` share, if they share one with num >= 0
        and fac > 0, both finite (a ratio then falls as its source rises: RatioValues); else None."""
        if self.kinds[ci] != RATIO:
            return None
        g0 = int(self.ends.searchsorted(a, side="right"))
        num, fac = self.tables[ci]
        if self.ends[g0] < b:               # rows of several groups (a read of neighbours)
            g1 = int(self.ends.searchsorted(b - 1, side="right"))
            if (num[g0:g1 + 1] != num[g0]).any() or (fac[g0:g1 + 1] != fac[g0]).any():
                return None
        n, f = float(num[g0]), float(fac[g0])
        return (n, f) if 0 <= n < np.inf and 0 < f < np.inf else None


@dataclass
class RatioValues:
    """A Ratio column's values of a group, held as its source's (stored: int32 with NAN32 or float64),
    its num and fac shared by every row (_Layout.ratio_of). Where num >= 0 and fac > 0, x ↦ num / x × fac
    never rises as x > 0 rises (IEEE division and product round monotonically), so the ratios in
    ascending order are the ratios of the sources > 0 in descending order: the same float64 values a
    sort of the computed column gives, from a sort of the source (an int32 sort: half the bytes)."""
    source: np.ndarray
    num: float
    fac: float

    def valid_sorted(self, presorted: bool = False) -> np.ndarray:
        """The sources > 0 (those whose ratio is not NaN), ascending; sorts ``source`` in place
        (``presorted``: it is sorted already)."""
        v = valid_ascending(self.source, presorted)
        return v[int(np.searchsorted(v, v.dtype.type(0), side="right")):]     # 0 in v's type: see valid_ascending

    def ratios(self, source: np.ndarray) -> np.ndarray:
        return ratio_values(source.astype(np.float64), self.num, self.fac)


def valid_ascending(x: np.ndarray, presorted: bool = False) -> np.ndarray:
    """The values of a column ``x`` that are not NaN, ascending: a view of ``x`` sorted in place
    (``presorted``: sorted already). NAN32 (an int32 column's NaN) sorts first, NaN last."""
    if not presorted:
        x.sort()
    if x.dtype == np.int32:
        # NAN32 as an int32: numpy searches an int32 array for a Python int in a copy of it in int64,
        # 0.77 GB more at the peak of the 10^8-event DDP summary (its one-group medians: 96.6 M values)
        return x[int(np.searchsorted(x, np.int32(NAN32), side="right")):]
    return x[:len(x) - int(np.isnan(x).sum())]


def valid_range(x: np.ndarray) -> tuple[int, int]:
    """Where a column's values that are not NaN lie once it is ordered (sorted, or partitioned at ranks
    among them): ranks lo..hi, NAN32 (an int32 column's NaN) before them, NaN after. Counted, so the
    column may be in any order (valid_ascending finds the same ends in a sorted one)."""
    if x.dtype == np.int32:
        return int(np.count_nonzero(x == NAN32)), len(x)
    return 0, len(x) - int(np.count_nonzero(np.isnan(x)))


def _layout(path: str) -> _Layout:
    """The _Layout of a piece file (write_groups), kept by the process for the file as it is: a
    median task reads every piece's for each of its groups (31,000 reads of 147 files, 1.8 s of the
    10^8-event DDP summary's medians in one process, read afresh each task)."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size, st.st_ino)
    lay = _LAYOUTS.get(key)
    if lay is None:
        if len(_LAYOUTS) >= 4096:
            _LAYOUTS.clear()
        lay = _LAYOUTS[key] = _read_layout(path)
    return lay


_LAYOUTS: dict[tuple, _Layout] = {}


def _read_layout(path: str) -> _Layout:
    with open(path, "rb") as f:
        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError(f"{path}: not a spill piece")
        ncols, rows = (int(v) for v in np.fromfile(f, dtype=np.uint64, count=2))
        head = np.fromfile(f, dtype=np.uint64, count=2 * ncols + 1).astype(np.int64)
        kinds, params, ngroups = head[:ncols].tolist(), head[ncols:2 * ncols].tolist(), int(head[-1])
        ends = np.fromfile(f, dtype=np.uint64, count=ngroups).astype(np.int64)
        tables = {ci: tuple(np.fromfile(f, dtype=np.float64, count=ngroups) for _ in range(2 if k == RATIO else 1))
                  for ci, k in enumerate(kinds) if k in (RATIO, CONST)}
        at = f.tell()
    dtypes = [_DTYPES[p] if k == CONST else _DTYPES[k] for k, p in zip(kinds, params)]
    starts = []
    for k, dt in zip(kinds, dtypes):
        written = k not in (RATIO, CONST)
        starts.append(at if written else None)
        at += dt.itemsize * rows if written else 0
    return _Layout(kinds, dtypes, starts, params, rows, ends, tables)


def _mapped(piece: Piece) -> list[np.ndarray]:
    """A piece's columns memory-mapped (read-only), as stored; a Ratio column computed (float64), a
    column of one value a group repeated (in the type it would have been stored in)."""
    lay = _layout(piece.path)
    with open(piece.path, "rb") as f:
        return [lay.read(f, ci, 0, lay.rows) if at is None else
                np.memmap(piece.path, dtype=dt, mode="r", offset=at, shape=(lay.rows,))
                for ci, (k, dt, at) in enumerate(zip(lay.kinds, lay.dtypes, lay.starts))]


def _floats(c: np.ndarray) -> np.ndarray:
    """A stored column's rows as float64 (NaN for a narrowed column's NAN32)."""
    return np.where(c == NAN32, np.nan, c) if c.dtype == np.int32 else np.asarray(c, dtype=np.float64)
