"""Chrome trace JSON built column-wise: every piece is an Arrow string array (or a literal) and an
event is the element-wise join of its pieces, so no Python string, dict or json.dumps is made per
event. Used by the Perfetto exporter (perfetto.py), which writes 185k events of the 128-rank sample
in ~0.12 s of CPU this way (benchmarks/export.py prints it).
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from syncviz.analysis import keys as K


# Arrow's kernels release the GIL, so long columns are built on both cores: a join of more rows
# than PARALLEL_ROWS runs as row ranges in threads (kept as the chunks of one ChunkedArray, no copy
# to put them together), and independent pieces can be built side by side (pieces()).
PARALLEL_ROWS = 8_192
WAYS = max(1, min(4, os.cpu_count() or 1))
_POOL = ThreadPoolExecutor(max_workers=WAYS, thread_name_prefix="syncviz-json")


def _join(flat: list) -> pa.Array:
    return pc.binary_join_element_wise(*flat, "")


# Rows of one joined chunk at most: an Arrow string array holds under 2 GiB of text (32-bit offsets),
# and the 10^7-event DDP run's comm events, joined in two halves, came to 2.5 GB each
# (ArrowCapacityError, 2026-11-29). An event is a few hundred bytes: a chunk stays near 0.5 GB.
JOIN_ROWS = 1_000_000


def cat(*parts) -> pa.Array | pa.ChunkedArray:
    """Element-wise concatenation of string arrays and literal strings (tuples are spliced in)."""
    flat = [q for p in parts for q in (p if isinstance(p, tuple) else (p,))]
    n = max((len(q) for q in flat if not isinstance(q, str)), default=0)
    ways = WAYS if n >= PARALLEL_ROWS else 1
    k = max(ways, -(-n // JOIN_ROWS))
    if k == 1:
        return _join(flat)
    bounds = np.linspace(0, n, k + 1).astype(np.int64).tolist()
    ranges = [[q if isinstance(q, str) else q.slice(a, b - a) for q in flat] for a, b in zip(bounds[:-1], bounds[1:])]
    joined = [_join(r) for r in ranges] if WAYS < 2 else [f.result() for f in [_POOL.submit(_join, r) for r in ranges]]
    return pa.chunked_array([c for j in joined for c in _chunks_of(j)], pa.string())


def pieces(*builders):
    """The results of the zero-argument functions ``builders``, built in threads (not for
    functions that call cat: its joins use the same threads)."""
    if WAYS < 2:
        return [b() for b in builders]
    return [f.result() for f in [_POOL.submit(b) for b in builders]]


def _chunks_of(arr) -> tuple:
    return tuple(arr.chunks) if isinstance(arr, pa.ChunkedArray) else (arr,)


def ints(values) -> pa.Array:
    """Integers as decimal strings; small ranges (ranks, steps, buckets) by lookup in a table of
    their strings, which costs a third of Arrow's cast."""
    v = np.asarray(values)
    if len(v) > 64 and v.dtype.kind in "iu":
        lo, hi = int(v.min()), int(v.max())
        if hi - lo < 4096:
            return pa.array([str(i) for i in range(lo, hi + 1)], pa.string()).take(pa.array(v - lo))
    return pc.cast(pa.array(v), pa.string())


_FRAC = pa.array([f".{i:03d}" for i in range(1000)], pa.string())


def us(ns) -> tuple[pa.Array, pa.Array]:
    """Nanoseconds as exact decimal microseconds: 1234567 -> ("1234", ".567"), two pieces for cat
    (one pass of the join instead of a join per number)."""
    whole, frac = np.divmod(np.asarray(ns, dtype=np.int64), 1000)
    return ints(whole), _FRAC.take(pa.array(frac))


def num(x) -> pa.Array:
    """Floats as JSON numbers, null where not finite (JSON has no NaN)."""
    x = np.asarray(x, dtype=float)
    ok = np.isfinite(x)
    return pc.if_else(pa.array(ok), pc.cast(pa.array(np.where(ok, x, 0.0)), pa.string()), "null")


# ".ddd" for the first three decimals of a millisecond value (stripped of trailing zeros at
# [1000 + i]) and "ddd" stripped for the last three: n ns = n // 10**6 ms + these two pieces.
_MS_HI = pa.array([f".{i:03d}" for i in range(1000)] + [f".{i:03d}".rstrip("0").rstrip(".") for i in range(1000)], pa.string())
_MS_LO = pa.array([f"{i:03d}".rstrip("0") for i in range(1000)], pa.string())


def ms(ns) -> tuple[pa.Array, ...]:
    """Nanoseconds as milliseconds, the same text as num(ns / 1e6) (Arrow's shortest float text,
    null where not finite) in a third of the time: for whole ns in [0, 10**15), ns / 1e6 prints as
    the exact decimal (at most 15 significant digits, so it is the shortest text that reads back
    to the same double; tests check it against Arrow on random values). Others go through num."""
    x = np.asarray(ns, dtype=float)
    ok = np.isfinite(x) & (x >= 0) & (x < 1e15)
    n = np.where(ok, x, 0.0).astype(np.int64)
    ok &= n == x
    whole, frac = np.divmod(n, 10 ** 6)
    hi, lo = np.divmod(frac, 1000)
    pieces = (ints(whole), _MS_HI.take(pa.array(np.where(lo == 0, hi + 1000, hi))), _MS_LO.take(pa.array(lo)))
    if ok.all():
        return pieces
    slow, fast = num(x / 1e6), pa.array(ok)
    return (pc.if_else(fast, pieces[0], slow), pc.if_else(fast, pieces[1], ""), pc.if_else(fast, pieces[2], ""))


def text(values, quoted: bool = True, suffix: str = "") -> pa.Array:
    """JSON string literals of values + suffix (escaped once per distinct value; quotes left off
    with quoted=False). A categorical is taken by its codes (one gradient-ready name per parameter
    per step: no Python string per row)."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype) and (values.cat.codes.to_numpy() >= 0).all():
        codes, uniques = values.cat.codes.to_numpy(), [str(u) + suffix for u in values.cat.categories]
    else:
        codes, uniques = pd.factorize(pd.Series(values, dtype=object).astype(str) + suffix)
    lit = [json.dumps(u) if quoted else json.dumps(u)[1:-1] for u in uniques]
    return pa.array(lit, pa.string()).take(pa.array(codes))


def when(cond, *pieces) -> pa.Array | tuple:
    """The pieces where cond holds, "" elsewhere (the pieces themselves, for cat to splice in,
    where it holds everywhere: no join of their own)."""
    cond = np.asarray(cond, dtype=bool)
    if cond.all():
        return pieces
    return pc.if_else(pa.array(cond), cat(*pieces), "")


def factor(*cols) -> tuple[pa.Array, np.ndarray]:
    """Codes of the distinct combinations of cols (as an Arrow index array for take) and the row
    where each combination first occurs: per-collective facts (op, bytes, dtype, ...) repeat for
    every step and rank, so their JSON is built once per combination and copied with take.
    Columns may be numpy arrays or pandas Series (Arrow-backed strings factorize in Arrow)."""
    codes, uniq = pd.factorize(K.group_codes(*cols))
    first = np.full(len(uniq), -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes))[::-1]
    return pa.array(codes), first


def chunks(parts: list[pa.Array | pa.ChunkedArray]) -> list[memoryview]:
    """The events' bytes straight from the Arrow string buffers (no Python str per event); each
    event already ends with ",\n"."""
    chunks = []
    for arr in (c for p in parts for c in _chunks_of(p)):
        if len(arr):
            offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
            chunks.append(memoryview(arr.buffers()[2])[offsets[0]:offsets[-1]])
    return chunks
