"""Order statistics of a big array without partitioning all of it: the values ``np.partition`` would
put at some ranks, found by bracketing them with a random sample and partitioning only the values
between the brackets (Floyd and Rivest's idea, in numpy's vector operations).

Why: the summary's medians select (spill._median_selected) on machines whose sort is slower than
numpy's introselect (spill.py, above median_in_place), and on the AMD EPYC of family 25 of sessions
38-46 np.partition is itself slow (numpy 2.4.6 with its AVX-512 dispatch switched off selects ~9x
faster, yet the whole summary was slower that way: session 45). In the 10^8-event DDP summary it was 6.3 s of
~80 s of CPU (cProfile, one process, session 46). Here: a sample of 8,192 sorted, two counts over the
array, one compare-and-compress, and a partition of the ~5% between the brackets. The middle of
800,000 int32 in 1.90 ms against 4.65 ms, float64 2.39 against 9.66 ms; 10^7 int32 18.7 against
66.6 ms (`benchmarks/selection.py`, alternated, the same values). The int32 quartiles are not found
this way: a bracket each was slower than one partition of all their ranks (0.64-0.85x).

Exact whatever the sample: the values are counted, not estimated. Where the brackets miss a rank (a
sample that is unlucky: under 10^-4 a call with a margin of four standard deviations) or more than a
quarter of the values are between them, the whole array is partitioned as before. NaN is never below or between brackets,
so it keeps np.partition's place (last) for float arrays, whose ranks asked here are those of values.
"""
from __future__ import annotations

import numpy as np

SAMPLE = 8192          # values drawn to place the brackets
SMALL = 1 << 16        # below this many values np.partition is as fast (61,000 int32: 0.45 ms either way)
CHUNK = 1 << 18        # values compared at a time: the masks stay small (a group of 10^8 values needs no 10^8-byte mask)


def select(x: np.ndarray, ranks: list[int]) -> np.ndarray:
    """The values ``np.partition(x, ranks)`` holds at ``ranks`` (sorted, distinct, in range), in that
    order: one bracket around them all, so for ranks close together (a median's one or two); ranks
    far apart are partitioned as before. ``x`` may be reordered (it is partitioned in place where the
    brackets do not help: no copy of a column of 10^8 values)."""
    n = len(x)
    if n < SMALL or ranks[-1] - ranks[0] > n // 64:
        return _partitioned(x, ranks)
    pick = np.random.default_rng(n).integers(0, n, SAMPLE)
    pick.sort()                              # reads in memory order
    s = np.sort(x[pick])
    margin = 2 * int(np.sqrt(SAMPLE)) + 2    # four standard deviations of the sample's count below a rank
    a, b = ranks[0] * SAMPLE // n - margin, ranks[-1] * SAMPLE // n + margin
    lo, hi = (s[a] if a >= 0 else None), (s[b] if b < SAMPLE else None)
    if (lo is not None and lo != lo) or (hi is not None and hi != hi):      # a NaN bracket counts nothing
        return _partitioned(x, ranks)
    below, upto = _counts(x, lo, hi)
    if not below <= ranks[0] or not ranks[-1] < upto:
        return _partitioned(x, ranks)        # the brackets missed
    if lo is not None and hi is not None and lo == hi:
        return np.full(len(ranks), lo, dtype=x.dtype)
    if upto - below > n // 4:                # brackets that hold most values save nothing
        return _partitioned(x, ranks)
    band = np.concatenate([_between(x[i:i + CHUNK], lo, hi) for i in range(0, n, CHUNK)])
    return _partitioned(band, [r - below for r in ranks])


def _counts(x: np.ndarray, lo, hi) -> tuple[int, int]:
    """How many values are below ``lo`` and how many are at most ``hi`` (None: no bracket there)."""
    below = upto = 0
    for i in range(0, len(x), CHUNK):
        c = x[i:i + CHUNK]
        below += int(np.count_nonzero(c < lo)) if lo is not None else 0
        upto += int(np.count_nonzero(c <= hi)) if hi is not None else len(c) - _nans(c)
    return below, upto


def _between(c: np.ndarray, lo, hi) -> np.ndarray:
    """The values of ``c`` between the brackets, both included."""
    if lo is None:
        return c[c <= hi]
    keep = c >= lo
    if hi is not None:
        keep &= c <= hi
    return c[keep]


def _partitioned(x: np.ndarray, ranks: list[int]) -> np.ndarray:
    x.partition(ranks)
    return x[ranks]


def _nans(x: np.ndarray) -> int:
    return int(np.count_nonzero(np.isnan(x))) if x.dtype.kind == "f" else 0
