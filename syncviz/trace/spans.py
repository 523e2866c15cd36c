"""Where each record batch of a rank file lies, so that one step of a run too big to read whole is
read without reading every stream from its start.

A rank file is an Arrow IPC *stream*: a schema message, dictionary messages, then record batches
(one per step, as ``syncviz trace`` writes them). A batch decodes from the *prefix* (every message
before the first batch: the schema and the first dictionaries) followed by its *span*: the bytes
from the end of the previous batch to its own end, which hold any dictionary the writer replaced
for it (the simulator replaces its step dictionary every batch). The index is taken while a file is
read whole anyway (the partitioned summary's first pass) and kept in the run's cache, which is
valid for exactly those files (views/runcache.py); reading step 120 of a 1,024-rank run then costs
a seek per file instead of decoding 120 batches of each.

A file is indexed only when that rule provably holds for it: no dictionary messages after the
first batch, or the same number in every span and the last batch decodes from prefix + span to
exactly the batch the stream reader gave (a writer that keeps a replaced dictionary for several
batches, or sends deltas, fails that and is read from the start as before).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

COLUMNS = ["rank", "lo", "hi", "start", "end", "prefix"]   # the cached table: one row per batch


def index(data: bytes, batches: list[pa.RecordBatch], ranges: list | None = None) -> tuple[int, np.ndarray] | None:
    """(prefix length, int64 rows [lowest step, highest step, start, end]) of the complete
    ``batches`` the stream reader read from ``data``; None when the file cannot be indexed safely.
    Batches without a step (all null) are left out: a step read keeps none of their rows.
    ``ranges``: each batch's (lowest, highest) step when the caller has them (decoded already)."""
    if not batches:
        return None
    kinds, ends, n = [], [], 0
    src = pa.BufferReader(data)
    reader = pa.ipc.MessageReader.open_stream(src)
    while n < len(batches):
        try:
            m = reader.read_next_message()
        except (StopIteration, pa.ArrowInvalid, pa.ArrowIOError, OSError):
            return None
        kinds.append(m.type)
        ends.append(src.tell())
        n += m.type == "record batch"
    kinds, ends = np.array(kinds), np.array(ends, dtype=np.int64)
    at = np.flatnonzero(kinds == "record batch")
    prefix = int(ends[at[0] - 1]) if at[0] > 0 else 0
    starts = np.r_[prefix, ends[at[:-1]]]
    dicts = np.diff(np.r_[at[0], at]) - 1          # dictionary messages in each span after the first
    steps = [_step_range(b) for b in batches] if ranges is None else ranges
    if any(s is False for s in steps):
        return None
    if len(batches) > 1 and dicts[1:].any():
        if len(set(dicts[1:].tolist())) != 1 or not _decodes(data, prefix, starts[-1], ends[at[-1]], batches[-1]):
            return None
    rows = [(lo, hi, a, b) for (lo, hi), a, b in zip((s or (None, None) for s in steps), starts, ends[at])
            if lo is not None]
    return prefix, np.array(rows, dtype=np.int64).reshape(-1, 4)


def _step_range(batch: pa.RecordBatch):
    """(min, max) of the batch's steps; None when all are null; False when there is no usable step
    column (the reader's validation names what is wrong; such files are not indexed)."""
    if "step" not in batch.schema.names:
        return False
    step = batch.column("step")
    if pa.types.is_dictionary(step.type):
        step = step.dictionary_decode()
    if not pa.types.is_integer(step.type):
        return False
    lo, hi = (v.as_py() for v in pc.min_max(step).values())
    return None if lo is None else (int(lo), int(hi))


def _decodes(data: bytes, prefix: int, start: int, end: int, batch: pa.RecordBatch) -> bool:
    try:
        got = pa.ipc.open_stream(pa.BufferReader(data[:prefix] + data[start:end])).read_next_batch()
    except (StopIteration, pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return False
    return got.equals(batch)


def read_spans(path: Path, prefix: int, spans: np.ndarray, steps: tuple[int, int]
               ) -> list[tuple[bool, pa.RecordBatch]]:
    """The batches of ``path`` whose steps meet [A, B), each read as prefix + span (raises OSError or
    pa.ArrowInvalid like a stream read), with whether all of its steps are in [A, B) (else
    streams._step_batches cuts it, as it cuts a batch read from the start)."""
    first, stop = steps
    pick = spans[(spans[:, 0] < stop) & (spans[:, 1] >= first)] if len(spans) else spans
    out = []
    with open(path, "rb") as f:
        head = f.read(prefix)
        for lo, hi, start, end in pick.tolist():
            f.seek(start)
            body = f.read(end - start)
            out.append((first <= lo and hi < stop, pa.ipc.open_stream(pa.BufferReader(head + body)).read_next_batch()))
    return out


def by_rank(t) -> dict | None:
    """The cached table (COLUMNS, one row per batch, ranks in order) as rank -> (prefix, int64 rows
    [lo, hi, start, end]): what load_events(spans=) takes. None for no table."""
    if t is None or not len(t):
        return None
    rank = t["rank"].to_numpy()
    rows = t[["lo", "hi", "start", "end"]].to_numpy(dtype=np.int64)
    prefix = t["prefix"].to_numpy()
    cut = np.flatnonzero(np.diff(rank)) + 1
    return {int(rank[a]): (int(prefix[a]), rows[a:b]) for a, b in zip(np.r_[0, cut], np.r_[cut, len(t)])}
