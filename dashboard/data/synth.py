"""Synthetic DDP runs of any size, written with syncviz.trace.write_run (same schema as recorded runs).

Used by the dashboard benchmark (a million bucket events), by tests and for the large sample run in
traces/. The timeline follows how DDP behaves: gradients become ready bucket by bucket during
backward, buckets are launched in index order on one communication stream, an all-reduce finishes
only once the slowest rank has joined it, and the optimizer waits for the last bucket. One rank can
be made a straggler (slower backward), which shows up as launch skew on every bucket.

Everything is vectorized over steps, so 64 ranks x 500 steps x 32 buckets is written in seconds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from syncviz.trace import schema as S
from syncviz.trace import events_to_batch, new_meta, write_run

MS = 1_000_000


def bucket_sizes(n_buckets: int, bucket_mb: float = 25.0, first_mb: float = 1.0) -> np.ndarray:
    """Bucket bytes as DDP sizes them: a small first bucket, then ~bucket_cap_mb each."""
    sizes = np.full(n_buckets, int(bucket_mb * 2**20), dtype=np.int64)
    sizes[0] = int(first_mb * 2**20)
    sizes[-1] = sizes[-1] * 3 // 5   # the last bucket holds what is left
    return sizes


def synth_events(world: int, steps: int, n_buckets: int, *, seed: int = 0, straggler: int | None = None,
                 straggle_ms: float = 0.0, fwd_ms: float = 30.0, bwd_ms: float = 60.0,
                 opt_ms: float = 8.0, gbps: float = 40.0, op: str = "all_reduce",
                 gap_ms: float = 2.0) -> dict[int, list[pa.RecordBatch]]:
    """Per rank, one record batch per step: step, forward, backward, optimizer and bucket rows."""
    rng = np.random.default_rng(seed)
    sizes = bucket_sizes(n_buckets)
    busfactor = 2.0 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
    # Per (step, rank) compute times with a little noise; the straggler's backward is slower.
    fwd = fwd_ms * MS * rng.uniform(0.97, 1.03, (steps, world))
    bwd = bwd_ms * MS * rng.uniform(0.97, 1.03, (steps, world))
    opt = opt_ms * MS * rng.uniform(0.95, 1.05, (steps, world))
    if straggler is not None:
        bwd[:, straggler] += straggle_ms * MS
    # Bucket i's gradients are ready after a share of backward proportional to its bytes
    # (DDP fills buckets in reverse parameter order, so bucket 0 is ready first).
    share = np.cumsum(sizes) / sizes.sum()
    dur = (20e-6 * 1e9 + sizes * busfactor / gbps) * rng.uniform(0.9, 1.25, (steps, n_buckets))  # ns
    delay = rng.uniform(0.02, 0.3, (steps, world, n_buckets)) * MS       # hook → launch
    t0 = np.zeros((steps, world))
    ready = np.empty((steps, world, n_buckets))
    launch = np.empty_like(ready)
    done = np.empty((steps, n_buckets))
    step_start = 0.0
    out_rows = []
    for k in range(steps):
        # Ranks start a step within ~0.3 ms of each other (they all waited for the previous step).
        t0[k] = step_start + rng.uniform(0, 0.3, world) * MS
        bstart = t0[k] + fwd[k]
        ready[k] = bstart[:, None] + bwd[k][:, None] * share[None, :]
        prev_done = np.zeros(world)
        for b in range(n_buckets):
            # One comm stream per rank: a bucket starts after it is ready and the previous bucket is done;
            # the collective completes when the last rank has joined plus its transfer time.
            launch[k, :, b] = np.maximum(ready[k, :, b] + delay[k, :, b], prev_done)
            done[k, b] = launch[k, :, b].max() + dur[k, b]
            prev_done = np.full(world, done[k, b])
        opt_start = np.maximum(bstart + bwd[k], done[k, -1])
        opt_end = opt_start + opt[k]
        out_rows.append((t0[k].copy(), bstart, opt_start, opt_end))
        step_start = opt_end.max() + gap_ms * MS
    batches: dict[int, list[pa.RecordBatch]] = {r: [] for r in range(world)}
    kinds = [S.STEP, S.FORWARD, S.BACKWARD, S.OPTIMIZER] + [S.BUCKET] * n_buckets
    names = ["step", "forward", "backward", "optimizer"] + ["allreduce_hook"] * n_buckets
    bucket_col = np.r_[[-1] * 4, np.arange(n_buckets)].astype(np.int32)
    bytes_col = np.r_[[0] * 4, sizes].astype(np.int64)
    for k in range(steps):
        ts, bs, os_, oe = out_rows[k]
        for r in range(world):
            start = np.r_[ts[r], ts[r], bs[r], os_[r], launch[k, r]].astype(np.int64)
            end = np.r_[oe[r], bs[r], bs[r] + bwd[k, r], oe[r], done[k]].astype(np.int64)
            n = len(start)
            batches[r].append(events_to_batch({
                "step": np.full(n, k, dtype=np.int64), "kind": kinds, "name": names,
                "start_ns": start, "end_ns": end, "bucket": bucket_col,
                "op": [""] * 4 + [op] * n_buckets, "bytes": bytes_col,
                "dtype": [""] * 4 + ["float32"] * n_buckets,
                "group_size": np.r_[[0] * 4, [world] * n_buckets].astype(np.int32),
                "ready_ns": np.r_[[-1] * 4, ready[k, r]].astype(np.int64),
                "launch_ns": np.r_[[-1] * 4, launch[k, r]].astype(np.int64),
                "phase": [""] * 4 + ["backward" if launch[k, r, b] < bs[r] + bwd[k, r] else "other"
                                     for b in range(n_buckets)],
                "layout": np.r_[[-1] * 4, [0 if k == 0 else 1] * n_buckets].astype(np.int32),
                "logical_bytes": bytes_col,
            }))
    return batches


def synth_layouts(n_buckets: int, params_per_bucket: int = 4) -> list[dict]:
    """Two layout versions: DDP's initial buckets and the rebuilt ones (parameters regrouped in the
    order their gradients became ready)."""
    sizes = bucket_sizes(n_buckets)
    layouts = []
    n_params = n_buckets * params_per_bucket
    names = [f"layers.{i // 4}.{('attn.qkv', 'attn.proj', 'mlp.fc', 'mlp.proj')[i % 4]}.weight"
             for i in range(n_params)]
    for version, order in ((0, np.arange(n_params)[::-1]), (1, np.roll(np.arange(n_params)[::-1], 1))):
        rows = {c: [] for c in S.LAYOUT_COLUMNS}
        for b in range(n_buckets):
            idx = order[b * params_per_bucket:(b + 1) * params_per_bucket]
            numel = sizes[b] // 4 // params_per_bucket
            for j, p in enumerate(idx):
                rows["layout"].append(version)
                rows["bucket"].append(b)
                rows["param"].append(names[p])
                rows["param_index"].append(int(p))
                rows["numel"].append(int(numel))
                rows["offset"].append(int(j * numel))
                rows["dtype"].append("float32")
        layouts.append(rows)
    return layouts


def write_synth_run(path: str | Path, world: int = 8, steps: int = 20, n_buckets: int = 16, *,
                    strategy: str = "ddp", seed: int = 0, straggler: int | None = None,
                    straggle_ms: float = 0.0, finished: bool = True, **timing) -> Path:
    """Write a synthetic run directory and return its path."""
    path = Path(path)
    sizes = bucket_sizes(n_buckets)
    meta = new_meta(path.name, world, strategy=strategy, backend="nccl", device="cuda",
                    engine="synthetic", model={"params": int(sizes.sum() // 4), "bytes": int(sizes.sum()),
                                               "grad_bytes": int(sizes.sum()), "name": "synthetic"},
                    ddp={"bucket_cap_mb": 25, "first_bucket_cap_mb": 1, "comm_hook": "allreduce_hook"},
                    steps_recorded=steps)
    meta["ranks"] = [{"rank": r, "host": f"node{r // 8}", "pid": 1000 + r, "clock_offset_ns": 0,
                      "clock_error_ns": 0} for r in range(world)]
    meta["nodes"] = max(1, world // 8)
    meta["finished"] = finished
    batches = synth_events(world, steps, n_buckets, seed=seed, straggler=straggler,
                           straggle_ms=straggle_ms, **timing)
    layouts = synth_layouts(n_buckets)
    return write_run(path, meta, batches, {r: layouts for r in range(world)})
