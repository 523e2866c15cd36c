"""Every rank's launch lateness, kept by step, so that one step of a run too big to read whole is
drawn without reading every rank's events.

The Replay page draws, for one step, the rank × collective lateness heatmap (tables.sync_lateness)
of *every* rank. Computing it means reading the step from every rank file: ~0.6 s for one step of
the 1,024-rank, 10^8-event run (benchmarks/scale.py), plus ~0.4 s to match collectives across
ranks. The summary's second pass has those rows anyway (partition_joined.lateness: it sums them
into the rank × step map), so each partition writes them here, to one Parquet file with one row
group per step. Reading a step is then one row group of each partition's file.

Format: columns LATENESS_COLUMNS (sync_lateness' rows less launch_ns), rows of a step in
sync_lateness' order for these ranks; ``label`` dictionary-encoded (every row of a step with buckets
holds ""). A piece must read back equal to the rows written (as views/runcache.py keeps its entries);
if one does not, the run keeps no lateness at all (analysis.partitioned), so a heatmap never lacks ranks.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

LATENESS_COLUMNS = ["rank", "step", "micro", "bucket", "late_ns", "label"]
_SCHEMA = pa.schema([("rank", pa.int32()), ("step", pa.int64()), ("micro", pa.int32()), ("bucket", pa.int64()),
                     ("late_ns", pa.int64()), ("label", pa.dictionary(pa.int32(), pa.string()))])


def _table(late: pd.DataFrame) -> pa.Table:
    label = late["label"]
    if isinstance(label.dtype, pd.CategoricalDtype):      # the summary's rows: codes as they are
        label = pa.DictionaryArray.from_arrays(pa.array(label.cat.codes.to_numpy().astype(np.int32)),
                                               pa.array(label.cat.categories.to_numpy(dtype=object), pa.string()))
    else:
        label = pa.array(label.to_numpy(dtype=object), pa.string()).dictionary_encode()
    return pa.Table.from_pydict({c: late[c].to_numpy() for c in LATENESS_COLUMNS[:-1]} | {"label": label}, schema=_SCHEMA)


# Each batch's buffers compressed and decompressed in this thread: a step's batch is ~2,000 rows, and
# handing its six buffers to Arrow's thread pool took longer than LZ4 itself. The 10^8 run's Replay
# reads a step (a batch of each of 128 pieces) in 11.1-11.9 ms without, 23-25 ms with (median of 30
# steps, three times each); one partition's piece is written in 12.5-14.8 ms against 36.8 ms and read
# back in 8.4-9.2 against 26.4-27.1 ms, the same bytes either way (in the summary, with both cores
# busy, this wall time was waiting, not CPU: the 10^8 summary's total did not change).
_WRITE = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
_READ = pa.ipc.IpcReadOptions(use_threads=False)


class NotKept(Exception):
    """A piece did not read back equal: the run's kept lateness would miss these ranks, so none is kept."""


def write_piece(path: str | Path, late: pd.DataFrame) -> dict | None:
    """Write ``late`` (partition_joined.lateness of one partition) to ``path``: one record batch
    per step, in step order. Returns {"file": name, "steps": [step of each batch]}, or None when
    there is nothing to keep. Raises NotKept when the file does not read back equal."""
    if late is None or not len(late):
        return None
    path = Path(path)
    table = _table(late)
    steps = late["step"].to_numpy()
    order = np.argsort(steps, kind="stable")      # a step's rows keep their order
    if (order != np.arange(len(order))).any():
        table, steps = table.take(pa.array(order)), steps[order]
    lo = np.r_[0, np.flatnonzero(steps[1:] != steps[:-1]) + 1]     # steps sorted: where each begins
    keys, hi = steps[lo], np.r_[lo[1:], len(steps)]                  # (np.unique sorted them again: 4.7 ms)
    table = table.combine_chunks()        # one chunk, one dictionary: a slice is one batch
    with pa.ipc.new_file(path, _SCHEMA, options=_WRITE) as w:
        for a, b in zip(lo, hi):
            w.write_batch(table.slice(int(a), int(b - a)).to_batches()[0])
    if not read_back(path).equals(table):
        path.unlink(missing_ok=True)
        raise NotKept(f"{path.name} did not read back equal")
    return {"file": path.name, "steps": [int(k) for k in keys]}


def read_back(path: Path) -> pa.Table:
    """A whole piece, as write_piece checks it (read into memory: nothing refers to the file after)."""
    with pa.OSFile(str(path)) as f:
        return pa.ipc.open_file(f, options=_READ).read_all()


class KeptLateness:
    """The kept pieces of one run (``pieces``: write_piece's dicts, files in ``folder``): one step's
    rows of every rank. Files are memory-mapped on first use and kept open (a footer is read once)."""

    def __init__(self, folder: Path, pieces: list[dict]):
        self.folder, self.pieces = Path(folder), pieces
        self._files: dict[str, pa.ipc.RecordBatchFileReader] = {}
        self._lock = threading.Lock()
        self._where = [{s: i for i, s in enumerate(p["steps"])} for p in pieces]

    def _file(self, name: str) -> pa.ipc.RecordBatchFileReader:
        if name not in self._files:
            self._files[name] = pa.ipc.open_file(pa.memory_map(str(self.folder / name)), options=_READ)
        return self._files[name]

    def step(self, step: int) -> pd.DataFrame:
        """tables.sync_lateness' rows of ``step`` (less launch_ns), every rank, in rank order."""
        with self._lock:      # the page and the read-ahead thread share the readers
            parts = [self._file(p["file"]).get_batch(where[step])
                     for p, where in zip(self.pieces, self._where) if step in where]
        if not parts:
            late = _table(pd.DataFrame({c: pd.Series(dtype=object if c == "label" else np.int64)
                                        for c in LATENESS_COLUMNS})).to_pandas()
        else:
            late = pa.Table.from_batches(parts).to_pandas(use_threads=False)
        late["label"] = late["label"].astype(object)      # as sync_lateness gives it (the file's is a dictionary)
        return late
