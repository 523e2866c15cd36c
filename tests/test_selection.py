"""analysis.selection.select: the values np.partition puts at the ranks asked, on arrays shaped like
the summary's columns (int32 with NAN32, float64 with NaN, many ties, sorted, one value), and the
brackets really narrow what is partitioned."""
from __future__ import annotations

import numpy as np
import pytest

from syncviz.analysis import selection
from syncviz.analysis.spill_file import NAN32


def _want(x: np.ndarray, ranks: list[int]) -> np.ndarray:
    y = x.copy()
    y.partition(ranks)
    return y[ranks]


def _columns(n: int, rng) -> dict[str, np.ndarray]:
    ints = rng.gamma(2.0, 1e5, n).astype(np.int32)
    with_nan32 = ints.copy()
    with_nan32[rng.random(n) < 0.2] = NAN32
    floats = rng.lognormal(3.0, 2.0, n)
    with_nan = floats.copy()
    with_nan[rng.random(n) < 0.3] = np.nan
    return {"int32": ints, "int32 with NAN32": with_nan32, "float64": floats, "float64 with NaN": with_nan,
            "ties": rng.integers(0, 5, n).astype(np.int32), "one value": np.full(n, 7.5),
            "sorted": np.sort(ints), "descending": np.sort(floats)[::-1].copy(),
            "periodic": np.tile(np.arange(64, dtype=np.int32), n // 64 + 1)[:n]}


@pytest.mark.parametrize("n", [1, 2, 1000, selection.SMALL - 1, selection.SMALL, 200_003])
def test_select_is_what_np_partition_puts_there(n):
    rng = np.random.default_rng(n)
    for name, x in _columns(n, rng).items():
        valid = n - int(np.isnan(x).sum()) if x.dtype.kind == "f" else n
        if not valid:
            continue
        asks = [[0], [valid - 1], [(valid - 1) // 2, valid // 2], [valid // 4, valid // 4 + 1],
                [int(0.75 * (valid - 1))], sorted({0, valid // 3, valid - 1})]
        for ranks in asks:
            ranks = sorted({r for r in ranks if r < valid})
            got = selection.select(x.copy(), ranks)
            assert got.dtype == x.dtype and np.array_equal(got, _want(x, ranks)), (name, n, ranks)


def test_select_partitions_only_between_its_brackets(monkeypatch):
    """On a big column the partition that finds the values is of ~5% of them, not of the column."""
    sizes = []
    real = selection._partitioned
    monkeypatch.setattr(selection, "_partitioned", lambda x, ranks: sizes.append(len(x)) or real(x, ranks))
    x = np.random.default_rng(3).gamma(2.0, 1e5, 1_000_000).astype(np.int32)
    for ranks in ([499_999, 500_000], [0], [999_999], [250_000]):
        assert np.array_equal(selection.select(x.copy(), ranks), _want(x, ranks))
    assert len(sizes) == 4 and max(sizes) < 60_000, sizes


def test_select_on_a_constant_bracket_partitions_nothing(monkeypatch):
    """Brackets on one value (a column of mostly ties) answer with that value, partitioning nothing."""
    calls = []
    monkeypatch.setattr(selection, "_partitioned", lambda x, ranks: calls.append(len(x)))
    x = np.full(500_000, 42, dtype=np.int32)
    x[:10] = 1
    assert selection.select(x, [250_000]).tolist() == [42] and not calls
