"""The records a rank's hooks append while a step runs. Named, so every module that produces or
reads them says which field it means; turned into the trace's columns once per step (batch.py).

Times are this rank's clock: ``local`` (clock.local_ns, not yet aligned) for gradient-ready
stamps, which are the hottest path (one per parameter per micro-step), and aligned
(``Recorder.now()``) everywhere else. Immutable records are NamedTuples (a tuple's cost to build);
records completed later, from another thread (a collective's done time), are slotted dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Phase(NamedTuple):
    """A forward, backward or optimizer interval (aligned ns)."""
    kind: str          # schema.FORWARD | EVAL_FORWARD | BACKWARD | OPTIMIZER
    name: str          # "forward", "backward", the optimizer's class name
    start: int
    end: int
    micro: int
    depth: int = -1    # optimizer steps: nesting depth (ZeroRedundancyOptimizer wraps AdamW); -1 otherwise


class GradReady(NamedTuple):
    """A parameter's gradient was accumulated (local clock, aligned at flush). The hook appends a
    plain tuple in this order (the hottest path: one per parameter per micro-step); the step
    boundary names it."""
    param: int         # parameter index (Recorder.param_index)
    t_local: int
    micro: int


@dataclass(slots=True)
class BucketCall:
    """One gradient bucket's communication: a call of DDP's comm hook, or (DDP's default all-reduce
    on CPU, record/reducer_group.py) of the reducer's own all-reduce."""
    index: int
    layout: int        # bucket-layout version (1 after DDP rebuilt its buckets)
    launch: int        # hook entry, or the reducer's call (aligned ns)
    nbytes: int        # the bucket's uncompressed bytes
    dtype: str
    hook: str          # name of the hook in force
    micro: int
    done: int = -1     # the hook's future completed
    issued: int = -1   # the default hook's all_reduce call (after DDP's ×1/N); -1: see batch.py
    cuda: Any = None   # [start event, end event] on CUDA, resolved a step later


@dataclass(slots=True)
class CollectiveCall:
    """One torch.distributed collective (or a row an engine reports itself: kind "bucket")."""
    kind: str          # schema.COLLECTIVE, or schema.BUCKET for an engine's own bucket rows
    name: str          # label, e.g. "all_reduce", "reduce_scatter_single (blocking)"
    op: str            # schema.OPS
    micro: int
    launch: int
    nbytes: int        # busbw convention (whole array for reduce-scatter / all-gather)
    dtype: str
    group_size: int
    bucket: int = -1   # the bucket whose hook issued it (-1: none)
    done: int = -1
    ready: int = -1    # engine bucket rows: last gradient ready
    layout: int = -1
    logical_bytes: int = -1   # -1: same as nbytes
    phase: str = ""    # "" = derived from the compute phases at flush
    work: Any = None   # the torch Work while in flight (future-less backends are settled at flush)
    cuda: Any = None   # [start event, end event, device] on CUDA (engine rows), resolved a step later


class BucketScope:
    """Recorder.in_bucket's block (collectives issued in it belong to a bucket). A plain context
    manager: it runs once per bucket in the comm hook, where a @contextmanager generator cost
    several µs more a call."""
    __slots__ = ("tls", "index", "before")

    def __init__(self, tls, index: int):
        self.tls, self.index = tls, index

    def __enter__(self):
        self.before = getattr(self.tls, "bucket", -1)
        self.tls.bucket = self.index

    def __exit__(self, *exc):
        self.tls.bucket = self.before
        return False
