"""One partition's events as plain numpy arrays (analysis.partition's input): the same rows, in the
same order, as trace.events_frame gives them, without a pandas frame.

Why: the summary's per-partition work on pandas frames cost ~4 µs of CPU per event, most of it
pandas' own bookkeeping around numpy (filters that copy every column, index alignment, categoricals
re-factorized per groupby), not the arithmetic (measured on a 820,512-event partition of the
1,024-rank simulated run: 3.5 s in pandas; the same numpy primitives alone take ~1–30 ms per call).
Repeated strings are dictionary codes here, with each dictionary sorted as events_frame sorts its
categories, so ordering by code is ordering by string.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from syncviz.trace import schema as S

KIND_CODE = {k: i for i, k in enumerate(S.KINDS)}
FORWARD, BACKWARD, OPTIMIZER, BUCKET, COLLECTIVE, GRAD_READY, STEP, EVAL_FORWARD, OFFLOAD = \
    (KIND_CODE[k] for k in (S.FORWARD, S.BACKWARD, S.OPTIMIZER, S.BUCKET, S.COLLECTIVE, S.GRAD_READY, S.STEP,
                            S.EVAL_FORWARD, S.OFFLOAD))
KIND_NAMES = np.array(S.KINDS, dtype=object)


@dataclass
class EventArrays:
    """Columns of trace.EVENT_SCHEMA plus ``rank``; string columns as int32 codes into the sorted
    dictionaries ``names``, ``ops``, ``dtypes``, ``phases`` (object arrays of str); ``kind`` as
    codes into schema.KINDS (KIND_CODE)."""
    rank: np.ndarray
    step: np.ndarray
    micro: np.ndarray
    kind: np.ndarray
    name: np.ndarray
    start: np.ndarray
    end: np.ndarray
    bucket: np.ndarray
    op: np.ndarray
    bytes: np.ndarray
    dtype: np.ndarray
    group_size: np.ndarray
    ready: np.ndarray
    launch: np.ndarray
    phase: np.ndarray
    layout: np.ndarray
    logical_bytes: np.ndarray
    names: np.ndarray
    ops: np.ndarray
    dtypes: np.ndarray
    phases: np.ndarray

    def __len__(self) -> int:
        return len(self.step)

    def take(self, rows: np.ndarray) -> "EventArrays":
        """These rows (a boolean mask or positions), dictionaries shared."""
        return EventArrays(**{f.name: getattr(self, f.name) if f.name in _DICTS else getattr(self, f.name)[rows]
                              for f in fields(self)})

    def is_kind(self, *kinds: int) -> np.ndarray:
        if len(kinds) == 1:
            return self.kind == kinds[0]
        return np.isin(self.kind, kinds)

    def code_of(self, dictionary: str, value: str) -> int:
        """The code of ``value`` in one of the dictionaries (-1 when absent)."""
        d = getattr(self, dictionary)
        i = int(np.searchsorted(d, value)) if len(d) else 0
        return i if i < len(d) and d[i] == value else -1


_DICTS = ("names", "ops", "dtypes", "phases")
_STRINGS = {"name": "names", "op": "ops", "dtype": "dtypes", "phase": "phases"}
_NUMBERS = {"step": "step", "micro": "micro", "start_ns": "start", "end_ns": "end", "bucket": "bucket",
            "bytes": "bytes", "group_size": "group_size", "ready_ns": "ready", "launch_ns": "launch",
            "layout": "layout", "logical_bytes": "logical_bytes", "rank": "rank"}


def from_tables(tables: list[pa.Table], decoded: dict | None = None) -> EventArrays:
    """The rows of validated rank tables (trace.read.read_ranks' tables or partition_read's one table,
    rank column appended), in order. Every kind is one of schema.KINDS there (validation drops the
    rest). ``decoded``: columns the reader has as numpy already (partition_read's)."""
    table = pa.concat_tables(tables) if len(tables) != 1 else tables[0]
    decoded = decoded or {}
    cols = {}
    for col, attr in _NUMBERS.items():
        cols[attr] = decoded[col] if col in decoded else _numbers(table.column(col))
    kind_codes, kind_dict = _codes(table.column("kind"))
    lut = np.array([KIND_CODE.get(k, -1) for k in kind_dict], dtype=np.int8)
    cols["kind"] = lut[kind_codes] if len(lut) else np.zeros(0, dtype=np.int8)
    if (cols["kind"] < 0).any():
        raise ValueError("unknown kind in a validated table")
    for col, attr in _STRINGS.items():
        cols[col], cols[attr] = _codes(table.column(col))
    return EventArrays(**cols)


def _numbers(col: pa.ChunkedArray) -> np.ndarray:
    a = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if pa.types.is_dictionary(a.type):
        return a.dictionary.to_numpy(zero_copy_only=False)[a.indices.to_numpy(zero_copy_only=False)]
    return a.to_numpy(zero_copy_only=False)


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """int32 codes and the sorted dictionary (object array of distinct str) of a string column
    without nulls: the file's own dictionary where it has one of distinct values, else encoded here."""
    a = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if not pa.types.is_dictionary(a.type):
        a = pc.dictionary_encode(a)
    values = np.asarray(a.dictionary.to_pylist(), dtype=object)
    if len(set(values.tolist())) != len(values):          # a writer may repeat a value: encode anew
        a = pc.dictionary_encode(a.dictionary_decode())
        values = np.asarray(a.dictionary.to_pylist(), dtype=object)
    idx = a.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    if not len(values):
        return idx, values
    order = np.argsort(values, kind="stable")
    place = np.empty(len(order), dtype=np.int32)
    place[order] = np.arange(len(order), dtype=np.int32)
    return place[idx], values[order]
