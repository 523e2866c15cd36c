"""Group keys as dense integer codes, and per-group cumcount / max over them, in numpy.

pandas' groupby over several columns (strings among them) hashes the columns again on every call;
the queueing tables group the same 28k comm rows of the 128-rank sample by six keys, which took
~20 ms of its Perfetto export. Here each column is factorized once (Arrow-backed strings in Arrow,
small integer ranges by offset) and the codes are combined arithmetically.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def _column_codes(col) -> tuple[np.ndarray, int]:
    """Codes 0..k-1 of one column and k (any order of codes: only equality matters), in a new int64
    array."""
    v = col.to_numpy() if isinstance(col, pd.Series) and col.dtype.kind in "iub" else col
    if isinstance(v, np.ndarray) and v.dtype.kind in "iub" and len(v):
        lo, hi = int(v.min()), int(v.max())
        if hi - lo < 1 << 24:
            c = v.astype(np.int64)
            if lo:
                c -= lo
            return c, hi - lo + 1
    codes, uniq = pd.factorize(v)
    codes = codes.astype(np.int64)
    k = len(uniq) + 1                                   # + 1: factorize gives -1 for missing
    codes[codes < 0] = k - 1
    return codes, k


def group_codes(*cols) -> np.ndarray:
    """One int64 code per row, equal exactly where the rows agree on every column (codes are not
    dense and not sorted; NaN/None equal each other). Built in place in one array, a column of one
    value skipped: the six identity columns of a 10^8-event partition's 660,000 comm rows in 1.8 ms
    against 5.4 ms for four new arrays a column (best of 15, the former code beside it)."""
    code, card = None, 1
    for col in cols:
        c, k = _column_codes(col)
        if k == 1 and code is not None:                 # one value: every code times 1, plus 0
            continue
        if code is None:
            code, card = c, k
            continue
        if card * k >= 1 << 62:                     # keep the combined code in int64: re-densify
            code, uniq = pd.factorize(code)
            code, card = code.astype(np.int64), len(uniq)
        code *= k
        code += c
        card *= k
    return code if code is not None else np.zeros(0, dtype=np.int64)


_WORD = 1 << 62        # packed keys stay below this: int64, with room for the offset arithmetic
_EXACT_FLOAT = 1 << 53  # floats that are whole numbers below this convert to int64 exactly


def lexsort(keys) -> np.ndarray:
    """``np.lexsort(keys)``, the same permutation (the last key primary, ties in array order),
    faster on trace columns. Whole-number keys are packed, most significant first and as many as
    fit, into int64 words; the rows are sorted by the leading word with a stable argsort (a
    timsort: fast on the nearly sorted orders trace rows come in), and only where that leaves ties
    by each next word, keyed as (rank among the ties so far, word). Measured on the keys of one
    10^8-event partition's calls (313k-467k rows, best of 5), against np.lexsort: two keys 1.5-2.7
    ms vs 6.0-12.8 ms, four keys 7.5-7.6 ms vs 12.7-26.6 ms. Keys that are not whole numbers (or
    NaN) fall back to np.lexsort."""
    keys = [np.asarray(k) for k in keys]
    if not keys or len(keys[0]) < 2:
        return np.lexsort(keys) if keys else np.zeros(0, dtype=np.intp)
    words, cards, word, card = [], [], None, 1      # words[0]: the most significant keys
    for k in reversed(keys):
        packed = _offset_ints(k)
        if packed is None or packed[1] >= _WORD:
            return np.lexsort(keys)
        v, span = packed
        if word is not None and card * span >= _WORD:
            words.append(word)
            cards.append(card)
            word, card = None, 1
        word = v if word is None else word * span + v
        card *= span
    words.append(word)
    cards.append(card)
    order = np.argsort(words[0], kind="stable")
    key = words[0][order]
    for w, card in zip(words[1:], cards[1:]):
        new = np.r_[True, key[1:] != key[:-1]]
        if new.all():                  # no ties left: the lesser keys cannot reorder anything
            break
        tied = np.cumsum(new) - 1      # rank among the distinct leading keys, in sorted order
        if (int(tied[-1]) + 1) * card >= _WORD:
            return np.lexsort(keys)
        key = tied * card + w[order]
        sub = np.argsort(key, kind="stable")
        order, key = order[sub], key[sub]
    return order


def _offset_ints(k: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(k - min(k) as int64, max - min + 1), or None where k is not whole numbers that int64 holds
    exactly (floats with a fraction, NaN, beyond 2^53; objects)."""
    if k.dtype.kind == "b":
        return k.astype(np.int64), 2
    if k.dtype.kind in "iu":
        lo, hi = int(k.min()), int(k.max())
        if hi - lo + 1 >= _WORD or k.dtype == np.uint64 and hi >= _WORD:
            return None
        return k.astype(np.int64) - lo, hi - lo + 1
    if k.dtype.kind == "f":
        lo, hi = float(k.min()), float(k.max())      # NaN in k makes both NaN: refused below
        if not (-_EXACT_FLOAT < lo <= hi < _EXACT_FLOAT and hi - lo < _EXACT_FLOAT) or not (k == np.floor(k)).all():
            return None
        return (k - lo).astype(np.int64), int(hi - lo) + 1
    return None


def cumcount(codes: np.ndarray) -> np.ndarray:
    """For each row, how many earlier rows (in array order) have the same code."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    idx = np.arange(n)
    first = np.maximum.accumulate(np.where(np.r_[True, sc[1:] != sc[:-1]], idx, 0)) if n else idx
    out = np.empty(n, dtype=np.int64)
    out[order] = idx - first
    return out


def group_max(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row, the max of ``values`` over the rows with the same code (NaN ignored unless all are)."""
    dense, uniq = pd.factorize(codes)
    top = np.full(len(uniq), -np.inf)
    v = np.asarray(values, dtype=float)
    np.fmax.at(top, dense, v)
    out = top[dense]
    return np.where(np.isneginf(out) & ~np.isneginf(v), np.nan, out)


def group_cummax(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For rows sorted by group: the running max of ``values`` within each group, as
    groupby(groups).cummax() gives it (whole-number values through numpy, else pandas)."""
    g = np.asarray(groups)
    v = np.asarray(values)
    n = len(v)
    if n == 0:
        return v.copy()
    start = np.r_[True, g[1:] != g[:-1]]
    seg = np.cumsum(start) - 1
    if v.dtype.kind in "iu":
        lo, hi = int(v.min()), int(v.max())
        span = hi - lo + 1
        if span * (int(seg[-1]) + 1) < 2 ** 62:
            w = (v.astype(np.int64) - lo) + seg * span
            return (np.maximum.accumulate(w) - seg * span + lo).astype(v.dtype)
    return pd.Series(v).groupby(g).cummax().to_numpy()


def prev_cummax(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For rows sorted by group: the max of ``values`` over the earlier rows of the same group
    (NaN for a group's first row); groupby(groups).cummax() then shift(1) within the group.
    numpy's running max over values offset per group where the values are whole numbers (ns
    times), else pandas."""
    g = np.asarray(groups)
    v = np.asarray(values, dtype=float)
    n = len(v)
    if n == 0:
        return v.copy()
    start = np.r_[True, g[1:] != g[:-1]]
    lo, hi = (float(v.min()), float(v.max())) if np.isfinite(v).all() else (np.nan, np.nan)
    seg = np.cumsum(start) - 1
    span = hi - lo + 1
    if not np.isfinite(span) or span * (seg[-1] + 1) >= 2 ** 62 or not (v == np.round(v)).all():
        cm = pd.Series(v).groupby(g).cummax()
        return cm.groupby(g).shift(1).to_numpy()
    w = (v - lo).astype(np.int64) + seg * int(span)
    run = np.maximum.accumulate(w) - seg * int(span)
    out = np.empty(n)
    out[1:] = run[:-1] + lo
    out[start] = np.nan
    return out


def lookup(table: pd.Series, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``table.reindex(MultiIndex.from_arrays([a, b]))`` as floats (NaN where absent), for a Series
    with a unique two-level integer index (e.g. per (rank, step)): one integer key per row and a
    flat index lookup instead of a MultiIndex reindex."""
    ta = table.index.get_level_values(0).to_numpy()
    tb = table.index.get_level_values(1).to_numpy()
    a, b = np.asarray(a), np.asarray(b)
    if not (len(ta) and len(a) and ta.dtype.kind in "iu" and tb.dtype.kind in "iu" and a.dtype.kind in "iu" and b.dtype.kind in "iu"):
        return table.reindex(pd.MultiIndex.from_arrays([a, b])).to_numpy(dtype=float)
    lo = min(int(tb.min()), int(b.min()))
    width = max(int(tb.max()), int(b.max())) - lo + 1
    top = max(abs(int(ta.min())), abs(int(ta.max())), abs(int(a.min())), abs(int(a.max()))) + 1
    if width * top * 2 >= 1 << 62:
        return table.reindex(pd.MultiIndex.from_arrays([a, b])).to_numpy(dtype=float)
    pos = pd.Index(ta.astype(np.int64) * width + (tb - lo)).get_indexer(a.astype(np.int64) * width + (b - lo))
    vals = np.r_[table.to_numpy(dtype=float), np.nan]
    return vals[pos]


def dense_codes(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes 0..k-1 in the order of ``codes``' values, and k: a dense table where the value range
    is small, else one stable sort (pd.factorize hashes: 36 ms against 7 ms for 500,000 nearly
    sorted int64 keys here). A new array, never ``codes`` itself."""
    return _dense(np.asarray(codes, dtype=np.int64), owned=False)


def _dense(codes: np.ndarray, owned: bool) -> tuple[np.ndarray, int]:
    """dense_codes of int64 ``codes``, which it may return as they are where ``owned`` (the caller's
    own scratch array) and they are already 0..k-1 with every value present (a bucket spill's
    (headline, layout, bucket) keys: a table lookup fewer)."""
    n = len(codes)
    if not n:
        return codes.copy(), 0
    lo, hi = int(codes.min()), int(codes.max())
    if hi - lo < 4 * n + (1 << 20):
        z = codes - lo if lo or not owned else codes
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[z] = True
        code_of = np.cumsum(present) - 1
        k = int(code_of[-1]) + 1
        return (z, k) if k == hi - lo + 1 else (code_of[z], k)
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    new = np.r_[True, sc[1:] != sc[:-1]]
    out = np.empty(n, dtype=np.int64)
    out[order] = np.cumsum(new) - 1
    return out, int(new.sum())


def max_by_key(src: list, values: np.ndarray, dst: list) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``dst`` (key columns): the max of ``values`` over the rows of ``src`` (key
    columns, same order) with the same key, and whether there is any (a groupby-max joined back)."""
    n = len(values)
    codes, k = dense_codes(group_codes(*[np.r_[np.asarray(a), np.asarray(b)] for a, b in zip(src, dst)]))
    top = np.full(k, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(top, codes[:n], np.asarray(values, dtype=np.int64))
    seen = np.zeros(k, dtype=bool)
    seen[codes[:n]] = True
    d = codes[n:]
    return top[d], seen[d]


def distinct_pairs(a: np.ndarray, b: np.ndarray) -> int:
    """How many distinct (a, b) pairs there are (unique_ints counts their codes: none made dense only
    to be counted)."""
    return len(unique_ints(group_codes(a, b))) if len(a) else 0


def group_rows(*cols) -> tuple[np.ndarray, np.ndarray]:
    """A sorted groupby of integer (or code) columns: each group's first row, each row's group."""
    codes, n = ordered_codes(*cols)
    first = np.full(n, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    return first, codes


def ordered_codes(*cols) -> tuple[np.ndarray, int]:
    """Dense codes 0..k-1 of integer key columns, in the lexicographic order of their values (a
    sorted groupby's group numbers), and k. The combined code is built in one int64 array, in place
    (each column's range read in its own type, not copied to int64 first): keys shaped like pass 2's
    spill groupings of a 10^8-event partition (660,000 rows of int8 and int16 columns), 4 columns in
    2.3 ms against 8.4 ms, 3 columns in 2.0 against 3.1 ms (best of 20, the former code beside it).
    A column with one value orders nothing and is skipped (the bucket spill's layout, the comm
    spill's phase and op on most runs)."""
    n = len(cols[0])
    if not n:
        return np.zeros(0, dtype=np.int64), 0
    code, card = None, 1
    for col in cols:
        v = np.asarray(col)
        if v.dtype.kind not in "bi" and not (v.dtype.kind == "u" and v.dtype.itemsize < 8):
            v = v.astype(np.int64)          # uint64 + int64 would be float64; floats as before
        lo, hi = int(v.min()), int(v.max())
        k = hi - lo + 1
        if k == 1:
            continue
        if code is None:
            code = v.astype(np.int64)
        else:
            if card * k >= 1 << 62:
                code, card = _dense(code, owned=True)
            code *= k
            code += v
        if lo:
            code -= lo
        card *= k
    if code is None:                        # every column one value: one group
        return np.zeros(n, dtype=np.int64), 1
    return _dense(code, owned=True)


def unique_ints(x: np.ndarray) -> np.ndarray:
    """np.unique of integers, by counting where their range is small (np.unique sorted 500,000 int64
    in 7-20 ms here, and took 0.5 s where the range was wide; counting takes ~1 ms)."""
    x = np.asarray(x)
    if not len(x):
        return x.copy()
    lo, hi = int(x.min()), int(x.max())
    if hi - lo > 4 * len(x) + (1 << 20):
        return np.sort(np.asarray(pd.unique(x)))
    return (np.flatnonzero(np.bincount((x - lo).astype(np.int64), minlength=hi - lo + 1)) + lo).astype(x.dtype)


def coded_index(columns: list, names: list) -> pd.MultiIndex:
    """pd.MultiIndex.from_arrays of ``columns`` (named ``names``), where a column is an integer array
    or (codes, dictionary): each row's string is dictionary[code]. The same index (levels, their
    dtypes, codes) without making a string per row and factorizing it again: ~2 ms against ~10 ms
    for the 58,320 identities of a 10^8-event run's partition. Falls back to the strings themselves
    when there are no rows or a used string appears twice in its dictionary."""
    levels, codes = [], []
    for col in columns:
        if isinstance(col, tuple):
            got = _coded_level(*col) if len(col[0]) else None
            if got is None:
                return _strings_index(columns, names)
        else:
            got = pd.factorize(col, sort=True)[::-1]
        levels.append(got[0])
        codes.append(got[1])
    return pd.MultiIndex(levels=levels, codes=codes, names=names, verify_integrity=False)


def _strings_index(columns: list, names: list) -> pd.MultiIndex:
    """coded_index the reference way: from_arrays of the strings."""
    return pd.MultiIndex.from_arrays(
        [(col[1][col[0]] if len(col[1]) else np.array([], dtype=object)) if isinstance(col, tuple) else col
         for col in columns], names=names)


def _coded_level(codes: np.ndarray, dictionary: np.ndarray) -> tuple[pd.Index, np.ndarray] | None:
    """The sorted distinct strings ``codes`` use, and each row's place among them: what
    factorize(sort=True) gives of the strings. None if the dictionary repeats a used string."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(dictionary)))
    values = dictionary[used]
    order = np.argsort(values, kind="stable")
    values = values[order]
    if len(values) > 1 and (values[1:] == values[:-1]).any():
        return None
    place = np.zeros(len(dictionary), dtype=np.int64)
    place[used[order]] = np.arange(len(used))
    return pd.Index(values), place[codes]
