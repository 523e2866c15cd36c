"""The rank files of a partition read as one table, as they are on disk, when validation would change
nothing in any of them: read.read_ranks' rows without its per-file casts.

read_ranks validates rank by rank: it decodes every dictionary-encoded column of every batch to the
schema's plain type (the recorder and the simulator write repeating columns as dictionaries) and
builds the invalid-row masks per file. On 84 files of the simulated 1,024-rank run (820,512 events)
that took 0.50 s, and turning its 84 tables into arrays 0.27 s more; reading the same files, unifying
each column's dictionaries and checking the same rules on the combined columns takes ~0.15 s.

The result is exactly read_ranks' only where it provably is: every schema column present with the
schema's value type, no null anywhere, no row validate.invalid_reasons would drop, and no step
written twice (validate.duplicate_steps). Anything else returns None, and the caller validates file
by file as before, so every problem is still named the same way.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from syncviz.trace import schema as S
from syncviz.trace import validate as V
from syncviz.trace import spans as SP
from syncviz.trace.streams import TraceError, read_bytes, stream_batches

_CHECKED = ("step", "start_ns", "end_ns", "ready_ns", "launch_ns", "bytes", "logical_bytes", "bucket")


def read_partition(files: dict[int, Path], index: dict | None = None):
    """(table, columns, problems, incomplete, errors): read_ranks' tables as one (rank column
    appended; columns dictionary-encoded where the files have them, one dictionary per column), the
    numeric columns it checked decoded to numpy (``columns``: the rank column and _CHECKED), and
    read_ranks' problems, incomplete ranks and errors; ``table`` is None when no file had a row. None
    instead when some file needs validation's repairs (or a type the files do not share)."""
    tables, problems, incomplete, errors, read = [], [], [], [], []
    for rank, path in files.items():
        try:
            data = read_bytes(path)
            batches, problem = stream_batches(path, data)
        except TraceError as e:
            errors.append((rank, str(e)))
            continue
        if problem:
            problems.append(f"rank {rank} incomplete: {path.name}: {problem}")
            incomplete.append(rank)
        if index is not None:
            index[rank] = None
        if not batches:
            continue
        t = pa.Table.from_batches(batches)
        if not _as_schema(t):
            return None
        t = t.select(list(S.EVENT_COLUMNS)).replace_schema_metadata(None)
        tables.append(t.append_column("rank", pa.array(np.full(t.num_rows, rank, dtype=np.int32))))
        read.append((rank, data, batches))
    if not tables:
        return None, {}, problems, incomplete, errors
    try:
        table = _one_chunk(pa.concat_tables(tables))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if any(_dictionary(table.column(c)).null_count for c in table.column_names if pa.types.is_dictionary(table.column(c).type)):
        return None
    cols = {c: values(table.column(c)) for c in _CHECKED + ("rank",)}
    batch_rows = np.array([b.num_rows for _, _, bs in read for b in bs], dtype=np.int64)
    if not batch_rows.all():        # an empty batch: validate.duplicate_steps' own rules
        return None
    ranges = _clean(table, cols, batch_rows)
    if ranges is None:
        return None
    if index is not None:
        at = 0
        for rank, data, batches in read:
            index[rank] = SP.index(data, batches, ranges[at:at + len(batches)])
            at += len(batches)
    return table, cols, problems, incomplete, errors


def _one_chunk(table: pa.Table) -> pa.Table:
    """Each column as one chunk, a dictionary column with one dictionary: the batches' dictionaries
    unified (the writers replace them batch by batch), or the values decoded where the unified one
    needs a wider index than the files' (240 steps in int8 indices: casting every batch's indices
    wider cost ~12 ms a column for 1,920 batches, decoding the one column 11 ms)."""
    cols = []
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            try:
                col = col.unify_dictionaries()
            except pa.ArrowInvalid:
                col = col.cast(col.type.value_type)
        cols.append(col.combine_chunks())
    return pa.table(cols, names=table.column_names)


def _dictionary(col: pa.ChunkedArray) -> pa.Array:
    return (col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()).dictionary


def _as_schema(t: pa.Table) -> bool:
    """Every schema column there, of the schema's type (as the values of a dictionary or plain), no
    null in a column (a dictionary's own values are checked once they are unified)."""
    for fld in S.EVENT_SCHEMA:
        if fld.name not in t.column_names:
            return False
        col = t.column(fld.name)
        typ = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if typ != fld.type or col.null_count:
            return False
    return True


def values(col: pa.ChunkedArray) -> np.ndarray:
    """A single-chunk column as numpy values (a dictionary column decoded by its indices)."""
    a = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if pa.types.is_dictionary(a.type):
        return a.dictionary.to_numpy(zero_copy_only=False)[a.indices.to_numpy(zero_copy_only=False)]
    return a.to_numpy(zero_copy_only=False)


def _kind_rows(col: pa.ChunkedArray, kinds) -> np.ndarray:
    a = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if pa.types.is_dictionary(a.type):
        hit = np.isin(np.asarray(a.dictionary.to_pylist(), dtype=object), np.asarray(kinds, dtype=object))
        return hit[a.indices.to_numpy(zero_copy_only=False)] if len(hit) else np.zeros(len(a), bool)
    return pc.is_in(a, value_set=pa.array(kinds, pa.string())).to_numpy(zero_copy_only=False)


def _clean(table: pa.Table, col: dict, batch_rows: np.ndarray) -> list | None:
    """Each batch's (lowest, highest) step when no row would be dropped by validation (invalid rows,
    a step in two batches of one file, a second step row of a (rank, step)); else None."""
    kind = table.column("kind")
    if any(m.any() for _, m in V.invalid_reasons(col, _kind_rows(kind, S.KINDS), _kind_rows(kind, (S.BUCKET,)))):
        return None
    step, rank = col["step"], col["rank"]
    starts = np.r_[0, np.cumsum(batch_rows)[:-1]]
    lo, hi = np.minimum.reduceat(step, starts), np.maximum.reduceat(step, starts)   # no empty batch: from_batches
    brank = rank[starts]
    if (lo == hi).all():       # a batch per step, as the recorder writes: each (rank, step) in one batch?
        if len(_pairs(brank, lo)) != len(lo):
            return None
    else:                      # packed batches: no (rank, step) in two of them
        key = _key(rank, step)
        batch = np.repeat(np.arange(len(batch_rows)), batch_rows)
        order = np.argsort(key, kind="stable")
        k, b = key[order], batch[order]
        if ((k[1:] == k[:-1]) & (b[1:] != b[:-1])).any():
            return None
    st = np.flatnonzero(_kind_rows(kind, (S.STEP,)))
    if len(_pairs(rank[st], step[st])) != len(st):
        return None
    return list(zip(lo.tolist(), hi.tolist()))


def _key(rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    rank = rank.astype(np.int64)
    return (rank - rank.min()) * (int(step.max()) + 1) + step.astype(np.int64) if len(step) else step.astype(np.int64)


def _pairs(rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The distinct (rank, step) pairs, as keys (few: batches or step rows)."""
    return np.unique(_key(rank, step)) if len(step) else step
