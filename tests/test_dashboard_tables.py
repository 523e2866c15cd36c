"""Whole-run tables of the dashboard (dashboard/data/loaded.py, stepview.py): computed once per
run and shared between pages, or block by block, they give the numbers of the whole-run analysis."""
from __future__ import annotations

import pandas as pd

from syncviz import analysis as A
from syncviz.dashboard.data.synth import write_synth_run


def test_whole_run_tables_from_blocks_equal_whole_run_analysis(tmp_path, monkeypatch):
    """Blocks.table(key) (only that table per block) and the Ratios heat map from the blocks'
    lateness give the numbers of the whole-run analysis (blocks of 2 steps here)."""
    from syncviz.dashboard.data import stepview
    from syncviz.dashboard.data.store import RunStore
    monkeypatch.setattr(stepview, "BLOCK_ROWS", 2 * 4 * 12)
    write_synth_run(tmp_path / "s", world=4, steps=9, n_buckets=5, straggler=2, straggle_ms=3)
    run = RunStore(tmp_path).get("s")
    assert len(run.blocks.blocks) >= 4
    whole = run.run()
    pd.testing.assert_frame_equal(run.rank_skew(), A.rank_step_skew(whole))
    steps = run.step_table().sort_values(["step", "rank"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(steps, A.step_metrics(whole).sort_values(["step", "rank"]).reset_index(drop=True))


def test_shared_whole_run_tables_give_the_same_numbers(tmp_path):
    """The dashboard's summary, comparison and Distributed tables reuse one step_metrics /
    comm_metrics of the run: the same numbers as computing them alone."""
    from syncviz.analysis.distributed import collective_kinds, rank_breakdown
    from syncviz.dashboard.data.store import RunStore
    from syncviz.views import compare as CMP
    write_synth_run(tmp_path / "s", world=8, steps=6, n_buckets=6, straggler=3, straggle_ms=4)
    run = RunStore(tmp_path).get("s")
    whole = run.run()
    assert run.summary() == A.run_summary(whole)
    assert run.comparison() == CMP.run_comparison(whole)
    breakdown, kinds = run.distributed()
    pd.testing.assert_frame_equal(breakdown, rank_breakdown(whole.events))
    pd.testing.assert_frame_equal(kinds, collective_kinds(whole.events))
