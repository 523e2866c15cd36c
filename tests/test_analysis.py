"""Metric definitions on hand-built traces whose answers are worked out by hand (see tracebuild)."""
import numpy as np
import pandas as pd
import pytest

from syncviz import analysis as A
from syncviz.trace import load_run
from tracebuild import MS, columns, ev, make_ddp_run


def test_step_metrics_by_hand(ddp_run):
    s = A.step_metrics(load_run(ddp_run))
    assert len(s) == 6
    r = s.iloc[0]
    # forward [0,10], backward compute [10, last ready 30] (the backward row ends at 32), optimizer [40,45]
    assert r.forward_ns == 10 * MS and r.backward_ns == 20 * MS and r.optimizer_ns == 5 * MS
    assert r.compute_ns == 35 * MS
    # comm: bucket 0 [16,26] (hidden under backward), bucket 1 [30,40] (after backward: exposed)
    assert r.comm_busy_ns == 20 * MS and r.overlapped_ns == 10 * MS and r.exposed_ns == 10 * MS
    assert r.overlap_pct == 50.0
    assert r.compute_comm_ratio == pytest.approx(35 / 20)
    assert r.step_ns == 45 * MS and r.bytes == 6_000_000


def test_bucket_metrics_by_hand(ddp_run):
    b = A.bucket_metrics(load_run(ddp_run))
    b0 = b[(b["bucket"] == 0)].iloc[0]
    b1 = b[(b["bucket"] == 1)].iloc[0]
    assert b0.launch_delay_ns == 1 * MS and b1.launch_delay_ns == 0
    assert b0.duration_ns == 10 * MS
    assert b0.algbw_gbps == pytest.approx(4e6 / 10e6)            # 4 MB in 10 ms = 0.4 GB/s
    assert b0.busbw_gbps == pytest.approx(0.4 * 2 * (2 - 1) / 2)  # all_reduce factor 2(n-1)/n
    assert b0.exposed_ns == 0 and b1.exposed_ns == 10 * MS and b1.after_backward_ns == 10 * MS


def test_busbw_factors():
    assert A.busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert A.busbw_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert A.busbw_factor("all_gather", 4) == pytest.approx(0.75)
    assert A.busbw_factor("broadcast", 8) == 1.0


def test_overlapping_comm_is_a_union_not_a_sum(tmp_path):
    # two collectives overlapping each other [0,10] and [5,15]; compute [0,8]
    evs = [ev("step", 0, 20), ev("forward", 0, 8),
           ev("bucket", 0, 10, bucket=0, op="all_reduce", nbytes=10),
           ev("bucket", 5, 15, bucket=1, op="all_reduce", nbytes=10)]
    from syncviz.trace import new_meta, write_run
    run = load_run(write_run(tmp_path / "r", new_meta("r", 1), {0: [columns(evs)]}))
    s = A.step_metrics(run).iloc[0]
    assert s.comm_busy_ns == 15 * MS and s.overlapped_ns == 8 * MS and s.exposed_ns == 7 * MS


def test_micro_steps_backward_compute(tmp_path):
    # gradient accumulation: two micro-steps, only the second syncs
    evs = [ev("step", 0, 50), ev("forward", 0, 5, micro=0), ev("backward", 5, 15, micro=0),
           ev("grad_ready", 12, 12, micro=0), ev("forward", 20, 25, micro=1), ev("backward", 25, 40, micro=1),
           ev("grad_ready", 35, 35, micro=1), ev("bucket", 35, 45, micro=1, bucket=0, op="all_reduce", nbytes=8),
           ev("optimizer", 45, 50)]
    from syncviz.trace import new_meta, write_run
    run = load_run(write_run(tmp_path / "r", new_meta("r", 1), {0: [columns(evs)]}))
    s = A.step_metrics(run).iloc[0]
    assert s.backward_ns == (12 - 5 + 35 - 25) * MS      # each micro's [bwd start, last ready]
    assert s.exposed_ns == 10 * MS and s.overlap_pct == 0


def test_skew_names_the_straggler(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "s", world=3, straggler=2, straggle_ms=4.0))
    sk = A.skew(run)
    b1 = sk[sk["bucket"] == 1]
    assert (b1["straggler"] == 2).all() and (b1["skew_ns"] == 4 * MS).all()
    assert (sk[sk["bucket"] == 0]["skew_ns"] == 0).all()
    heat = A.rank_step_skew(run)
    assert heat.loc[2].min() == pytest.approx(2 * MS)   # mean over two buckets: (0 + 4)/2
    assert heat.loc[0].max() == 0


def test_run_summary_and_verdict(ddp_run):
    s = A.run_summary(load_run(ddp_run))
    assert s["headline_steps"] == [1, 2]
    assert s["exposed_pct"] == 50.0 and s["step_ms"] == 45.0
    assert s["verdict"].startswith("50% of communication is exposed (10.00 of 20.00 ms per step), mostly bucket 1 after backward ends")


def test_large_trace_is_vectorized(tmp_path):
    # 200k bucket rows analysed without Python loops per row
    n_steps, n_b, ranks = 500, 50, 8
    rows = []
    rng = np.random.default_rng(0)
    for r in range(ranks):
        st = np.repeat(np.arange(n_steps), n_b)
        start = st * 100 * MS + np.tile(np.arange(n_b), n_steps) * MS + rng.integers(0, MS, len(st))
        rows.append(pd.DataFrame({"rank": r, "step": st, "micro": 0, "kind": "bucket", "name": "b",
                                  "start_ns": start, "end_ns": start + 2 * MS, "bucket": np.tile(np.arange(n_b), n_steps),
                                  "op": "all_reduce", "bytes": 1000, "logical_bytes": 1000, "dtype": "float32",
                                  "group_size": ranks, "ready_ns": start, "launch_ns": start, "phase": "backward",
                                  "layout": 0}))
        rows.append(pd.DataFrame({"rank": r, "step": np.arange(n_steps), "micro": 0, "kind": "backward", "name": "",
                                  "start_ns": np.arange(n_steps) * 100 * MS, "end_ns": np.arange(n_steps) * 100 * MS + 30 * MS,
                                  "bucket": -1, "op": "", "bytes": 0, "logical_bytes": 0, "dtype": "", "group_size": 0,
                                  "ready_ns": -1, "launch_ns": -1, "phase": "", "layout": -1}))
    events = pd.concat(rows, ignore_index=True)
    s = A.step_metrics(events)
    assert len(s) == ranks * n_steps
    # buckets 0..29 start inside backward [0,30ms]: busy = union of [k, k+2+jitter] ...
    assert (s["overlapped_ns"] <= s["comm_busy_ns"]).all() and (s["exposed_ns"] > 0).all()
    b = A.bucket_metrics(events)
    assert len(b) == ranks * n_steps * n_b


def test_blocking_collective_is_cut_out_of_compute():
    """A synchronous host collective (" (blocking)") inside the forward is time the rank did not
    compute: [12, 15] is cut out of forward [10, 20]; a non-blocking collective and a missing name
    cut nothing. The same whether names are categoricals (as read from a run) or plain strings."""
    from syncviz.analysis.intervals import blocking_rows, compute_intervals
    from syncviz.trace import schema as S
    evs = [ev("forward", 10, 20), ev("backward", 20, 30),
           ev("collective", 12, 15, name="all_reduce" + S.BLOCKING, op="all_reduce", nbytes=8),
           ev("collective", 16, 18, name="all_gather", op="all_gather", nbytes=8),
           ev("collective", 25, 27, name="x", op="all_reduce", nbytes=8)]
    plain = pd.DataFrame(columns(evs)).assign(rank=0)
    plain.loc[4, "name"] = None                         # a missing name is never blocking
    typed = plain.astype({c: "category" for c in S.CATEGORICAL_COLUMNS})
    for frame in (plain, typed):
        b = blocking_rows(frame)
        assert b.index.tolist() == [2]
        comp = compute_intervals(frame)
        fwd = comp[comp["kind"] == "forward"].sort_values("start_ns")
        assert list(zip(fwd["start_ns"], fwd["end_ns"])) == [(10 * MS, 12 * MS), (15 * MS, 20 * MS)]
        bwd = comp[comp["kind"] == "backward"]
        assert list(zip(bwd["start_ns"], bwd["end_ns"])) == [(20 * MS, 30 * MS)]
    pd.testing.assert_frame_equal(compute_intervals(plain), compute_intervals(typed))
