"""The partitioned summary's engine (analysis/partition_*.py, trace/partition_read.py): the cases its
own code paths take — a partition read as one table or rank by rank, dictionaries that outgrow their
index type, packed batches, several ranks a partition, the comm rows kept between the passes, the
medians — each against the whole-run functions (test_partitioned._compare: every number, table and
report byte) or numpy/pandas themselves."""
from __future__ import annotations

import shutil
from concurrent.futures import ProcessPoolExecutor
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from syncviz.analysis import eventarrays as E
from syncviz.analysis import keys as K
from syncviz.analysis import partition_local as PL
from syncviz.analysis import queueing as Q
from syncviz.analysis import spill
from syncviz.analysis.partitioned import partitions
from syncviz.trace import read as R
from syncviz.trace.partition_read import read_partition
from test_partitioned import DATA, _compare
from tracebuild import simulated_run


def _rewrite(path: Path, change) -> None:
    """Rewrite a rank file with ``change(table) -> table`` applied, a batch per run of equal steps."""
    with pa.OSFile(str(path)) as f:
        reader = pa.ipc.open_stream(f)
        schema, table = reader.schema, reader.read_all()
    table = change(table.cast(pa.schema([pa.field(n, t.value_type if pa.types.is_dictionary(t) else t)
                                         for n, t in zip(table.column_names, table.schema.types)],
                                        metadata=schema.metadata)))
    steps = table.column("step").to_numpy()
    cuts = np.r_[0, np.flatnonzero(steps[1:] != steps[:-1]) + 1, len(steps)]
    with pa.ipc.new_stream(str(path), table.schema) as w:
        for a, b in zip(cuts[:-1], cuts[1:]):
            w.write_table(table.slice(a, b - a))


def _same_rows(run: Path):
    """read_partition's table holds exactly read_ranks' rows, problems and spans index."""
    files = R.rank_files(run)
    a_index, b_index = {}, {}
    fast = read_partition(files, a_index)
    assert fast is not None, "clean files are read as one table"
    table, decoded, problems, incomplete, errors = fast
    tables, p2, i2, e2 = R.read_ranks(files, index=b_index)
    assert (problems, incomplete, errors) == (p2, i2, e2)
    got, want = E.from_tables([table], decoded), E.from_tables(tables)
    for f in ("rank", "step", "micro", "start", "end", "bucket", "bytes", "group_size", "ready", "launch", "layout",
              "logical_bytes", "kind"):
        assert np.array_equal(getattr(got, f), getattr(want, f)), f
    for f, d in (("name", "names"), ("op", "ops"), ("dtype", "dtypes"), ("phase", "phases")):
        assert np.array_equal(getattr(got, d)[getattr(got, f)], getattr(want, d)[getattr(want, f)]), f
    assert a_index.keys() == b_index.keys()
    for r in a_index:
        assert (a_index[r] is None) == (b_index[r] is None)
        if a_index[r] is not None:
            assert a_index[r][0] == b_index[r][0] and np.array_equal(a_index[r][1], b_index[r][1])


@pytest.mark.parametrize("fixture", ["ddp-2rank", "straggler", "zero2", "truncated-rank"])
def test_clean_files_read_as_one_table(fixture):
    _same_rows(DATA / fixture)


def test_more_steps_than_an_int8_dictionary_holds(tmp_path):
    """200 steps: each column's per-batch dictionaries unify to more values than their int8 indices
    hold (the simulator's step column); read as one table all the same, same numbers."""
    run = simulated_run(tmp_path, "long", "--model", "gpt2-medium", "--world-size", "2", "--steps", "200",
                        "--strategy", "zero3", "--steps-per-batch", "1")
    with pa.OSFile(str(run / "rank-0.arrow")) as f:
        typ = pa.ipc.open_stream(f).schema.field("step").type
    assert pa.types.is_dictionary(typ) and typ.index_type == pa.int8()
    _same_rows(run)
    _compare(run, target_events=10 ** 9)


def test_packed_batches_and_several_ranks_a_partition(tmp_path):
    """Several steps in a batch (the simulator's packed layout) and partitions of several ranks."""
    run = simulated_run(tmp_path, "packed", "--model", "gpt2-medium", "--world-size", "5", "--steps", "6",
                        "--steps-per-batch", "4", "--straggler", "1:0.2")
    _same_rows(run)
    files = R.rank_files(run)
    two_ranks = 5 * (run / "rank-0.arrow").stat().st_size // (2 * 52)     # partitioned.BYTES_PER_EVENT
    assert {len(p) for p in partitions(files, two_ranks)} == {1, 2}
    _compare(run, target_events=two_ranks)


@pytest.mark.parametrize("damage", ["end before start", "step written twice", "unknown kind"])
def test_files_that_need_repairs_are_validated_rank_by_rank(tmp_path, damage):
    """A file validation would change sends the partition to read_ranks, which names the damage;
    the numbers are the whole-run path's."""
    run = Path(shutil.copytree(DATA / "straggler", tmp_path / "run"))

    def change(t):
        if damage == "end before start":
            end = t.column("end_ns").to_numpy().copy()
            end[3] = t.column("start_ns").to_numpy()[3] - 5
            return t.set_column(t.schema.get_field_index("end_ns"), "end_ns", pa.array(end))
        if damage == "unknown kind":
            kind = t.column("kind").to_pylist()
            kind[2] = "mystery"
            return t.set_column(t.schema.get_field_index("kind"), "kind", pa.array(kind))
        again = (t.column("step").to_numpy() == 1) & (np.asarray(t.column("kind").to_pylist()) != "step")
        return pa.concat_tables([t, t.filter(pa.array(again))])         # step 1's rows in a second batch
    _rewrite(run / "rank-1.arrow", change)
    assert read_partition(R.rank_files(run)) is None
    old, new = _compare(run)
    assert any("rank 1" in p for p in new.problems)


def test_kept_comm_rows_read_back_as_computed(tmp_path):
    """partition_local.save / load: the comm rows, identities and extras come back as local_pass made
    them (types included), though the identity's columns are not written and codes are narrowed."""
    files = R.rank_files(DATA / "straggler")
    tables, *_ = R.read_ranks(files)
    local = PL.local_pass(E.from_tables(tables))
    extra = {"order": local.order, "rows": np.array([7])}
    PL.save(str(tmp_path / "kept"), local, extra)
    c, idents, x = PL.load(str(tmp_path / "kept"))
    assert c.keys() == local.comm.keys() and idents.keys() == local.idents.keys()
    for k, v in local.comm.items():
        assert np.array_equal(c[k], v, equal_nan=v.dtype.kind == "f") and c[k].dtype == v.dtype, k
    assert np.array_equal(x["order"], local.order) and x["order"].dtype == local.order.dtype


@pytest.mark.parametrize("fixture", ["ddp-2rank", "straggler", "zero2", "truncated-rank"])
def test_identity_index_from_codes_is_the_one_from_strings(fixture):
    """keys.coded_index builds from_arrays' MultiIndex from the name and kind codes: the same levels
    (values and dtypes), codes and names as from the strings; a dictionary that repeats a used string,
    and no rows, take the strings' path."""
    tables, *_ = R.read_ranks(R.rank_files(DATA / fixture))
    local = PL.local_pass(E.from_tables(tables))
    c, idents = local.comm, local.idents

    def cols(names, name_codes, rows=slice(None)):
        return [idents["step"][rows], idents["micro"][rows], (idents["kind"][rows], E.KIND_NAMES),
                idents["bucket"][rows], (name_codes[rows], names), idents["occurrence"][rows]]

    def same(columns):
        a, b = K.coded_index(columns, Q.EVENT_KEY), K._strings_index(columns, Q.EVENT_KEY)
        assert a.identical(b) and a.names == b.names
        for la, lb, ca, cb in zip(a.levels, b.levels, a.codes, b.codes):
            assert la.equals(lb) and la.dtype == lb.dtype and np.array_equal(ca, cb)
        return a
    assert PL.ident_index(c, idents).identical(same(cols(c["names"], idents["name"])))
    assert len(idents["name"]) > 1 and K._coded_level(idents["name"], c["names"]) is not None
    # names in reverse dictionary order, and an unused entry: still sorted strings, used ones only
    flipped = np.r_[c["names"][::-1], np.array(["unused"], dtype=object)]
    same(cols(flipped, len(c["names"]) - 1 - idents["name"]))
    twice = np.r_[c["names"], c["names"]]       # every other row names the second copy
    both = idents["name"] + len(c["names"]) * (np.arange(len(idents["name"])) % 2)
    assert K._coded_level(both, twice) is None
    same(cols(twice, both))
    same(cols(c["names"], idents["name"], slice(0, 0)))


@pytest.mark.parametrize("n", [0, 1, 9, 5000])
def test_rank_step_lateness_is_the_groupby(n):
    """partial_views.rank_step_lateness on group codes gives the groupby's frame (index, dtypes)."""
    from syncviz.analysis import partial_views as PV
    rng = np.random.default_rng(n)
    steps = rng.integers(0, 7, n)
    late = pd.DataFrame({"rank": rng.integers(3, 40, n).astype(np.int32), "step": steps,
                         "late_ns": rng.integers(0, 1 << 40, n), "buckets": steps % 2 == 0})
    g = late.groupby(["rank", "step"])
    want = pd.DataFrame({"sum": g["late_ns"].sum(), "count": g.size(), "buckets": g["buckets"].first()})
    pd.testing.assert_frame_equal(PV.rank_step_lateness(late), want, check_index_type=True)


@pytest.fixture(params=["sort", "select"])
def medians_by(request, monkeypatch):
    """Medians taken by sorting and by selecting (spill._sorts_faster picks one a machine; spawned
    pool workers read the variable too)."""
    monkeypatch.setenv(spill.MEDIANS_ENV, request.param)
    return request.param


@pytest.mark.parametrize("n", [0, 1, 2, 7, 10, 1001])
def test_median_in_place_is_pandas_median(n, medians_by):
    rng = np.random.default_rng(n)
    for nan_share in (0.0, 0.3, 1.0):
        x = rng.normal(size=n) * 10.0 ** rng.integers(-3, 12)
        x[rng.random(n) < nan_share] = np.nan
        if n > 3:
            x[:2] = (-0.0, 0.0)
        want = pd.Series(x).median()
        got = spill.median_in_place(x.copy())
        assert (np.isnan(got) and np.isnan(want)) or got == want


@pytest.mark.parametrize("n", [1, 2, 3, 8, 999, 1000, 100_000])
def test_medians_of_narrowed_columns_and_ratios_by_sort_and_selection(n, medians_by):
    """median_in_place of an int32 column (NAN32 for NaN), of a float64 one (NaN, -0.0) and of
    RatioValues (sources 0, negative, NaN or NAN32: no ratio) is pandas' median of the values they
    stand for, exactly; and again on the same array, which the first call sorted or partitioned
    (``presorted``: what spill._read says of a column handed twice)."""
    rng = np.random.default_rng(n)
    for share in (0.0, 0.4, 1.0):
        ints = rng.integers(-5, 10 ** 6, n).astype(np.int32)
        ints[rng.random(n) < 0.1] = 0                      # no ratio: a Ratio's ranks are not its source's
        ints[rng.random(n) < share] = spill.NAN32
        floats = rng.normal(size=n) * 1e6
        floats[rng.random(n) < share] = np.nan
        for src in (ints, floats):
            want = pd.Series(spill._floats(src)).median()
            ratios = spill.ratio_values(spill._floats(src), 4096.0, 1.75)
            ratios[~(spill._floats(src) > 0)] = np.nan
            want_ratio = pd.Series(ratios).median()
            for x, w in ((src.copy(), want), (spill.RatioValues(src.copy(), 4096.0, 1.75), want_ratio)):
                for presorted in (False, True):
                    got = spill.median_in_place(x, presorted)
                    assert (np.isnan(got) and np.isnan(w)) or got == w, (medians_by, src.dtype, presorted, got, w)
            # the quantiles of a column, then of its Ratio handed the same array (spill._read's "again")
            x = src.copy()
            for values, got in ((spill._floats(src), spill.quantile_stats(x)),
                                (ratios, spill.quantile_stats(spill.RatioValues(x, 4096.0, 1.75), True))):
                v = np.sort(values[~np.isnan(values)])        # groupby quantile's formula on the sorted values
                want = [spill._quantile_at(v, 0, q * (len(v) - 1)) for q in spill.QUANTILES] if len(v) else [np.nan] * 5
                assert np.array_equal(got[:5], want, equal_nan=True), (medians_by, src.dtype, got, want)
                assert got[6] == len(v) and (np.isnan(got[5]) if not len(v) else np.isclose(got[5], v.mean(), rtol=1e-13, atol=0))


def test_the_faster_of_sorting_and_selecting_is_timed_once(monkeypatch):
    """Without SYNCVIZ_MEDIANS, spill._sorts_faster times both once a process and keeps the answer."""
    monkeypatch.delenv(spill.MEDIANS_ENV, raising=False)
    monkeypatch.setattr(spill, "_SPEED", {})
    first = spill._sorts_faster()
    speed = dict(spill._SPEED)
    assert set(speed) == {"sort", "select"} and first == (speed["sort"] <= speed["select"])
    assert spill._sorts_faster() is first and spill._SPEED == speed           # not timed again
    monkeypatch.setenv(spill.MEDIANS_ENV, "select")
    assert spill._sorts_faster() is False


def test_group_medians_on_a_process_pool_equal_serial(tmp_path, monkeypatch, medians_by):
    """Big groups are a task per column, small ones batched; the pool's answers are the serial ones."""
    monkeypatch.setattr(spill, "BIG_GROUP", 50)
    rng = np.random.default_rng(1)
    pieces = []
    for i in range(3):
        n = 300
        frame = pd.DataFrame({"g": rng.integers(0, 5, n), "a": rng.normal(size=n), "b": rng.exponential(size=n)})
        frame.loc[frame.index[::7], "a"] = np.nan
        pieces.append(spill.write_piece(tmp_path, f"p{i}", frame, ["g"], ["a", "b"]))
    serial = spill.group_medians(pieces, ["g"], ["a", "b"])
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        pooled = spill.group_medians(pieces, ["g"], ["a", "b"], pool.map)
    pd.testing.assert_frame_equal(serial, pooled, check_exact=True)
    whole = pd.concat([pd.DataFrame(np.stack([spill._floats(c) for c in spill._mapped(p)]).T, columns=["a", "b"]).assign(
        g=np.repeat([k[0] for k in p.groups], p.counts)) for p in pieces])
    pd.testing.assert_frame_equal(serial, whole.groupby("g")[["a", "b"]].median(), check_exact=True, check_names=False)


def test_medians_that_select_groups_of_one_spill(tmp_path, monkeypatch, medians_by):
    """Several medians read one spill (as the summary reads partition_joined's comm values): each
    picks its groups with ``select`` and its columns by name, in any order, and equals pandas'
    median of exactly the rows it selects; groups next to each other in a file are one read."""
    from syncviz.analysis import partition_joined as PJ
    monkeypatch.setattr(spill, "BIG_GROUP", 50)
    rng = np.random.default_rng(3)
    frames, pieces = [], []
    for i in range(3):
        n = 250
        f = pd.DataFrame({"flag": rng.integers(0, 3, n), "step": rng.integers(0, 6, n),
                          "a": rng.normal(size=n), "b": rng.integers(0, 1000, n).astype(float)})
        f.loc[rng.random(n) < 0.1, "a"] = np.nan
        frames.append(f)
        pieces.append(PJ.spill_by(tmp_path, f"p{i}", [(f["flag"].to_numpy(), None), (f["step"].to_numpy(), None)],
                                  [f["a"].to_numpy(), f["b"].to_numpy()], ("a", "b")))
    whole = pd.concat(frames, ignore_index=True)
    flagged = lambda k: () if k[0] >= 1 else None                  # noqa: E731
    by_step = lambda k: (k[1],) if k[0] != 0 else None             # noqa: E731
    by_flag = lambda k: (k[0],)                                    # noqa: E731
    for map_fn in (map, None):
        if map_fn is None:
            pool = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))
            map_fn = pool.map
        one, steps, flags = spill.group_medians_many([(pieces, [], ["b"], flagged), (pieces, ["step"], ["a", "b"], by_step),
                                                      (pieces, ["flag"], ["b", "a"], by_flag)], map_fn)
        sel = whole[whole["flag"] >= 1]
        assert one.shape == (1, 1) and one.iloc[0, 0] == sel["b"].median()
        pd.testing.assert_frame_equal(steps, sel.groupby("step")[["a", "b"]].median(), check_exact=True, check_names=False)
        pd.testing.assert_frame_equal(flags, whole.groupby("flag")[["b", "a"]].median(), check_exact=True, check_names=False)
    pool.shutdown()
    assert [len(s) for s in spill._where(pieces, flagged).values()] == [3]     # flags 1 and 2 adjacent: a read a file


def test_quantiles_over_spilled_pieces_are_pandas_quantiles(tmp_path, monkeypatch, medians_by):
    """spill.group_quantiles (the Buckets page's distributions of a run read by partitions) equals
    tables.quantiles of the whole table: every quantile and count exactly (NaN skipped per column, a
    group with no value of a column has no row), the mean to the last bits; serial and pooled."""
    from syncviz.analysis import partition_joined as PJ
    from syncviz.analysis.tables import quantiles
    monkeypatch.setattr(spill, "BIG_GROUP", 40)     # big groups a task each, small ones batched
    rng = np.random.default_rng(11)
    frames, pieces = [], []
    for i in range(4):
        n = int(rng.integers(1, 120))
        f = pd.DataFrame({"g": rng.integers(0, 7, n), "a": rng.normal(size=n) * 1e6,
                          "b": rng.integers(0, 50, n).astype(float)})
        f.loc[rng.random(n) < 0.15, "a"] = np.nan
        f.loc[f["g"] == 5, "b"] = np.nan            # a column with no value in a group
        frames.append(f)
        pieces.append(PJ.spill_by(tmp_path, f"q{i}", [(f["g"].to_numpy(), None)], [f["a"].to_numpy(), f["b"].to_numpy()]))
    whole = pd.concat(frames, ignore_index=True)
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        for map_fn in (map, pool.map):
            got = spill.group_quantiles(pieces + [None], ["g"], ["a", "b"], map_fn)
            for col, frame in zip(["a", "b"], got):
                ref = quantiles(whole, "g", col)
                assert list(frame.columns) == list(ref.columns) == list(spill.STATS)
                pd.testing.assert_frame_equal(frame.drop(columns="mean"), ref.drop(columns="mean"),
                                              check_exact=True, check_index_type=False)
                np.testing.assert_allclose(frame["mean"], ref["mean"], rtol=1e-13, atol=0)
    assert 5 not in got[1].index and 5 in got[0].index


def test_the_quantiles_mean_sums_int32_values_to_the_same_long_double():
    """quantile_stats' mean of a narrowed (int32) column sums in int64 where that gives the long double
    sum exactly (spill._exact_sum): the same value on random columns and at the extremes, one of them
    a sum past 2^53 that float64 cannot hold (an odd number: a float64 sum would differ)."""
    rng = np.random.default_rng(3)
    cases = [rng.integers(-2 ** 31 + 1, 2 ** 31, n, dtype=np.int64).astype(np.int32) for n in (1, 2, 7, 1000, 200_000)]
    cases += [np.full(5_000_001, 2 ** 31 - 1, dtype=np.int32), np.full(70_000, -2 ** 31 + 1, dtype=np.int32)]
    for v in cases:
        want = v.sum(dtype=np.longdouble)
        got = spill._exact_sum(v)
        assert type(got) is type(want) and got == want, len(v)
        assert spill.quantile_stats(v.copy())[-2] == float(want / len(v))
    assert np.longdouble(cases[-2].sum(dtype=np.float64)) != cases[-2].sum(dtype=np.longdouble) or not spill._LONG_HOLDS_INT64
    f = rng.normal(size=1000) * 1e9                 # float64: summed in long double as before
    assert spill._exact_sum(f) == f.sum(dtype=np.longdouble)


def test_medians_and_quantiles_of_a_column_allocate_no_copy_of_it(medians_by):
    """median_in_place, quantile_stats and a Ratio's median work in the group's array itself: numpy asked to
    search an int32 array for a Python int searches a copy of it in int64 (twice its memory; the
    10^8-event DDP summary's peak rose 0.7 GB with one such search). Traced numpy allocations stay far
    below the array's size."""
    import tracemalloc
    rng = np.random.default_rng(8)
    base = rng.integers(-50, 10 ** 9, 2_000_000).astype(np.int32)
    base[::7] = spill.NAN32
    floats = np.where(base == spill.NAN32, np.nan, base.astype(np.float64))
    cases = [(spill.median_in_place, lambda: base.copy()), (spill.quantile_stats, lambda: base.copy()),
             (spill.median_in_place, lambda: spill.RatioValues(base.copy(), 1e9, 1.5)),
             (spill.median_in_place, lambda: floats.copy())]      # (a Ratio's quantiles compute every ratio: its mean)
    for fn, make in cases:
        x = make()
        tracemalloc.start()
        try:
            fn(x)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < base.nbytes / 2, (fn.__name__, peak)


def test_narrowed_columns_give_the_same_medians_and_quantiles(tmp_path, monkeypatch, medians_by):
    """A spilled column of whole numbers is kept as int32 (NaN as NAN32); one that is not (a fraction,
    a value past 32 bits, INT32_MIN itself, -0.0) stays float64, decided piece by piece. A group whose
    column is narrowed in one piece and not in another reads as float64; every median and quantile is
    pandas' of the whole table, exactly."""
    from syncviz.analysis import partition_joined as PJ
    from syncviz.analysis.tables import quantiles
    monkeypatch.setattr(spill, "BIG_GROUP", 30)
    rng = np.random.default_rng(5)
    odd = [0.5, 2.0 ** 31, float(np.iinfo(np.int32).min), -0.0, None]     # None: a piece of whole numbers only
    frames, pieces, kinds = [], [], []
    for i, extra in enumerate(odd):
        n = 60
        f = pd.DataFrame({"g": rng.integers(0, 4, n), "a": rng.integers(-10**6, 10**6, n).astype(float),
                          "b": rng.integers(0, 100, n)})
        f.loc[rng.random(n) < 0.2, "a"] = np.nan
        if extra is not None:
            f.loc[f.index[3], "a"] = extra
        frames.append(f)
        pieces.append(PJ.spill_by(tmp_path, f"n{i}", [(f["g"].to_numpy(), None)], [f["a"].to_numpy(), f["b"].to_numpy()],
                                  ("a", "b")))
        kinds.append([c.dtype for c in spill._mapped(pieces[-1])])
    assert [k[0] for k in kinds] == [np.float64] * 4 + [np.int32] and all(k[1] == np.int32 for k in kinds)
    whole = pd.concat(frames, ignore_index=True)
    med = spill.group_medians(pieces, ["g"], ["a", "b"])
    pd.testing.assert_frame_equal(med, whole.groupby("g")[["a", "b"]].median(), check_exact=True, check_names=False)
    only_whole = [pieces[-1]]            # every slice int32: selected in int32
    pd.testing.assert_frame_equal(spill.group_medians(only_whole, ["g"], ["a"]),
                                  frames[-1].groupby("g")[["a"]].median(), check_exact=True, check_names=False)
    for col, frame in zip(["a", "b"], spill.group_quantiles(only_whole, ["g"], ["a", "b"])):
        ref = quantiles(frames[-1].astype({"b": float}), "g", col)
        pd.testing.assert_frame_equal(frame, ref, check_exact=True, check_index_type=False)
    monkeypatch.setattr(spill, "MAX_OPEN", 2)        # fewer open files than pieces: closed and opened again
    pd.testing.assert_frame_equal(spill.group_medians(pieces, ["g"], ["a", "b"]), med, check_exact=True)
    zero = spill.narrow(np.array([0.0, -0.0]))
    assert zero.dtype == np.float64 and np.signbit(zero[1])
    assert spill.narrow(np.array([1, 2**40])).dtype == np.float64


def test_bandwidth_columns_computed_on_reading_are_the_written_ones(tmp_path, monkeypatch, medians_by):
    """algbw and busbw spilled as spill.Ratio of the service time (partition_joined.bandwidth_ratios):
    not written where a group's bytes and factor are shared, and read back as the very float64 that
    partition_joined.comm_times computes (service 0, negative, NaN, fractional; a piece whose group's
    bytes differ writes them). Every median and quantile equals pandas' of the whole table exactly,
    serial and pooled: from the service times' order where a group's slices share (bytes, factor),
    two groups of one file in one read included; from the computed column where a group's bytes
    differ between pieces, a piece wrote the column, or the factor is 0."""
    from syncviz.analysis import partition_joined as PJ
    from syncviz.analysis.tables import quantiles
    monkeypatch.setattr(spill, "BIG_GROUP", 60)
    rng = np.random.default_rng(9)
    frames, pieces, written = [], [], []
    for i in range(5):
        n = int(rng.integers(50, 200))
        g = np.zeros(n, dtype=int) if i == 4 else rng.integers(0, 6, n)
        svc = rng.integers(-5, 10**7, n).astype(float)
        svc[rng.random(n) < 0.1] = np.nan
        svc[rng.random(n) < 0.05] = 0.0
        if i == 3:
            svc[::5] += 0.5                              # a piece whose service time stays float64
        nbytes = np.array([4096, 1 << 20, 1 << 20, 3, 0, 7 << 20])[g] * np.where((i == 2) & (g == 3), 2, 1)
        if i == 4:
            nbytes = rng.integers(1, 10, n)              # bytes differ within the group: written
        factor = np.where(g == 5, 0.0, 2 * 7 / 8)
        with np.errstate(divide="ignore", invalid="ignore"):
            algbw = np.where(svc > 0, nbytes / svc, np.nan)     # comm_times' formula
        f = pd.DataFrame({"h": (g == 5).astype(int), "g": g, "svc": svc, "algbw": algbw, "busbw": algbw * factor})
        frames.append(f)
        ratios = PJ.bandwidth_ratios("svc", nbytes, factor)
        ratios = {"algbw": ratios["algbw_gbps"], "busbw": ratios["busbw_gbps"]}
        pieces.append(PJ.spill_by(tmp_path, f"r{i}", [(f["h"].to_numpy(), None), (g, None)],
                                  [f[c].to_numpy() for c in ("svc", "algbw", "busbw")], ("svc", "algbw", "busbw"), ratios))
        written.append(spill._layout(pieces[-1].path).kinds)
        for c, got in zip(("svc", "algbw", "busbw"), spill._mapped(pieces[-1])):
            want = f.sort_values(["h", "g"], kind="stable")[c].to_numpy()
            assert np.array_equal(spill._floats(np.asarray(got)), want, equal_nan=True)
    assert written[0][1:] == [spill.RATIO] * 2 and written[4][1:] == [0, 0]
    whole = pd.concat(frames, ignore_index=True)
    cols = ["svc", "algbw", "busbw"]
    two = lambda k: () if k[1] in (1, 2) else None          # noqa: E731   (groups 1 and 2: one read a piece)
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        for map_fn in (map, pool.map):
            med, both = spill.group_medians_many([(pieces, ["g"], cols, lambda k: (k[1],)), (pieces, [], cols, two)], map_fn)
            pd.testing.assert_frame_equal(med, whole.groupby("g")[cols].median(), check_exact=True, check_names=False)
            assert list(both.iloc[0]) == list(whole[whole["g"].isin([1, 2])][cols].median())
            for col, frame in zip(cols, spill.group_quantiles(pieces, ["g"], cols, map_fn, lambda k: (k[1],))):
                ref = quantiles(whole, "g", col)
                pd.testing.assert_frame_equal(frame.drop(columns="mean"), ref.drop(columns="mean"),
                                              check_exact=True, check_index_type=False)
                np.testing.assert_allclose(frame["mean"], ref["mean"], rtol=1e-13, atol=0)
    assert [len(s) for s in spill._where(pieces, two).values()] == [4]
    # the service times read once for a group's algbw and busbw where they share its slices (spill._read)
    tasks, _ = spill._plan([(pieces, ["g"], cols, lambda k: (k[1],))])
    again = [a for t in tasks for *_, a in spill._read(t)]
    assert any(again) and not all(again)


def test_columns_of_one_value_a_group_are_kept_once_and_read_as_written(tmp_path, monkeypatch, medians_by):
    """A column whose rows hold one value through each group (a bucket's launch delay with no
    gradient-ready times, NaN; its hook-to-launch time, 0; per-group constants, int32 and float64)
    is written as the group's value only (spill_file.CONST),
    and reads back as the very column that would have been written: its type, NaN, -0.0 apart from 0.0.
    A column constant in one piece and not in another, a Ratio whose source is such a column, reads
    of one group and of several: every median and quantile equals pandas' of the whole table exactly,
    serial and pooled."""
    from syncviz.analysis import partition_joined as PJ
    from syncviz.analysis import spill_file as SF
    from syncviz.analysis.tables import quantiles
    monkeypatch.setattr(spill, "BIG_GROUP", 40)
    rng = np.random.default_rng(21)
    names = ("nan", "zero", "per_g", "fl", "mixed", "svc", "bw")
    frames, pieces, kinds = [], [], []
    for i in range(4):
        n = int(rng.integers(60, 160))
        g = rng.integers(0, 5, n)
        svc = np.array([1e6, 2e6, 5e5, 3e6, 7e6])[g]                 # a duration constant in each group
        per_g = np.array([3.0, -7.0, 0.0, 2.0 ** 30, 11.0])[g]
        fl = np.array([0.25, -0.0, np.nan, 1e300, 0.0])[g]             # float64: -0.0 and 0.0 apart
        mixed = per_g.copy() if i != 2 else rng.integers(0, 9, n).astype(float)
        f = pd.DataFrame({"g": g, "nan": np.full(n, np.nan), "zero": np.zeros(n), "per_g": per_g, "fl": fl,
                          "mixed": mixed, "svc": svc, "bw": 4096 / svc * 1.75})
        frames.append(f)
        pieces.append(PJ.spill_by(tmp_path, f"k{i}", [(g, None)], [f[c].to_numpy() for c in names], names,
                                  {"bw": spill.Ratio("svc", np.full(n, 4096), 1.75)}))
        kinds.append(spill._layout(pieces[-1].path).kinds)
        for c, got in zip(names, spill._mapped(pieces[-1])):
            want = f.sort_values("g", kind="stable")[c].to_numpy()
            assert np.array_equal(spill._floats(np.asarray(got)), want, equal_nan=True), c
            assert np.array_equal(np.signbit(spill._floats(np.asarray(got))), np.signbit(want)), c
            assert got.dtype == spill.narrow(want).dtype, c
        lay = spill._layout(pieces[-1].path)
        with open(pieces[-1].path, "rb") as fh:             # a read across groups, and an empty one
            for ci in range(len(names)):
                want = spill._floats(np.asarray(spill._mapped(pieces[-1])[ci]))
                assert np.array_equal(spill._floats(lay.read(fh, ci, 3, n - 2)), want[3:n - 2], equal_nan=True)
                assert len(lay.read(fh, ci, 5, 5)) == 0
    const = SF.CONST
    assert kinds[0] == [const] * 6 + [spill.RATIO] and kinds[2][4] == 1        # "mixed" written where it varies
    # no row written: the magic, the header (2 + 2 a column + 1 words), 5 group ends, 6 + 2 value tables
    assert Path(pieces[0].path).stat().st_size == 16 + 8 * (2 + 2 * 7 + 1) + 8 * 5 + 8 * 5 * (6 + 2)
    whole = pd.concat(frames, ignore_index=True)
    cols = list(names)
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        for map_fn in (map, pool.map):
            med, one = spill.group_medians_many([(pieces, ["g"], cols, lambda k: k), (pieces, [], cols, lambda k: ())],
                                                map_fn)
            pd.testing.assert_frame_equal(med, whole.groupby("g")[cols].median(), check_exact=True, check_names=False)
            assert np.array_equal(one.iloc[0].to_numpy(dtype=float), whole[cols].median().to_numpy(), equal_nan=True)
            for col, frame in zip(cols, spill.group_quantiles(pieces, ["g"], cols, map_fn)):
                ref = quantiles(whole, "g", col)
                pd.testing.assert_frame_equal(frame.drop(columns="mean"), ref.drop(columns="mean"),
                                              check_exact=True, check_index_type=False)
                np.testing.assert_allclose(frame["mean"], ref["mean"], rtol=1e-13, atol=0)


def test_bucket_first_reduced_elementwise_equals_the_groupby(monkeypatch):
    """partial_views.reduce_bucket_first: partitions that saw the same buckets are reduced
    elementwise; the result is the concatenated groupby's min exactly (values, index, names, types),
    and partitions with different buckets still take the groupby."""
    from syncviz.analysis import partial_views as PV
    rng = np.random.default_rng(4)

    def part(n, steps):
        f = pd.DataFrame({"step": rng.choice(steps, n), "micro": rng.integers(0, 2, n),
                          "bucket": rng.integers(0, 5, n), "launch": rng.integers(0, 10 ** 12, n)})
        return f.groupby(PV.LATE_KEY)["launch"].min()

    full = [part(400, np.arange(6)) for _ in range(4)]
    full = [p.reindex(full[0].index.union(p.index)).fillna(0).astype(np.int64) for p in full]   # same buckets
    full = [p.reindex(full[0].index) for p in full]
    assert all(p.index.equals(full[0].index) for p in full)
    for parts in (full, [part(50, np.arange(3)), part(60, np.arange(2, 8)), None]):
        want = pd.concat([p for p in parts if p is not None]).groupby(level=[0, 1, 2]).min()
        pd.testing.assert_series_equal(PV.reduce_bucket_first(parts), want, check_exact=True)
        pd.testing.assert_index_equal(PV.reduce_bucket_first(parts).index, want.index, exact=True)
    want = PV.reduce_bucket_first(full)
    monkeypatch.setattr(PV.pd, "concat", None)         # the same buckets everywhere: no groupby at all
    pd.testing.assert_series_equal(PV.reduce_bucket_first(full), want, check_exact=True)
