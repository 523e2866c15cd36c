"""Opt-in recording of gradient *values* around DDP's synchronization (``syncviz trace
--grad-values [K]`` or SYNCVIZ_GRAD_VALUES=K): for each parameter of each bucket, its first K
elements and its norm as this rank held them before the bucket's collective and after it.

Off by default. When on it only reads the bucket buffer (slices copied, norms computed) and never
writes to it, so training is bitwise identical (tested). The copies are made inside the comm hook
and its completion callback; the file is written at step boundaries (grads-<rank>.arrow, one
record batch per step, trace.schema.GRADS_SCHEMA). syncviz.analysis.grads checks the values."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa
import torch

from syncviz.trace import schema as S

DEFAULT_ELEMENTS = 4


class GradValues:
    def __init__(self, rec, elements: int = DEFAULT_ELEMENTS):
        if elements < 1:
            raise ValueError(f"--grad-values needs at least 1 element per parameter (got {elements})")
        self.rec, self.k = rec, int(elements)
        self._rows: list[tuple] = []
        self._sink = self._writer = None
        rec.meta_extra["grad_values"] = {"elements": self.k, "files": "grads-<rank>.arrow"}

    # ---------------------------------------------------------------- inside the comm hook
    def before(self, bucket, buf: torch.Tensor, layout: int, index: int):
        """Called at hook entry, before anything touches ``buf``; returns the token for after()."""
        rec = self.rec
        if rec.step not in rec.selection:
            return None
        params = []
        offset = 0
        for p in bucket.parameters():
            i, name = rec.param_index(p)
            params.append((i, name, offset, p.numel()))
            offset += p.numel()
        token = (rec.step, max(rec.micro, 0), index, layout, params, S.dtype_name(buf.dtype))
        self._take(token, buf, S.GRAD_BEFORE)
        return token

    def after(self, token, result: torch.Tensor) -> None:
        """Called when the bucket's future completes, with the tensor DDP copies into .grad."""
        if token is not None and isinstance(result, torch.Tensor):
            self._take(token, result, S.GRAD_AFTER)

    def _take(self, token, buf: torch.Tensor, when: str) -> None:
        step, micro, index, layout, params, dtype = token
        flat = buf.detach().reshape(-1)
        with torch.no_grad():
            for i, name, off, n in params:
                g = flat[off:off + n]
                head = g[:self.k].to(torch.float64).cpu().tolist()        # a copy: buf is untouched
                norm = float(torch.linalg.vector_norm(g.to(torch.float64)))
                self._rows.append((step, micro, index, layout, name, i, n, when, norm, head, dtype))

    # ---------------------------------------------------------------- step boundaries
    def on_step_end(self, step: int) -> None:
        rows = [r for r in self._rows if r[0] <= step]
        if not rows:
            return
        self._rows = [r for r in self._rows if r[0] > step]
        if self._writer is None:
            path = Path(self.rec.run_dir) / S.grads_file(self.rec.rank)
            self._sink = pa.OSFile(str(path), "wb")
            self._writer = pa.ipc.new_stream(self._sink, S.GRADS_SCHEMA.with_metadata(
                S.stream_metadata(self.rec.rank)))
        cols = list(zip(*rows))
        self._writer.write_batch(pa.RecordBatch.from_arrays(
            [pa.array(list(c), type=f.type) for c, f in zip(cols, S.GRADS_SCHEMA)], schema=S.GRADS_SCHEMA))
        self._sink.flush()

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
                self._sink.close()
            self._writer = None


def install(rec, elements: int = DEFAULT_ELEMENTS) -> GradValues:
    """Attach gradient-value recording to a recorder (before the DDP model is built or after)."""
    gv = GradValues(rec, elements)
    rec.grad_values = gv
    rec.on_step_end(gv.on_step_end)
    rec.on_close(lambda _rec: gv.close())
    return gv
