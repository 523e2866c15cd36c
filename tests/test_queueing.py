"""Queue, wait and service time per collective, exposed time attributed once, the run's straggler
and a self-consistent headline: every number below is worked out by hand from the trace."""
from __future__ import annotations

import numpy as np
import pytest

from syncviz import analysis as A
from syncviz.trace import load_run, new_meta, write_run
from tracebuild import MS, columns, ev, make_ddp_run


def bucket(step, hook, launch, end, b, nbytes=4_000_000):
    e = ev("bucket", hook, end, step=step, bucket=b, op="all_reduce", nbytes=nbytes, ready_ms=hook, layout=0)
    e["launch_ns"] = int(launch * MS)
    return e


def write(path, by_rank, world=2):
    meta = new_meta(path.name, world, strategy="ddp", backend="gloo", device="cpu", engine="torch")
    meta["ranks"] = [{"rank": r, "clock_offset_ns": 0, "clock_error_ns": 0} for r in range(world)]
    return load_run(write_run(path, meta, {r: [columns(evs)] for r, evs in by_rank.items()}, {}))


@pytest.fixture
def queued(tmp_path):
    """One step, two ranks, two buckets (ms):
    rank 0: bucket 0 hook 8, launch 10, done 30; bucket 1 launch 12, done 40 (behind bucket 0)
    rank 1: bucket 0 launch 15, done 30;          bucket 1 hook 20, launch 25, done 40
    compute: forward [0, 5], backward [5, 12] on both ranks."""
    def rank(b0, b1):
        return [ev("step", 0, 45), ev("forward", 0, 5), ev("backward", 5, 12), b0, b1]
    return write(tmp_path / "q", {0: rank(bucket(0, 8, 10, 30, 0), bucket(0, 12, 12, 40, 1)),
                                  1: rank(bucket(0, 15, 15, 30, 0), bucket(0, 20, 25, 40, 1))})


def test_queue_wait_service(queued):
    c = A.comm_metrics(queued).set_index(["rank", "bucket"])
    ms = lambda col: {k: v / MS for k, v in c[col].items()}  # noqa: E731
    # bucket 0: every rank launched at 15 (rank 1 last); nothing ran before it
    assert ms("service_start_ns")[(0, 0)] == 15 and ms("service_ns")[(0, 0)] == 15
    assert ms("wait_peers_ns")[(0, 0)] == 5 and ms("queued_ns")[(0, 0)] == 0
    assert ms("queue_ns")[(1, 0)] == 0 and ms("service_ns")[(1, 0)] == 15
    # bucket 1 on rank 0: launched 12, bucket 0 ran until 30 -> 18 ms queued behind it, none for peers
    # (rank 1 launched at 25 < 30), service 30 -> 40
    assert ms("queue_ns")[(0, 1)] == 18 and ms("queued_ns")[(0, 1)] == 18 and ms("wait_peers_ns")[(0, 1)] == 0
    assert ms("service_ns")[(0, 1)] == 10 and ms("duration_ns")[(0, 1)] == 10
    # bucket 1 on rank 1: hook entry 20, launch 25; queued 5 behind its bucket 0
    assert ms("hook_to_launch_ns")[(1, 1)] == 5 and ms("queued_ns")[(1, 1)] == 5
    assert ms("span_ns")[(1, 1)] == 15 and ms("launch_ns")[(1, 1)] == 25
    # bandwidth divides by service time: 4 MB / 10 ms = 0.4 GB/s algbw, ×2(n−1)/n = 0.4 busbw on 2 ranks
    assert c.loc[(0, 1), "algbw_gbps"] == pytest.approx(0.4) and c.loc[(0, 1), "busbw_gbps"] == pytest.approx(0.4)
    # the fit reads the same number
    svc = A.comm_service(A.comm_metrics(queued))
    assert np.allclose(svc["service_ns"].to_numpy(), A.comm_metrics(queued)["duration_ns"].to_numpy())


def test_comm_interval_starts_at_launch(queued):
    """comm busy counts from the collective call, not from the hook entry: rank 1 is busy
    [15, 40] = 25 ms; rank 0 [10, 40] = 30 ms (its hook entered at 8)."""
    s = A.step_metrics(queued).set_index("rank")
    assert s.loc[0, "comm_busy_ns"] == 30 * MS and s.loc[1, "comm_busy_ns"] == 25 * MS


def test_wait_for_peers_then_queue(tmp_path):
    """Previous collective done at 22, this one launched at 20, last peer launched at 25:
    2 ms queued behind the previous one, then 3 ms waiting for the peer."""
    def rank(l0, e0, l1):
        return [ev("step", 0, 50), bucket(0, l0, l0, e0, 0), bucket(0, l1, l1, 40, 1)]
    run = write(tmp_path / "w", {0: rank(10, 22, 20), 1: rank(10, 21, 25)})
    c = A.comm_metrics(run).set_index(["rank", "bucket"])
    assert c.loc[(0, 1), "queue_ns"] == 5 * MS
    assert c.loc[(0, 1), "queued_ns"] == 2 * MS and c.loc[(0, 1), "wait_peers_ns"] == 3 * MS
    assert c.loc[(0, 1), "service_ns"] == 15 * MS


def test_exposed_attributed_once(tmp_path):
    """Compute [0, 10]; bucket 0 [5, 20] and bucket 1 [8, 25]: ∪comm = [5, 25] = 20 ms, 5 ms under
    compute, exposed 15 ms. At [10, 20] the rank waits on bucket 0 (launched first), at [20, 25]
    on bucket 1: 10 + 5 = 15. (Each bucket's own un-hidden time would add 10 + 15 = 25.)"""
    evs = [ev("step", 0, 30), ev("forward", 0, 4), ev("backward", 4, 10),
           bucket(0, 5, 5, 20, 0), bucket(0, 8, 8, 25, 1)]
    run = write(tmp_path / "a", {0: evs, 1: evs})
    c = A.comm_metrics(run)
    steps = A.step_metrics(run)
    assert (steps["exposed_ns"] == 15 * MS).all()
    per = c.groupby(["rank", "bucket"])["exposed_ns"].sum().unstack()
    assert (per[0] == 10 * MS).all() and (per[1] == 5 * MS).all()
    assert c.groupby("rank")["exposed_ns"].sum().tolist() == steps["exposed_ns"].tolist()
    # everything exposed lies after backward compute ended (at 10)
    assert (c["after_backward_ns"] == c["exposed_ns"]).all()
    s = A.run_summary(run)
    top = {t["bucket"]: t for t in s["top_exposed"]}
    assert top[0]["exposed_share_pct"] == pytest.approx(200 / 3) and top[1]["exposed_share_pct"] == pytest.approx(100 / 3)
    assert sum(t["exposed_ms_per_step"] for t in s["top_exposed"]) == pytest.approx(s["exposed_ms"])


def test_exposed_attribution_sums_on_ddp_trace(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "d", steps=4, straggler=1, straggle_ms=3.0))
    c = A.comm_metrics(run)
    steps = A.step_metrics(run).set_index(["rank", "step"])["exposed_ns"]
    got = c.groupby(["rank", "step"])["exposed_ns"].sum()
    assert (got.reindex(steps.index).fillna(0) - steps).abs().max() <= 2   # rounding, ns


def test_headline_ratios_agree(tmp_path):
    """Every time number is a mean over headline (rank, step) pairs; percentages come from them."""
    run = load_run(make_ddp_run(tmp_path / "h", steps=5, straggler=1, straggle_ms=4.0))
    s = A.run_summary(run)
    h = A.step_metrics(run)
    h = h[h["step"] > 0]
    assert s["exposed_ms"] == pytest.approx(h["exposed_ns"].mean() / 1e6)
    assert s["comm_busy_ms"] == pytest.approx(h["comm_busy_ns"].mean() / 1e6)
    assert s["exposed_pct"] == pytest.approx(100 * s["exposed_ms"] / s["comm_busy_ms"])
    assert s["overlap_pct"] == pytest.approx(100 - s["exposed_pct"])
    assert s["compute_comm_ratio"] == pytest.approx(
        (s["forward_ms"] + s["backward_ms"] + s["optimizer_ms"]) / s["comm_busy_ms"])
    assert f"{s['exposed_pct']:.0f}% of communication is exposed ({s['exposed_ms']:.2f} of {s['comm_busy_ms']:.2f} ms" \
        in s["verdict"]
    assert s["aggregate"] == A.HEADLINE_AGGREGATE


# ------------------------------------------------------------------------------- stragglers

def test_straggler_from_the_whole_run(tmp_path):
    """make_ddp_run: rank 1 launches bucket 1 late by 0.2 ms in every step (bucket 0 ties and
    has no last rank). 8 headline steps: last in 8 of 8 (chance 1/256) -> named, though 0.2 ms
    is small next to 20 ms of comm per step."""
    run = load_run(make_ddp_run(tmp_path / "s", steps=9, straggler=1, straggle_ms=0.2))
    s = A.run_summary(run)
    st = s["straggler_detail"]
    assert s["straggler"] == 1 and st["last"] == 8 and st["events"] == 8
    assert st["mean_late_ms"] == pytest.approx(0.1)      # 0.2 ms late on 1 of its 2 buckets
    assert st["waited_for_ms_per_step"] == pytest.approx(0.2)
    assert "rank 1 is the straggler: it launched last in 8 of 8 collectives (100%)" in s["verdict"]
    assert "(100% of their waiting for peers)" in s["verdict"]
    table = {r["rank"]: r for r in s["stragglers"]}
    assert table[0]["last"] == 0 and table[0]["mean_late_ms"] == 0


def test_no_straggler_when_not_consistent(tmp_path):
    run = load_run(make_ddp_run(tmp_path / "n", steps=9))
    s = A.run_summary(run)
    assert s["straggler"] is None and "straggler" not in s["verdict"]
    # 5 of 8 on 2 ranks happens by chance (p = 0.36): not named
    t = A.straggler_table(A.comm_metrics(run))
    t.loc[:, "events"], t.loc[:, "last"] = 8, [3, 5]
    t.loc[:, "mean_late_ms"], t.loc[:, "waited_for_ms_per_step"] = [0.1, 0.2], [0.1, 0.9]
    assert A.straggler(t, 2) is None
    t.loc[:, "last"] = [0, 8]
    st = A.straggler(t, 2)
    assert st["rank"] == 1 and st["wait_share_pct"] == pytest.approx(90.0)
    # lateness inside the clock alignment error: order unknown, not named
    assert A.straggler(t, 2, clock_error_ns=0.5 * MS) is None
    # last in 12 of 16 (p = 0.038) but the others waited about as long for rank 0: not named
    t.loc[:, "events"], t.loc[:, "last"], t.loc[:, "waited_for_ms_per_step"] = 16, [4, 12], [8.0, 10.0]
    assert A.straggler(t, 2) is None
    t.loc[:, "waited_for_ms_per_step"] = [0.5, 25.0]          # measured in a real run: 98% of the waiting
    assert A.straggler(t, 2)["rank"] == 1


def test_straggler_among_eight_ranks(tmp_path):
    """dashboard.data.synth: rank 3's backward is 3 ms slower on 8 ranks with jitter. Every other
    rank also makes the rest wait a little now and then, so rank 3 causes well under 2/3 of all
    waiting — it is compared with the runner-up, and named."""
    from syncviz.dashboard.data.synth import write_synth_run
    run = load_run(write_synth_run(tmp_path / "s", world=8, steps=12, n_buckets=10, straggler=3, straggle_ms=3))
    s = A.run_summary(run)
    assert s["straggler"] == 3
    table = {r["rank"]: r for r in s["stragglers"]}
    assert table[3]["waited_for_ms_per_step"] >= 2 * max(r["waited_for_ms_per_step"] for k, r in table.items() if k != 3)
    run = load_run(write_synth_run(tmp_path / "n", world=8, steps=12, n_buckets=10))
    assert A.run_summary(run)["straggler"] is None
