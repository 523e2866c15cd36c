"""The analysis functions the dashboard draws from (added for the views), checked by hand and
against the existing metric definitions."""
import numpy as np
import pandas as pd
import pytest

from syncviz import analysis as A
from syncviz.dashboard.data.synth import write_synth_run
from syncviz.trace import load_run
from tracebuild import MS, make_ddp_run


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    return load_run(write_synth_run(tmp_path_factory.mktemp("s") / "s", world=6, steps=5, n_buckets=5,
                                    straggler=2, straggle_ms=5))


def test_exposed_intervals_by_hand(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "d", steps=2, straggler=1, straggle_ms=3))
    ex = A.exposed_intervals(run).sort_values(["rank", "step"]).reset_index(drop=True)
    # bucket 1 runs [30, 40] ms after the last gradient (backward compute ends at 30): all exposed;
    # the straggler's step is shifted by 3 ms.
    assert ex[["start_ns", "end_ns"]].to_numpy().tolist() == [
        [30 * MS, 40 * MS], [130 * MS, 140 * MS], [33 * MS, 43 * MS], [133 * MS, 143 * MS]]


def test_exposed_intervals_sum_to_step_exposed(synth):
    ex = A.exposed_intervals(synth)
    per = (ex["end_ns"] - ex["start_ns"]).groupby([ex["rank"], ex["step"]]).sum()
    sm = A.step_metrics(synth).set_index(["rank", "step"])["exposed_ns"]
    assert np.allclose(per.reindex(sm.index).fillna(0).to_numpy(), sm.to_numpy())


def test_launch_lateness_matches_rank_step_skew(synth):
    late = A.launch_lateness(synth)
    assert (late["late_ns"] >= 0).all()
    mean = late.pivot_table(index="rank", columns="step", values="late_ns", aggfunc="mean")
    pd.testing.assert_frame_equal(mean, A.rank_step_skew(synth), check_names=False)


def test_rank_lanes_are_quantiles_and_analysable(synth):
    lanes = A.rank_lanes(synth)
    assert sorted(lanes["rank"].unique()) == [0, 1, 2]
    b = synth.events[(synth.events["kind"] == "bucket") & (synth.events["step"] == 3) & (synth.events["bucket"] == 2)]
    lb = lanes[(lanes["kind"] == "bucket") & (lanes["step"] == 3) & (lanes["bucket"] == 2)].set_index("rank")
    assert lb.loc[0, "launch_ns"] == b["launch_ns"].min() and lb.loc[2, "end_ns"] == b["end_ns"].max()
    assert lb.loc[1, "start_ns"] == round(b["start_ns"].median())
    # lanes go through the metric functions like ranks
    assert len(A.step_metrics(lanes)) == 3 * 5 and len(A.comm_metrics(lanes)) == 3 * 5 * 5


def test_quantiles_and_rank_spread(synth):
    bm = A.bucket_metrics(synth)
    q = A.quantiles(bm, "bucket", "duration_ns")
    d = bm[bm["bucket"] == 1]["duration_ns"]
    assert q.loc[1, "q0"] == d.min() and q.loc[1, "q50"] == d.median() and q.loc[1, "count"] == len(d)
    sm = A.step_metrics(synth)
    sp = A.rank_spread(sm, ["exposed_ns", "compute_comm_ratio"]).set_index("step")
    s2 = sm[sm["step"] == 2]
    assert sp.loc[2, "exposed_ns_max"] == s2["exposed_ns"].max()
    assert sp.loc[2, "compute_comm_ratio_median"] == pytest.approx(s2["compute_comm_ratio"].median())


def test_rank_spread_of_one_step_equals_the_groupby(synth):
    """rank_spread of one step (the Replay's cards) is taken in numpy: the same frame, values and dtypes
    as the groupby of several steps gives for that step, with NaN, ±inf and a column of NaN only."""
    sm = A.step_metrics(synth)
    cols = ["step_ns", "exposed_ns", "overlap_pct", "compute_comm_ratio", "bytes", "odd", "none"]
    rng = np.random.default_rng(3)
    for step in sorted(sm["step"].unique()):
        one = sm[sm["step"] == step].reset_index(drop=True)
        one["odd"] = rng.choice([np.nan, np.inf, -np.inf, 1.5, 2.5], size=len(one))
        one["none"] = np.nan
        other = one.assign(step=step + 100, bytes=one["bytes"] + 1)
        whole = A.rank_spread(pd.concat([one, other], ignore_index=True), cols)     # the groupby
        pd.testing.assert_frame_equal(A.rank_spread(one, cols), whole[whole["step"] == step], check_exact=True)
    assert A.rank_spread(sm.iloc[:0], cols[:4]).empty


def test_bucket_map_both_layouts(synth):
    bmap = A.bucket_map(synth.layouts)
    assert sorted(bmap["layout"].unique()) == [0, 1]
    assert not bmap[bmap["layout"] == 0]["moved"].any() and bmap[bmap["layout"] == 1]["moved"].any()
    assert (bmap["bytes"] == bmap["numel"] * 4).all()
    first = bmap[(bmap["layout"] == 0) & (bmap["bucket"] == 1)]
    assert first["start_byte"].tolist() == sorted(first["start_byte"].tolist())


def test_op_bytes_and_time_split(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "d", steps=3))
    ob = A.op_bytes_per_step(run)
    assert ob.to_dict("records") == [{"op": "all_reduce", "bytes_per_step": 6e6, "count_per_step": 2.0,
                                      "count_min": 2, "count_max": 2}]
    split = A.time_split(A.step_metrics(run))
    # hand-built step: 45 ms; compute 35 (10 of it under comm), exposed 10, nothing else
    assert split == pytest.approx({"step_ms": 45.0, "compute_only_ms": 25.0, "overlapped_ms": 10.0,
                                   "exposed_ms": 10.0, "other_ms": 0.0})
    assert split["compute_only_ms"] + split["overlapped_ms"] + split["exposed_ms"] + split["other_ms"] == \
        pytest.approx(split["step_ms"])
