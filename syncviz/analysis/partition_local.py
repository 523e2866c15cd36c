"""What one partition of whole ranks gives on its own (the summary's first pass, on arrays): the
compute and comm intervals, step_metrics, every collective's identity and occurrence, and per comm
row what does not depend on other ranks — the previous done on its stream (queueing) and its share
of exposed time. The definitions are the reference functions' own array cores (intervals.compute_rows,
metrics.step_metric_rows, queueing.stream_prev_done / owned_arrays / attributed_arrays); this module
only feeds them. partition_joined.py finishes each comm row once every rank's launches are known.

``Local.comm`` is kept between the passes as one .npz of plain arrays (no pickle): about 120 bytes
a comm row, against a pickled pandas frame of every event before.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from syncviz.analysis import eventarrays as E
from syncviz.analysis import keys as K
from syncviz.analysis import queueing as Q
from syncviz.analysis.intervals import compute_rows
from syncviz.analysis.metrics import step_metric_rows
from syncviz.trace import schema as S

# per comm row: kept between the passes (the string columns as codes into the partition's dictionaries)
COMM_COLUMNS = ("rank", "step", "micro", "kind", "bucket", "name", "op", "phase", "layout", "dtype", "bytes",
                "logical_bytes", "group_size", "ready", "hook", "launch", "end", "occurrence", "ident", "prev",
                "exposed", "after_backward")
DICTIONARIES = ("names", "ops", "dtypes", "phases")


@dataclass
class Local:
    """A partition's first-pass results on arrays."""
    steps: pd.DataFrame              # step_metrics rows
    comm: dict                       # COMM_COLUMNS (rows of comm_rows, in row order) and DICTIONARIES
    idents: dict                     # per identity (queueing.EVENT_KEY): step, micro, kind, bucket, name, occurrence, first row
    comp: tuple                      # compute intervals (rank, step, start, end)


def compute_of(ev: E.EventArrays) -> tuple[tuple, np.ndarray]:
    """compute_intervals of the partition: ((rank, step, start, end), kind code of each interval)."""
    k = ev.kind
    b = blocking(ev)
    blocked = (ev.rank[b], ev.step[b], ev.start[b], ev.end[b]) if len(b) else None
    src, _, start, end = compute_rows(ev.rank, ev.step, ev.micro, ev.start, ev.end, ev.layout,
                                      (k == E.FORWARD) | (k == E.EVAL_FORWARD), k == E.BACKWARD,
                                      k == E.OPTIMIZER, k == E.GRAD_READY, blocked)
    return (ev.rank[src], ev.step[src], start, end), k[src]


def blocking(ev: E.EventArrays) -> np.ndarray:
    """intervals.blocking_rows: the (valid) collective rows during which the calling thread was blocked."""
    coll = np.flatnonzero(ev.kind == E.COLLECTIVE)
    if not len(coll) or not len(ev.names):
        return coll[:0]
    is_blocking = np.array([n.endswith(S.BLOCKING) for n in ev.names], dtype=bool)
    b = coll[is_blocking[ev.name[coll]]]
    return b[(ev.start[b] >= 0) & (ev.end[b] >= ev.start[b])]


def comm_of(ev: E.EventArrays) -> tuple[np.ndarray, np.ndarray]:
    """comm_rows of the partition: the rows (positions in ``ev``) and their launch (the collective
    call; the row's start where none was stamped inside the row)."""
    rows = np.flatnonzero((ev.kind == E.BUCKET) | (ev.kind == E.COLLECTIVE))
    s, launch, e = ev.start[rows], ev.launch[rows], ev.end[rows]
    launch = np.where((launch >= s) & (launch <= e), launch, s)
    valid = (launch >= 0) & (e >= launch)
    return rows[valid], launch[valid]


def is_wire(kind: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """intervals.wire_mask on codes."""
    return (kind == E.BUCKET) | (bucket < 0)


def step_metrics_of(ev: E.EventArrays, comp=None, comm=None) -> pd.DataFrame:
    """metrics.step_metrics of the partition (``comp``, ``comm``: compute_of and comm_of when known)."""
    (cspans, ckind) = comp if comp is not None else compute_of(ev)
    rows, launch = comm if comm is not None else comm_of(ev)
    st = np.flatnonzero((ev.kind == E.STEP) & (ev.start >= 0) & (ev.end >= ev.start))
    kinds = {S.FORWARD: ckind == E.FORWARD, S.BACKWARD: ckind == E.BACKWARD, S.OPTIMIZER: ckind == E.OPTIMIZER,
             S.EVAL_FORWARD: ckind == E.EVAL_FORWARD}
    return step_metric_rows(cspans, kinds, (ev.rank[rows], ev.step[rows], launch, ev.end[rows]),
                            is_wire(ev.kind[rows], ev.bucket[rows]), ev.bytes[rows],
                            (ev.rank[st], ev.step[st], ev.start[st], ev.end[st]))


def local_pass(ev: E.EventArrays) -> Local:
    """Everything per rank: step_metrics, and the comm rows with their occurrence, identity, previous
    done on their stream and attributed exposed time."""
    comp = compute_of(ev)
    rows, launch = comm_of(ev)
    steps = step_metrics_of(ev, comp, (rows, launch))
    c = {col: getattr(ev, col)[rows] for col in ("rank", "step", "micro", "kind", "bucket", "name", "op", "phase",
                                                  "layout", "dtype", "bytes", "logical_bytes", "group_size", "ready")}
    c["hook"], c["launch"], c["end"] = ev.start[rows], launch, ev.end[rows]
    wire = is_wire(c["kind"], c["bucket"])
    not_wire = (~wire).astype(np.int64)
    # queueing.occurrences: the n-th call of one identity on a rank, in launch order (ties: row order)
    order = np.lexsort((launch, c["rank"]))
    same = K.group_codes(*(c[k] for k in ("rank", "step", "micro", "kind", "bucket", "name")))
    occ = np.empty(len(rows), dtype=np.int64)
    occ[order] = K.cumcount(same[order])
    c["occurrence"] = occ
    ident, n_ident = K.dense_codes(K.group_codes(*(c[k] for k in ("step", "micro", "kind", "bucket", "name")), occ))
    c["ident"] = ident
    lf, ef = launch.astype(float), c["end"].astype(float)
    c["prev"] = Q.stream_prev_done(c["rank"], not_wire, lf, ef)
    # queueing.attributed_exposed: backward compute's end per (rank, step) of the compute intervals
    cspans, ckind = comp
    b = ckind == E.BACKWARD
    if b.any():
        bend, found = K.max_by_key([cspans[0][b], cspans[1][b]], cspans[3][b], [c["rank"], c["step"]])
        bend = np.where(found, bend.astype(float), np.nan)
    else:
        bend = None
    if len(rows):
        s, e = Q.owned_arrays(K.group_codes(c["rank"], c["step"]), lf, ef, not_wire)
        exposed, after = Q.attributed_arrays(c["rank"], c["step"], s, e, cspans, bend)
    else:
        exposed = after = np.zeros(0)
    c["exposed"] = np.round(exposed).astype(np.int64)
    c["after_backward"] = np.round(after).astype(np.int64)
    for d in DICTIONARIES:
        c[d] = getattr(ev, d)
    # the first row (in launch order, rank by rank) of each identity: its key, and the op
    # queueing's per-collective table names it by (the lowest rank's call)
    first = np.full(n_ident, len(rows), dtype=np.int64)
    np.minimum.at(first, ident[order], np.arange(len(rows)))
    first = order[first] if len(rows) else first
    idents = {k: c[k][first] for k in ("step", "micro", "kind", "bucket", "name", "occurrence")}
    idents["row"] = first
    return Local(steps=steps, comm=c, idents=idents, comp=cspans)


def ident_index(c: dict, idents: dict) -> pd.MultiIndex:
    """The identities as queueing.EVENT_KEY tuples (strings as strings), in identity order."""
    return pd.MultiIndex.from_arrays(
        [idents["step"], idents["micro"], E.KIND_NAMES[idents["kind"]], idents["bucket"],
         c["names"][idents["name"]] if len(c["names"]) else np.array([], dtype=object), idents["occurrence"]],
        names=Q.EVENT_KEY)


def collective_table(c: dict, idents: dict) -> pd.DataFrame | None:
    """pass 1's per-collective table: first and last launch, how many of these ranks made the call,
    and the op of the lowest rank's call (partials.combine_events' input)."""
    n = len(idents["row"])
    if not n:
        return None
    ident = c["ident"]
    lo = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, ident, c["launch"])
    np.maximum.at(hi, ident, c["launch"])
    ops = c["ops"][c["op"][idents["row"]]] if len(c["ops"]) else np.full(n, "", dtype=object)
    return pd.DataFrame({"min": lo, "max": hi, "size": np.bincount(ident, minlength=n).astype(np.int64),
                         "op": ops}, index=ident_index(c, idents))


def save(path: str, local: Local, extra: dict) -> None:
    """Local.comm and .idents, and ``extra`` (plain arrays), as one .npz (strings as unicode arrays:
    it loads without pickle)."""
    arrays = {f"c_{k}": v for k, v in local.comm.items() if k not in DICTIONARIES}
    arrays.update({f"d_{k}": np.asarray(local.comm[k].tolist(), dtype=str) for k in DICTIONARIES})
    arrays.update({f"i_{k}": v for k, v in local.idents.items()})
    arrays.update({f"x_{k}": v for k, v in extra.items()})
    with open(path, "wb") as f:        # a file object: np.savez would append ".npz" to a name without it
        np.savez(f, **arrays)


def load(path: str) -> tuple[dict, dict, dict]:
    """(comm, idents, extra) as save wrote them."""
    with np.load(path, allow_pickle=False) as z:
        comm = {k[2:]: z[k] for k in z.files if k.startswith("c_")}
        comm.update({k[2:]: z[k].astype(object) for k in z.files if k.startswith("d_")})
        idents = {k[2:]: z[k] for k in z.files if k.startswith("i_")}
        extra = {k[2:]: z[k] for k in z.files if k.startswith("x_")}
    return comm, idents, extra
