"""Reading one Arrow IPC stream (a rank file or a layout file) of a run directory: every complete
batch, or the batches of a step range (from the start, or from where spans.index says they lie).
read.py turns these batches into validated tables."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from syncviz.trace import schema as S
from syncviz.trace import spans as SP

# Arrow IPC end-of-stream marker: continuation token + zero length. Its absence means the writer
# never closed the stream (the rank died or is still running).
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class TraceError(Exception):
    """A run directory or file that cannot be read; str() is the one line shown to the user."""


def _read_stream(path: Path, expected: pa.Schema, steps: tuple[int, int] | None = None, spans=None,
                 index: dict | None = None) -> tuple[list[pa.RecordBatch], str | None]:
    """All complete batches of an IPC stream and a problem description (None when clean).
    ``steps`` (A, B): only rows of steps A <= step < B, read one batch at a time (memory bounded
    by a batch, not the file; see _step_batches); ``spans``: this file's (prefix, spans) from
    spans.index, to read those batches alone. ``index``: a dict that gets ``index[path]`` = this
    file's spans.index (None when it cannot be indexed), for a later step read.

    The file is read into memory first, never memory-mapped: a file truncated under a mapped
    reader (a second recording into the same directory) kills the process with SIGBUS."""
    if steps is not None:
        return _step_batches(path, steps, spans)
    data = read_bytes(path)
    batches, problem = stream_batches(path, data)
    if index is not None and data:
        index[path] = SP.index(data, batches)
    return batches, problem


def read_bytes(path: Path) -> bytes:
    """A whole file (read, not memory-mapped: see _read_stream); TraceError when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({_short(e)})") from None


def stream_batches(path: Path, data: bytes) -> tuple[list[pa.RecordBatch], str | None]:
    """_read_stream of a file's bytes: every complete batch and the problem (None when clean)."""
    if not data:
        return [], "empty file (the rank wrote nothing)"
    batches: list[pa.RecordBatch] = []
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise TraceError(f"{path}: not an Arrow IPC stream ({_short(e)})") from None
    _check_version(path, reader)
    problem = None
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
            problem = f"truncated or corrupt after {len(batches)} complete batches ({_short(e)})"
            break
    if problem is None and data[-len(_EOS):] != _EOS:
        problem = f"not closed (rank stopped or still running) after {len(batches)} complete steps"
    return batches, problem


def _check_version(path: Path, reader) -> None:
    meta = reader.schema.metadata or {}
    version = meta.get(b"syncviz.schema", b"").decode(errors="replace")
    try:
        major = S.parse_version(version)
    except ValueError:
        raise TraceError(f"{path}: not a syncviz stream (no schema version)") from None
    if major != S.SCHEMA_MAJOR:
        raise TraceError(f"{path}: trace schema {version} is not supported (reads {S.SCHEMA_VERSION})")


def _step_batches(path: Path, steps: tuple[int, int], spans=None) -> tuple[list[pa.RecordBatch], str | None]:
    """The rows of steps A <= step < B of one rank file, read batch by batch from the file (plain
    reads, no memory map: see _read_stream) and cut to those steps; batches of other steps are
    dropped as soon as they are read. A rank writes one batch per step in step order, so reading
    stops at the first batch past B once every batch so far came in order: a 2-step export of a
    long run reads the start of each file only. ``spans`` (spans.index of this file): only the
    batches that hold those steps are read, each from its own bytes."""
    first, stop = steps
    out: list[pa.RecordBatch] = []
    try:
        size = path.stat().st_size
        f = pa.OSFile(str(path), "rb")
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({_short(e)})") from None
    if size == 0:
        f.close()
        return [], "empty file (the rank wrote nothing)"
    with f:
        if spans is not None:
            try:
                batches = SP.read_spans(path, spans[0], spans[1], steps)
            except (OSError, pa.ArrowInvalid, pa.ArrowIOError, StopIteration) as e:
                raise TraceError(f"{path}: changed since it was indexed ({_short(e)}); read it again") from None
            out = [b if inside else _cut(b, first, stop) for inside, b in batches]
            f.seek(size - len(_EOS))
            closed = f.read(len(_EOS)) == _EOS
            return out, None if closed else "not closed (rank stopped or still running)"
        try:
            reader = pa.ipc.open_stream(f)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
            raise TraceError(f"{path}: not an Arrow IPC stream ({_short(e)})") from None
        _check_version(path, reader)
        n, in_order, last_max = 0, True, None
        while True:
            try:
                b = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
                return out, f"truncated or corrupt after {n} complete batches ({_short(e)})"
            n += 1
            step = _steps_of(b)
            if step is None:
                out.append(b)            # conform names what is wrong with it
                continue
            lo, hi = (v.as_py() for v in pc.min_max(step).values())
            if lo is None:
                continue
            in_order &= last_max is None or lo >= last_max
            last_max = hi
            if lo >= stop and in_order:   # past the range: the rest of the file is not read
                f.seek(size - len(_EOS))
                closed = f.read(len(_EOS)) == _EOS
                return out, None if closed else "not closed (rank stopped or still running)"
            if hi >= first and lo < stop:
                out.append(b.filter(pc.fill_null(pc.and_(pc.greater_equal(step, first), pc.less(step, stop)), False)))
        f.seek(size - len(_EOS))
        closed = f.read(len(_EOS)) == _EOS
    return out, None if closed else f"not closed (rank stopped or still running) after {n} complete steps"


def _steps_of(b: pa.RecordBatch):
    """The batch's step column as plain integers; None when there is no usable one (kept whole:
    conform names what is wrong with it)."""
    if "step" not in b.schema.names or not b.num_rows:
        return None
    step = b.column("step")
    if pa.types.is_dictionary(step.type):       # the simulator writes steps dictionary-encoded
        step = step.dictionary_decode()
    if not (pa.types.is_integer(step.type) or pa.types.is_floating(step.type)):
        return None
    return step


def _cut(b: pa.RecordBatch, first: int, stop: int) -> pa.RecordBatch:
    """A batch read by its span (one that holds some of steps [first, stop)), cut to them."""
    step = _steps_of(b)
    if step is None:
        return b
    return b.filter(pc.fill_null(pc.and_(pc.greater_equal(step, first), pc.less(step, stop)), False))


def _short(e: Exception) -> str:
    return str(e).strip().splitlines()[0][:160] if str(e).strip() else e.__class__.__name__
