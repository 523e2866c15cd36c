"""A record batch's Arrow IPC stream message kept as a template: the same message for another
batch whose columns are equal except some int64 columns (RankWriter.write_repeating).

An IPC message is the batch's metadata (row count, each buffer's offset and length) and its body
(the buffers, in schema order, each padded to 8 bytes). Two batches with the same row count and
equal values in every other column have the same metadata and the same body except the data
buffers of those int64 columns (no nulls, so no validity buffers). Where each of those buffers
lies in the message is read from Arrow itself: the message is read back zero-copy and each
column's data buffer address is taken relative to the message's. A batch this does not fit (a
column with nulls, a buffer Arrow did not place as expected) gets no template (``of`` → None)
and is written as usual.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa


class BatchTemplate:
    """``message(times)``: the IPC message of the kept batch with ``times[i]`` as the values of
    its i-th templated column."""

    def __init__(self, message: bytes, offsets: list[int], rows: int):
        # the message cut around the templated buffers: pieces[0], values 0, pieces[1], values 1, …
        size = 8 * rows
        ends = [0] + [at + size for at in offsets]
        self._pieces = [message[a:b] for a, b in zip(ends, offsets + [len(message)])]
        self._size = size
        self.shape = (len(offsets), rows)

    @classmethod
    def of(cls, batch: pa.RecordBatch, columns: tuple[str, ...]) -> "BatchTemplate | None":
        buf = batch.serialize()
        read = pa.ipc.read_record_batch(pa.ipc.read_message(buf), batch.schema)
        offsets = []
        for name in columns:
            col = read.column(name)
            if col.type != pa.int64() or col.null_count or col.offset:
                return None
            data = col.buffers()[1]
            at = data.address - buf.address
            # the message was read back zero-copy: the column's values lie in it, at ``at``
            if not 0 <= at <= buf.size - 8 * len(col) or not buf[at:at + 8 * len(col)].equals(data[:8 * len(col)]):
                return None
            offsets.append(at)
        return cls(buf.to_pybytes(), offsets, batch.num_rows)

    def message(self, times: np.ndarray) -> bytes:
        """``times``: int64, shape ``self.shape``. One join of byte strings: numpy calls on views
        of a copied message cost ~50 µs a step in a traced training loop (cold caches), ~5x this."""
        values = np.ascontiguousarray(times, dtype="<i8").tobytes()
        size, pieces = self._size, self._pieces
        parts = [pieces[0]]
        for i in range(1, len(pieces)):
            parts.append(values[(i - 1) * size:i * size])
            parts.append(pieces[i])
        return b"".join(parts)
