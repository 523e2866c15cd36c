"""Every rank's launch lateness, kept by step, so that one step of a run too big to read whole is
drawn without reading every rank's events.

The Replay page draws, for one step, the rank × collective lateness heatmap (tables.sync_lateness)
of *every* rank. Computing it means reading the step from every rank file: ~0.6 s for one step of
the 1,024-rank, 10^8-event run (benchmarks/scale.py), plus ~0.4 s to match collectives across
ranks. The summary's second pass has those rows anyway (partition_joined.lateness: it sums them
into the rank × step map), so each partition writes them here, to one file of columns in step order
with where each step begins. Reading a step is then a slice of each partition's file.

Format (since session 32; one Arrow IPC record batch per step before): a magic line, the header's
length (8 bytes), the header (JSON: rows, the steps and where each begins, the label dictionary, each
column's stored type), then each column's values (LATENESS_COLUMNS but ``step``: sync_lateness' rows
less launch_ns, a step's rows in sync_lateness' order for these ranks; ``label`` as codes into the
dictionary, -1 for none; each in the smallest integer type that holds it), each starting at a
multiple of 8 bytes. Why: Arrow's writer cost ~26 µs a batch, and the 10^8-event DDP run has 781
steps in each of its 147 pieces: a piece shaped like them (661,507 rows, 7 ranks × 781 steps × 121
buckets) was written and checked in 49 ms, now in 14-20 ms (best of 5), 5.3 MB against 4.2 MB
(LZ4-compressed); a step of 128 such pieces reads in 4.5 ms against 2.2. A piece
must read back equal to the rows written (as views/runcache.py keeps its entries); if one does not,
the run keeps no lateness at all (analysis.partitioned), so a heatmap never lacks ranks.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pandas as pd

LATENESS_COLUMNS = ["rank", "step", "micro", "bucket", "late_ns", "label"]
_TYPES = {"rank": np.int32, "step": np.int64, "micro": np.int32, "bucket": np.int64, "late_ns": np.int64,
          "label": np.int32}      # label: codes into the piece's dictionary
_MAGIC = b"syncviz lateness 2\n"
# the step column is not stored (a step's rows are together: the header says where each begins)
_STORED = [c for c in LATENESS_COLUMNS if c != "step"]


def _narrow(v: np.ndarray) -> np.ndarray:
    """Integers in the smallest type that holds them (read back in their own type: KeptLateness):
    ranks, micro-steps, buckets and label codes fit a byte or two, so a piece of the 10^8-event DDP
    run takes ~10 bytes a row instead of 36."""
    if not len(v):
        return v
    lo, hi = int(v.min()), int(v.max())
    for t in (np.int8, np.int16, np.int32):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return v.astype(t) if np.dtype(t).itemsize < v.dtype.itemsize else v
    return v


class NotKept(Exception):
    """A piece did not read back equal: the run's kept lateness would miss these ranks, so none is kept."""


def _columns(late: pd.DataFrame) -> tuple[dict, list]:
    """The rows as the file holds them: each column in its type, labels as codes, and the dictionary."""
    label = late["label"]
    if isinstance(label.dtype, pd.CategoricalDtype):      # the summary's rows: codes as they are
        codes, labels = label.cat.codes.to_numpy(), label.cat.categories.to_numpy(dtype=object)
    else:
        codes, labels = pd.factorize(label.to_numpy(dtype=object), use_na_sentinel=True)
    cols = {c: late[c].to_numpy().astype(_TYPES[c], copy=False) for c in LATENESS_COLUMNS[:-1]}
    cols["label"] = np.asarray(codes).astype(np.int32, copy=False)
    return cols, [str(x) for x in labels]


def write_piece(path: str | Path, late: pd.DataFrame) -> dict | None:
    """Write ``late`` (partition_joined.lateness of one partition) to ``path``, its rows in step
    order (a step's rows keep their order). Returns {"file": name, "steps": [each step kept]}, or
    None when there is nothing to keep. Raises NotKept when the file does not read back equal."""
    if late is None or not len(late):
        return None
    path = Path(path)
    cols, labels = _columns(late)
    stored = {c: _narrow(cols[c]) for c in _STORED}      # narrowed first: less to reorder
    steps = cols["step"]
    if (steps[1:] < steps[:-1]).any():
        order = np.argsort(steps, kind="stable")
        stored, steps = {c: v[order] for c, v in stored.items()}, steps[order]
    lo = np.r_[0, np.flatnonzero(steps[1:] != steps[:-1]) + 1]     # steps sorted: where each begins
    head = {"rows": len(steps), "steps": steps[lo].tolist(), "starts": lo.tolist(), "labels": labels,
            "columns": [[c, stored[c].dtype.str] for c in _STORED]}
    raw = json.dumps(head).encode()
    with open(path, "wb") as f:
        f.write(_MAGIC + len(raw).to_bytes(8, "little") + raw)
        for c in _STORED:
            f.write(b"\0" * (-f.tell() % 8))
            f.write(np.ascontiguousarray(stored[c]).tobytes())
    back = read_back(path, widen=False)
    if back is None or back["labels"] != labels or back["steps"] != head["steps"] or back["starts"] != head["starts"] \
            or not all(back[c].dtype == stored[c].dtype and np.array_equal(back[c], stored[c]) for c in _STORED):
        path.unlink(missing_ok=True)
        raise NotKept(f"{path.name} did not read back equal")
    return {"file": path.name, "steps": head["steps"]}


def read_back(path: Path, widen: bool = True) -> dict | None:
    """A whole piece: each column (memory-mapped; ``widen``: in its type in LATENESS_COLUMNS, else as
    stored, as write_piece checks it) and "labels", "steps", "starts" from the header; None when the
    file is not such a piece."""
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        if bytes(mm[:len(_MAGIC)]) != _MAGIC:
            return None
        n = int.from_bytes(bytes(mm[len(_MAGIC):len(_MAGIC) + 8]), "little")
        at = len(_MAGIC) + 8
        head = json.loads(bytes(mm[at:at + n]))
        at += n
        out = {"labels": head["labels"], "steps": head["steps"], "starts": head["starts"]}
        rows = int(head["rows"])
        for name, dtype in head["columns"]:
            at += -at % 8
            dt = np.dtype(dtype)
            out[name] = np.frombuffer(mm, dtype=dt, count=rows, offset=at)
            if widen:
                out[name] = out[name].astype(_TYPES[name], copy=False)
            at += rows * dt.itemsize
        return out
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None


class KeptLateness:
    """The kept pieces of one run (``pieces``: write_piece's dicts, files in ``folder``): one step's
    rows of every rank. Files are memory-mapped on first use and kept open (a header is read once);
    only the step's rows are read (the 10^8-event DDP run's pieces are 0.8 GB in all)."""

    def __init__(self, folder: Path, pieces: list[dict]):
        self.folder, self.pieces = Path(folder), pieces
        self._files: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._where = [{s: i for i, s in enumerate(p["steps"])} for p in pieces]
        self._codes: dict = {}                      # label -> its code in _names
        self._names = np.zeros(0, dtype=object)

    def _label_code(self, label: str | None) -> int:
        return self._codes.setdefault(label, len(self._codes))

    def _file(self, name: str) -> dict:
        if name not in self._files:
            got = read_back(self.folder / name, widen=False)     # slices are widened, not the file
            if got is None:
                raise OSError(f"{self.folder / name}: not a lateness piece of this syncviz")
            got["ends"] = got["starts"][1:] + [len(got["rank"])]
            # the piece's label codes as codes into one dictionary of every piece read so far (code -1:
            # no label, the last entry): a step's labels are then one take of its codes
            got["codes"] = np.array([self._label_code(x) for x in got["labels"]] + [self._label_code(None)], dtype=np.int64)
            self._files[name] = got
        return self._files[name]

    def step(self, step: int) -> pd.DataFrame:
        """tables.sync_lateness' rows of ``step`` (less launch_ns), every rank, in rank order."""
        with self._lock:      # the page and the read-ahead thread share the readers
            parts = []
            for p, where in zip(self.pieces, self._where):
                if step in where:
                    f, i = self._file(p["file"]), where[step]
                    parts.append((f, f["starts"][i], f["ends"][i]))
            if len(self._names) != len(self._codes):      # labels of a piece opened just now
                self._names = np.array(list(self._codes), dtype=object)
            names = self._names
        out = {c: np.concatenate([f[c][a:b] for f, a, b in parts], dtype=_TYPES[c]) if parts
               else np.zeros(0, dtype=_TYPES[c]) for c in LATENESS_COLUMNS[:-1] if c != "step"}
        out["step"] = np.full(sum(b - a for _, a, b in parts), step, dtype=_TYPES["step"])
        out = {c: out[c] for c in LATENESS_COLUMNS[:-1]}
        label = names[np.concatenate([f["codes"][f["label"][a:b]] for f, a, b in parts])] if parts \
            else np.zeros(0, dtype=object)
        # object, as sync_lateness gives it: pandas would infer its Arrow string type (7 ms a ZeRO-3 step of 248,832 rows)
        out["label"] = pd.Series(label, dtype=object, copy=False)
        return pd.DataFrame(out)
