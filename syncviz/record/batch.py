"""A step's records → one record batch's columns (schema.EVENT_COLUMNS). Runs once per step at the
step boundary, off the hooks' hot path; a pure function of the records, so it is tested alone.
The gradient-ready rows (most of a step's rows) are built as arrays (columns.py)."""
from __future__ import annotations

from typing import Callable

from syncviz.record.columns import ARRAY_ROWS, GradBlock, RowGrads, StepColumns
from syncviz.record.events import BucketCall, CollectiveCall, Phase
from syncviz.trace import schema as S

_COMPUTE = (S.FORWARD, S.BACKWARD, S.OPTIMIZER)   # not EVAL_FORWARD: evaluation is no training phase


def build_batch(step: int, *, phases: list[Phase], ready, buckets: list[BucketCall],
                collectives: list[CollectiveCall], base: int, world_size: int, step_start: int | None,
                param_name: Callable[[int], str],
                bucket_params: Callable[[int, int], list[int]], param_names=None) -> StepColumns:
    """Columns of one step (StepColumns.to_batch() makes the record batch). ``base`` turns a
    local-clock stamp into the aligned clock (gradient-ready times are stamped locally, the hottest
    hook); ``bucket_params(layout, index)`` lists a bucket's parameter indices; ``param_names``
    (optional): every parameter's ``param_name`` by index as an Arrow array, kept by the caller."""
    # Rows as tuples in EVENT_COLUMNS order, turned into columns once at the end (zip(*rows)):
    # half the cost of appending each value to its column list (timeit, a 14-row step).
    rows: list[tuple] = []
    append = rows.append

    def add(kind, name, start, end, micro=0, bucket=-1, op="", nbytes=0, dtype="", group_size=0,
            ready=-1, launch=-1, phase="", layout=-1, logical=0):
        append((step, micro, kind, name, start, end, bucket, op, nbytes, dtype,
                group_size, ready, launch, phase, layout, logical))

    spans = []   # (start, end, kind) for phase lookup
    for p in phases:
        add(p.kind, p.name, p.start, p.end, micro=max(p.micro, 0), layout=p.depth)
        spans.append((p.start, p.end, p.kind))
    # hooks append plain tuples in GradReady's order; many become arrays, a few rows right here
    # (or an (n, 3) int64 array from the C++ hooks: record/native)
    grads = GradBlock(ready, base) if len(ready) >= ARRAY_ROWS else RowGrads(ready, base, add, param_name)
    # What each bucket's hook really sent (a compression hook sends less than the bucket holds):
    # the collectives issued inside it.
    # Its launch: the collective call inside the hook (DDP's default path stamps it; for another
    # hook the first collective issued inside the bucket), the hook entry when none was recorded.
    sent: dict[tuple[int, int], int] = {}
    sent_dtype: dict[tuple[int, int], str] = {}
    first_call: dict[tuple[int, int], int] = {}
    sent_op: dict[tuple[int, int], str] = {}       # DeepSpeed's ZeRO-3 buckets reduce-scatter
    for c in collectives:
        if c.bucket >= 0 and c.kind == S.COLLECTIVE:
            key = (c.micro, c.bucket)
            sent[key] = sent.get(key, 0) + c.nbytes
            sent_dtype.setdefault(key, c.dtype)
            if key not in first_call or c.launch < first_call[key]:
                first_call[key] = c.launch
            sent_op.setdefault(key, c.op)
    for b in buckets:
        last_ready = grads.last_ready(b.micro, bucket_params(b.layout, b.index))
        key = (max(b.micro, 0), b.index)
        add(S.BUCKET, b.hook, b.launch, b.done, micro=max(b.micro, 0), bucket=b.index, op=sent_op.get(key, "all_reduce"),
            nbytes=sent.get(key, b.nbytes), dtype=sent_dtype.get(key, b.dtype), group_size=world_size,
            ready=last_ready, launch=b.issued if b.issued >= 0 else max(first_call.get(key, b.launch), b.launch),
            phase=phase_at(b.launch, spans), layout=b.layout,
            logical=b.nbytes)
    for c in collectives:
        add(c.kind, c.name, c.launch, c.done, micro=c.micro, bucket=c.bucket, op=c.op, nbytes=c.nbytes,
            dtype=c.dtype, group_size=c.group_size, ready=c.ready, launch=c.launch,
            phase=c.phase or phase_at(c.launch, spans), layout=c.layout,
            logical=c.nbytes if c.logical_bytes < 0 else c.logical_bytes)
    starts = [r[_START] for r in rows if r[_START] >= 0]
    ends = [r[_END] for r in rows]
    if grads.n:
        ok = grads.t[grads.t >= 0]
        if len(ok):
            starts.append(int(ok.min()))
        ends.append(int(grads.t.max()))
    if starts:
        add(S.STEP, "step", step_start if step_start is not None else min(starts), max(ends))
    cols = {c: list(v) for c, v in zip(S.EVENT_COLUMNS, zip(*rows))} if rows else {c: [] for c in S.EVENT_COLUMNS}
    return StepColumns(cols, len(phases), block=(grads, step, param_name, param_names) if grads.n else None)


_START, _END = S.EVENT_COLUMNS.index("start_ns"), S.EVENT_COLUMNS.index("end_ns")


def phase_at(t: int, spans: list[tuple[int, int, str]]) -> str:
    """The compute phase a launch fell in ("other" outside forward, backward and optimizer)."""
    for s, e, kind in spans:
        if s <= t <= e and kind in _COMPUTE:
            return kind
    return "other"


def apply_cuda_times(cols: dict[str, list], calls: list, anchor, gpu_clock=None) -> None:
    """Replace host times of CUDA rows (BucketCall and CollectiveCall records with ``.cuda`` events)
    by GPU-side start/end: the step anchor's time on our clock plus the anchor event's elapsed time
    to each start/end event (events already completed). The anchor's time comes from
    ``gpu_clock`` (cudaclock.GpuClock: the GPU runs behind the host); without one, the host time
    at which the anchor was enqueued."""
    if not anchor:
        return
    t_anchor, ev_anchor = anchor
    if gpu_clock is not None:
        t_anchor = gpu_clock.anchor_time(t_anchor, ev_anchor)
    by_key = {}   # (kind, micro, bucket, launch) → [start, end]
    for c in calls:
        if c.cuda is not None:
            kind, bucket = (S.BUCKET, c.index) if isinstance(c, BucketCall) else (c.kind, c.bucket)
            by_key[(kind, max(c.micro, 0), bucket, c.launch)] = c.cuda
    for i, kind in enumerate(cols["kind"]):
        # start_ns is the hook entry for DDP buckets, = launch for engine rows (both: call.launch)
        evs = by_key.get((kind, cols["micro"][i], cols["bucket"][i], cols["start_ns"][i]))
        if evs and evs[1] is not None:
            # the start event is recorded right before the collective call (ddp.py, sync.py)
            hook_to_call = cols["launch_ns"][i] - cols["start_ns"][i]   # host: hook entry → collective call
            cols["launch_ns"][i] = t_anchor + int(ev_anchor.elapsed_time(evs[0]) * 1e6)
            cols["start_ns"][i] = cols["launch_ns"][i] - hook_to_call
            cols["end_ns"][i] = t_anchor + int(ev_anchor.elapsed_time(evs[1]) * 1e6)


def stamp_late_ends(cols: dict[str, list], late: list[CollectiveCall]) -> None:
    """End times of collectives that completed after their step's batch was built (an async
    all-reduce waited steps later, syncviz.workloads.stale): their rows were built with end -1.
    The step row keeps its end: the collective outlived the step, the step did not grow."""
    done = {(c.kind, max(c.micro, 0), c.bucket, c.launch): c.done for c in late if c.done >= 0}
    for i, end in enumerate(cols["end_ns"]):
        if end < 0:
            t = done.get((cols["kind"][i], cols["micro"][i], cols["bucket"][i], cols["start_ns"][i]))
            if t is not None:
                cols["end_ns"][i] = t
