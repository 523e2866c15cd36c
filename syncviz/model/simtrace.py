"""Turn a simulated Timeline (syncviz.model.simcore) into trace rows and write them as an ordinary run
directory (run.json, rank-<r>.arrow, layout-<r>.arrow) that syncviz.trace.load_run reads.

Every step of every rank has the same rows in the same order (a *template*: step, forward,
backward, grad_ready…, bucket…, optimizer, collectives…); only the four time columns and the step
number differ. That is what makes 1,024 ranks × 1,000 steps × 100 buckets writable in seconds:
- columns that depend only on the row's place in the template (kind, name, bucket, op, bytes,
  dtype, …) are dictionary-encoded Arrow arrays whose int8/int16 index buffer is built once and
  shared by every batch of every rank (readers cast them back to the schema's plain types);
- the step column is a dictionary too (indices repeat per batch, the dictionary holds the steps);
- the time columns are int64 numpy arrays computed per rank with broadcasting, zero-copy into Arrow;
- a record batch holds up to 127 steps (int8 step indices) instead of one, since one batch per
  step would mean a million tiny batches; readers treat batches as opaque;
- ranks are written by several processes (fork) when there are many.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz.analysis import rank_pass
from syncviz.trace import schema as S
from syncviz.trace import write_json_atomic

TIME_COLUMNS = ("start_ns", "end_ns", "ready_ns", "launch_ns")
DEFAULTS = {"micro": 0, "bucket": -1, "op": "", "bytes": 0, "dtype": "", "group_size": 0, "phase": "",
            "layout": -1, "logical_bytes": 0}
GRAD_READY_MODES = ("param", "bucket", "none")


# ----------------------------------------------------------------------------- the template

def template(tl, grad_ready: str = "param") -> list[tuple[str, dict]]:
    """Blocks of rows of one step: (block name, fixed columns: col -> scalar or per-row list)."""
    if grad_ready not in GRAD_READY_MODES:
        raise ValueError(f"unknown grad-ready mode {grad_ready!r}; choose from {', '.join(GRAD_READY_MODES)}")
    p, cfg, n = tl.p, tl.cfg, tl.cfg.world_size
    blocks = [("step", {"kind": S.STEP, "name": "step"})]
    if cfg.strategy == "zero3":
        u, names = tl.units, tl.unit_names
        coll = lambda op, nbytes, dtype, phase: {"kind": S.COLLECTIVE, "name": names, "op": op,  # noqa: E731
                                                 "bytes": nbytes, "logical_bytes": nbytes, "dtype": dtype,
                                                 "group_size": n, "phase": phase}
        blocks += [("ag_f", coll("all_gather", tl.unit_param_bytes, p.param_dtype, "forward")),
                   ("fwd", {"kind": S.FORWARD, "name": ["forward"] * u}),
                   ("ag_b", coll("all_gather", tl.unit_param_bytes, p.param_dtype, "backward")),
                   ("bwd", {"kind": S.BACKWARD, "name": ["backward"] * u}),
                   ("rs", coll("reduce_scatter", tl.unit_grad_bytes, p.grad_dtype, "backward")),
                   ("optimizer", {"kind": S.OPTIMIZER, "name": "AdamW", "layout": 0})]
        return blocks
    blocks += [("forward", {"kind": S.FORWARD, "name": "forward"}),
               ("backward", {"kind": S.BACKWARD, "name": "backward"})]
    if grad_ready == "param":
        blocks.append(("grad_param", {"kind": S.GRAD_READY, "name": list(p.tensor_names), "bucket": tl.bucket_of}))
    elif grad_ready == "bucket":
        last = np.r_[np.flatnonzero(np.diff(tl.bucket_of)), len(tl.bucket_of) - 1]
        blocks.append(("grad_bucket", {"kind": S.GRAD_READY, "name": [p.tensor_names[i] for i in last],
                                       "bucket": np.arange(len(last))}))
    k = len(tl.x)
    blocks.append(("bucket", {"kind": S.BUCKET, "name": tl.hook, "bucket": np.arange(k), "op": tl.op,
                              "bytes": tl.wire_bytes, "logical_bytes": tl.logical_bytes, "dtype": tl.wire_dtype,
                              "group_size": n, "phase": S.BACKWARD, "layout": 0}))
    blocks.append(("optimizer", {"kind": S.OPTIMIZER, "name": "AdamW", "layout": 0}))
    if cfg.strategy in ("zero1", "zero2"):
        blocks.append(("ag", {"kind": S.COLLECTIVE, "name": "all_gather", "op": "all_gather",
                              "bytes": tl.ag_bytes, "logical_bytes": tl.ag_bytes, "dtype": p.param_dtype,
                              "group_size": n, "phase": S.OPTIMIZER}))
    return blocks


def block_sizes(tl, blocks) -> list[int]:
    sizes = {"grad_param": len(tl.p.tensor_names), "grad_bucket": len(getattr(tl, "x", [])),
             "bucket": len(getattr(tl, "x", [])), "ag": len(getattr(tl, "x", []))}
    u = getattr(tl, "units", 0)
    sizes.update({b: u for b in ("ag_f", "fwd", "ag_b", "bwd", "rs")})
    return [sizes.get(name, 1) for name, _ in blocks]


def fixed_columns(tl, blocks) -> dict[str, list]:
    """Per template row, the value of every non-time column except step."""
    sizes = block_sizes(tl, blocks)
    out = {c: [] for c in S.EVENT_COLUMNS if c not in TIME_COLUMNS and c != "step"}
    for (name, fixed), n in zip(blocks, sizes):
        for col in out:
            v = fixed.get(col, DEFAULTS.get(col))
            out[col].extend(list(v) if isinstance(v, (list, np.ndarray)) else [v] * n)
    return out


# ------------------------------------------------------------------------------ rank times

def _block_times(tl, r: int) -> dict[str, tuple]:
    """Per block: (start, end, ready, launch) in ns, arrays (steps,) or (steps, n); None = -1."""
    p, G, a, c = tl.p, tl.G, tl.a[r], tl.c[r]
    t0 = G + a
    opt_start = G + tl.E + p.post_comm_ns
    opt_end = opt_start + c * tl.opt_ns
    col = lambda x: x[:, None]  # noqa: E731
    if tl.cfg.strategy == "zero3":
        z, Gc = tl.z, col(G)
        ag_f_issue, ag_b_issue = Gc + z["ag_f_issue"][:, :, r], Gc + z["ag_b_issue"][:, :, r]
        rs_launch = Gc + z["bwd_end"][:, :, r]
        return {"step": (t0, opt_end, None, None),
                "ag_f": (ag_f_issue, Gc + z["ag_f_end"], None, ag_f_issue),
                "fwd": (Gc + z["fwd_start"][:, :, r], Gc + z["fwd_end"][:, :, r], None, None),
                "ag_b": (ag_b_issue, Gc + z["ag_b_end"], None, ag_b_issue),
                "bwd": (Gc + z["bwd_start"][:, :, r], rs_launch, None, None),
                "rs": (rs_launch, Gc + z["rs_end"], rs_launch, rs_launch),
                "optimizer": (opt_start, opt_end, None, None)}
    fwd_end = t0 + c * p.forward_ns
    bwd_start = fwd_end + c * p.pre_backward_ns
    # The (steps × buckets) arrays dominate the cost: integers once, the global end computed once
    # for all ranks (rounded up, so it never precedes a launch it waited for).
    ready = np.multiply(col(c), tl.x[None, :])
    ready += col(bwd_start)
    ready = ready.astype(np.int64)
    if tl.h_const:
        launch = ready + np.int64(tl.h[0])
    else:
        launch = np.maximum.accumulate(ready + tl.h.astype(np.int64)[None, :], axis=1)
    if getattr(tl, "_bucket_end", None) is None:
        tl._bucket_end = np.ceil(col(G) + tl.e).astype(np.int64)
    bucket_end = tl._bucket_end
    out = {"step": (t0, opt_end if tl.ag_end is None else G + tl.ag_end[:, -1], None, None),
           "forward": (t0, fwd_end, None, None),
           "backward": (bwd_start, bwd_start + c * p.backward_ns, None, None),
           "bucket": (launch, bucket_end, ready, launch),
           "optimizer": (opt_start, opt_end, None, None)}
    if "grad_param" in tl.blocks_used:
        t = col(bwd_start) + col(c) * p.ready_ns[None, :]
        out["grad_param"] = (t, t, None, None)
    if "grad_bucket" in tl.blocks_used:
        out["grad_bucket"] = (ready, ready, None, None)
    if tl.ag_end is not None:
        out["ag"] = (col(opt_end), col(G) + tl.ag_end, None, col(opt_end))
    return out


def rank_times(tl, r: int, blocks, sizes, out: dict | None = None) -> dict[str, np.ndarray]:
    """The four time columns of rank r, each (steps, rows per step) int64 (into ``out`` if given:
    the writer reuses its buffers from rank to rank instead of faulting in fresh pages)."""
    s, width = tl.cfg.steps, sum(sizes)
    out = out or {c: np.empty((s, width), dtype=np.int64) for c in TIME_COLUMNS}
    times = _block_times(tl, r)
    pos = 0
    for (name, _), n in zip(blocks, sizes):
        sl = slice(pos, pos + n)
        for c, v in zip(TIME_COLUMNS, times[name]):
            if v is None:
                out[c][:, sl] = -1
            else:
                out[c][:, sl] = v if v.ndim == 2 else v[:, None]
        pos += n
    return out


def prepare(tl, grad_ready: str = "param"):
    blocks = template(tl, grad_ready)
    tl.blocks_used = {name for name, _ in blocks}
    return blocks, block_sizes(tl, blocks)


def events_frame(tl, ranks=None, grad_ready: str = "param") -> pd.DataFrame:
    """The simulated events as load_run's events table (plain columns), for in-memory analysis."""
    blocks, sizes = prepare(tl, grad_ready)
    fixed = fixed_columns(tl, blocks)
    width, steps = sum(sizes), tl.cfg.steps
    frames = []
    for r in (range(tl.cfg.world_size) if ranks is None else ranks):
        t = rank_times(tl, r, blocks, sizes)
        cols = {"step": np.repeat(np.arange(steps, dtype=np.int64), width)}
        cols.update({c: np.tile(np.asarray(v), steps) for c, v in fixed.items()})
        cols.update({c: t[c].ravel() for c in TIME_COLUMNS})
        df = pd.DataFrame({c: cols[c] for c in S.EVENT_COLUMNS})
        df["rank"] = np.int32(r)
        frames.append(df)
    ev = pd.concat(frames, ignore_index=True)
    for c in S.CATEGORICAL_COLUMNS:   # typed as the trace reader types a run (trace.events_frame)
        ev[c] = ev[c].astype("category")
    return ev


# ---------------------------------------------------------------------------------- writing

def _dictionary(values: list, typ: pa.DataType):
    """codes (per template row) and the dictionary of distinct values."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object), sort=False)
    idx = np.int8 if len(uniques) <= 127 else np.int16 if len(uniques) <= 32767 else np.int32
    return codes.astype(idx), pa.array(list(uniques), type=typ)


class _Encoder:
    """Builds record batches of whole steps; index buffers are cached per batch length."""

    def __init__(self, tl, blocks, sizes, steps_per_batch: int):
        self.width = sum(sizes)
        self.spb = steps_per_batch
        fixed = fixed_columns(tl, blocks)
        types = {f.name: f.type for f in S.EVENT_SCHEMA}
        self.dicts = {c: _dictionary(v, types[c]) for c, v in fixed.items()}
        self.step_index_type = np.int8 if steps_per_batch <= 127 else np.int16
        fields = []
        for f in S.EVENT_SCHEMA:
            if f.name in TIME_COLUMNS:
                fields.append(f)
            else:
                idx = self.step_index_type if f.name == "step" else self.dicts[f.name][0].dtype
                fields.append(pa.field(f.name, pa.dictionary(pa.from_numpy_dtype(idx), f.type)))
        self.fields = fields
        self._cache: dict[int, dict[str, pa.Array]] = {}

    def schema(self, rank: int) -> pa.Schema:
        return pa.schema(self.fields, metadata=S.stream_metadata(rank))

    def _fixed(self, nsteps: int) -> dict[str, pa.Array]:
        """Dictionary columns of a batch of ``nsteps`` steps: identical in every batch of every rank."""
        if nsteps not in self._cache:
            cols = {c: pa.DictionaryArray.from_arrays(pa.array(np.tile(codes, nsteps)), values)
                    for c, (codes, values) in self.dicts.items()}
            cols["step"] = pa.array(np.repeat(np.arange(nsteps, dtype=self.step_index_type), self.width))
            self._cache[nsteps] = cols
        return self._cache[nsteps]

    def batches(self, times: dict[str, np.ndarray], schema: pa.Schema):
        total = times["start_ns"].shape[0]
        flat = {c: pa.array(times[c].ravel()) for c in TIME_COLUMNS}
        for s0 in range(0, total, self.spb):
            n = min(self.spb, total - s0)
            fixed = self._fixed(n)
            lo, ln = s0 * self.width, n * self.width
            cols = []
            for f in S.EVENT_SCHEMA:
                if f.name in TIME_COLUMNS:
                    cols.append(flat[f.name].slice(lo, ln))
                elif f.name == "step":   # indices 0..n-1 are in range by construction: skip the check
                    cols.append(pa.DictionaryArray.from_arrays(fixed["step"], pa.array(np.arange(s0, s0 + n)),
                                                               safe=False))
                else:
                    cols.append(fixed[f.name])
            yield pa.RecordBatch.from_arrays(cols, schema=schema)


_JOB: dict = {}   # set before forking: workers inherit the timeline instead of unpickling it


def _write_ranks(ranks: list[int]) -> int:
    tl, blocks, sizes, enc, run_dir, layout = (_JOB[k] for k in ("tl", "blocks", "sizes", "enc", "dir", "layout"))
    rows, times = 0, None
    for r in ranks:
        times = rank_times(tl, r, blocks, sizes, times)
        schema = enc.schema(r)
        path = os.devnull if _JOB.get("dry_run") else str(run_dir / S.rank_file(r))
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            for b in enc.batches(times, schema):
                w.write_batch(b)
                rows += b.num_rows
        lpath = os.devnull if _JOB.get("dry_run") else str(run_dir / S.layout_file(r))
        with pa.OSFile(lpath, "wb") as sink, pa.ipc.new_stream(
                sink, S.LAYOUT_SCHEMA.with_metadata(S.stream_metadata(r))) as w:
            w.write_batch(layout)
        if not _JOB.get("dry_run") and rank_pass.worth_it(os.path.getsize(path), tl.cfg.world_size):
            _keep_first_pass(r, Path(path))
    return rows


def _keep_first_pass(rank: int, path: Path) -> None:
    """As a traced rank does when it closes (record/first_pass.py): a failure costs the summary
    that saving (it reads the rank's events), never the simulated run."""
    try:
        rank_pass.write(rank, path)
    except Exception as e:     # noqa: BLE001
        print(f"syncviz simulate: rank {rank}: first pass not kept ({type(e).__name__}: {e})", file=sys.stderr)


def layout_batch(tl) -> pa.RecordBatch:
    """Bucket → parameters (ZeRO-3: unit → parameters, the unit index in the bucket column)."""
    p = tl.p
    if tl.cfg.strategy == "zero3":
        ids = sorted(set(np.asarray(p.layer).tolist()))
        group = np.searchsorted(ids, np.asarray(p.layer))
    else:
        group = tl.bucket_of
    offset = pd.Series(p.numel).groupby(group).cumsum().to_numpy() - p.numel
    return pa.RecordBatch.from_pydict({
        "layout": np.zeros(len(group), np.int32), "bucket": group.astype(np.int32),
        "param": list(p.tensor_names), "param_index": np.asarray(p.param_index, np.int32),
        "numel": p.numel.astype(np.int64), "offset": offset.astype(np.int64),
        "dtype": [p.grad_dtype] * len(group)}, schema=S.LAYOUT_SCHEMA)


def _set_job(job: dict) -> None:
    _JOB.update(job)


def _threads() -> set[str] | None:
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return None


# The threads libraries start at import (numpy's, pyarrow's jemalloc background thread) have fork
# handlers; threads started later (servers, process groups, a test session's leftovers) may hold a
# lock at the fork and hang the child.
_IMPORT_THREADS = _threads()


def _fork_safe() -> bool:
    now = _threads()
    return now is not None and _IMPORT_THREADS is not None and now <= _IMPORT_THREADS


def write(run_dir, tl, meta: dict, *, grad_ready: str = "param", steps_per_batch: int | None = None,
          workers: int | None = None, dry_run: bool = False) -> int:
    """Write the simulated run; returns the number of event rows written. ``dry_run`` encodes
    every rank's stream but sends the bytes to /dev/null (benchmarks: the cost without the OS's)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    blocks, sizes = prepare(tl, grad_ready)
    width = sum(sizes)
    n_ranks = tl.cfg.world_size
    if steps_per_batch is None:
        # One batch per step, as recorders write (the dashboard finds a step's rows as whole
        # batches), unless that means too many tiny batches: then up to 127 steps per batch.
        steps_per_batch = 1 if n_ranks * tl.cfg.steps <= 20_000 else max(1, min(127, 65536 // width))
    spb = steps_per_batch
    enc = _Encoder(tl, blocks, sizes, spb)
    n = tl.cfg.world_size
    if workers is None:
        workers = min(os.cpu_count() or 1, max(1, n * tl.cfg.steps * width // 2_000_000))
    job = dict(tl=tl, blocks=blocks, sizes=sizes, enc=enc, dir=run_dir, layout=layout_batch(tl), dry_run=dry_run)
    _JOB.update(job)
    try:
        if workers <= 1 or n == 1:
            rows = _write_ranks(list(range(n)))
        else:
            chunks = [list(range(n))[i::workers] for i in range(workers)]
            # fork is cheapest (the job is inherited, not pickled: 2.4 s against 4.0 s for a fresh
            # forkserver, llama70b-1024 x 20 steps) but forked from the full test session a worker
            # hung for 10 minutes: fork only while no thread has started since this import.
            ctx = mp.get_context("fork" if _fork_safe() else "forkserver")
            with ctx.Pool(workers, initializer=_set_job, initargs=(job,)) as pool:
                rows = sum(pool.map(_write_ranks, chunks))
    finally:
        _JOB.clear()
    meta = dict(meta, steps_recorded=tl.cfg.steps, finished=True)
    write_json_atomic(run_dir / S.RUN_FILE, meta)
    return rows
