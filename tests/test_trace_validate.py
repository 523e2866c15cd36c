"""The hardened reader on hand-built damage: counted and named, never dropped or doubled silently."""
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from syncviz import analysis as A
from syncviz.trace import schema as S
from syncviz.trace import TraceError, load_run, write_json_atomic
from tracebuild import columns, make_ddp_run, simple_step


def _rewrite_rank(run, rank, steps, drop=()):
    """Rewrite rank ``rank``'s stream from per-step column dicts (optionally without columns)."""
    batches = [pa.RecordBatch.from_pydict({c: v for c, v in s.items() if c not in drop}) for s in steps]
    sch = batches[0].schema.with_metadata(S.stream_metadata(rank))
    with pa.OSFile(str(run / S.rank_file(rank)), "wb") as sink, pa.ipc.new_stream(sink, sch) as w:
        for b in batches:
            w.write_batch(b.replace_schema_metadata(sch.metadata))


def _steps(n=3):
    return [columns(simple_step(k, 100 * k)) for k in range(n)]


def test_step_written_twice_is_counted_once(tmp_path):
    run = make_ddp_run(tmp_path / "r")
    before = A.run_summary(load_run(run))["step_ms"]
    steps = _steps()
    _rewrite_rank(run, 1, steps[:2] + [steps[1]] + steps[2:])
    r = load_run(run)
    s = A.run_summary(r)
    assert s["step_ms"] == before == 45.0      # not doubled
    assert any("step 1 written more than once; kept the first copy" in p for p in r.problems)
    assert len(r.events[(r.events["rank"] == 1) & (r.events["kind"] == "step")]) == 3


def test_invalid_rows_are_counted_not_silently_dropped(tmp_path):
    run = make_ddp_run(tmp_path / "r")
    steps = _steps()
    steps[1]["end_ns"][5] = steps[1]["start_ns"][5] - 1      # bucket 0 ends before it starts
    steps[2]["end_ns"][0] = 2 ** 62                          # overflowed summary before
    _rewrite_rank(run, 1, steps)
    r = load_run(run)
    line = next(p for p in r.problems if p.startswith("rank 1:"))
    assert "2 invalid rows ignored" in line and "1 end before start" in line and "1 time out of range" in line
    A.run_summary(r)                                         # no OverflowError


@pytest.mark.parametrize("col", ["step", "kind", "start_ns", "end_ns"])
def test_missing_required_column_is_named(tmp_path, col):
    run = make_ddp_run(tmp_path / "r", world=1)
    _rewrite_rank(run, 0, _steps(), drop=(col,))
    with pytest.raises(TraceError, match=f"required column '{col}' is missing"):
        load_run(run)


def test_one_bad_rank_file_leaves_the_others_readable(tmp_path):
    run = make_ddp_run(tmp_path / "r")
    _rewrite_rank(run, 1, _steps(), drop=("step",))
    (run / "layout-0.arrow").write_bytes(b"garbage" * 10)
    r = load_run(run)
    assert r.ranks == [0] and 1 in r.incomplete_ranks
    assert any("rank 1 unreadable" in p and "'step'" in p for p in r.problems)
    assert any(p.startswith("layout-0.arrow: unreadable") for p in r.problems)


@pytest.mark.parametrize("world", ["two", -1, 0, 10 ** 10, 1.5, True])
def test_untrusted_world_size(tmp_path, world):
    run = make_ddp_run(tmp_path / "r")
    meta = json.loads((run / "run.json").read_text())
    meta["world_size"] = world
    (run / "run.json").write_text(json.dumps(meta))
    r = load_run(run)      # 10^10 used to build set(range(world)): 15 GB
    assert r.world_size == 2 and any("world_size" in p for p in r.problems)


def test_world_size_larger_than_files_names_missing_ranks(tmp_path):
    run = make_ddp_run(tmp_path / "r")
    meta = json.loads((run / "run.json").read_text())
    meta["world_size"] = 4
    (run / "run.json").write_text(json.dumps(meta))
    r = load_run(run)
    assert "ranks 2, 3 wrote no file" in r.problems and r.incomplete_ranks == [2, 3]


def test_unfinished_run_says_where_it_stopped(tmp_path):
    run = make_ddp_run(tmp_path / "r")
    meta = json.loads((run / "run.json").read_text())
    meta["finished"] = False
    (run / "run.json").write_text(json.dumps(meta))
    p = (run / "rank-1.arrow")
    p.write_bytes(p.read_bytes()[:-8])          # rank 1 never closed its stream
    r = load_run(run)
    assert r.problems[0] == ("run did not finish (crashed, stopped, or still recording): rank 1 after step 2")


def test_run_json_is_world_readable(tmp_path):
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "run.json", {"a": 1})
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "run.json").st_mode & 0o777) == "0o644"


def test_truncated_under_a_reader_is_no_sigbus(tmp_path):
    # The reader holds no mapping of the files: truncating one after load leaves the tables valid.
    run = make_ddp_run(tmp_path / "r")
    r = load_run(run)
    for p in run.glob("rank-*.arrow"):
        os.truncate(p, 0)
    assert A.run_summary(r)["steps"] == 3


def test_cli_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    run = make_ddp_run(tmp_path / "r")
    (run / "run.json").write_text('{"schema": "syncviz-trace/1", "world_size": 2, "strategy_config": {}}')
    env = dict(os.environ, PYTHONPATH="")
    bad = tmp_path / "nope"
    p = subprocess.run([sys.executable, "-m", "syncviz.cli", "summary", str(bad)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "no such run directory" in p.stderr
    p = subprocess.run([sys.executable, "-m", "syncviz.cli", "export", "perfetto", str(run)], capture_output=True,
                       text=True, env=env, timeout=120)   # usage error (no -o): one line too
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "--output" in p.stderr


@pytest.mark.parametrize("debug", [False, True])
def test_unexpected_error_is_one_line_unless_debug(tmp_path, monkeypatch, capsys, debug):
    from syncviz.cli import main
    from syncviz.views import summary
    run = make_ddp_run(tmp_path / "r")

    def boom(*a, **k):
        raise RuntimeError("kaput\nsecond line")
    monkeypatch.setattr(summary, "print_summary", boom)
    with pytest.raises(SystemExit) as e:
        main((["--debug"] if debug else []) + ["summary", str(run)])
    err = capsys.readouterr().err
    assert e.value.code == 1
    assert err.strip().splitlines()[-1].startswith("syncviz: error: RuntimeError: kaput")
    assert ("Traceback (most recent call last)" in err) == debug
    if not debug:
        assert err.strip().count("\n") == 0


def test_the_lowest_ranks_layouts_alone(tmp_path):
    """load_layouts(lowest=True), what the dashboard reads to open a run from its cache: the layouts
    of the lowest rank that has any (analysis.bucket_map draws one rank's), found in rank order
    (layout-10 sorts before layout-2 by name) past damaged files; the same bucket map as all ranks'."""
    import pandas as pd
    from syncviz.trace import load_layouts
    run = make_ddp_run(tmp_path / "r", world=12)
    whole, _ = load_layouts(run)
    one, problems = load_layouts(run, lowest=True)
    assert one["rank"].unique().tolist() == [0] and not problems
    pd.testing.assert_frame_equal(one, whole[whole["rank"] == 0].reset_index(drop=True))
    pd.testing.assert_frame_equal(A.bucket_map(one), A.bucket_map(whole))
    (run / "layout-0.arrow").write_bytes(b"garbage" * 10)
    (run / "layout-1.arrow").write_bytes(b"")
    whole, _ = load_layouts(run)
    one, problems = load_layouts(run, lowest=True)
    assert one["rank"].unique().tolist() == [2] and [p.split(":")[0] for p in problems] == ["layout-0.arrow", "layout-1.arrow"]
    pd.testing.assert_frame_equal(A.bucket_map(one), A.bucket_map(whole))
