"""The whole-run tables kept beside a run (views/runcache.py) and the dashboard reading them
(dashboard/data/loaded.py): a cached number must be the computed number, for exactly those files,
or not be used at all."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from syncviz.dashboard.data.loaded import PERSISTED, LoadedRun
from syncviz.views import runcache as RC

ROOT = Path(__file__).resolve().parents[1]


def fresh_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(RC.CACHE_DIR))
    return dst


def loaded(path: Path) -> LoadedRun:
    run = LoadedRun(path.name, path, RC.signature(path))
    run._write_async = False       # writes in place, so the test sees them
    return run


def frame_examples() -> dict[str, pd.DataFrame]:
    return {
        "range": pd.DataFrame({"a": [1, 2, 3], "b": [0.5, np.nan, 2.0], "s": ["x", "y", "z"]}),
        "named-int-columns": pd.DataFrame(np.arange(6.0).reshape(2, 3), index=pd.Index([0, 1], name="rank", dtype="int32"),
                                          columns=pd.Index([3, 4, 5], name="step")),
        "multi": pd.DataFrame({"v": [1.0, 2.0]}, index=pd.MultiIndex.from_tuples([("all_gather", 0), ("all_reduce", 1)],
                                                                                  names=["op", "bucket"])),
        "categorical": pd.DataFrame({"k": pd.Categorical(["bucket", "step", "bucket"]), "n": [1, 2, 3]}),
        "empty": pd.DataFrame({"a": pd.Series([], dtype=np.int64)}),
    }


def test_values_read_back_equal(tmp_path):
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    cache = RC.RunCache(run, RC.signature(run))
    value = {"step_ms": np.float64(1.5), "n": np.int64(3), "nan": float("nan"), "none": None,
             "rows": [{"rank": 0, "late": 0.25}], "text": "ok"}
    assert cache.put("summary", value)
    frames = frame_examples()
    for key, df in frames.items():
        assert cache.put(key, df), key
    assert cache.put("pair", (frames["range"], frames["multi"]))
    again = RC.RunCache(run, RC.signature(run))
    back = again.get("summary")
    assert back["step_ms"] == 1.5 and back["n"] == 3 and type(back["n"]) is int and np.isnan(back["nan"])
    assert back["rows"] == [{"rank": 0, "late": 0.25}] and back["none"] is None
    for key, df in frames.items():
        pd.testing.assert_frame_equal(again.get(key), df, check_exact=True)
    a, b = again.get("pair")
    pd.testing.assert_frame_equal(a, frames["range"])
    pd.testing.assert_frame_equal(b, frames["multi"])
    assert again.get("never-written") is None


def test_one_steps_rows_are_read_from_their_row_groups_alone(tmp_path, monkeypatch):
    """get_rows (the Replay's step table of one step): the rows a filter of the whole frame gives,
    in its order, from the row groups that may hold the value; None for a frame kept in one big
    group (an older syncviz's), for a damaged file, and for a stale cache."""
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    monkeypatch.setattr(RC, "ROW_GROUP_ROWS", 5)
    rng = np.random.default_rng(0)
    steps = pd.DataFrame({"rank": np.tile(np.arange(3), 9), "step": np.repeat(np.arange(9) * 2, 3),
                          "step_ns": rng.integers(0, 10**9, 27), "overlap_pct": rng.random(27)})
    steps.loc[4, "overlap_pct"] = np.nan
    cache = RC.RunCache(run, RC.signature(run))
    assert cache.put("steps", steps)
    import pyarrow.parquet as pq
    from syncviz.views import cacherows
    assert pq.ParquetFile(run / RC.CACHE_DIR / "steps.parquet").num_row_groups == 6
    read = []
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, i, _r=pq.ParquetFile.read_row_group, **kw:
                        read.append(i) or _r(self, i, **kw))
    monkeypatch.setattr(cacherows, "KEEP_GROUPS", 4)
    again = RC.RunCache(run, RC.signature(run))
    for step in [0, 2, 4, 16, 3, 99, 10, 0]:
        want = steps[steps["step"] == step].reset_index(drop=True)
        pd.testing.assert_frame_equal(again.get_rows("steps", "step", step), want, check_exact=True)
    # groups of 5 rows hold steps 0-2, 2-6, 6-8, 10-12, 14-16 and 16: step 2's rows span two, as step
    # 16's; the last 4 groups read stay decoded, so step 10's group puts out group 0, read again for step 0
    assert read == [0, 1, 4, 5, 3, 0]
    changed = steps.assign(step_ns=steps["step_ns"] + 1)       # kept again: read from the new file
    assert again.put("steps", changed)
    pd.testing.assert_frame_equal(again.get_rows("steps", "step", 4), changed[changed["step"] == 4].reset_index(drop=True),
                                  check_exact=True)
    assert again.get_rows("never-written", "step", 0) is None
    monkeypatch.setattr(RC, "ROW_GROUP_ROWS", 100)             # kept in one group of 27 rows (older syncviz) ...
    assert cache.put("steps", steps)
    monkeypatch.setattr(RC, "ROW_GROUP_ROWS", 5)               # ... more than 4 x 5: read whole instead
    assert RC.RunCache(run, RC.signature(run)).get_rows("steps", "step", 4) is None
    (run / RC.CACHE_DIR / "steps.parquet").write_bytes(b"PAR1 truncated")
    assert RC.RunCache(run, RC.signature(run)).get_rows("steps", "step", 4) is None
    assert cache.put("steps", steps)
    rank = next(run.glob("rank-*.arrow"))
    os.utime(rank, ns=(rank.stat().st_atime_ns, rank.stat().st_mtime_ns + 1_000_000))
    assert RC.RunCache(run, RC.signature(run)).get_rows("steps", "step", 4) is None


def test_some_columns_of_a_kept_frame_are_read_alone(tmp_path, monkeypatch):
    """get_columns (the Ratios page's step columns): exactly those columns of what get gives, in the
    order asked, read from the file without the others; None for a column the frame lacks, a
    damaged file and a stale cache."""
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    rng = np.random.default_rng(1)
    steps = pd.DataFrame({"rank": np.tile(np.arange(3), 4), "step": np.repeat(np.arange(4), 3),
                          "step_ns": rng.integers(0, 10**9, 12), "overlap_pct": rng.random(12),
                          "name": list("abcdefghijkl")})
    steps.loc[5, "overlap_pct"] = np.nan
    cache = RC.RunCache(run, RC.signature(run))
    assert cache.put("steps", steps)
    read = []
    monkeypatch.setattr(pd, "read_parquet", lambda path, _r=pd.read_parquet, **kw: read.append(kw.get("columns")) or _r(path, **kw))
    again = RC.RunCache(run, RC.signature(run))
    for cols in (["step", "overlap_pct"], ["name", "rank"], ["step"]):
        pd.testing.assert_frame_equal(again.get_columns("steps", cols), again.get("steps")[cols], check_exact=True)
    assert read == [["c1", "c3"], None, ["c4", "c0"], None, ["c1"], None]     # get_columns' reads, then get's
    assert again.get_columns("steps", ["step", "no such column"]) is None
    assert again.get_columns("never-written", ["step"]) is None
    (run / RC.CACHE_DIR / "steps.parquet").write_bytes(b"PAR1 truncated")
    assert RC.RunCache(run, RC.signature(run)).get_columns("steps", ["step"]) is None
    assert cache.put("steps", steps)
    rank = next(run.glob("rank-*.arrow"))
    os.utime(rank, ns=(rank.stat().st_atime_ns, rank.stat().st_mtime_ns + 1_000_000))
    assert RC.RunCache(run, RC.signature(run)).get_columns("steps", ["step"]) is None


def test_values_that_do_not_round_trip_are_not_cached(tmp_path):
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    cache = RC.RunCache(run, RC.signature(run))
    assert not cache.put("tuple", {"steps": (1, 2)})          # JSON would give a list back
    assert not cache.put("int-keys", {1: "a"})                # JSON would give "1" back
    assert not cache.put("object", {"x": object()})
    assert cache.get("tuple") is None and cache.get("int-keys") is None and cache.get("object") is None


def test_any_change_to_the_files_the_path_or_syncviz_makes_the_cache_stale(tmp_path, monkeypatch):
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    cache = RC.RunCache(run, RC.signature(run))
    assert cache.put("summary", {"step_ms": 1.0})
    assert RC.RunCache(run, RC.signature(run)).get("summary") == {"step_ms": 1.0}
    # a rank file rewritten (same size, later mtime)
    rank = next(run.glob("rank-*.arrow"))
    st = rank.stat()
    os.utime(rank, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert RC.RunCache(run, RC.signature(run)).get("summary") is None
    # recomputed and written again: the old entries are gone with the old stamp
    fresh = RC.RunCache(run, RC.signature(run))
    assert fresh.put("steps", pd.DataFrame({"a": [1]}))
    assert RC.RunCache(run, RC.signature(run)).get("summary") is None
    # the same files elsewhere (copied with their mtimes): the cache names the old path
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    assert RC.RunCache(moved, RC.signature(moved)).get("steps") is None
    # other syncviz code
    assert RC.RunCache(run, RC.signature(run)).get("steps") is not None
    monkeypatch.setattr(RC, "code_digest", lambda: "some-other-build")
    assert RC.RunCache(run, RC.signature(run)).get("steps") is None


def test_unwritable_or_damaged_cache_means_computing_again(tmp_path):
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    (run / RC.CACHE_DIR).write_text("not a folder")           # as root, permissions would not stop a write
    cache = RC.RunCache(run, RC.signature(run))
    assert not cache.put("summary", {"a": 1}) and cache.get("summary") is None
    (run / RC.CACHE_DIR).unlink()
    cache = RC.RunCache(run, RC.signature(run))
    assert cache.put("steps", pd.DataFrame({"a": [1, 2]}))
    (run / RC.CACHE_DIR / "steps.parquet").write_bytes(b"PAR1 truncated")
    assert RC.RunCache(run, RC.signature(run)).get("steps") is None
    # a LoadedRun over the damaged cache computes the table and gives the true one
    first = loaded(run)
    truth = first.step_table()
    pd.testing.assert_frame_equal(loaded(run).step_table(), truth)


@pytest.mark.parametrize("src", ["tests/data/ddp-2rank", "tests/data/zero2", "tests/data/straggler",
                                 "tests/data/truncated-rank", "traces/sim-gpt2-medium-128"])
def test_cached_tables_equal_computed_ones_and_need_no_events(tmp_path, src):
    run = fresh_copy(ROOT / src, tmp_path / "run")
    cold = loaded(run)
    assert cold._opened
    assert not cold.warm()
    computed = {k: getattr(cold, m)() for k, m in METHODS.items()}
    warm = loaded(run)
    assert not warm._opened, "the facts were cached: the events should not be read for whole-run tables"
    assert warm.problems == cold.problems and warm.incomplete_ranks == cold.incomplete_ranks
    assert warm.step_list.tolist() == cold.step_list.tolist() and warm.ranks == cold.ranks
    assert warm._extents == cold._extents and warm.n_buckets == cold.n_buckets
    for key, method in METHODS.items():
        same(getattr(warm, method)(), computed[key], key)
    assert not warm._opened, "every page table came from the cache"
    assert set(METHODS) | {"facts"} == set(PERSISTED)
    # the replay's first step is read alone from the rank files: the same tables as sliced from all events
    step = warm.start_step
    alone = warm.step_view(step)
    assert alone.source == "step analysed alone"
    whole = cold.step_view(step)
    for key in ("compute", "comm", "exposed", "steps", "step_spread", "lateness"):
        same(alone.get(key).reset_index(drop=True), whole.get(key).reset_index(drop=True), f"step {step} {key}")


@pytest.mark.parametrize("src", ["tests/data/ddp-2rank", "tests/data/zero2", "tests/data/straggler",
                                 "tests/data/truncated-rank", "traces/sim-gpt2-medium-128"])
def test_partitioned_summary_keeps_what_the_dashboard_computes(tmp_path, src):
    """`syncviz summary` (by partitions of ranks: here one rank each, so every combination runs)
    keeps the step index, summary, step table and lateness map under the dashboard's keys; each equals what the
    dashboard computes from the whole run, exactly (types included)."""
    from syncviz.analysis.partitioned import summarize
    run = fresh_copy(ROOT / src, tmp_path / "a" / "run")
    sig = RC.signature(run)
    assert RC.put_summary(run, summarize(run, jobs=1, target_events=1, compare=True), sig)
    kept = RC.RunCache(run, RC.signature(run))
    cold = loaded(fresh_copy(ROOT / src, tmp_path / "b" / "run"))
    assert cold._opened
    assert RC._same(cold._facts(), kept.get("facts"))
    same(cold.summary(), kept.get("summary"), "summary")
    same(kept.get("steps"), cold.step_table(), "steps")
    same(kept.get("time_split"), cold.time_split(), "time_split")       # the Strategies page's split of a step
    ref = cold.rank_skew()
    if len(ref):
        same(kept.get("rank_skew"), ref, "rank_skew")     # Ratios' rank × step lateness map
    else:
        assert kept.get("rank_skew") is None or not len(kept.get("rank_skew"))
    same_stats(kept.get("bucket_stats"), cold.bucket_stats())    # the Buckets page's distributions
    # the Strategies page's (the cold run is a copy elsewhere: its path differs, nothing else)
    assert kept.get("comparison")["path"] == str(run)
    same({**kept.get("comparison"), "path": ""}, {**cold.comparison(), "path": ""}, "comparison")
    same(kept.get("op_bytes"), cold.op_bytes(), "op_bytes")
    for k, r, what in zip(kept.get("distributed"), cold.distributed(), ("rank_breakdown", "collective_kinds")):
        same(k, r, what)          # the Distributed page's, from the partitions
    warm = loaded(run)
    assert not warm._opened and warm.summary() == cold.summary()
    assert warm.partial is None and not warm._opened
    same_stats(warm.bucket_stats(), cold.bucket_stats())
    same({**warm.comparison(), "path": ""}, {**cold.comparison(), "path": ""}, "comparison")
    same(warm.op_bytes(), cold.op_bytes(), "op_bytes")
    same(warm.time_split(), cold.time_split(), "time_split")
    assert "steps" not in warm._cache, "the time split was kept: no step table read for it"
    for k, r, what in zip(warm.distributed(), cold.distributed(), ("rank_breakdown", "collective_kinds")):
        same(k, r, what)
    assert not warm._opened, "the Buckets, Strategies and Distributed pages' tables came from what the summary kept"


def same_stats(kept: tuple, ref: tuple) -> None:
    """bucket_stats kept by the summary against the dashboard's whole-run one: quantiles, counts,
    index and types exactly; the mean to the last bits (spill.group_quantiles: a correctly rounded
    sum where pandas adds with Kahan's compensation)."""
    assert kept is not None and len(kept) == len(ref) == 4
    for k, r, what in zip(kept[:3], ref[:3], ("duration", "busbw", "launch delay")):
        pd.testing.assert_frame_equal(k.drop(columns="mean"), r.drop(columns="mean"), check_exact=True, obj=what)
        np.testing.assert_allclose(k["mean"].to_numpy(), r["mean"].to_numpy(), rtol=1e-13, atol=0, err_msg=what)
    rows = [int(x["rows"].iloc[0]) if isinstance(x, pd.DataFrame) else x for x in (kept[3], ref[3])]
    assert rows[0] == rows[1] and isinstance(rows[1], int)


@pytest.mark.parametrize("src", ["tests/data/ddp-2rank", "tests/data/zero2", "tests/data/straggler",
                                 "tests/data/truncated-rank", "traces/sim-gpt2-medium-128"])
def test_summary_prints_the_same_report_from_the_cache(tmp_path, src):
    """`syncviz summary` a second time prints from what the first kept, byte for byte what a fresh
    summary prints, and says so on stderr; --fresh, and any change to the files, summarize again."""
    import subprocess
    import sys
    run = fresh_copy(ROOT / src, tmp_path / "run")

    def summary(*extra):
        p = subprocess.run([sys.executable, "-m", "syncviz", "summary", str(run), *extra],
                           capture_output=True, text=True, check=True)
        return p.stdout, "printed from" in p.stderr

    computed, cached = summary()
    assert not cached and (run / RC.CACHE_DIR / f"{RC.REPORT_KEY}-bucket_table.json").exists()
    again, cached = summary()
    assert cached and again == computed and "Verdict:" in again
    assert summary("--fresh") == (computed, False)
    os.utime(run / "rank-0.arrow", ns=(1, 1))       # the same bytes, another file: summarized again
    assert summary() == (computed, False)
    assert summary()[1]
    # --json always summarizes (a row per bucket event is not kept)
    assert json.loads(subprocess.run([sys.executable, "-m", "syncviz", "summary", "--json", str(run)],
                                     capture_output=True, text=True, check=True).stdout)["steps_table"]


def test_kept_report_needs_every_table(tmp_path):
    from syncviz.analysis.partitioned import summarize
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    sig = RC.signature(run)
    tables = summarize(run, jobs=1)
    assert RC.put_summary(run, tables, sig)
    kept = RC.kept_report(run, sig)
    for name in RC.REPORT_TABLES:
        same(getattr(kept, name), getattr(tables, name), name)
    same(kept.summary, tables.summary, "summary")
    (run / RC.CACHE_DIR / f"{RC.REPORT_KEY}-collective_table.json").unlink()
    assert RC.kept_report(run, sig) is None


def test_summary_keeps_nothing_for_files_that_changed_meanwhile(tmp_path):
    from syncviz.analysis.partitioned import summarize
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "run")
    sig = RC.signature(run)
    tables = summarize(run, jobs=1)
    os.utime(run / "rank-0.arrow", ns=(1, 1))       # a rank file rewritten while the summary ran
    assert not RC.put_summary(run, tables, sig)
    assert RC.RunCache(run, RC.signature(run)).get("facts") is None


METHODS = {"summary": "summary", "steps": "step_table", "bucket_stats": "bucket_stats", "rank_skew": "rank_skew",
           "time_split": "time_split", "op_bytes": "op_bytes", "comparison": "comparison", "distributed": "distributed"}


def same(a, b, what):
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=what)
    elif isinstance(a, tuple):
        assert len(a) == len(b), what
        for x, y in zip(a, b):
            same(x, y, what)
    else:
        assert RC._same(RC._plain_tree(b), json.loads(json.dumps(a, default=RC._plain))), what


def test_recording_runs_are_not_cached(tmp_path):
    run = fresh_copy(ROOT / "tests/data/truncated-rank", tmp_path / "run")
    meta = json.loads((run / "run.json").read_text())
    meta["finished"] = False
    (run / "run.json").write_text(json.dumps(meta))
    for f in run.iterdir():          # just written: still recording
        os.utime(f)
    live = loaded(run)
    assert live.recording
    live.summary()
    assert not (run / RC.CACHE_DIR).exists()


def test_finding_runs_skips_cache_folders_and_ends_link_cycles(tmp_path):
    from syncviz.trace import find_runs
    run = fresh_copy(ROOT / "tests/data/ddp-2rank", tmp_path / "root" / "a")
    decoy = run / RC.CACHE_DIR / "old"
    decoy.mkdir(parents=True)
    (decoy / "run.json").write_text("{}")                # not a run: inside a cache folder
    (tmp_path / "root" / "loop").symlink_to(tmp_path / "root", target_is_directory=True)
    assert find_runs(tmp_path / "root") == [run]
