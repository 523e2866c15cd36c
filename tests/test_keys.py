"""The numpy group-key helpers behind the faster analysis (analysis/keys.py, intervals._group_codes,
tables.bytes_in_flight) give exactly what the pandas code they replaced gave, on random data with
ties, negative and missing values; and the exporter's millisecond text equals Arrow's float text."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pytest

from syncviz.analysis import keys as K
from syncviz.analysis.intervals import _group_codes
from syncviz.analysis.tables import bytes_in_flight
from syncviz.views.export.jsoncols import cat, ms, num


@pytest.fixture(params=[0, 1, 2])
def frame(request):
    rng = np.random.default_rng(request.param)
    n = 3000
    return pd.DataFrame({
        "rank": rng.integers(0, 9, n).astype(np.int32),
        "step": rng.integers(-1, 40, n).astype(np.int64) * (1 if request.param < 2 else 10 ** 9),
        "kind": pd.Categorical(rng.choice(["bucket", "collective", "forward"], n)),
        "name": pd.array(rng.choice(["a", "b", "all_gather", "x (blocking)"], n), dtype="str"),
        "t": rng.integers(0, 50, n).astype(np.int64) * 1000,
    })


def test_cumcount_and_group_max(frame):
    cols = ["rank", "step", "kind", "name"]
    codes = K.group_codes(*(frame[c] for c in cols))
    assert np.array_equal(K.cumcount(codes), frame.groupby(cols, observed=True).cumcount().to_numpy())
    want = frame.groupby(cols, observed=True)["t"].transform("max").to_numpy(dtype=float)
    assert np.array_equal(K.group_max(codes, frame["t"].to_numpy()), want)


def test_group_codes_agree_exactly_where_the_rows_do():
    """K.group_codes (built in place, one-value columns skipped) gives equal codes exactly to rows
    equal on every column: small and wide ints, bools, strings with None, a column of one value
    first, last or alone; the callers' arrays are left as they were."""
    rng = np.random.default_rng(4)
    makers = [lambda n: rng.integers(0, 3, n).astype(np.int8), lambda n: rng.integers(-2, 2, n) * 10 ** 12,
              lambda n: rng.integers(0, 2, n).astype(bool), lambda n: np.full(n, 7, dtype=np.int16),
              lambda n: pd.Series(rng.choice(["a", "b", None], n)), lambda n: rng.integers(5, 9, n).astype(np.uint16)]
    for _ in range(300):
        n = int(rng.integers(1, 50))
        cols = [makers[int(i)](n) for i in rng.integers(0, len(makers), int(rng.integers(1, 5)))]
        before = [pd.Series(c).copy() for c in cols]
        codes = K.group_codes(*cols)
        frame = pd.DataFrame({f"c{i}": c for i, c in enumerate(cols)})
        want = frame.groupby(list(frame.columns), sort=False, dropna=False).ngroup().to_numpy()
        assert codes.dtype == np.int64 and np.array_equal(pd.factorize(codes)[0], pd.factorize(want)[0])
        assert all(pd.Series(c).equals(b) for c, b in zip(cols, before))


def test_prev_cummax(frame):
    f = frame.sort_values(["rank", "t"], kind="stable")
    g, v = f["rank"].to_numpy(), f["t"].to_numpy().astype(float)
    want = pd.Series(v).groupby(g).cummax().groupby(g).shift(1).to_numpy()
    assert np.array_equal(K.prev_cummax(g, v), want, equal_nan=True)
    v[::7] += 0.5                      # not whole numbers: the pandas path
    want = pd.Series(v).groupby(g).cummax().groupby(g).shift(1).to_numpy()
    assert np.array_equal(K.prev_cummax(g, v), want, equal_nan=True)


def test_group_cummax(frame):
    f = frame.sort_values(["rank", "t"], kind="stable")
    g = f["rank"].to_numpy()
    for v in (f["step"].to_numpy(), f["t"].to_numpy()[::-1].copy(), f["t"].to_numpy() + 0.5):
        assert np.array_equal(K.group_cummax(g, v), pd.Series(v).groupby(g).cummax().to_numpy())


def test_group_codes_of_rank_step(frame):
    a, b = frame.iloc[:1000], frame.iloc[1000:]
    idx, codes = _group_codes([a, b])
    want = pd.MultiIndex.from_frame(pd.concat([a, b])[["rank", "step"]]).unique().sort_values()
    assert idx.equals(want)
    for f, c in zip((a, b), codes):
        assert np.array_equal(c, want.get_indexer(pd.MultiIndex.from_frame(f[["rank", "step"]])))


def test_lookup(frame):
    table = frame.groupby(["rank", "step"])["t"].max()
    probe = frame.sample(frac=1.0, random_state=0)
    ra, st = probe["rank"].to_numpy(), probe["step"].to_numpy() + 1     # some absent: NaN
    want = table.reindex(pd.MultiIndex.from_arrays([ra, st])).to_numpy(dtype=float)
    assert np.array_equal(K.lookup(table, ra, st), want, equal_nan=True)


def test_bytes_in_flight_as_the_groupby(frame):
    rows = frame.assign(kind="bucket", bucket=0, bytes=np.arange(len(frame)) * 1000, start_ns=frame["t"],
                        end_ns=frame["t"] + 5000, launch_ns=frame["t"])
    got = bytes_in_flight(rows)
    r = rows["rank"].to_numpy()
    nb = rows["bytes"].to_numpy(dtype=np.int64)
    ch = pd.DataFrame({"rank": np.r_[r, r], "t_ns": np.r_[rows["start_ns"], rows["end_ns"]], "delta": np.r_[nb, -nb]})
    ch = ch.groupby(["rank", "t_ns"], sort=True)["delta"].sum().reset_index()
    ch["bytes"] = ch.groupby("rank")["delta"].cumsum().astype(np.int64)
    pd.testing.assert_frame_equal(got, ch[["rank", "t_ns", "bytes"]].reset_index(drop=True))


def test_ms_text_is_arrows_float_text():
    rng = np.random.default_rng(0)
    ns = np.concatenate([rng.integers(0, 10 ** e + 1, 2000) for e in range(16)]).astype(float)
    ns = np.r_[ns, np.nan, -1.0, -2_500_000.0, 0.5, 1e15, 1e16 + 2, 123.25, np.inf]
    assert pc.all(pc.equal(cat(ms(ns)), num(ns / 1e6))).as_py()


def test_cat_in_row_ranges_is_one_join():
    """cat joins long columns as row ranges in threads: the same strings, byte for byte, as one join
    (nested: a cat of cat results and of when()'s if_else of them)."""
    import pyarrow as pa
    from syncviz.views.export import jsoncols as J
    n = 3 * J.PARALLEL_ROWS + 7
    v = np.arange(n, dtype=np.int64) * 7919
    a = J.ints(v)
    inner = cat('{"x":', a, ',"us":', J.us(v))
    assert isinstance(inner, pa.ChunkedArray) or J.WAYS < 2
    outer = cat(inner, J.when(v % 3 == 0, ',"y":', a), "}")
    one = pc.binary_join_element_wise(
        pc.binary_join_element_wise('{"x":', a, ',"us":', *J.us(v), ""),
        pc.if_else(pa.array(v % 3 == 0), pc.binary_join_element_wise(',"y":', a, ""), ""), "}", "")
    assert outer.to_pylist() == one.to_pylist()
    assert b"".join(bytes(m) for m in J.chunks([outer])) == "".join(one.to_pylist()).encode()


def test_cat_bounds_each_chunk_to_join_rows(monkeypatch):
    """A column longer than JOIN_ROWS is joined in chunks of at most that many rows (an Arrow string
    array holds under 2 GiB: the 10^7-event run's Perfetto export failed there), in threads or not,
    with the same bytes as one join."""
    import pyarrow as pa
    from syncviz.views.export import jsoncols as J
    n = 3 * J.PARALLEL_ROWS + 7
    v = np.arange(n, dtype=np.int64) * 7919
    one = cat('{"x":', J.ints(v), ',"us":', J.us(v), "}")
    monkeypatch.setattr(J, "JOIN_ROWS", 1000)
    for ways in (1, 2):
        monkeypatch.setattr(J, "WAYS", ways)
        got = cat('{"x":', J.ints(v), ',"us":', J.us(v), "}")
        assert isinstance(got, pa.ChunkedArray) and max(len(c) for c in got.chunks) <= 1000
        assert got.num_chunks >= n // 1000
        assert b"".join(bytes(m) for m in J.chunks([got])) == b"".join(bytes(m) for m in J.chunks([one]))


def _lexsort_cases():
    """(name, keys) pairs where K.lexsort must give np.lexsort's permutation exactly: every kind of
    key it packs, the ones it must refuse (and hand to np.lexsort), ties at every level, and keys
    whose spans force several words and a rank-among-ties step."""
    rng = np.random.default_rng(7)
    n = 5000
    small = rng.integers(0, 4, n)                       # many ties
    times = np.sort(rng.integers(0, 2_300_000_000_000, n))   # ns over ~40 min, nearly sorted
    rank = rng.integers(0, 1024, n)
    yield "empty", [np.zeros(0, dtype=np.int64)]
    yield "one row", [np.array([3]), np.array([1.5])]
    yield "one key", [rng.integers(-50, 50, n)]
    yield "two ints", [times, rank]
    yield "int32 uint8 bool", [rng.integers(0, 9, n).astype(np.int32), rng.integers(0, 3, n).astype(np.uint8),
                               rng.integers(0, 2, n).astype(bool)]
    yield "negative and equal", [-times, small, np.zeros(n, dtype=np.int64)]
    yield "whole floats", [times.astype(float), small.astype(float), rank]
    yield "negative zero", [np.where(small == 0, -0.0, 0.0), small]
    yield "floats with a fraction (fallback)", [rng.random(n), small]
    yield "NaN (fallback)", [np.where(small == 1, np.nan, times.astype(float)), rank]
    yield "beyond 2^53 as float (fallback)", [np.r_[2.0 ** 60, np.zeros(n - 1)], small]
    yield "span 2^62 (fallback)", [np.r_[np.iinfo(np.int64).min, np.zeros(n - 1, dtype=np.int64)], small]
    yield "uint64 above int64", [np.r_[np.uint64(2 ** 63 + 5), np.zeros(n - 1, dtype=np.uint64)], small]
    yield "object (fallback)", [np.array([str(x) for x in small], dtype=object), rank]
    # four keys as queueing.owned_arrays sorts: two words, ties in the leading one
    launch = np.repeat(times[: n // 2], 2)
    yield "owned_arrays' four", [-(launch + small), small % 2, launch, rank]
    yield "stream_prev_done's four", [np.arange(n), launch, small % 2, rank]
    # three words (each key's span times the next one's is past 2^62), ties left after the first and
    # the second: each resolved by (rank among the ties, next word)
    wide = lambda: rng.integers(0, 4, n) * 2 ** 38 + 2 ** 37       # noqa: E731
    yield "three words, ties twice", [rng.integers(0, 2 ** 40, n), wide(), wide()]
    # ranks among ties times the next word's span overflow: np.lexsort takes over
    yield "tie ranks overflow", [rng.integers(0, 2 ** 61, n), small]


@pytest.mark.parametrize("name,keys", list(_lexsort_cases()), ids=[c[0] for c in _lexsort_cases()])
def test_lexsort_is_numpys(name, keys):
    expected = np.lexsort(keys)
    got = K.lexsort(keys)
    assert np.array_equal(got, expected), name
    # the same for shuffled rows (the fast path assumes nothing about the input order)
    perm = np.random.default_rng(1).permutation(len(keys[0]))
    shuffled = [k[perm] for k in keys]
    assert np.array_equal(K.lexsort(shuffled), np.lexsort(shuffled)), name


def test_ordered_codes_are_a_sorted_groupbys_group_numbers():
    """K.ordered_codes (pass 2's spill groupings) numbers rows as pandas' sorted groupby does, on the
    column types traces give it: bool, small and wide ints, uint64, keys too wide for one int64."""
    rng = np.random.default_rng(1)
    makers = [lambda n: rng.integers(0, 2, n).astype(bool), lambda n: rng.integers(-100, 100, n).astype(np.int8),
              lambda n: rng.integers(0, 2 ** 40, n).astype(np.uint64), lambda n: rng.integers(-10 ** 12, 10 ** 12, n),
              lambda n: rng.integers(0, 60_000, n).astype(np.uint16), lambda n: rng.integers(0, 3, n).astype(np.int16)]
    for _ in range(200):
        n = int(rng.integers(1, 60))
        cols = [makers[int(i)](n) for i in rng.integers(0, len(makers), int(rng.integers(1, 5)))]
        codes, k = K.ordered_codes(*cols)
        frame = pd.DataFrame({f"c{i}": c for i, c in enumerate(cols)})
        want = frame.groupby(list(frame.columns), sort=True).ngroup().to_numpy()
        assert np.array_equal(codes, want) and k == want.max() + 1
    codes, k = K.ordered_codes(np.zeros(0, dtype=np.int8))
    assert len(codes) == 0 and codes.dtype == np.int64 and k == 0
    # a column of one value (skipped), every column so (one group), every combination present
    # (the codes as built, no table lookup) and one missing: each a groupby's numbers
    five, b = np.full(6, 5, dtype=np.int16), np.array([3, 1, 2, 1, 3, 2], dtype=np.int8)
    h = np.array([1, 0, 1, 1, 0, 0], dtype=np.int8)
    for cols in ([five, b], [b, five], [five, five], [h, five, b], [h, b], [h[:5], b[:5]], [b + 100, h]):
        frame = pd.DataFrame({f"c{i}": c for i, c in enumerate(cols)})
        want = frame.groupby(list(frame.columns), sort=True).ngroup().to_numpy()
        codes, k = K.ordered_codes(*cols)
        assert np.array_equal(codes, want) and k == want.max() + 1 and codes.dtype == np.int64
    x = np.array([0, 2, 1, 2], dtype=np.int64)      # already 0..k-1, all present: a new array all the same
    codes, k = K.dense_codes(x)
    assert k == 3 and np.array_equal(codes, x) and codes is not x and not np.shares_memory(codes, x)


def test_distinct_pairs_counts_the_set_of_pairs():
    """K.distinct_pairs: the size of the set of (a, b), by a table over a small code range or by
    pd.unique over a wide one; 0 for no rows."""
    rng = np.random.default_rng(9)
    for scale in (1, 10 ** 12):
        for _ in range(50):
            n = int(rng.integers(1, 80))
            a, b = rng.integers(-3, 4, n) * scale, rng.integers(0, 5, n).astype(np.int16)
            assert K.distinct_pairs(a, b) == len(set(zip(a.tolist(), b.tolist())))
    assert K.distinct_pairs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)) == 0
