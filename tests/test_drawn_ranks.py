"""analysis.drawn_ranks (what the Replay analyses the drawn ranks of a big run's step with) against the
reference functions on the same events: compute_intervals, comm_metrics of every comm kind with each
collective's last launch over all ranks, exposed_intervals — every column, dtype and value equal, on
the frozen fixtures of real runs (DDP, ZeRO-2, a straggler), simulated DDP and ZeRO-3 runs, and a
hand-built run of the rows that take a branch of their own."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from syncviz import analysis as A
from syncviz import trace as T
from syncviz.analysis import drawn_ranks as DR
from syncviz.analysis import partitioned as PT
from syncviz.analysis import queueing as Q
from syncviz.trace import new_meta, write_run
from syncviz.trace import schema as S
from tracebuild import MS, columns, ev, simulated_run

DATA = Path(__file__).parent / "data"


def reference(events: pd.DataFrame, joined: pd.Series) -> tuple:
    intervals = (A.compute_intervals(events), A.comm_rows(events))
    return (intervals[0], A.comm_metrics(events, kinds=S.COMM_KINDS, joined=joined, intervals=intervals),
            A.exposed_intervals(events, intervals=intervals))


def joined_of(run: Path, tmp_path: Path) -> pd.Series:
    """Each collective's last launch over all ranks, as the summary keeps it for the Replay."""
    kept = tmp_path / f"replay-{run.name}"
    kept.mkdir(exist_ok=True)
    tables = PT.summarize(run, jobs=1, replay_dir=str(kept))
    return tables.replay["joined"].set_index(Q.EVENT_KEY)["last"].astype(float)


def assert_same(run: Path, joined: pd.Series, ranks: list[int], steps: tuple[int, int]) -> int:
    table, _, _ = T.load_events(run, ranks=ranks, steps=steps)
    new = DR.analyse(table, DR.Joined(joined))
    ref = reference(T.events_frame(table), joined)
    for a, b, what in zip(new, ref, ("compute", "comm", "exposed")):
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True,
                                      obj=f"{run.name} ranks {ranks} steps {steps}: {what}")
    return len(ref[1])


@pytest.mark.parametrize("name", ["ddp-2rank", "zero2", "straggler"])
def test_equal_to_the_reference_on_real_runs(name, tmp_path):
    run = DATA / name
    joined = joined_of(run, tmp_path)
    facts = PT.summarize(run, jobs=1).facts
    rows = 0
    for step in facts["steps"]:
        for ranks in ([0], facts["ranks"]):
            rows += assert_same(run, joined, ranks, (step, step + 1))
    assert rows > 0


@pytest.mark.parametrize("args", [["--model", "gpt2-medium", "--strategy", "ddp", "--bucket-cap-mb", "25"],
                                  ["--model", "gpt2-medium", "--strategy", "zero3"]])
def test_equal_to_the_reference_on_simulated_runs(args, tmp_path):
    run = simulated_run(tmp_path, "sim", *args, "--world-size", "8", "--steps", "3")
    joined = joined_of(run, tmp_path)
    for step in range(3):
        assert assert_same(run, joined, [0, 3, 5, 7], (step, step + 1)) > 0
    assert assert_same(run, joined, [2, 6], (0, 3)) > 0          # several steps at once


def _edge_run(path: Path) -> Path:
    """Two ranks, two steps, of the rows that take branches: an eval forward, a nested optimizer,
    gradient-ready rows that end backward compute, a bucket launched inside its row and one whose
    stamp lies outside it, a collective inside a bucket's hook, one identity called twice, a blocking
    host collective, a row that ends before it starts, and a step with no backward on rank 1."""
    by_rank = {}
    for r in range(2):
        d = 0.5 * r
        steps = []
        for k in range(2):
            t = 100 * k
            rows = [ev("step", t, t + 60 + d, step=k),
                    ev("forward", t, t + 10, step=k),
                    ev("eval_forward", t + 52, t + 55, step=k, name="eval"),
                    ev("optimizer", t + 45, t + 50 + d, step=k, name="Wrapper", layout=0),
                    ev("optimizer", t + 46, t + 49 + d, step=k, name="AdamW", layout=1),
                    ev("bucket", t + 16, t + 26 + d, step=k, bucket=0, op="all_reduce", nbytes=4_000_000,
                       ready_ms=t + 15, phase="backward", layout=0, dtype="bfloat16"),
                    ev("collective", t + 17, t + 25 + d, step=k, bucket=0, name="all_reduce", op="all_reduce",
                       nbytes=4_000_000, phase="backward"),
                    ev("bucket", t + 30, t + 40 + d, step=k, bucket=1, op="all_reduce", nbytes=2_000_000,
                       ready_ms=t + 29, phase="backward", layout=0),
                    ev("collective", t + 41, t + 44 + 2 * d, step=k, name="all_gather", op="all_gather",
                       nbytes=1_000_000, phase="optimizer"),
                    ev("collective", t + 44 + 2 * d, t + 45 + 2 * d, step=k, name="all_gather", op="all_gather",
                       nbytes=1_000_000, phase="optimizer"),
                    ev("collective", t + 56, t + 58, step=k, name="barrier" + S.BLOCKING, op="barrier"),
                    ev("collective", t + 59, t + 58, step=k, name="broken", op="broadcast")]
            if not (r == 1 and k == 1):
                rows += [ev("backward", t + 10, t + 32 + d, step=k),
                         ev("grad_ready", t + 15, t + 15, step=k, name="fc2.weight", bucket=0),
                         ev("grad_ready", t + 29 + d, t + 29 + d, step=k, name="fc1.weight", bucket=1)]
            cols = columns(rows)
            cols["launch_ns"][5] += MS                  # bucket 0 launched 1 ms after its hook began
            cols["launch_ns"][7] = cols["start_ns"][7] - MS   # a stamp before the row: the row's start
            steps.append(cols)
        by_rank[r] = steps
    meta = new_meta(path.name, 2, strategy="ddp", backend="gloo", device="cpu", engine="torch")
    meta["ranks"] = [{"rank": r, "host": "localhost", "pid": 1000 + r, "clock_offset_ns": 0, "clock_error_ns": 0}
                     for r in range(2)]
    return write_run(path, meta, by_rank, {})


def test_equal_to_the_reference_on_every_branch(tmp_path):
    run = _edge_run(tmp_path / "edge")
    joined = joined_of(run, tmp_path)
    for ranks in ([0], [1], [0, 1]):
        for steps in ((0, 1), (1, 2), (0, 2)):
            assert_same(run, joined, ranks, steps)
    table, _, _ = T.load_events(run, ranks=[1], steps=(1, 2))
    comp, comm, exposed = DR.analyse(table, DR.Joined(joined))
    assert "backward" not in set(comp["kind"]) and len(exposed)
    gathers = comm[comm["op"] == "all_gather"]
    assert len(gathers) == 2 and gathers["joined_ns"].notna().all()
    # a collective the summary did not match across ranks (not in ``joined``): no last launch, as the reference
    missing = joined.drop(index=joined.index[joined.index.get_level_values("name") == "all_gather"])
    assert_same(run, missing, [0, 1], (0, 2))
    table, _, _ = T.load_events(run, ranks=[0], steps=(0, 1))
    comm = DR.analyse(table, DR.Joined(missing))[1]
    assert comm.loc[comm["op"] == "all_gather", "joined_ns"].isna().all()
    assert np.isfinite(comm.loc[comm["kind"] == "bucket", "joined_ns"]).all()


def test_a_step_with_no_comm(tmp_path):
    by_rank = {r: [columns([ev("step", 0, 20), ev("forward", 0, 8), ev("backward", 8, 18), ev("optimizer", 18, 20)])]
               for r in range(2)}
    meta = new_meta("nocomm", 2, strategy="ddp", backend="gloo", device="cpu", engine="torch")
    run = write_run(tmp_path / "nocomm", meta, by_rank, {})
    joined = pd.Series([], dtype=float, index=pd.MultiIndex.from_arrays([[]] * len(Q.EVENT_KEY), names=Q.EVENT_KEY))
    table, _, _ = T.load_events(run, ranks=[0, 1], steps=(0, 1))
    comp, comm, exposed = DR.analyse(table, DR.Joined(joined))
    assert len(comp) == 6 and not len(comm) and not len(exposed)
    ref = reference(T.events_frame(table), joined)
    pd.testing.assert_frame_equal(comp.reset_index(drop=True), ref[0].reset_index(drop=True), check_exact=True)
    assert list(comm.columns) == list(ref[1].columns)
