"""Validation of what the reader takes from disk: run.json fields and every event row.

A trace can be damaged (a rank killed mid-write, a file edited by hand, a second recording into the
same directory) or hostile. The rule: nothing is dropped or repaired silently. Rows the analysis
cannot use are removed *and counted* in one warning line (``Run.problems``); a step a rank wrote
twice keeps its first copy (a second copy would double the step's time); a run.json field of the
wrong type is named and ignored. Nothing is allocated from a size read from disk.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from syncviz.trace import schema as S

# Columns without which a row means nothing; a stream lacking one is refused, naming it.
REQUIRED_COLUMNS = ("step", "kind", "start_ns", "end_ns")
# Columns an older writer did not have: filled with their defaults without a warning (schema.py's
# EVENT_DEFAULTS). Any other missing column is damage: defaults are used and the rows counted.
COMPAT_COLUMNS = ("logical_bytes",)
# Times are ns since run start. 2^52 ns is 52 days: longer than any run, exact in float64, and far
# from int64 overflow when a few thousand intervals are summed (2^62 overflowed in summary).
MAX_TIME_NS = 2 ** 52
MAX_BYTES = 2 ** 50            # 1 PiB in one collective
MAX_STEP = 2 ** 40
MAX_WORLD = 1 << 20            # more ranks than any job; bounds every per-rank loop


class StreamError(Exception):
    """A rank stream that cannot be used at all (missing required column, unusable column type)."""


# ---------------------------------------------------------------------------------- run.json

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_meta(meta: dict, ranks_on_disk: list[int]) -> list[str]:
    """Validate run.json in place: wrong-typed optional fields are named and removed (readers fall
    back to their defaults); world_size is checked against the rank files. Returns problems."""
    problems = []
    typed = {"name": str, "strategy": str, "engine": str, "backend": str, "device": str,
             "model": dict, "ddp": dict, "ranks": list, "memory": (list, dict), "strategy_config": dict,
             "command": list, "created": str, "run_id": str, "finished": bool}
    for key, typ in typed.items():
        if key in meta and meta[key] is not None and not isinstance(meta[key], typ):
            want = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
            problems.append(f"run.json: {key} is {type(meta[key]).__name__}, expected {want}; ignored")
            del meta[key]
    if isinstance(meta.get("name"), str) and (len(meta["name"]) > 200 or "\n" in meta["name"]):
        meta["name"] = meta["name"].replace("\n", " ")[:200]
    for key in ("model", "ddp"):
        sub = meta.get(key)
        if isinstance(sub, dict):
            for k, v in list(sub.items()):
                if k in ("params", "bytes", "grad_bytes") and not (_is_int(v) and 0 <= v <= MAX_BYTES):
                    problems.append(f"run.json: {key}.{k} = {str(v)[:40]!r} is not a size; ignored")
                    del sub[k]
                elif k in ("bucket_cap_mb", "first_bucket_cap_mb") and v is not None and not (
                        isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1e9):
                    problems.append(f"run.json: {key}.{k} = {str(v)[:40]!r} is not a size; ignored")
                    del sub[k]
    for key in ("ranks", "memory"):
        if isinstance(meta.get(key), list):
            bad = [x for x in meta[key] if x is not None and not isinstance(x, dict)]
            if bad or len(meta[key]) > MAX_WORLD:
                problems.append(f"run.json: {key} entries are not objects; ignored")
                meta[key] = []
            else:
                meta[key] = [_clean_numbers(x) for x in meta[key]]
    for key in ("steps_recorded", "nodes"):
        v = meta.get(key)
        if v is not None and not (_is_int(v) and 0 <= v <= MAX_STEP):
            problems.append(f"run.json: {key} = {str(v)[:40]!r} is not a count; ignored")
            del meta[key]
    cfg = meta.get("strategy_config")
    shapes = cfg.get("param_shapes") if isinstance(cfg, dict) else None
    if shapes is not None and not (isinstance(shapes, dict) and len(shapes) <= 10 ** 6 and all(
            isinstance(v, list) and len(v) <= 16 and all(_is_int(x) and 0 <= x <= 2 ** 40 for x in v)
            for v in shapes.values())):
        problems.append("run.json: strategy_config.param_shapes is not {name: [dims]}; ignored")
        del cfg["param_shapes"]
    if isinstance(meta.get("memory"), list):
        for m in meta["memory"]:
            for k, v in list((m or {}).items()):
                if v is not None and not (_is_int(v) and 0 <= v <= MAX_BYTES) and k.endswith("_bytes"):
                    problems.append(f"run.json: memory {k} = {str(v)[:40]!r} is not a size; ignored")
                    m[k] = None
    top = max(ranks_on_disk, default=-1) + 1
    w = meta.get("world_size")
    if w is None:
        meta["world_size"] = top
    elif not (_is_int(w) and 1 <= w <= MAX_WORLD):
        problems.append(f"run.json: world_size = {str(w)[:40]!r} is not a rank count; using {top} from the rank files")
        meta["world_size"] = top
    elif w < top:
        problems.append(f"run.json: world_size {w} but rank files up to rank {top - 1}; using {top}")
        meta["world_size"] = top
    return problems


def _clean_numbers(d: dict | None) -> dict | None:
    """Per-rank dicts (clock offsets, memory): numbers outside int64-safe bounds become None."""
    if not isinstance(d, dict):
        return d
    out = {}
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            out[k] = v if isinstance(v, (str, type(None))) else None
        else:
            out[k] = v if abs(v) <= 2 ** 62 and v == v else None
    return out


# ---------------------------------------------------------------------------- event columns

def conform(table: pa.Table, schema: pa.Schema, defaults: dict) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """Cast ``table`` to ``schema``: missing optional columns get defaults; values that do not fit
    (null, NaN, fractional, out of the type's range) become the default and are returned as
    per-column masks so the caller can count them. Raises StreamError naming an unusable column."""
    n = table.num_rows
    cols, bad = [], {}
    for fld in schema:
        if fld.name not in table.column_names:
            if fld.name in REQUIRED_COLUMNS and schema.names[0] == "step":
                raise StreamError(f"required column '{fld.name}' is missing")
            cols.append(pa.array([defaults.get(fld.name)] * n, type=fld.type))
            if fld.name not in COMPAT_COLUMNS:
                bad[f"missing:{fld.name}"] = np.ones(n, bool)   # counted: the numbers use a default
            continue
        col = table.column(fld.name)
        arr, mask = _cast(col, fld.type, fld.name)
        if mask is not None and mask.any():
            bad[fld.name] = mask
            arr = pc.if_else(_like(mask, arr), pa.scalar(defaults.get(fld.name), fld.type), arr)
        cols.append(arr)
    return pa.Table.from_arrays(cols, schema=schema), bad


def _cast(col: pa.ChunkedArray, target: pa.DataType, name: str):
    src = col.type
    if pa.types.is_dictionary(src):
        col, src = col.cast(src.value_type), src.value_type
    nulls = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else None
    if src == target:
        return col, nulls
    if pa.types.is_integer(target) and (pa.types.is_integer(src) or pa.types.is_floating(src)
                                        or pa.types.is_boolean(src)):
        v = pc.cast(col, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        info = np.iinfo(target.to_pandas_dtype())
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(v) | (np.floor(v) != v) | (v < info.min) | (v >= float(info.max) + 1)
        if nulls is not None:
            bad |= nulls
        fixed = pc.if_else(_like(bad, col), pa.scalar(0, src) if not pa.types.is_boolean(src) else False, col)
        return pc.cast(fixed, target, safe=False), bad
    if pa.types.is_string(target) and (pa.types.is_string(src) or pa.types.is_large_string(src)
                                       or pa.types.is_integer(src) or pa.types.is_floating(src)
                                       or pa.types.is_boolean(src)):
        return pc.cast(col, target), nulls
    raise StreamError(f"column '{name}' has type {src}, expected {target}")


def _like(mask: np.ndarray, col):
    """A boolean mask chunked like ``col`` (batches stay batches: one batch is one step)."""
    if isinstance(col, pa.ChunkedArray):
        cuts = np.cumsum([len(c) for c in col.chunks])[:-1]
        return pa.chunked_array([pa.array(m) for m in np.split(mask, cuts)], type=pa.bool_())
    return pa.array(mask)


def _kind_in(kind: pa.ChunkedArray | pa.Array, values: tuple[str, ...]) -> np.ndarray:
    """Which rows' kind is one of ``values`` (null: no), in Arrow: converting the column to Python
    strings first cost 0.6 s of a 1.15M-event run's 1.1 s load (measured)."""
    hit = pc.is_in(kind, value_set=pa.array(values, pa.string()))
    if isinstance(hit, pa.ChunkedArray):
        hit = hit.combine_chunks()
    return hit.fill_null(False).to_numpy(zero_copy_only=False)


def invalid_rows(table: pa.Table, bad: dict[str, np.ndarray]) -> tuple[np.ndarray, Counter]:
    """Rows the analysis cannot use and why (a row counts once, under its first reason)."""
    n = table.num_rows
    col = {c: table.column(c).to_numpy() for c in ("step", "start_ns", "end_ns", "ready_ns", "launch_ns",
                                                    "bytes", "logical_bytes", "bucket")}
    kind = table.column("kind")
    required_bad = np.logical_or.reduce([bad[c] for c in REQUIRED_COLUMNS if c in bad] or [np.zeros(n, bool)])
    drop = np.zeros(n, bool)
    why: Counter = Counter()
    for reason, mask in invalid_reasons(col, _kind_in(kind, S.KINDS), _kind_in(kind, (S.BUCKET,)), required_bad):
        new = mask & ~drop
        if new.any():
            why[reason] += int(new.sum())
            drop |= new
    filled = sum(int(m.sum()) for c, m in bad.items() if c not in REQUIRED_COLUMNS and not c.startswith("missing:"))
    if filled:
        why["optional values unreadable (set to defaults)"] += filled
    missing = [c.split(":", 1)[1] for c in bad if c.startswith("missing:")]
    if missing:
        why[f"optional values missing (no column {', '.join(missing)}; defaults used)"] += n
    return drop, why


def invalid_reasons(col: dict[str, np.ndarray], known_kind: np.ndarray, bucket_kind: np.ndarray,
                    required_bad: np.ndarray | None = None) -> list[tuple[str, np.ndarray]]:
    """(reason, rows) for each reason a row is unusable, in the order invalid_rows counts them:
    ``col`` holds step, start_ns, end_ns, ready_ns, launch_ns, bytes, logical_bytes and bucket;
    ``known_kind`` / ``bucket_kind``: rows whose kind is one of schema.KINDS / is "bucket";
    ``required_bad``: rows with a null or non-numeric required value."""
    n = len(col["step"])
    return [
        ("null or non-numeric required value", required_bad if required_bad is not None else np.zeros(n, bool)),
        ("unknown kind", ~known_kind),
        ("bucket row without a bucket index", bucket_kind & (col["bucket"] < 0)),
        ("negative or huge step", (col["step"] < 0) | (col["step"] > MAX_STEP)),
        ("no start time", col["start_ns"] < 0),
        ("time out of range", (col["start_ns"] > MAX_TIME_NS) | (col["end_ns"] > MAX_TIME_NS)
         | (col["ready_ns"] > MAX_TIME_NS) | (col["launch_ns"] > MAX_TIME_NS)
         | (col["ready_ns"] < -1) | (col["launch_ns"] < -1)),
        ("end before start", col["end_ns"] < col["start_ns"]),
        ("bytes out of range", (col["bytes"] < 0) | (col["bytes"] > MAX_BYTES)
         | (col["logical_bytes"] < 0) | (col["logical_bytes"] > MAX_BYTES)),
    ]


def duplicate_steps(table: pa.Table) -> tuple[np.ndarray, list[int]]:
    """Rows of a step this rank already wrote in an earlier batch (a step written twice: keep the
    first copy) and extra "step" rows of one step. Fast path: one batch per step, all distinct."""
    n = table.num_rows
    steps = table.column("step").to_numpy()
    lengths = np.array([len(c) for c in table.column("step").chunks], dtype=np.int64)
    lengths = lengths[lengths > 0]
    drop = np.zeros(n, bool)
    if n and len(lengths):
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        lo, hi = np.minimum.reduceat(steps, starts), np.maximum.reduceat(steps, starts)
        if not ((lo == hi).all() and len(np.unique(lo)) == len(lo)):
            seen: set[int] = set()
            for s, ln in zip(starts.tolist(), lengths.tolist()):
                part = steps[s:s + ln]
                uniq = set(np.unique(part).tolist())
                dup = uniq & seen
                if dup:
                    drop[s:s + ln] = np.isin(part, list(dup))
                seen |= uniq
    is_step = _kind_in(table.column("kind"), (S.STEP,)) & ~drop
    if is_step.any():
        idx = np.flatnonzero(is_step)
        _, first = np.unique(steps[idx], return_index=True)
        extra = np.setdiff1d(idx, idx[first])
        drop[extra] = True
    return drop, sorted(set(steps[drop].tolist()))


def clean_rank_table(table: pa.Table, bad: dict[str, np.ndarray], rank: int) -> tuple[pa.Table, list[str]]:
    """Drop invalid and duplicate rows of one rank's table; one problem line per kind of damage."""
    problems = []
    drop, why = invalid_rows(table, bad)
    if drop.any():
        table = table.filter(pa.array(~drop))
    if why:
        dropped = sum(v for k, v in why.items() if not k.startswith("optional"))
        what = ", ".join(f"{v} {k}" for k, v in why.items())
        problems.append(f"rank {rank}: {dropped} invalid rows ignored ({what})" if dropped
                        else f"rank {rank}: {what}")
    dup, steps = duplicate_steps(table)
    if dup.any():
        table = table.filter(pa.array(~dup))
        shown = ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")
        problems.append(f"rank {rank}: step{'s' if len(steps) > 1 else ''} {shown} written more than once; "
                        f"kept the first copy ({int(dup.sum())} duplicate rows ignored)")
    return table, problems
