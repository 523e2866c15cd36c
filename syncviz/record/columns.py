"""A step's gradient-ready rows as arrays, and the step's record batch (batch.py builds the rest).

One gradient-ready row per parameter per micro-step makes these rows most of a step's batch
(1,200 of ~1,210 rows for a model of 1,200 small tensors). Built row by row in Python they cost
3.5 ms a step there (build) plus 1.0 ms (Python lists → Arrow), ~10% of a 48 ms step's CPU time
(measured on rank 0, benchmarks/overhead_script.py many-params, 2 gloo ranks); built as arrays
they cost a few hundred µs. Every value is the same as the row-by-row build's (a test compares
them on random steps).
"""
from __future__ import annotations

from itertools import chain

import numpy as np
import pyarrow as pa

from syncviz.trace import schema as S
from syncviz.trace.write import TIME_COLUMNS

_NUMPY = {pa.int64(): np.int64, pa.int32(): np.int32}


def repeat_str(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as an Arrow string array, built from its buffers (no Python list)."""
    b = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(b)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(b * n))


# Below this many rows a step's gradient-ready rows are added row by row (RowGrads): the arrays'
# fixed cost (~30 numpy/Arrow calls) exceeds the rows' (short-steps: 8 parameters, ~0.3 ms more a step).
ARRAY_ROWS = 64


class RowGrads:
    """A few gradient-ready records, added as rows by ``add`` (batch.py's row adder) right away."""
    n = 0     # no rows left for an array block

    def __init__(self, ready, base: int, add, param_name):
        self._by: dict[tuple[int, int], int] = {}
        # the C++ hooks' (n, 3) array (record/native) as Python ints, as the Python hooks' tuples hold
        for param, t_local, micro in (ready.tolist() if isinstance(ready, np.ndarray) else ready):
            t = t_local + base
            add(S.GRAD_READY, param_name(param), t, t, micro=max(micro, 0))
            key = (micro, param)
            self._by[key] = max(self._by.get(key, -1), t)

    def last_ready(self, micro: int, params) -> int:
        by = self._by
        return max((by.get((micro, i), -1) for i in params), default=-1)


class GradBlock:
    """The step's gradient-ready records (plain tuples: param index, local ns, micro) as arrays.

    ``t`` is aligned (local + ``base``); ``last_ready(micro, params)`` is the latest of a bucket's
    parameters in one micro-step (-1 when none), as batch.py's bucket rows need it."""

    def __init__(self, ready, base: int):
        # fromiter over the flattened tuples: np.array(list of tuples) took 5x longer (timeit); the
        # C++ hooks (record/native) hand over the (n, 3) array itself
        arr = ready if isinstance(ready, np.ndarray) else \
            np.fromiter(chain.from_iterable(ready), dtype=np.int64, count=3 * len(ready)).reshape(-1, 3)
        self.n = len(arr)
        self.param, self.micro = arr[:, 0], arr[:, 2]
        self.t = arr[:, 1] + base
        self._max: dict[int, np.ndarray] = {}

    def last_ready(self, micro: int, params) -> int:
        if self.n == 0 or len(params) == 0:
            return -1
        latest = self._max.get(micro)
        if latest is None:     # the latest ready time of every parameter in this micro-step, -1 if none
            size = int(max(self.param.max(), 0)) + 1
            latest = self._max[micro] = np.full(size, -1, dtype=np.int64)
            mask = (self.micro == micro) & (self.param >= 0)
            np.maximum.at(latest, self.param[mask], self.t[mask])
        idx = np.asarray(params, dtype=np.int64)
        best = -1
        if (idx < 0).any():    # an unindexed parameter (index -1) is looked up as the row-by-row build did
            for i in set(idx[idx < 0].tolist()):
                hit = self.t[(self.micro == micro) & (self.param == i)]
                best = max(best, int(hit.max()) if len(hit) else -1)
        idx = idx[(idx >= 0) & (idx < len(latest))]
        return max(int(latest[idx].max()), best) if len(idx) else best

    def time_rows(self, step: int) -> np.ndarray:
        """The rows' TIME_COLUMNS as int64, shape (5, n): the step, the ready time as start and
        end, no ready or launch time (StepColumns.write_to writes only these for a kept shape)."""
        rows = np.empty((len(_TIME_COLUMNS), self.n), dtype=np.int64)
        for i, c in enumerate(_TIME_COLUMNS):
            rows[i] = step if c == "step" else self.t if c in ("start_ns", "end_ns") else S.EVENT_DEFAULTS[c]
        return rows

    def columns(self, step: int, param_name, names: pa.Array | None = None) -> dict[str, pa.Array | np.ndarray]:
        """Every event column of the rows (numpy for numbers, Arrow for strings). ``names``: every
        parameter's name by index, when the caller keeps them as an array (the recorder does)."""
        n = self.n
        times = self.time_rows(step)
        if names is not None and self.param.min() >= 0 and self.param.max() < len(names):
            names = names.take(pa.array(self.param))
        else:
            uniq, inv = np.unique(self.param, return_inverse=True)
            names = pa.array([param_name(int(i)) for i in uniq], pa.string()).take(pa.array(inv.astype(np.int32)))
        out: dict[str, pa.Array | np.ndarray] = {}
        for fld in S.EVENT_SCHEMA:
            c = fld.name
            if c in _TIME_INDEX:
                out[c] = times[_TIME_INDEX[c]]
            elif c == "micro":
                out[c] = np.maximum(self.micro, 0).astype(np.int32)
            elif c == "kind":
                out[c] = repeat_str(S.GRAD_READY, n)
            elif c == "name":
                out[c] = names
            elif fld.type == pa.string():
                out[c] = repeat_str(S.EVENT_DEFAULTS[c], n)
            else:
                out[c] = np.full(n, S.EVENT_DEFAULTS[c], dtype=_NUMPY[fld.type])
        return out


class StepColumns(dict):
    """A step's columns (name → list) except its gradient-ready rows, which stay a GradBlock
    (``block``: (GradBlock, step, param_name, param_names)) and go after the first ``grad_at`` rows
    (the phases), where the row-by-row build put them. Their columns (``grad``) are made when first
    needed: a steady loop's step written from a kept message never needs them (write_to). The
    lists stay mutable: CUDA times and late ends are patched into them in place."""

    def __init__(self, cols: dict[str, list], grad_at: int = 0, block: tuple | None = None):
        super().__init__(cols)
        self.grad_at, self.block = grad_at, block
        self._grad: dict | None = None

    @property
    def grad(self) -> dict | None:
        if self._grad is None and self.block is not None:
            block, step, param_name, param_names = self.block
            self._grad = block.columns(step, param_name, param_names)
        return self._grad

    def to_batch(self) -> pa.RecordBatch:
        if not self.grad:
            return self._rows_batch()
        arrays = []
        at = self.grad_at
        for fld in S.EVENT_SCHEMA:
            vals = self[fld.name]
            if fld.type == pa.string():
                arrays.append(pa.concat_arrays([pa.array(vals[:at], pa.string()), self.grad[fld.name],
                                                pa.array(vals[at:], pa.string())]))
            else:
                dt = _NUMPY[fld.type]
                arrays.append(pa.array(np.concatenate([np.asarray(vals[:at], dtype=dt), self.grad[fld.name].astype(dt),
                                                       np.asarray(vals[at:], dtype=dt)]), type=fld.type))
        return pa.RecordBatch.from_arrays(arrays, schema=S.EVENT_SCHEMA)

    def write_to(self, writer) -> None:
        """Write the step's batch to ``writer`` (trace.RankWriter). A step of up to
        _REPEATING_MAX_ROWS rows besides its gradient-ready arrays goes through
        RankWriter.write_repeating, keyed by its non-time columns: in a steady loop every step
        after the first of its shape is the kept stream message with new times."""
        if len(self["step"]) > _REPEATING_MAX_ROWS:
            writer.write_step(self.to_batch())
            return
        key = tuple([tuple(self[c]) for c in _STATIC_COLUMNS])
        times = np.array([self[c] for c in _TIME_COLUMNS], dtype=np.int64)
        if self.block is None:
            writer.write_repeating(key, times, lambda: self._rows_batch(times))
            return
        # Gradient-ready rows as arrays: what they hold besides their times is which parameter
        # each row is (its name) and its micro-step, in hook order, so those two arrays' bytes
        # join the key. many-params (1,200 parameters): making the rows' Arrow columns and
        # writing the ~60 kB batch was ~0.6 ms of rank 0's CPU a 34 ms step (py-spy, 250 Hz).
        block, step, *_ = self.block
        key = (key, self.grad_at, block.param.tobytes(), block.micro.tobytes())
        at = self.grad_at
        times = np.concatenate([times[:, :at], block.time_rows(step), times[:, at:]], axis=1)
        writer.write_repeating(key, times, self.to_batch)

    def _rows_batch(self, times: np.ndarray | None = None) -> pa.RecordBatch:
        """The batch of a step without array blocks (a few dozen rows). The times change every
        step: one numpy block, then a zero-copy Arrow array each. The other columns (kinds, names,
        buckets, bytes, phases) repeat step after step in a steady loop: their Arrow arrays are
        kept (_REPEATING) and reused. 2.1x faster than an Arrow array per column list (88 against
        189 µs for the 14-row step of benchmarks/overhead_script.py short-steps, timeit)."""
        if times is None:
            times = np.array([self[c] for c in _TIME_COLUMNS], dtype=np.int64)
        arrays = []
        for fld in S.EVENT_SCHEMA:
            name = fld.name
            if name in _TIME_INDEX:
                arrays.append(pa.array(times[_TIME_INDEX[name]]))
                continue
            vals = self[name]
            if len(vals) > _REPEATING_MAX_ROWS:
                arrays.append(pa.array(vals, type=fld.type))
                continue
            key = (name, tuple(vals))
            arr = _REPEATING.get(key)
            if arr is None:
                if len(_REPEATING) >= _REPEATING_MAX:
                    _REPEATING.clear()
                arr = _REPEATING[key] = pa.array(vals, type=fld.type)
            arrays.append(arr)
        return pa.RecordBatch.from_arrays(arrays, schema=S.EVENT_SCHEMA)


# Columns whose values change every step (int64 all). Arrow arrays are immutable, so one kept
# array may serve every batch whose column has the same values.
_TIME_COLUMNS = TIME_COLUMNS
_TIME_INDEX = {c: i for i, c in enumerate(_TIME_COLUMNS)}
_STATIC_COLUMNS = tuple(c for c in S.EVENT_COLUMNS if c not in _TIME_INDEX)
_REPEATING: dict[tuple, pa.Array] = {}
_REPEATING_MAX = 512          # kept arrays at most (a loop whose steps differ clears and refills)
_REPEATING_MAX_ROWS = 1024    # longer columns are built each time (hashing costs as much)
