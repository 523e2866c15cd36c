"""Writer/reader: round trip, and every kind of damage gives one clear line (never a traceback)."""
import json
import subprocess
import sys

import pyarrow as pa
import pytest

from syncviz.trace import schema as S
from syncviz.trace import RankWriter, TraceError, load_run, write_json_atomic
from tracebuild import columns, ev, make_ddp_run


def test_round_trip(ddp_run):
    run = load_run(ddp_run)
    assert run.problems == [] and run.incomplete_ranks == []
    assert run.world_size == 2 and run.ranks == [0, 1]
    assert set(run.events["kind"].astype(str)) == {"step", "forward", "backward", "grad_ready", "bucket", "optimizer"}
    assert len(run.events) == 2 * 3 * 8
    assert list(run.layouts["param"][:2]) == ["fc2.weight", "fc1.weight"]


def _partial_run(tmp_path, steps=3, close=True):
    w = RankWriter(tmp_path, 0)
    for k in range(steps):
        w.write_step(columns([ev("step", 10 * k, 10 * k + 5, step=k)]))
    if close:
        w.close()
    write_json_atomic(tmp_path / S.RUN_FILE, {"schema": S.SCHEMA_VERSION, "name": "x", "world_size": 1})
    return tmp_path / "rank-0.arrow"


def test_truncated_file_keeps_complete_steps(tmp_path):
    path = _partial_run(tmp_path, steps=4)
    data = path.read_bytes()
    path.write_bytes(data[:-60])   # cut into the last batch (and the end-of-stream marker)
    run = load_run(tmp_path)
    assert sorted(run.events["step"].unique()) == [0, 1, 2]
    assert run.incomplete_ranks == [0]
    assert "rank 0 incomplete" in run.problems[0] and "truncated" in run.problems[0]


def test_unclosed_stream_is_reported(tmp_path):
    _partial_run(tmp_path, steps=2, close=False)
    run = load_run(tmp_path)
    assert sorted(run.events["step"].unique()) == [0, 1]
    assert run.incomplete_ranks == [0] and "not closed" in run.problems[0]


@pytest.mark.parametrize("damage, message", [
    (lambda d: d / "run.json", "missing"),
    (lambda d: (d / "run.json").write_text("{not json"), "corrupt JSON"),
    (lambda d: (d / "run.json").write_text(json.dumps({"schema": "syncviz-trace/9"})), "not supported"),
    (lambda d: (d / "run.json").write_text(json.dumps({"schema": "other/1"})), "no syncviz schema"),
    (lambda d: (d / "rank-0.arrow").write_bytes(b"garbage" * 10), "not an Arrow IPC stream"),
])
def test_damage_gives_one_clear_line(tmp_path, damage, message):
    _partial_run(tmp_path)
    target = damage(tmp_path)
    if target is not None and not isinstance(target, int):
        target.unlink()
    with pytest.raises(TraceError, match=message) as e:
        load_run(tmp_path)
    assert "\n" not in str(e.value)


def test_empty_rank_file(tmp_path):
    _partial_run(tmp_path)
    (tmp_path / "rank-1.arrow").write_bytes(b"")
    run = load_run(tmp_path)
    assert 1 in run.incomplete_ranks and any("empty" in p for p in run.problems)


def test_wrong_stream_version(tmp_path):
    _partial_run(tmp_path)
    sch = S.EVENT_SCHEMA.with_metadata({b"syncviz.schema": b"syncviz-trace/2"})
    with pa.OSFile(str(tmp_path / "rank-0.arrow"), "wb") as f, pa.ipc.new_stream(f, sch) as w:
        w.write_batch(sch.empty_table().to_batches()[0] if sch.empty_table().to_batches() else
                      pa.RecordBatch.from_pylist([], schema=sch))
    with pytest.raises(TraceError, match="not supported"):
        load_run(tmp_path)


def test_missing_dir(tmp_path):
    with pytest.raises(TraceError, match="no such run directory"):
        load_run(tmp_path / "nope")


def test_older_minor_version_without_a_column_is_read(tmp_path):
    # a writer that did not know `logical_bytes` yet: the reader fills the default
    fields = [f for f in S.EVENT_SCHEMA if f.name != "logical_bytes"]
    sch = pa.schema(fields, metadata=S.stream_metadata(0))
    row = {f.name: [S.EVENT_DEFAULTS[f.name]] for f in fields}
    row.update(kind=["step"], step=[0], start_ns=[0], end_ns=[5])
    with pa.OSFile(str(tmp_path / "rank-0.arrow"), "wb") as f, pa.ipc.new_stream(f, sch) as w:
        w.write_batch(pa.RecordBatch.from_pydict(row, schema=sch))
    write_json_atomic(tmp_path / "run.json", {"schema": S.SCHEMA_VERSION, "world_size": 1})
    run = load_run(tmp_path)
    assert run.events["logical_bytes"].tolist() == [0]


def test_cli_errors_are_one_line(tmp_path):
    for args in (["summary", str(tmp_path / "missing")], ["summary"], ["nonsense"]):
        p = subprocess.run([sys.executable, "-m", "syncviz", *args], capture_output=True, text=True)
        assert p.returncode != 0
        assert "Traceback" not in p.stderr, p.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text("{")
    p = subprocess.run([sys.executable, "-m", "syncviz", "summary", str(tmp_path / "bad")], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "corrupt JSON" in p.stderr


def test_summary_cli_on_hand_built_run(ddp_run):
    p = subprocess.run([sys.executable, "-m", "syncviz", "summary", str(ddp_run)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "50% of communication is exposed (10.00 of 20.00 ms per step), mostly bucket 1 after backward ends" \
        in " ".join(p.stdout.split())
    p = subprocess.run([sys.executable, "-m", "syncviz", "summary", "--json", str(ddp_run)], capture_output=True, text=True)
    data = json.loads(p.stdout)
    assert data["exposed_ms"] == 10.0 and data["overlap_pct"] == 50.0 and len(data["steps_table"]) == 6



def test_some_ranks_read_without_listing_the_folder(tmp_path):
    """load_events of some ranks finds rank-<r>.arrow by name (files_of) and falls back to listing the
    folder for a rank file named otherwise (rank-01.arrow is rank 1, as rank_files reads it)."""
    from syncviz.trace import read as R
    run = make_ddp_run(tmp_path / "r", world=3)
    assert R.files_of(run, [2, 0]) == {0: run / "rank-0.arrow", 2: run / "rank-2.arrow"}
    (run / "rank-1.arrow").rename(run / "rank-01.arrow")
    assert R.files_of(run, [1, 2]) == {1: run / "rank-01.arrow", 2: run / "rank-2.arrow"} == \
        {r: p for r, p in R.rank_files(run).items() if r in (1, 2)}
    assert R.files_of(run, [5]) == {}                       # no such rank: nothing, as before
    table, problems, _ = R.load_events(run, ranks=[1])
    assert problems == [] and set(table.column("rank").to_pylist()) == {1} and table.num_rows == 3 * 8
