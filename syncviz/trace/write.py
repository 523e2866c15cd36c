"""Write syncviz run directories (the format is defined in schema.py).

Writers append one Arrow record batch per step to ``rank-<r>.arrow`` and flush it to the OS, so a
rank killed mid-run (even with SIGKILL) leaves every completed step readable.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from syncviz.trace import schema as S
from syncviz.trace.ipc_template import BatchTemplate

# --------------------------------------------------------------------------------------- writing

def write_json_atomic(path: str | os.PathLike, data: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically so a reader never sees half a run.json."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    # mkstemp creates 0600; a run is shared like the arrow files next to it (0666 minus umask,
    # 0644 usually), so a dashboard running as another user can read it.
    os.fchmod(fd, 0o666 & ~_umask())
    # one string, one write: json.dump to the file wrote it in hundreds of small pieces
    text = json.dumps(data, indent=1, sort_keys=True, default=str)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _umask() -> int:
    """The process umask without changing it (os.umask sets it; another thread may be creating
    files meanwhile): Linux reports it in /proc/self/status."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def events_to_batch(columns: Mapping[str, Iterable]) -> pa.RecordBatch:
    """Build a record batch from column-name → values; missing columns get their defaults."""
    n = None
    arrays = []
    for fld in S.EVENT_SCHEMA:
        vals = columns.get(fld.name)
        if vals is not None:
            arr = pa.array(vals, type=fld.type) if not isinstance(vals, pa.Array) else vals
            n = len(arr) if n is None else n
            if len(arr) != n:
                raise ValueError(f"column {fld.name} has {len(arr)} values, expected {n}")
            arrays.append(arr)
        else:
            arrays.append(None)
    n = n or 0
    arrays = [a if a is not None else pa.array([S.EVENT_DEFAULTS[f.name]] * n, type=f.type)
              for a, f in zip(arrays, S.EVENT_SCHEMA)]
    return pa.RecordBatch.from_arrays(arrays, schema=S.EVENT_SCHEMA)


WRITE_BUFFER_BYTES = 1 << 20   # a step's batch is far smaller (a 1,200-parameter model: ~60 kB)
# The event columns whose values change from step to step in a steady training loop (write_repeating)
TIME_COLUMNS = ("step", "start_ns", "end_ns", "ready_ns", "launch_ns")
TEMPLATES_MAX = 64            # kept step messages per rank (a loop whose steps all differ clears and refills)


class RankWriter:
    """Append-only writer of one rank's event stream and bucket layouts."""

    def __init__(self, run_dir: str | os.PathLike, rank: int):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.path = self.run_dir / S.rank_file(rank)
        # Buffered, flushed once a step: the IPC writer emits a batch as ~33 small pieces, one
        # write(2) each on a bare OSFile (strace: 3,304 writes for 100 steps of 14 rows; 39 µs a
        # batch against 7 µs buffered, timeit; ~100 µs a step of rank 0's CPU in a traced
        # short-steps run). flush() hands the whole batch to the OS in one write before the next
        # step starts, so a SIGKILL still loses nothing complete (and never half a batch).
        self._file = pa.OSFile(str(self.path), "wb")
        self._fd = self._file.fileno()
        self._sink = pa.BufferedOutputStream(self._file, WRITE_BUFFER_BYTES)
        schema = S.EVENT_SCHEMA.with_metadata(S.stream_metadata(rank))
        self._writer = pa.ipc.new_stream(self._sink, schema)
        self._sink.flush()
        self._layouts: list[pa.RecordBatch] = []
        self._templates: dict[Hashable, BatchTemplate | None] = {}    # write_repeating
        self.steps_written = 0
        self.closed = False

    def write_step(self, batch: pa.RecordBatch | Mapping[str, Iterable]) -> None:
        if not isinstance(batch, pa.RecordBatch):
            batch = events_to_batch(batch)
        self._writer.write_batch(batch)
        # Flush to the OS (not fsync): a killed process loses nothing the kernel already has.
        self._sink.flush()
        self.steps_written += 1

    def write_repeating(self, key: Hashable, times: np.ndarray, build: Callable[[], pa.RecordBatch]) -> None:
        """A step whose every column but TIME_COLUMNS is the same as an earlier step's: ``key``
        holds those columns' values (equal keys, equal columns: the caller's promise), ``times``
        the TIME_COLUMNS as int64 rows (shape (5, rows)), ``build()`` the step's record batch.

        The bytes written are those write_step(build()) writes. A stream message of a record batch
        of the same other columns and row count differs from an earlier one only in the time
        columns' data buffers, so the first such step's message is kept (ipc_template) and later
        ones are a copy of it with their times written in. Why: in a traced short-steps run
        (benchmarks/overhead_script.py, 14 rows a step) building the batch and writing it took
        ~270 µs of rank 0's CPU a step, ~2% of its ~12 ms step (timers around each, 1,000 steps)."""
        tpl = self._templates.get(key)
        if tpl is None or times.shape != tpl.shape:
            batch = build()
            self.write_step(batch)
            if len(self._templates) >= TEMPLATES_MAX:
                self._templates.clear()
            self._templates[key] = BatchTemplate.of(batch, TIME_COLUMNS)
            return
        # Straight to the file: the sink is empty (flushed after every step), and its copy and
        # flush cost ~55 µs a step against one os.write (timers in the traced run above).
        _write_all(self._fd, tpl.message(times))
        self.steps_written += 1

    def write_layout(self, rows: Mapping[str, Iterable]) -> None:
        """Add one layout version (bucket → parameters) and rewrite layout-<r>.arrow atomically."""
        self._layouts.append(pa.RecordBatch.from_pydict(dict(rows), schema=S.LAYOUT_SCHEMA))
        path = self.run_dir / S.layout_file(self.rank)
        tmp = path.with_name(f".tmp-{path.name}")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(
                sink, S.LAYOUT_SCHEMA.with_metadata(S.stream_metadata(self.rank))) as w:
            for b in self._layouts:
                w.write_batch(b)
        os.replace(tmp, path)

    def close(self) -> None:
        if not self.closed:
            self._writer.close()
            self._sink.close()        # flushes, then closes the file under it
            if not self._file.closed:
                self._file.close()
            self.closed = True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def new_meta(name: str, world_size: int, **fields) -> dict:
    """A run.json dict with the required keys; callers add what they know."""
    import datetime
    import uuid

    from syncviz import __version__
    meta = {"schema": S.SCHEMA_VERSION, "run_id": uuid.uuid4().hex, "name": name,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "world_size": int(world_size), "nodes": 1, "syncviz_version": __version__,
            "ranks": [], "finished": False}
    meta.update(fields)
    return meta


def write_run(run_dir: str | os.PathLike, meta: Mapping[str, Any],
              steps_by_rank: Mapping[int, Iterable[Mapping[str, Iterable]]],
              layouts_by_rank: Mapping[int, Iterable[Mapping[str, Iterable]]] | None = None,
              finished: bool = True) -> Path:
    """Write a whole run at once (simulator, synthetic fixtures): per rank, a list of per-step
    column dicts (or record batches) and optionally layout versions."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for rank, steps in steps_by_rank.items():
        w = RankWriter(run_dir, rank)
        for step in steps:
            w.write_step(step)
        for layout in (layouts_by_rank or {}).get(rank, []):
            w.write_layout(layout)
        w.close()
    meta = dict(meta)
    meta["finished"] = finished     # every stream was closed: a whole run (new_meta starts at False)
    write_json_atomic(run_dir / S.RUN_FILE, meta)
    return run_dir
