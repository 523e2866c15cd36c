"""The step's record batch built with gradient-ready rows as arrays (record/columns.py) holds exactly
what the row-by-row build (before it, kept below as the reference) wrote: same rows, same order,
same values, on random steps (many parameters, micro-steps, buckets, collectives, repeated and
missing gradient stamps)."""
from __future__ import annotations

import random
from typing import Callable

import pyarrow as pa
import pytest

from syncviz.record.batch import build_batch, phase_at
from syncviz.record.events import BucketCall, CollectiveCall, GradReady, Phase
from syncviz.trace import events_to_batch
from syncviz.trace import schema as S


def rowwise_build_batch(step: int, *, phases: list[Phase], ready: list[tuple], buckets: list[BucketCall],
                collectives: list[CollectiveCall], base: int, world_size: int, step_start: int | None,
                param_name: Callable[[int], str],
                bucket_params: Callable[[int, int], list[int]]) -> dict[str, list]:
    """Columns of one step. ``base`` turns a local-clock stamp into the aligned clock (gradient-ready
    times are stamped locally, the hottest hook); ``bucket_params(layout, index)`` lists a bucket's
    parameter indices."""
    cols: dict[str, list] = {c: [] for c in S.EVENT_COLUMNS}
    append = [cols[c].append for c in S.EVENT_COLUMNS]

    def add(kind, name, start, end, micro=0, bucket=-1, op="", nbytes=0, dtype="", group_size=0,
            ready=-1, launch=-1, phase="", layout=-1, logical=0):
        for a, v in zip(append, (step, micro, kind, name, start, end, bucket, op, nbytes, dtype,
                                 group_size, ready, launch, phase, layout, logical)):
            a(v)

    spans = []   # (start, end, kind) for phase lookup
    for p in phases:
        add(p.kind, p.name, p.start, p.end, micro=max(p.micro, 0), layout=p.depth)
        spans.append((p.start, p.end, p.kind))
    ready_by: dict[tuple[int, int], int] = {}
    for r in map(GradReady._make, ready):    # hooks append plain tuples in GradReady's order
        t = r.t_local + base
        add(S.GRAD_READY, param_name(r.param), t, t, micro=max(r.micro, 0))
        key = (r.micro, r.param)
        ready_by[key] = max(ready_by.get(key, -1), t)
    # What each bucket's hook really sent (a compression hook sends less than the bucket holds):
    # the collectives issued inside it.
    # Its launch: the collective call inside the hook (DDP's default path stamps it; for another
    # hook the first collective issued inside the bucket), the hook entry when none was recorded.
    sent: dict[tuple[int, int], int] = {}
    sent_dtype: dict[tuple[int, int], str] = {}
    first_call: dict[tuple[int, int], int] = {}
    sent_op: dict[tuple[int, int], str] = {}       # DeepSpeed's ZeRO-3 buckets reduce-scatter
    for c in collectives:
        if c.bucket >= 0 and c.kind == S.COLLECTIVE:
            key = (c.micro, c.bucket)
            sent[key] = sent.get(key, 0) + c.nbytes
            sent_dtype.setdefault(key, c.dtype)
            if key not in first_call or c.launch < first_call[key]:
                first_call[key] = c.launch
            sent_op.setdefault(key, c.op)
    for b in buckets:
        last_ready = max((ready_by.get((b.micro, i), -1) for i in bucket_params(b.layout, b.index)), default=-1)
        key = (max(b.micro, 0), b.index)
        add(S.BUCKET, b.hook, b.launch, b.done, micro=max(b.micro, 0), bucket=b.index, op=sent_op.get(key, "all_reduce"),
            nbytes=sent.get(key, b.nbytes), dtype=sent_dtype.get(key, b.dtype), group_size=world_size,
            ready=last_ready, launch=b.issued if b.issued >= 0 else max(first_call.get(key, b.launch), b.launch),
            phase=phase_at(b.launch, spans), layout=b.layout,
            logical=b.nbytes)
    for c in collectives:
        add(c.kind, c.name, c.launch, c.done, micro=c.micro, bucket=c.bucket, op=c.op, nbytes=c.nbytes,
            dtype=c.dtype, group_size=c.group_size, ready=c.ready, launch=c.launch,
            phase=c.phase or phase_at(c.launch, spans), layout=c.layout,
            logical=c.nbytes if c.logical_bytes < 0 else c.logical_bytes)
    starts = [s for s in cols["start_ns"] if s >= 0]
    if starts:
        add(S.STEP, "step", step_start if step_start is not None else min(starts), max(cols["end_ns"]))
    return cols



def _step(rng: random.Random, nparams: int, micros: int):
    phases, ready, buckets, collectives = [], [], [], []
    t = 1_000
    for m in range(micros):
        phases.append(Phase(S.FORWARD, "forward", t, t + 500, m))
        phases.append(Phase(S.BACKWARD, "backward", t + 500, t + 5_000, m))
        for p in rng.sample(range(nparams), rng.randint(0, nparams)):
            for _ in range(rng.choice((1, 1, 1, 2))):          # a parameter used twice is stamped twice
                ready.append((p, t + rng.randint(500, 5_000), m if rng.random() > 0.05 else -1))
        if rng.random() < 0.3:                                  # an engine's stamp for an unindexed parameter
            ready.append((-1, t + rng.randint(500, 5_000), m))
        for b in range(rng.randint(0, 4)):
            launch = t + rng.randint(500, 5_000)
            call = BucketCall(b, rng.choice((0, 1)), launch, 4096 * (b + 1), "float32", "allreduce", m,
                              done=launch + rng.randint(0, 900), issued=rng.choice((-1, launch + 5)))
            buckets.append(call)
            if rng.random() < 0.5:
                collectives.append(CollectiveCall(S.COLLECTIVE, "all_reduce", "all_reduce", m, launch + 7, 2048, "float16",
                                                  2, bucket=b, done=launch + 300))
        t += 6_000
    phases.append(Phase(S.OPTIMIZER, "SGD", t, t + 200, micros - 1, 0))
    return phases, ready, buckets, collectives


@pytest.mark.parametrize("seed", range(12))
def test_array_build_equals_rowwise_build(seed):
    rng = random.Random(seed)
    nparams = (1, 7, 300, 1200)[seed % 4]     # both builds: row by row below columns.ARRAY_ROWS, arrays above
    phases, ready, buckets, collectives = _step(rng, nparams, rng.randint(1, 4))
    layout = {(lay, b): rng.sample(range(-1, nparams + 3), rng.randint(0, min(nparams, 40))) for lay in (0, 1) for b in range(4)}
    kw = dict(phases=phases, ready=ready, buckets=buckets, collectives=collectives, base=rng.randint(-900, 10**9),
              world_size=2, step_start=rng.choice((None, 900)), param_name=lambda i: f"layer.{i}.weight",
              bucket_params=lambda lay, b: layout[(lay, b)])
    got = build_batch(5, **kw).to_batch()
    want = events_to_batch(rowwise_build_batch(5, **kw))
    assert got.schema == want.schema
    assert got.to_pydict() == want.to_pydict()
    assert sum(k == S.GRAD_READY for k in got.column("kind").to_pylist()) == len(ready)


def test_no_gradient_rows():
    phases = [Phase(S.FORWARD, "forward", 0, 10, 0)]
    kw = dict(phases=phases, ready=[], buckets=[], collectives=[], base=0, world_size=2, step_start=None,
              param_name=str, bucket_params=lambda lay, b: [])
    assert build_batch(0, **kw).to_batch().to_pydict() == events_to_batch(rowwise_build_batch(0, **kw)).to_pydict()
    assert isinstance(build_batch(0, **kw).to_batch(), pa.RecordBatch)


@pytest.mark.parametrize("kept_max", [512, 3])
def test_kept_columns_give_the_same_batches(monkeypatch, kept_max):
    """A steady loop's steps differ in their times only: their non-time columns are kept Arrow
    arrays (columns._REPEATING), reused from step to step. Every batch still equals the row-by-row
    build's, when the kept arrays are reused, when steps change shape, and when the store is full."""
    from syncviz.record import columns
    monkeypatch.setattr(columns, "_REPEATING", {})
    monkeypatch.setattr(columns, "_REPEATING_MAX", kept_max)
    for step in range(12):
        shape = random.Random(step // 4)          # four steps of one shape, then another shape
        phases, ready, buckets, collectives = _step(shape, 7, shape.randint(1, 3))
        shift = random.Random(100 + step).randint(0, 10**9)     # same shape, other times
        phases = [p._replace(start=p.start + shift, end=p.end + shift) for p in phases]
        kw = dict(phases=phases, ready=[(p, t + shift, m) for p, t, m in ready], buckets=buckets,
                  collectives=collectives, base=7, world_size=2, step_start=None,
                  param_name=lambda i: f"layer.{i}.weight", bucket_params=lambda lay, b: [0, 3, 5])
        kept = len(columns._REPEATING)
        got = build_batch(step, **kw).to_batch()
        assert got.to_pydict() == events_to_batch(rowwise_build_batch(step, **kw)).to_pydict()
        assert len(columns._REPEATING) <= kept_max
        if kept_max > 100 and step % 4:     # the shape's columns were all kept by its first step
            assert len(columns._REPEATING) == kept


def _steady_steps(count: int, shapes: int = 3, nparams: int = 7):
    """``count`` steps of ``shapes`` different shapes, interleaved, each with its own times."""
    for step in range(count):
        shape = random.Random(step % shapes)
        phases, ready, buckets, collectives = _step(shape, nparams, shape.randint(1, 3))
        shift = random.Random(100 + step).randint(0, 10**9)
        phases = [p._replace(start=p.start + shift, end=p.end + shift) for p in phases]
        yield build_batch(step, phases=phases, ready=[(p, t + shift, m) for p, t, m in ready], buckets=buckets,
                          collectives=collectives, base=7, world_size=2, step_start=None,
                          param_name=lambda i: f"layer.{i}.weight", bucket_params=lambda lay, b: [0, 3, 5])


@pytest.mark.parametrize("templates_max", [64, 2])
def test_written_steps_are_the_bytes_of_the_built_batches(tmp_path, monkeypatch, templates_max):
    """RankWriter.write_repeating (a steady loop's steps written as the kept message with new
    times) writes the very bytes pyarrow's stream writer writes for each built batch: steps of
    three shapes interleaved (a template hit after a miss of another shape), the template store
    cleared when full (templates_max 2 < 3 shapes), and steps whose gradient-ready rows are arrays
    (1,200 parameters) among them, three of one shape (hits: their key holds the rows' parameter
    and micro-step arrays) and one whose rows came in another order. A rank's file read while it
    is still open has every step written."""
    from syncviz.trace import write as W
    monkeypatch.setattr(W, "TEMPLATES_MAX", templates_max)
    fast, slow = W.RankWriter(tmp_path / "fast", 0), W.RankWriter(tmp_path / "slow", 0)
    steps = list(_steady_steps(14))
    grads = list(_steady_steps(3, shapes=1, nparams=1200))
    shuffled = next(_steady_steps(1, shapes=1, nparams=1200))
    shuffled.block[0].param[:] = shuffled.block[0].param[::-1].copy()    # same rows, another hook order
    steps[9:9] = grads[:2]
    steps[4:4] = [shuffled]
    steps.append(grads[2])
    written = []
    monkeypatch.setattr(W, "_write_all", lambda fd, data, real=W._write_all: (written.append(len(data)), real(fd, data)))
    for cols in steps:
        cols.write_to(fast)
        slow.write_step(cols.to_batch())
    assert fast._templates, "no step was written from a template"
    assert sum(n > 50_000 for n in written) >= (2 if templates_max > 2 else 1), "no gradient-array step from a template"
    assert len(fast._templates) <= templates_max
    from syncviz.trace.streams import read_bytes, stream_batches
    open_batches, problem = stream_batches(fast.path, read_bytes(fast.path))
    assert len(open_batches) == len(steps) and problem.startswith("not closed")
    fast.close()
    slow.close()
    assert fast.path.read_bytes() == slow.path.read_bytes()
    got = pa.ipc.open_stream(fast.path.read_bytes()).read_all()
    assert got.to_pydict() == pa.Table.from_batches([c.to_batch() for c in steps]).to_pydict()


def test_a_batch_with_null_times_gets_no_template():
    from syncviz.trace.ipc_template import BatchTemplate
    from syncviz.trace.write import TIME_COLUMNS
    batch = events_to_batch({"step": [1, 1], "kind": ["forward", "step"], "name": ["f", "s"],
                             "start_ns": [5, None], "end_ns": [6, 7]})
    assert BatchTemplate.of(batch, TIME_COLUMNS) is None
    ok = events_to_batch({"step": [1, 1], "kind": ["forward", "step"], "name": ["f", "s"],
                          "start_ns": [5, 4], "end_ns": [6, 7]})
    tpl = BatchTemplate.of(ok, TIME_COLUMNS)
    times = [[2, 2], [50, 40], [60, 70], [-1, -1], [-1, -1]]
    import numpy as np
    again = pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(tpl.message(np.array(times)))), S.EVENT_SCHEMA)
    assert [again.column(c).to_pylist() for c in TIME_COLUMNS] == times
    assert again.column("kind").to_pylist() == ["forward", "step"]
