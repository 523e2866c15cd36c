"""Every rank's launch lateness, kept by step, so that one step of a run too big to read whole is
drawn without reading every rank's events.

The Replay page draws, for one step, the rank × collective lateness heatmap (tables.sync_lateness)
of *every* rank. Computing it means reading the step from every rank file: ~0.6 s for one step of
the 1,024-rank, 10^8-event run (benchmarks/scale.py), plus ~0.4 s to match collectives across
ranks. The summary's second pass has those rows anyway (partition_joined.lateness: it sums them
into the rank × step map), so each partition writes them here, to one file in step order with where
each step begins. Reading a step is then one block of each partition's file.

Format (since session 32; one Arrow IPC record batch per step before): a magic line, the header's
length (8 bytes), the header (JSON: rows, the steps and where each begins, the label dictionary, each
column's stored type, and the blocks), then the blocks: LZ4 frames of whole consecutive steps
(BLOCK_BYTES), each holding its rows column after column (LATENESS_COLUMNS but ``step``, which the
header implies: sync_lateness' rows less launch_ns, a step's rows in sync_lateness' order for these
ranks; ``label`` as codes into the dictionary, -1 for none; each column in the smallest integer type
that holds it). Why: Arrow's writer cost ~26 µs a batch, and the 10^8-event DDP run has 781 steps in
each of its 147 pieces: a piece shaped like them (661,507 rows, 7 ranks × 781 steps × 121 buckets)
was written and checked in 49 ms, now in ~24 ms, 2.7 MB against 4.2 MB (tests/test_steplateness.py
checks every step back). A piece must read back equal to the rows written (as views/runcache.py keeps its entries); if one does not,
the run keeps no lateness at all (analysis.partitioned), so a heatmap never lacks ranks.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz.analysis.partition_local import small_ints

LATENESS_COLUMNS = ["rank", "step", "micro", "bucket", "late_ns", "label"]
_TYPES = {"rank": np.int32, "step": np.int64, "micro": np.int32, "bucket": np.int64, "late_ns": np.int64,
          "label": np.int32}      # label: codes into the piece's dictionary
_MAGIC = b"syncviz lateness 2\n"
# the step column is not stored (a step's rows are together: the header says where each begins)
_STORED = [c for c in LATENESS_COLUMNS if c != "step"]


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


BLOCK_BYTES = 64 << 10
"""Steps are kept together in LZ4 blocks of about this many bytes (before compression): a step of a
partition of the 10^8-event DDP run is ~9 KB, of the ZeRO-3 run ~21 KB. One block a step would be
781 compress calls a piece of the DDP run; the whole piece uncompressed was 5.4 times Arrow's
LZ4-compressed files for the ZeRO-3 run (621 against 115 MB)."""


def write_piece(path: str | Path, late: pd.DataFrame) -> dict | None:
    """Write ``late`` (partition_joined.lateness of one partition) to ``path``, its rows in step
    order (a step's rows keep their order). Returns {"file": name, "steps": [each step kept]}, or
    None when there is nothing to keep. Raises NotKept when the file does not read back equal."""
    if late is None or not len(late):
        return None
    path = Path(path)
    cols, labels = _columns(late)
    stored = {c: small_ints(cols[c]) for c in _STORED}      # narrowed first: less to reorder
    steps = cols["step"]
    if (steps[1:] < steps[:-1]).any():
        order = np.argsort(steps, kind="stable")
        stored, steps = {c: v[order] for c, v in stored.items()}, steps[order]
    lo = np.r_[0, np.flatnonzero(steps[1:] != steps[:-1]) + 1]     # steps sorted: where each begins
    bounds = np.r_[lo, len(steps)]
    row_bytes = sum(v.dtype.itemsize for v in stored.values())
    # blocks of whole steps: a block starts where the rows since the last start pass BLOCK_BYTES
    first, blocks, payload, at = 0, [], [], 0
    while first < len(lo):
        last = int(np.searchsorted(bounds, bounds[first] + max(1, BLOCK_BYTES // row_bytes), side="right")) - 1
        last = min(max(last, first + 1), len(lo))          # at least one step, whole steps only
        a, b = int(bounds[first]), int(bounds[last])
        packed = pa.compress(b"".join(np.ascontiguousarray(stored[c][a:b]).tobytes() for c in _STORED),
                             codec="lz4", asbytes=True)
        blocks.append([first, a, b, at, len(packed)])
        payload.append(packed)
        at += len(packed)
        first = last
    head = {"rows": len(steps), "steps": steps[lo].tolist(), "starts": lo.tolist(), "labels": labels,
            "columns": [[c, stored[c].dtype.str] for c in _STORED], "blocks": blocks}
    raw = json.dumps(head).encode()
    with open(path, "wb") as f:
        f.write(_MAGIC + len(raw).to_bytes(8, "little") + raw)
        f.writelines(payload)
    back = read_back(path, widen=False)
    if back is None or back["labels"] != labels or back["steps"] != head["steps"] or back["starts"] != head["starts"] \
            or not all(back[c].dtype == stored[c].dtype and np.array_equal(back[c], stored[c]) for c in _STORED):
        path.unlink(missing_ok=True)
        raise NotKept(f"{path.name} did not read back equal")
    return {"file": path.name, "steps": head["steps"]}


class _Piece:
    """One piece opened: its header, and its blocks decompressed on demand (the last one kept: the
    Replay's next step is mostly in the same block)."""

    def __init__(self, path: Path):
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        if bytes(self.mm[:len(_MAGIC)]) != _MAGIC:
            raise ValueError(f"{path.name}: not a lateness piece of this syncviz")
        n = int.from_bytes(bytes(self.mm[len(_MAGIC):len(_MAGIC) + 8]), "little")
        self.base = len(_MAGIC) + 8 + n
        self.head = json.loads(bytes(self.mm[len(_MAGIC) + 8:self.base]))
        self.columns = [(c, np.dtype(t)) for c, t in self.head["columns"]]
        self.starts = self.head["starts"] + [int(self.head["rows"])]
        self.block_of = np.zeros(len(self.head["steps"]), dtype=np.int64)
        for j, (first, *_rest) in enumerate(self.head["blocks"]):
            self.block_of[first:] = j
        self._last: tuple[int, dict] | None = None

    def block(self, j: int) -> tuple[int, dict]:
        """(first row, the block's columns as stored)."""
        if self._last is not None and self._last[0] == j:
            return self._last[1]
        _, a, b, at, size = self.head["blocks"][j]
        raw = pa.decompress(self.mm[self.base + at:self.base + at + size], codec="lz4", asbytes=True,
                            decompressed_size=(b - a) * sum(t.itemsize for _, t in self.columns))
        cols, off = {}, 0
        for c, t in self.columns:
            cols[c] = np.frombuffer(raw, dtype=t, count=b - a, offset=off)
            off += (b - a) * t.itemsize
        self._last = (j, (a, cols))
        return a, cols

    def rows(self, i: int) -> dict:
        """Step number ``i`` of the piece (its place in "steps"): each column's rows, as stored."""
        first, cols = self.block(int(self.block_of[i]))
        a, b = self.starts[i] - first, self.starts[i + 1] - first
        return {c: v[a:b] for c, v in cols.items()}


def read_back(path: Path, widen: bool = True) -> dict | None:
    """A whole piece: each column (``widen``: in its type in LATENESS_COLUMNS, else as stored, as
    write_piece checks it) and "labels", "steps", "starts" from the header; None when the file is
    not such a piece."""
    try:
        piece = _Piece(Path(path))
        head = piece.head
        parts = [piece.block(j)[1] for j in range(len(head["blocks"]))]
        out = {"labels": head["labels"], "steps": head["steps"], "starts": head["starts"]}
        for c, t in piece.columns:
            out[c] = np.concatenate([p[c] for p in parts]) if parts else np.zeros(0, dtype=t)
            if widen:
                out[c] = out[c].astype(_TYPES[c], copy=False)
        if any(len(out[c]) != int(head["rows"]) for c, _ in piece.columns):
            return None
        return out
    except (OSError, ValueError, KeyError, TypeError, IndexError, json.JSONDecodeError, pa.ArrowException):
        return None


class KeptLateness:
    """The kept pieces of one run (``pieces``: write_piece's dicts, files in ``folder``): one step's
    rows of every rank. Files are memory-mapped on first use and kept open (a header is read once);
    a step decompresses its block of each piece, nothing more."""

    def __init__(self, folder: Path, pieces: list[dict]):
        self.folder, self.pieces = Path(folder), pieces
        self._files: dict[str, _Piece] = {}
        self._lock = threading.Lock()
        self._where = [{s: i for i, s in enumerate(p["steps"])} for p in pieces]
        self._codes: dict = {}                      # label -> its code in _names
        self._names = np.zeros(0, dtype=object)

    def _file(self, name: str) -> _Piece:
        if name not in self._files:
            try:
                piece = _Piece(self.folder / name)
            except (ValueError, KeyError, TypeError, IndexError) as e:     # JSONDecodeError is a ValueError
                raise OSError(f"{self.folder / name}: not a lateness piece of this syncviz ({e})") from None
            # the piece's label codes as codes into one dictionary of every piece read so far (code -1:
            # no label, the last entry): a step's labels are then one take of its codes
            piece.codes = np.array([self._codes.setdefault(x, len(self._codes)) for x in piece.head["labels"] + [None]],
                                   dtype=np.int64)
            self._files[name] = piece
        return self._files[name]

    def step(self, step: int) -> pd.DataFrame:
        """tables.sync_lateness' rows of ``step`` (less launch_ns), every rank, in rank order."""
        with self._lock:      # the page and the read-ahead thread share the readers (and their kept blocks)
            parts = []
            for p, where in zip(self.pieces, self._where):
                if step in where:
                    piece = self._file(p["file"])
                    rows = piece.rows(where[step])
                    rows["label"] = piece.codes[rows["label"]]
                    parts.append(rows)
            if len(self._names) != len(self._codes):      # labels of a piece opened just now
                self._names = np.array(list(self._codes), dtype=object)
            names = self._names
        out = {c: np.concatenate([r[c] for r in parts], dtype=_TYPES[c]) if parts else np.zeros(0, dtype=_TYPES[c])
               for c in _STORED}
        n = len(out["rank"])
        late = {c: out[c] if c != "step" else np.full(n, step, dtype=_TYPES["step"]) for c in LATENESS_COLUMNS[:-1]}
        # object, as sync_lateness gives it: pandas would infer its Arrow string type (7 ms a ZeRO-3 step of 248,832 rows)
        late["label"] = pd.Series(names[out["label"]] if n else np.zeros(0, dtype=object), dtype=object, copy=False)
        return pd.DataFrame(late)
