"""The Distributed view's numbers (analysis/distributed.py) on hand-built traces."""
from __future__ import annotations

import numpy as np

from syncviz.analysis.distributed import BREAKDOWN, collective_kinds, rank_breakdown
from syncviz.trace import load_run
from tracebuild import MS, make_ddp_run


def test_breakdown_by_hand(tmp_path):
    """tracebuild's step: compute 35 ms (bucket 0 [16, 26] under backward), bucket 1 [30, 40]
    alone, step 45 ms. Rank 1 launches bucket 1 3 ms late, so rank 0's bucket 1 waits 3 ms of its
    10 exposed ms for it."""
    run = load_run(make_ddp_run(tmp_path / "r", straggler=1, straggle_ms=3))
    b = rank_breakdown(run.events).set_index("rank")
    assert b.loc[0, "computation_ns"] == 25 * MS and b.loc[0, "overlapped_ns"] == 10 * MS
    assert b.loc[0, "waiting_ns"] == 3 * MS and b.loc[0, "communication_ns"] == 7 * MS
    assert b.loc[0, "other_ns"] == 0
    assert b.loc[1, "waiting_ns"] == 0 and b.loc[1, "communication_ns"] == 10 * MS
    assert np.allclose(b[list(BREAKDOWN)].sum(axis=1), b["step_ns"])       # the parts add up


def test_collective_kinds_by_hand(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "r"))
    k = collective_kinds(run.events).set_index("op")
    assert list(k.index) == ["all_reduce"]
    row = k.loc["all_reduce"]
    # per rank and step: 2 buckets, 4 + 2 MB, 10 ms each; 2 ranks: bus factor 2(n-1)/n = 1
    assert row["calls"] == 2 and row["bytes"] == 6e6 and (row["calls_min"], row["calls_max"]) == (2, 2) and row["bus_bytes"] == 6e6
    assert row["time_ns"] == 20 * MS and row["mean_ns"] == 10 * MS


def test_empty(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "r"))
    none = run.events.iloc[:0]
    assert len(rank_breakdown(none)) == 0 and len(collective_kinds(none)) == 0


def test_calls_range_when_ranks_differ(tmp_path):
    """A rank that issues one call fewer in one step: the mean is fractional, the range is exact
    integers (what the Distributed page shows)."""
    run = load_run(make_ddp_run(tmp_path / "r", steps=3))
    ev = run.events
    drop = ev.index[(ev["rank"] == 1) & (ev["step"] == 2) & (ev["bucket"] == 1)]
    kinds = collective_kinds(ev.drop(drop))
    assert kinds["calls_min"].dtype.kind == "i" and kinds["calls_max"].dtype.kind == "i"
    k = kinds.set_index("op").loc["all_reduce"]
    assert k["calls"] == 1.75 and (k["calls_min"], k["calls_max"]) == (1, 2)


def test_shared_tables_give_the_same_numbers(tmp_path):
    """The dashboard computes step_metrics and comm_metrics once for both functions."""
    import pandas as pd
    from syncviz import analysis as A
    from syncviz.trace import schema as S
    run = load_run(make_ddp_run(tmp_path / "r", steps=4, straggler=1, straggle_ms=3))
    ev = run.events
    steps, comm = A.step_metrics(ev), A.comm_metrics(ev, kinds=S.COMM_KINDS)
    pd.testing.assert_frame_equal(rank_breakdown(ev, steps, comm), rank_breakdown(ev))
    pd.testing.assert_frame_equal(collective_kinds(ev, steps, comm), collective_kinds(ev))


def test_waiting_exposed_equals_brute_force():
    """exposed ∩ waiting per (rank, step) against a count of whole nanoseconds, on random intervals:
    waits in other rank-steps, before, after, across and inside the exposed ones, overlapping each
    other (the waits far from any exposed interval are left out of the subtraction: same sums).
    Steps numbered 0, 1, 2, … and steps a million apart: the (rank, step) cells are then too many
    for the table the waits are looked up in, and they are searched for instead."""
    from syncviz.analysis.distributed import waiting_exposed_arrays
    rng = np.random.default_rng(7)
    for trial in range(80):
        spread = 1 if trial < 40 else 1_000_000
        n_e, n_w = rng.integers(1, 12), rng.integers(0, 40)
        ex = [rng.integers(0, 3, n_e), rng.integers(-1, 3, n_e) * spread]
        es = rng.integers(0, 60, n_e)
        ex += [es, es + rng.integers(0, 15, n_e)]
        rank, step = rng.integers(0, 4, n_w), rng.integers(-1, 4, n_w) * spread
        start = rng.integers(0, 80, n_w)
        end = start + rng.integers(0, 30, n_w)
        service = np.where(rng.random(n_w) < 0.2, np.nan, rng.integers(0, 30, n_w).astype(float))
        got = waiting_exposed_arrays(tuple(np.asarray(a, dtype=np.int64) for a in ex), rank, step, start, end, service)
        want = {}
        for r, s, a, b in zip(*ex):     # each exposed interval's whole-ns points that some wait covers
            waited = set()
            for r2, s2, a2, b2, sv in zip(rank, step, start, end, service):
                wait = 0 if np.isnan(sv) else max(0, (b2 - a2) - sv)
                if (r2, s2) == (r, s) and wait > 0:
                    waited |= set(range(a2, int(a2 + wait)))
            key = (int(r), int(s))
            want[key] = want.get(key, 0.0) + float(len(set(range(a, b)) & waited))
        # pairs with nothing waited may be left out (no wire rows at all: an empty Series)
        assert {k: float(v) for k, v in got.items() if v} == {k: v for k, v in want.items() if v}, trial
        assert all(v == 0 for k, v in got.items() if k not in want), trial
