"""Reading one step from where its batches lie (trace/spans.py): the same rows as reading each stream
from its start, on every layout syncviz writes (the recorder's one batch per step, the simulator's
replaced step dictionaries and its many-step batches), and no index at all where the rule that
makes it exact does not hold (a dictionary kept across batches, delta dictionaries)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from syncviz.model import simcore as SC
from syncviz.model import simtrace as ST
from syncviz.trace import read as R
from syncviz.trace import schema as S
from syncviz.trace import spans as SP
from test_simulate import cfg, two_tensor_profile
from tracebuild import make_ddp_run


def indexed(run: Path) -> dict:
    index: dict = {}
    tables, problems, _, errors = R.read_ranks(R.rank_files(run), index=index)
    assert tables and not errors
    return index


def same_step_reads(run: Path, index: dict, steps: list[tuple[int, int]]) -> None:
    for rng in steps:
        plain = R.load_events(run, steps=rng)
        fast = R.load_events(run, steps=rng, spans=index)
        assert fast[0].equals(plain[0]), rng
        assert fast[2] == plain[2], rng


def test_recorder_layout_one_batch_per_step(tmp_path):
    run = make_ddp_run(tmp_path / "ddp", steps=6)
    index = indexed(run)
    assert all(v is not None for v in index.values())
    prefix, rows = index[0]
    assert prefix > 0 and rows[:, 0].tolist() == list(range(6)) and (rows[:, 0] == rows[:, 1]).all()
    assert (rows[1:, 2] == rows[:-1, 3]).all(), "spans follow each other"
    same_step_reads(run, index, [(0, 1), (3, 4), (5, 6), (2, 5), (6, 9), (-3, 0)])


@pytest.mark.parametrize("per_batch", [1, 4])
def test_simulator_layouts(tmp_path, per_batch):
    """One batch per step with the step dictionary replaced in every batch, and 4 steps a batch."""
    tl = SC.Timeline(two_tensor_profile(), cfg(world_size=3, steps=9, jitter=SC.Jitter(seed=2)))
    meta = {"schema": S.SCHEMA_VERSION, "name": "t", "world_size": 3}
    run = tmp_path / "sim"
    ST.write(run, tl, meta, steps_per_batch=per_batch, workers=1)
    index = indexed(run)
    assert all(v is not None for v in index.values())
    assert len(index[1][1]) == (9 if per_batch == 1 else 3)
    same_step_reads(run, index, [(0, 1), (4, 5), (8, 9), (3, 7), (0, 9)])


def _stream(path: Path, dictionaries: list[list[str]], deltas: bool = False) -> list[pa.RecordBatch]:
    """A rank file whose ``name`` column is dictionary-encoded with the given dictionary per batch."""
    typ = pa.dictionary(pa.int8(), pa.string())
    fields = [pa.field(f.name, typ) if f.name == "name" else f for f in S.EVENT_SCHEMA]
    schema = pa.schema(fields).with_metadata(S.stream_metadata(0))
    batches = []
    opts = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=deltas)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema, options=opts) as w:
        for step, words in enumerate(dictionaries):
            cols = []
            for f in fields:
                if f.name == "name":
                    cols.append(pa.DictionaryArray.from_arrays(pa.array([len(words) - 1], pa.int8()), pa.array(words)))
                elif f.name == "step":
                    cols.append(pa.array([step], f.type))
                elif f.name in ("start_ns", "end_ns"):
                    cols.append(pa.array([step * 10], f.type))
                else:
                    cols.append(pa.array([S.EVENT_DEFAULTS[f.name]], f.type))
            b = pa.RecordBatch.from_arrays(cols, schema=schema)
            w.write_batch(b)
            batches.append(b)
    return batches


def test_a_dictionary_kept_across_batches_is_not_indexed(tmp_path):
    """Batch 2 reuses the dictionary replaced for batch 1 (not sent again): prefix + span would give
    it batch 0's dictionary, so the file is not indexed and steps are read from the start."""
    path = tmp_path / "rank-0.arrow"
    batches = _stream(path, [["a"], ["a", "b"], ["a", "b"], ["a", "b", "c"]])
    assert SP.index(path.read_bytes(), batches) is None
    same = [["x"], ["y"], ["z"]]                       # replaced every batch: exact, indexed
    batches = _stream(path, same)
    prefix, rows = SP.index(path.read_bytes(), batches)
    got = SP.read_spans(path, prefix, rows, (2, 3))
    assert len(got) == 1 and got[0][0] and got[0][1].equals(batches[2])


def test_delta_dictionaries_are_not_indexed_wrongly(tmp_path):
    path = tmp_path / "rank-0.arrow"
    batches = _stream(path, [["a"], ["a", "b"], ["a", "b", "c"]], deltas=True)
    found = SP.index(path.read_bytes(), batches)
    if found is not None:     # only if every batch decodes from its own span
        for i, b in enumerate(batches):
            assert SP.read_spans(path, found[0], found[1], (i, i + 1))[0][1].equals(b)


def test_truncated_file_indexes_its_complete_steps(tmp_path):
    run = make_ddp_run(tmp_path / "ddp", steps=5)
    f = run / S.rank_file(1)
    f.write_bytes(f.read_bytes()[: f.stat().st_size * 2 // 3])
    index = indexed(run)
    assert index[1] is not None and len(index[1][1]) < 5
    same_step_reads(run, index, [(0, 1), (2, 3), (4, 5)])


def test_a_file_changed_after_indexing_is_one_line(tmp_path):
    """(The run cache's stamp keeps an index only for the files it was taken from; this is the
    reader's own guard.) The changed rank is left out with one line, the others are read."""
    run = make_ddp_run(tmp_path / "ddp", steps=4)
    index = indexed(run)
    (run / S.rank_file(0)).write_bytes(b"\0" * 64)
    table, problems, incomplete = R.load_events(run, steps=(3, 4), spans=index)
    assert incomplete == [0] and any("changed since it was indexed" in p for p in problems)
    assert set(table.column("rank").to_pylist()) == {1}


def _both_ways(run: Path, rng, monkeypatch, spans=None):
    files = R.rank_files(run)
    at_once = R.read_ranks(files, rng, spans)
    with monkeypatch.context() as m:
        m.setattr(R, "_read_ranks_at_once", lambda *a: None)
        one_by_one = R.read_ranks(files, rng, spans)
    return at_once, one_by_one


def _same_read(a, b, what):
    ta = pa.concat_tables(a[0]) if a[0] else None
    tb = pa.concat_tables(b[0]) if b[0] else None
    assert (ta is None) == (tb is None), what
    if ta is not None:
        assert ta.equals(tb), what
    assert a[1:] == b[1:], what          # problems, incomplete ranks, errors: the same lines


@pytest.mark.parametrize("src", ["tests/data/ddp-2rank", "tests/data/zero2", "tests/data/straggler",
                                 "tests/data/truncated-rank", "traces/sim-gpt2-medium-128"])
def test_ranks_validated_at_once_give_what_rank_by_rank_gives(src, monkeypatch):
    run = Path(__file__).resolve().parents[1] / src
    index = indexed(run)
    steps = sorted(set(R.load_events(run)[0].column("step").to_pylist()))
    for rng in [(s, s + 1) for s in steps] + [(steps[0], steps[-1] + 1), (10 ** 6, 10 ** 6 + 1)]:
        for spans in (None, index):
            _same_read(*_both_ways(run, rng, monkeypatch, spans), f"{src} {rng}")


def test_every_damaged_run_reads_a_step_as_rank_by_rank(tmp_path, monkeypatch):
    """The fuzz matrix (tests/fuzzcases.py): damaged rows, types, duplicate steps, truncations.
    Where validation would change or name anything, the at-once read gives way to rank by rank."""
    import shutil
    from fuzzcases import STEPS, base_run, cases
    base, sizes = base_run(tmp_path / "base")
    n = 0
    for name, damage in cases(sizes):
        d = tmp_path / "runs" / name
        shutil.copytree(base, d)
        damage(d)
        if not R.rank_files(d):
            continue
        for rng in [(k, k + 1) for k in range(STEPS)] + [(0, STEPS)]:
            try:
                got = _both_ways(d, rng, monkeypatch)
            except Exception as e:            # then both ways must fail alike
                with monkeypatch.context() as m, pytest.raises(type(e)):
                    m.setattr(R, "_read_ranks_at_once", lambda *a: None)
                    R.read_ranks(R.rank_files(d), rng)
                continue
            _same_read(*got, f"{name} {rng}")
            n += 1
    assert n > 200
