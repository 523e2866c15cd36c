"""Exact medians over a run too big to hold: each partition writes the values it owns to a
scratch file, sorted by group, and the combine step reads one group's values from every
partition at a time (read into one array: _read), so memory holds one group of one column, not the run.

Medians are exact and equal to pandas' (``Series.median`` / ``groupby(...).median()``: NaN
skipped, the mean of the two middle values for an even count), not estimates: the summary must
print the same numbers whichever path computed them.

How a piece is written and read back (int32 columns, bandwidths computed on reading) is
analysis.spill_file's.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from syncviz.analysis import selection
from syncviz.analysis.spill_file import (NAN32, RATIO, Piece, Ratio, RatioValues, _floats, _Layout, _layout,  # noqa: F401
                                         _mapped, narrow, ratio_values, valid_ascending, valid_range, write_groups,
                                         write_piece)


def median(x: np.ndarray) -> float:
    """pandas' median: NaN skipped; NaN when nothing is left."""
    return median_in_place(np.array(x, dtype=float))


# Medians and quantiles sort a group's values, or select the middle ones (np.partition, introselect),
# whichever this machine does faster (_sorts_faster): the order statistics are the same values either
# way. numpy's sort is vectorized (x86-simd-sort, AVX2 and AVX-512; Highway on Arm), its partition is
# not, and how much that pays depends on the CPU. Measured (numpy 2.4, one core, best of 3): on the
# machine of sessions 31-37, 800,000 int32 durations sorted in 2.0 ms, partitioned at the middle in
# 4.3 ms (12.5 M int32 37 ms against 95 ms; 800,000 float64 4.0 against 4.6 ms); on an AMD EPYC of
# family 25 (Zen 4, session 38) 23.7 ms against 6.4 ms (float64 41 against 6.2 ms; 10 M int32 429
# against 78 ms), and the 10^8-event DDP summary's medians took 16.7 s, against 3.7 s there.
def median_in_place(x: np.ndarray | RatioValues, presorted: bool = False) -> float:
    """median() of a float array it may reorder: NaN sorts last in numpy, so the middle
    of the n values that are not NaN is at ranks (n - 1) // 2 and n // 2, taken as np.median takes
    them (the mean of the two for an even n), with no copy of the array without NaN. An int32 array
    (a narrowed column) has its NaN as NAN32, which sorts first: the middle is m ranks later.
    RatioValues: their sources sorted, the middle ones' ratios. ``presorted``: sorted in place by an
    earlier call (_read hands a column again). Where selecting is faster than sorting here
    (_sorts_faster), the two middle values are selected instead: the same values."""
    if not _sorts_faster():
        return _median_selected(x)
    if isinstance(x, RatioValues):
        v = x.valid_sorted(presorted)
        n = len(v)         # ranks k of the ratios are ranks n - 1 - k of their sources
        return float("nan") if not n else _middle(x.ratios(v[[n - 1 - (n - 1) // 2, n - 1 - n // 2]]), n)
    v = valid_ascending(x, presorted)       # sorted where that is faster: see above median_in_place
    n = len(v)
    return float("nan") if not n else _middle(v[[(n - 1) // 2, n // 2]], n)


def _median_selected(x: np.ndarray | RatioValues) -> float:
    """median_in_place by selection: the values at the middle ranks of the valid ones, those
    np.partition puts there (which orders NaN last and NAN32 first, as the sort does; found by
    analysis.selection) on the array as it is (sorted, partitioned or neither: a column handed again
    is one of those)."""
    ratio = isinstance(x, RatioValues)
    src = x.source if ratio else x
    lo, hi = valid_range(src)
    if ratio:                   # the sources > 0, ascending up to hi; ratio rank k is their rank nv - 1 - k
        nv = int(np.count_nonzero(src > 0))
        ranks = [hi - 1 - (nv - 1) // 2, hi - 1 - nv // 2]
    else:
        nv = hi - lo
        ranks = [lo + (nv - 1) // 2, lo + nv // 2]
    if not nv:
        return float("nan")
    at = sorted(set(ranks))
    middle = selection.select(src, at)[np.searchsorted(at, ranks)]    # np.partition's values at ``ranks``
    return _middle(x.ratios(middle) if ratio else middle, nv)


_SPEED: dict[str, float] = {}       # seconds to sort and to select in 2^18 int32 (sorting_speed)
MEDIANS_ENV = "SYNCVIZ_MEDIANS"     # "sort" / "select": that way, not timed (tests take both)


def _sorts_faster() -> bool:
    """Whether medians sort (else select): SYNCVIZ_MEDIANS where set, else whether this machine sorts
    int32 faster than it selects their middle (sorting_speed)."""
    forced = os.environ.get(MEDIANS_ENV, "").strip().lower()
    if forced in ("sort", "select"):
        return forced == "sort"
    speed = sorting_speed()
    return speed["sort"] <= speed["select"]


def sorting_speed() -> dict[str, float]:
    """Seconds this process took to sort 2^18 random int32 and to select their middle (np.partition),
    the best of 3 each (~10 ms at most on the machines above), timed once a process. benchmarks/scale.py
    prints them: the summary's medians depend on them."""
    if not _SPEED:
        import time
        x = np.random.default_rng(0).integers(0, 1 << 30, 1 << 18, dtype=np.int32)
        for name, run in (("sort", lambda y: y.sort()), ("select", lambda y: y.partition([len(y) // 2]))):
            times = []
            for _ in range(3):
                y = x.copy()
                t = time.perf_counter()
                run(y)
                times.append(time.perf_counter() - t)
            _SPEED[name] = min(times)
    return _SPEED


def _middle(v: np.ndarray, n: int) -> float:
    return float(np.mean(v)) if n % 2 == 0 else float(v[0])


BIG_GROUP = 1 << 20       # values: a group this big is one median task; smaller ones are batched


def group_medians(pieces: list[Piece | None], keys: list[str], cols, map_fn=map) -> pd.DataFrame:
    """Median of every column per group over all partitions' pieces (index: the keys, sorted).
    ``map_fn``: a map to run the median tasks with (a process pool's: the groups and columns are
    independent); each task reads its own values from the pieces, one column at a time."""
    return group_medians_many([(pieces, keys, cols)], map_fn)[0]


def group_medians_many(requests: list[tuple], map_fn=map) -> list[pd.DataFrame]:
    """group_medians of several (pieces, keys, cols) at once: every task in one map, the biggest
    first, so that two workers finish together (the summary's four tables at 10^8 events: 3.6 s one
    table after another, the tasks of a table waiting for its biggest). A request may add
    ``select``: a function of a piece's group key that returns the key of the request's group its
    rows belong to, or None (rows not in this median); its ``cols`` are then the pieces' columns by
    name (Piece.names). Several medians then read one spill of the same rows."""
    tasks, layout = _plan(requests)
    outs = [np.full((len(g), len(c)), np.nan) for g, _, c in layout]
    for done in map_fn(median_task, tasks):
        for ri, gi, ci, m in done:
            outs[ri][gi, ci] = m
    return [pd.DataFrame(out, index=_index(groups, keys), columns=cols) for (groups, keys, cols), out in zip(layout, outs)]


QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)
STATS = tuple(f"q{round(q * 100)}" for q in QUANTILES) + ("mean", "count")


def group_quantiles(pieces: list[Piece | None], keys: list[str], cols, map_fn=map, select=None) -> list[pd.DataFrame]:
    """tables.quantiles of every column per group over all partitions' pieces: one frame a column
    (index: the keys, sorted; columns STATS), as ``quantiles(table, key, col)`` of the whole table
    gives it. The quantiles are pandas' exactly (its linear interpolation, NaN skipped); the mean
    is a sum in extended precision over the count, where pandas adds float64 with Kahan's
    compensation: the two can differ in the last bits. ``select``: as group_medians_many's."""
    tasks, layout = _plan([(pieces, keys, cols) + ((select,) if select is not None else ())])
    groups, keys, cols = layout[0]
    out = np.full((len(cols), len(groups), len(STATS)), np.nan)
    for done in map_fn(quantile_task, tasks):
        for _, gi, ci, stats in done:
            out[ci, gi] = stats
    frames = []
    for ci in range(len(cols)):
        f = pd.DataFrame(out[ci], index=_index(groups, keys), columns=list(STATS))
        keep = f["count"].to_numpy() > 0           # a group with no value of this column: no row (dropna)
        frames.append(f[keep].astype({"count": np.int64}))
    return frames


def _plan(requests: list[tuple]) -> tuple[list[list], list[tuple]]:
    """The tasks of group_medians_many's requests (the biggest first; each a list of (request,
    group number, column, the piece's column, slices)) and each request's (groups, keys, cols)."""
    tasks, layout = [], []
    for ri, (pieces, keys, cols, *select) in enumerate(requests):
        where = _where(pieces, select[0] if select else None)
        names = next((p.names for p in pieces if p is not None), ())
        at = [names.index(c) for c in cols] if names else list(range(len(cols)))
        groups = sorted(where)
        layout.append((groups, keys, list(cols)))
        batch, size = [], 0
        for gi, k in enumerate(groups):
            n = sum(b - a for _, a, b in where[k])
            if n >= BIG_GROUP:
                tasks += [(n, [(ri, gi, ci, at[ci], where[k])]) for ci in range(len(cols))]
                continue
            batch += [(ri, gi, ci, at[ci], where[k]) for ci in range(len(cols))]
            size += n * len(cols)
            if size >= BIG_GROUP:
                tasks.append((size, batch))
                batch, size = [], 0
        if batch:
            tasks.append((size, batch))
    tasks.sort(key=lambda t: -t[0])
    return [t for _, t in tasks], layout


def _index(groups: list, keys: list[str]) -> pd.Index:
    if not keys:
        return pd.RangeIndex(len(groups))
    return pd.MultiIndex.from_tuples(groups, names=keys) if len(keys) > 1 else \
        pd.Index([g[0] for g in groups], name=keys[0])


def median_task(task: list) -> list[tuple[int, int, int, float]]:
    """The medians of a list of (request, group number, column, the piece's column, [(piece file,
    first row, end row)]): each group's column read into one array and its median taken in place."""
    return [(ri, gi, ci, median_in_place(x, presorted)) for ri, gi, ci, x, presorted in _read(task)]


def quantile_task(task: list) -> list[tuple[int, int, int, list[float]]]:
    """median_task's reads, each group's column summarized as STATS (group_quantiles)."""
    return [(ri, gi, ci, quantile_stats(x, presorted)) for ri, gi, ci, x, presorted in _read(task)]


def quantile_stats(x: np.ndarray | RatioValues, presorted: bool = False) -> list[float]:
    """STATS of the values that are not NaN: pandas' groupby quantile (at q·(n − 1) in sorted order,
    ``v[i] + (v[i + 1] − v[i]) · frac`` between two values), the mean and the count. The ranks
    the quantiles read are in place after one sort (see above median_in_place), and the sum is taken in
    extended precision by numpy (math.fsum would walk each group's values as a Python list).
    ``presorted``: as median_in_place's. Where selecting is faster here (_sorts_faster), an int32
    column's ranks are selected instead, its sum being exact in any order (_exact_sum); a float64
    column and a Ratio's are still sorted, since their long double sum depends on the order."""
    fast_sort = _sorts_faster()
    presorted = presorted and fast_sort     # selecting leaves a column handed again unsorted
    if isinstance(x, RatioValues):
        v = x.ratios(x.valid_sorted(presorted)[::-1])      # every ratio, ascending
    elif x.dtype == np.int32 and not fast_sort and _LONG_HOLDS_INT64 and len(x) < 1 << 32:
        return _int_quantiles_selected(x)
    else:
        v = valid_ascending(x, presorted)        # sorted: see above median_in_place
    n = len(v)
    if not n:
        return [np.nan] * (len(QUANTILES) + 1) + [0.0]
    return [_quantile_at(v, 0, q * (n - 1)) for q in QUANTILES] + [float(_exact_sum(v) / n), float(n)]


def _quantile_at(v: np.ndarray, lo: int, a: float) -> float:
    """pandas' linear quantile at ``a`` of the values from rank ``lo`` on (v ordered there)."""
    i, frac = int(a), a % 1
    x = np.float64(v[lo + i])           # an int32 column's values as the float64 they were
    return float(x) if frac == 0.0 else float(x + (np.float64(v[lo + i + 1]) - x) * frac)


def _int_quantiles_selected(x: np.ndarray) -> list[float]:
    """quantile_stats of an int32 column by selection: the ranks each quantile reads, selected in
    place past the NAN32 ones (which select first), and the int64 sum of the valid values, which is
    _exact_sum's of them sorted."""
    lo, hi = valid_range(x)
    n = hi - lo
    if not n:
        return [np.nan] * (len(QUANTILES) + 1) + [0.0]
    at = [q * (n - 1) for q in QUANTILES]
    ranks = sorted({lo + r for a in at for r in ((int(a), int(a) + 1) if a % 1 else (int(a),))})
    x.partition(ranks)
    total = int(x.sum(dtype=np.int64)) - lo * int(NAN32)
    return [_quantile_at(x, lo, a) for a in at] + [float(np.longdouble(total) / n), float(n)]


# Whether a sum of int32 values in int64, made a long double, is the long double sum itself: with
# a 64-bit mantissa (x86's extended precision) every partial sum of fewer than 2^32 int32 values is
# a whole number below 2^63, held exactly either way.
_LONG_HOLDS_INT64 = np.finfo(np.longdouble).nmant >= 63


def _exact_sum(v: np.ndarray) -> np.longdouble:
    """v.sum(dtype=np.longdouble), the same value; an int32 array's in int64 where that is exact
    (_LONG_HOLDS_INT64). Why: the long double sum runs on the x87 unit, one value at a time: 0.87 s
    of the workers' CPU in the 10^8-event DDP summary's quantiles (py-spy), where int64 adds with SIMD."""
    if v.dtype == np.int32 and _LONG_HOLDS_INT64 and len(v) < 1 << 32:
        return np.longdouble(int(v.sum(dtype=np.int64)))
    return v.sum(dtype=np.longdouble)


MAX_OPEN = 256        # files a median task keeps open (_read): a quarter of the usual 1,024 a process


def _read(task: list):
    """(request, group, column, values) of each item of a task, its values read into one array
    (int32 when every piece holds that column narrowed, else float64 with NaN for NAN32), or, for a
    Ratio column whose slices share one (num, fac), RatioValues of its source column read so.
    Read, not memory-mapped: the mapped pages of a column of 6*10^7 values count in the worker's
    resident memory as much again. A task keeps up to MAX_OPEN files open (it reads every piece for
    each of its groups and columns: ~150,000 opens in the 10^8-event summary's medians, 147 files),
    closing the one opened first when it needs another: a run of more partitions never holds more
    descriptors than that.

    Each item comes with ``presorted``: True when its array is the one the item before was handed
    (the same column of the same slices: the bucket rows' duration, then its algbw and busbw, Ratios
    of it), which every consumer (median_in_place, quantile_stats) has sorted in place by then. Why: the
    10^8-event DDP summary's bucket medians read and sorted each group's durations three times."""
    files: dict[str, _Layout] = {}
    handles: dict = {}              # in the order opened
    last: tuple | None = None       # (column, slices, array) of the item before

    def handle(path):
        f = handles.get(path)
        if f is None:
            if len(handles) >= MAX_OPEN:
                handles.pop(next(iter(handles))).close()
            f = handles[path] = open(path, "rb")
        return f

    try:
        for ri, gi, ci, pci, slices in task:
            for path, _, _ in slices:
                if path not in files:
                    files[path] = _layout(path)
            pairs = {files[path].ratio_of(pci, a, b) for path, a, b in slices}
            pair = pairs.pop() if len(pairs) == 1 else None
            read = files[slices[0][0]].params[pci] if pair is not None else pci     # a Ratio's: its source
            again = last is not None and last[0] == read and last[1] == slices
            x = last[2] if again else _column(files, handle, slices, read)
            last = (read, slices, x)
            yield ri, gi, ci, (RatioValues(x, *pair) if pair is not None else x), again
    finally:
        for f in handles.values():
            f.close()


def _column(files: dict, handle, slices: list, pci: int) -> np.ndarray:
    """Column ``pci`` of the slices in one array (see _read)."""
    wide = any(files[path].dtypes[pci] != np.int32 for path, _, _ in slices)
    x = np.empty(sum(b - a for _, a, b in slices), dtype=np.float64 if wide else np.int32)
    at = 0
    for path, a, b in slices:
        lay, f = files[path], handle(path)
        if lay.dtypes[pci] == x.dtype and lay.starts[pci] is not None:
            f.seek(lay.starts[pci] + x.dtype.itemsize * a)
            f.readinto(memoryview(x[at:at + b - a]).cast("B"))
        elif x.dtype == np.int32:   # one value a group (spill_file.CONST), int32 as the group's
            x[at:at + b - a] = lay.read(f, pci, a, b)
        else:                   # an int32 piece into a float64 group, a Ratio, or one value a group
            x[at:at + b - a] = _floats(lay.read(f, pci, a, b))
        at += b - a
    return x


def _where(pieces: list[Piece | None], select=None) -> dict[tuple, list[tuple[str, int, int]]]:
    """Each group's slices (piece file, first row, end row), pieces in order; ``select``: see
    group_medians_many. Slices that follow each other in one file are one slice (one read)."""
    where: dict[tuple, list[tuple[str, int, int]]] = {}
    memo: dict[tuple, tuple | None] = {}
    for p in pieces:
        if p is None:
            continue
        ends = np.cumsum(p.counts)
        for k, a, b in zip(p.groups, (ends - p.counts).tolist(), ends.tolist()):
            if select is not None:
                k = memo[k] if k in memo else memo.setdefault(k, select(k))
                if k is None:
                    continue
            s = where.setdefault(k, [])
            if s and s[-1][0] == p.path and s[-1][2] == a:
                s[-1] = (p.path, s[-1][1], b)
            else:
                s.append((p.path, a, b))
    return where


def group_values(pieces: list[Piece | None]):
    """(group key, values: columns × rows) for every group over all partitions' pieces, groups in
    sorted order, each group's rows in piece order (a partition of lower ranks first: the row order
    of the whole run's table), one group in memory at a time."""
    pieces = [p for p in pieces if p is not None]
    where: dict[tuple, list[tuple[int, int, int]]] = {}
    arrays = []
    for i, p in enumerate(pieces):
        arrays.append(_mapped(p))
        ends = np.cumsum(p.counts)
        for k, a, b in zip(p.groups, ends - p.counts, ends):
            where.setdefault(k, []).append((i, int(a), int(b)))
    for k in sorted(where):
        yield k, np.stack([np.concatenate([_floats(arrays[i][ci][a:b]) for i, a, b in where[k]])
                           for ci in range(len(arrays[where[k][0][0]]))])
