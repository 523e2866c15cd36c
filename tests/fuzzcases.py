"""The damaged-run matrix of tests/test_fuzz.py: each case is (name, damage(run_dir)) applied to a
copy of a small hand-built run (tests/tracebuild.py). Generated, not listed: truncations at every
batch boundary of a rank stream and inside every batch, row damage of every kind on every event
column that matters, type swaps, run.json variants and broken optional files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa

from syncviz.trace import schema as S
from syncviz.trace import RankWriter, new_meta, write_json_atomic
from tracebuild import columns, simple_step

STEPS, WORLD = 4, 2
MS = 1_000_000


def base_run(path: Path) -> tuple[Path, list[int]]:
    """A 2-rank, 4-step DDP-like run; returns it and rank 1's stream size after each flush
    (schema, then one per step, then the end-of-stream marker): the batch boundaries."""
    path.mkdir(parents=True)
    sizes = []
    for r in range(WORLD):
        w = RankWriter(path, r)
        if r == 1:
            sizes.append(w.path.stat().st_size)
        for k in range(STEPS):
            w.write_step(columns(simple_step(k, 100 * k, straggle_ms=3.0 if r == 1 else 0.0)))
            if r == 1:
                sizes.append(w.path.stat().st_size)
        w.write_layout({"layout": [0, 0], "bucket": [0, 1], "param": ["fc2.weight", "fc1.weight"],
                        "param_index": [1, 0], "numel": [1_000_000, 500_000], "offset": [0, 0],
                        "dtype": ["float32", "float32"]})
        w.close()
        if r == 1:
            sizes.append(w.path.stat().st_size)
    meta = new_meta(path.name, WORLD, strategy="ddp", backend="gloo", device="cpu", engine="torch",
                    model={"params": 1_500_000, "bytes": 6_000_000, "grad_bytes": 6_000_000, "name": "mlp"},
                    ddp={"bucket_cap_mb": 25, "first_bucket_cap_mb": 1, "comm_hook": None,
                         "gradient_as_bucket_view": False},
                    finished=True, steps_recorded=STEPS,
                    ranks=[{"rank": r, "host": "localhost", "pid": 1000 + r, "clock_offset_ns": 0,
                            "clock_error_ns": 1000} for r in range(WORLD)])
    write_json_atomic(path / S.RUN_FILE, meta)
    return path, sizes


# ---------------------------------------------------------------------------- damage helpers

def _truncate(n):
    def f(d: Path):
        p = d / "rank-1.arrow"
        p.write_bytes(p.read_bytes()[:n])
    return f


def _rows(edit, schema=None):
    """Rewrite rank 1's stream with ``edit(list of per-step column dicts)`` (may change types)."""
    def f(d: Path):
        steps = [columns(simple_step(k, 100 * k, straggle_ms=3.0)) for k in range(STEPS)]
        steps = edit(steps)
        p = d / "rank-1.arrow"
        batches = [pa.RecordBatch.from_pydict(s) if schema is None else
                   pa.RecordBatch.from_pydict(s, schema=schema) for s in steps]
        sch = batches[0].schema.with_metadata(S.stream_metadata(1))
        with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_stream(sink, sch) as w:
            for b in batches:
                w.write_batch(b.replace_schema_metadata(sch.metadata))
    return f


def _typed(steps):
    """Per-step dicts as Arrow arrays of the schema's types (so one column can be swapped)."""
    return [{c: pa.array(s[c], type=S.EVENT_SCHEMA.field(c).type) for c in S.EVENT_COLUMNS} for s in steps]


def _set(col, row, value, typ=None, convert=None):
    """Set ``col`` of ``row`` (index in step 2's rows) to ``value``; with ``typ`` the column has that
    type in every batch (other values converted with ``convert``, str for strings)."""
    def edit(steps):
        steps = _typed(steps)
        for k, s in enumerate(steps):
            vals = s[col].to_pylist()
            if typ is not None:
                vals = [(convert or (str if pa.types.is_string(typ) else (lambda v: v)))(v) for v in vals]
            if k == 2:
                vals[row] = value
            s[col] = pa.array(vals, type=typ or S.EVENT_SCHEMA.field(col).type)
        return steps
    return _rows(edit)


def _drop_col(col):
    def edit(steps):
        return [{c: v for c, v in s.items() if c != col} for s in steps]
    return _rows(edit)


def _dup_step(k):
    def edit(steps):
        return steps[:k + 1] + [steps[k]] + steps[k + 1:]
    return _rows(edit)


def _dup_step_row(steps):
    s = steps[1]
    i = s["kind"].index("step")
    for c in s:
        s[c] = s[c] + [s[c][i]]
    return steps


def _meta(**changes):
    def f(d: Path):
        p = d / S.RUN_FILE
        m = json.loads(p.read_text())
        for k, v in changes.items():
            if v is _DEL:
                m.pop(k, None)
            elif "." in k:
                a, b = k.split(".")
                m[a][b] = v
            else:
                m[k] = v
        p.write_text(json.dumps(m))
    return f


_DEL = object()


def _write(name, data: bytes | None):
    def f(d: Path):
        p = d / name
        if data is None:
            p.unlink()
        else:
            p.write_bytes(data)
    return f


def _as_dir(name):
    def f(d: Path):
        p = d / name
        p.unlink()
        p.mkdir()
    return f


def _layout_truncated(d: Path):
    p = d / "layout-0.arrow"
    p.write_bytes(p.read_bytes()[:40])


def _remove_all_ranks(d: Path):
    for p in d.glob("rank-*.arrow"):
        p.unlink()


def _copy_rank(src, dst):
    def f(d: Path):
        shutil.copy(d / src, d / dst)
    return f


# ----------------------------------------------------------------------------- the matrix

def cases(sizes: list[int]) -> list[tuple[str, object]]:
    out = [("undamaged", lambda d: None)]
    # truncations at every batch boundary of rank 1's stream and inside each batch and the schema
    for i, n in enumerate(sizes):
        out.append((f"truncate-boundary-{i}@{n}", _truncate(n)))
    for a, b in zip([0] + sizes[:-1], sizes):
        for frac in (0.5,):
            out.append((f"truncate-inside-{a}-{b}@{frac}", _truncate(a + max(1, int((b - a) * frac)))))
    row_cases = {
        "end-before-start": _set("end_ns", 5, 40 * MS),            # bucket 0 of step 2 ends before it starts
        "null-end": _set("end_ns", 5, None),
        "null-step": _set("step", 1, None),
        "null-kind": _set("kind", 1, None),
        "time-2^62": _set("end_ns", 0, 2 ** 62),                   # the step row
        "time-2^63-1": _set("start_ns", 6, 2 ** 63 - 1),
        "negative-start": _set("start_ns", 1, -5 * MS),
        "bytes-negative": _set("bytes", 5, -4_000_000),
        "bytes-2^62": _set("bytes", 5, 2 ** 62),
        "unknown-kind": _set("kind", 2, "warp"),
        "step-minus-1": _set("step", 2, -1),
        "step-huge": _set("step", 2, 2 ** 62),
        "nan-start-float": _set("start_ns", 5, float("nan"), pa.float64()),
        "float-times-valid": _set("start_ns", 5, 216.0 * MS, pa.float64()),
        "fractional-time": _set("start_ns", 5, 216.5, pa.float64()),
        "step-as-string": _set("step", 0, "two", pa.string()),
        "kind-as-int": _set("kind", 0, 7, pa.int64(), S.KINDS.index),
        "bucket-int64-overflow": _set("bucket", 5, 2 ** 40, pa.int64()),
        "bytes-as-string": _set("bytes", 5, "lots", pa.string()),
        "duplicate-step-batch-0": _dup_step(0),
        "duplicate-step-batch-2": _dup_step(2),
        "duplicate-step-row": _rows(_dup_step_row),
        "dictionary-kind": _rows(lambda st: [{**s, "kind": pa.array(s["kind"]).dictionary_encode()} for s in st]),
        "extra-column": _rows(lambda st: [{**s, "surprise": [1] * len(s["step"])} for s in st]),
    }
    for c in ("step", "kind", "start_ns", "end_ns", "bucket", "bytes", "op"):
        row_cases[f"missing-column-{c}"] = _drop_col(c)
    out += list(row_cases.items())
    meta_cases = {
        "world-two": _meta(world_size="two"), "world-negative": _meta(world_size=-2),
        "world-zero": _meta(world_size=0), "world-10^10": _meta(world_size=10 ** 10),
        "world-float": _meta(world_size=1.5), "world-bool": _meta(world_size=True),
        "world-3-files-2": _meta(world_size=3), "world-1-files-2": _meta(world_size=1),
        "world-null": _meta(world_size=None), "world-missing": _meta(world_size=_DEL),
        "model-list": _meta(model=[1, 2]), "model-params-string": _meta(**{"model.params": "many"}),
        "model-params-huge": _meta(**{"model.params": 10 ** 30}),
        "ranks-dict": _meta(ranks={"0": 1}), "ranks-strings": _meta(ranks=["a", "b"]),
        "ranks-huge-offset": _meta(ranks=[{"rank": 0, "clock_error_ns": 10 ** 30}]),
        "ddp-string": _meta(ddp="yes"), "ddp-cap-string": _meta(**{"ddp.bucket_cap_mb": "big"}),
        "name-300": _meta(name="n" * 300), "name-newline": _meta(name="a\nb"), "name-int": _meta(name=5),
        "finished-string": _meta(finished="yes"), "finished-false": _meta(finished=False),
        "strategy-int": _meta(strategy=3), "strategy-unknown": _meta(strategy="zero9"),
        "param-shapes-garbage": _meta(strategy_config={"param_shapes": "x"}),
        "param-shapes-bad-values": _meta(strategy_config={"param_shapes": {"w": "abc"}}),
        "memory-garbage": _meta(memory=[{"params_bytes": "x"}]),
        "steps-recorded-string": _meta(steps_recorded="x"), "nodes-negative": _meta(nodes=-1),
        "schema-missing": _meta(schema=_DEL), "schema-v2": _meta(schema="syncviz-trace/2"),
        "runjson-array": _write("run.json", b"[1, 2]"), "runjson-empty": _write("run.json", b""),
        "runjson-garbage": _write("run.json", bytes(range(256))), "runjson-dir": _as_dir("run.json"),
        "runjson-deep": _write("run.json", b"[" * 100_000 + b"]" * 100_000),
    }
    out += list(meta_cases.items())
    file_cases = {
        "layout-garbage": _write("layout-0.arrow", b"\x00garbage" * 20), "layout-truncated": _layout_truncated,
        "layout-empty": _write("layout-0.arrow", b""),
        "rank1-garbage": _write("rank-1.arrow", b"\xff\xff\xff\xff" + bytes(range(200))),
        "rank1-missing": _write("rank-1.arrow", None), "rank1-empty": _write("rank-1.arrow", b""),
        "rank1-dir": _as_dir("rank-1.arrow"), "all-ranks-missing": _remove_all_ranks,
        "extra-rank-7": _copy_rank("rank-1.arrow", "rank-7.arrow"),
        "rank-huge-index": _copy_rank("rank-1.arrow", "rank-99999999999.arrow"),
        "layout-as-rank": _copy_rank("layout-0.arrow", "rank-1.arrow"),
    }
    out += list(file_cases.items())
    return out
