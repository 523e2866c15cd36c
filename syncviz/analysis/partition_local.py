"""What one partition of whole ranks gives on its own (the summary's first pass, on arrays): the
compute and comm intervals, step_metrics, every collective's identity and occurrence, and per comm
row what does not depend on other ranks — the previous done on its stream (queueing) and its share
of exposed time. The definitions are the reference functions' own array cores (intervals.compute_rows,
metrics.step_metric_rows, queueing.stream_prev_done / owned_arrays / attributed_arrays); this module
only feeds them. partition_joined.py finishes each comm row once every rank's launches are known.

``Local.comm`` is kept between the passes as one file of plain arrays (no pickle, see ``save``): about
45 bytes a comm row, its near-constant columns LZ4-compressed (21 MB for a partition of 781,440
events of the 10^8-event run; 33 MB uncompressed), against a pickled pandas frame of every event before.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz.analysis import eventarrays as E
from syncviz.analysis import keys as K
from syncviz.analysis import queueing as Q
from syncviz.analysis.intervals import compute_rows
from syncviz.analysis.metrics import step_metric_rows
from syncviz.trace import schema as S

# per comm row (the string columns as codes into the partition's dictionaries); the identity's own
# columns are not kept between the passes (they are the identity's: ``idents``)
COMM_COLUMNS = ("rank", "step", "micro", "kind", "bucket", "name", "occurrence", "op", "phase", "bytes", "group_size",
                "launch", "end", "ident", "prev", "exposed", "after_backward")
IDENTITY = ("step", "micro", "kind", "bucket", "name", "occurrence")
# of the bucket rows only (``bucket_rows``: their places among the comm rows), the only rows that use them
BUCKET_COLUMNS = ("layout", "dtype", "ready", "hook", "logical_bytes")
DICTIONARIES = ("names", "ops", "dtypes", "phases")


@dataclass
class Local:
    """A partition's first-pass results on arrays."""
    steps: pd.DataFrame              # step_metrics rows
    comm: dict                       # COMM_COLUMNS (rows of comm_rows, in row order) and DICTIONARIES
    idents: dict                     # per identity (queueing.EVENT_KEY): step, micro, kind, bucket, name, occurrence, first row
    comp: tuple                      # compute intervals (rank, step, start, end)
    order: np.ndarray                # the comm rows in launch order, rank by rank (ties in row order)


def compute_of(ev: E.EventArrays) -> tuple[tuple, np.ndarray]:
    """compute_intervals of the partition: ((rank, step, start, end), kind code of each interval)."""
    src, _, start, end = compute_rows_of(ev)
    return (ev.rank[src], ev.step[src], start, end), ev.kind[src]


def compute_rows_of(ev: E.EventArrays) -> tuple:
    """intervals.compute_rows of the events: (source row, place before invalid rows were dropped or
    None, start, end) of each compute interval."""
    k = ev.kind
    b = blocking(ev)
    blocked = (ev.rank[b], ev.step[b], ev.start[b], ev.end[b]) if len(b) else None
    return compute_rows(ev.rank, ev.step, ev.micro, ev.start, ev.end, ev.layout,
                        (k == E.FORWARD) | (k == E.EVAL_FORWARD), k == E.BACKWARD,
                        k == E.OPTIMIZER, k == E.GRAD_READY, blocked)


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


def step_metrics_of(ev: E.EventArrays, comp=None, comm=None, keep: dict | None = None) -> pd.DataFrame:
    """metrics.step_metrics of the partition (``comp``, ``comm``: compute_of and comm_of when known;
    ``keep``: see metrics.step_metric_rows)."""
    (cspans, ckind) = comp if comp is not None else compute_of(ev)
    rows, launch = comm if comm is not None else comm_of(ev)
    st = np.flatnonzero((ev.kind == E.STEP) & (ev.start >= 0) & (ev.end >= ev.start))
    kinds = {S.FORWARD: ckind == E.FORWARD, S.BACKWARD: ckind == E.BACKWARD, S.OPTIMIZER: ckind == E.OPTIMIZER,
             S.EVAL_FORWARD: ckind == E.EVAL_FORWARD}
    return step_metric_rows(cspans, kinds, (ev.rank[rows], ev.step[rows], launch, ev.end[rows]),
                            is_wire(ev.kind[rows], ev.bucket[rows]), ev.bytes[rows],
                            (ev.rank[st], ev.step[st], ev.start[st], ev.end[st]), keep)


def occurrences(rank, step, micro, kind, bucket, name, launch) -> tuple[np.ndarray, np.ndarray]:
    """queueing.occurrences on arrays: each comm row's count of earlier calls of its identity on its
    rank, in launch order (ties: row order), and that order (the rows by rank, then launch)."""
    order = K.lexsort((launch, rank))
    occ = np.empty(len(rank), dtype=np.int64)
    occ[order] = K.cumcount(K.group_codes(rank, step, micro, kind, bucket, name)[order])
    return occ, order


def backward_end(spans: tuple, backward: np.ndarray, rank: np.ndarray, step: np.ndarray) -> np.ndarray | None:
    """queueing.attributed_exposed's backward end of each row's (rank, step): the latest end of the
    compute intervals ``spans`` (rank, step, start, end) marked ``backward``; NaN where it has none,
    None where no interval is backward."""
    if not backward.any():
        return None
    top, found = K.max_by_key([spans[0][backward], spans[1][backward]], spans[3][backward], [rank, step])
    return np.where(found, top.astype(float), np.nan)


def local_pass(ev: E.EventArrays) -> Local:
    """Everything per rank: step_metrics, and the comm rows with their occurrence, identity, previous
    done on their stream and attributed exposed time."""
    comp = compute_of(ev)
    rows, launch = comm_of(ev)
    shared: dict = {}
    steps = step_metrics_of(ev, comp, (rows, launch), shared)
    c = {col: getattr(ev, col)[rows] for col in ("rank", "step", "micro", "kind", "bucket", "name", "op", "phase",
                                                  "bytes", "group_size")}
    c["launch"], c["end"] = launch, ev.end[rows]
    b = np.flatnonzero(c["kind"] == E.BUCKET)
    c["bucket_rows"] = b
    c.update({col: (ev.start if col == "hook" else getattr(ev, col))[rows[b]] for col in BUCKET_COLUMNS})
    wire = is_wire(c["kind"], c["bucket"])
    not_wire = (~wire).astype(np.int64)
    c["occurrence"], order = occurrences(*(c[k] for k in ("rank", "step", "micro", "kind", "bucket", "name")), launch)
    lf, ef = launch.astype(float), c["end"].astype(float)
    c["prev"] = Q.stream_prev_done(c["rank"], not_wire, lf, ef)
    cspans, ckind = comp
    bend = backward_end(cspans, ckind == E.BACKWARD, c["rank"], c["step"])
    if len(rows):
        s, e = Q.owned_arrays(K.group_codes(c["rank"], c["step"]), lf, ef, not_wire)
        exposed, after = Q.attributed_arrays(c["rank"], c["step"], s, e, cspans, bend, shared or None)
    else:
        exposed = after = np.zeros(0)
    c["exposed"] = np.round(exposed).astype(np.int64)
    c["after_backward"] = np.round(after).astype(np.int64)
    for d in DICTIONARIES:
        c[d] = getattr(ev, d)
    return Local(steps=steps, comm=c, idents=identities(c, order), comp=cspans, order=order)


def identities(c: dict, order: np.ndarray, blocks: list[int] | None = None) -> dict:
    """Number the comm rows' identities (c["ident"], dense in the order of their key) and return,
    per identity, its key and its first row in launch order, rank by rank (``order``): the op
    queueing's per-collective table names it by is the lowest rank's call. ``blocks``: the rows'
    count of each rank, rank by rank (rank_pass.merge), where known."""
    n = len(c["step"])
    same = _same_calls(c, blocks)
    ident, n_ident = same or K.dense_codes(K.group_codes(*(c[k] for k in IDENTITY)))
    c["ident"] = ident
    if same and n_ident == blocks[0]:
        # every rank made each call once (an identity counts its repeats), the first rank's rows
        # first in ``order``: an identity's first place there is its place among them. One
        # assignment of a rank's rows, not a minimum over all (~6 ms a partition of the 10^8-event
        # DDP run, in each pass: session 47)
        m = blocks[0]
        first = np.empty(n_ident, dtype=np.int64)
        first[ident[order[:m]]] = np.arange(m)
    else:
        first = np.full(n_ident, n, dtype=np.int64)
        np.minimum.at(first, ident[order], np.arange(n))
    first = order[first] if n else first
    idents = {k: c[k][first] for k in IDENTITY}
    idents["row"] = first
    return idents


def _same_calls(c: dict, blocks: list[int] | None) -> tuple[np.ndarray, int] | None:
    """identities' numbering where every rank made the same calls in the same row order (a data-
    parallel loop's ranks do): each rank's identity columns equal the first rank's, element by
    element. Then the identities over all rows are the first rank's, numbered over its rows alone
    (the same dense codes in key order: the other ranks add no key), and repeated for each rank.
    None where that does not hold (the rows are then grouped as a whole). Why: grouping the six
    columns of a 10^8-event run's partitions was ~9% of its summary's CPU (cProfile, 2026-11-29),
    checking them costs one comparison a value."""
    if not blocks or len(blocks) < 2 or any(b != blocks[0] for b in blocks) or not blocks[0]:
        return None
    m = blocks[0]
    cols = [c[k] for k in IDENTITY]
    for col in cols:
        first = col[:m]
        if not np.array_equal(col.reshape(len(blocks), m), np.broadcast_to(first, (len(blocks), m))):
            return None
    ident, n_ident = K.dense_codes(K.group_codes(*(col[:m] for col in cols)))
    return np.tile(ident, len(blocks)), n_ident


def ident_index(c: dict, idents: dict) -> pd.MultiIndex:
    """The identities as queueing.EVENT_KEY tuples (strings as strings), in identity order: the
    MultiIndex from_arrays makes of the strings, built from their codes (keys.coded_index: from_arrays
    turned each row's name and kind into a string and factorized them again, ~10 ms of the ~0.85 s a
    partition of the 10^8-event run takes, twice: pass 1's collective table and pass 2's lookup)."""
    return K.coded_index([idents["step"], idents["micro"], (idents["kind"], E.KIND_NAMES), idents["bucket"],
                          (idents["name"], c["names"]), idents["occurrence"]], Q.EVENT_KEY)


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
    table = pd.DataFrame({"min": lo, "max": hi, "size": np.bincount(ident, minlength=n).astype(np.int64),
                          "op": ops}, index=ident_index(c, idents))
    return table.sort_index()       # sorted here, in the worker: the parent folds sorted tables fast


def save(path: str, local: Local, extra: dict) -> None:
    """Local.comm and .idents, and ``extra`` (plain arrays), to one file: the arrays' names, then each
    array in .npy format (strings as unicode arrays: it loads without pickle). Not .npz: zip's CRC
    over ~80 MB a partition cost ~50 ms of the write (measured). The identity's columns are left out
    and codes kept in the smallest integer type that holds them: at 10^8 events these files are
    ~6 GB of scratch written while the rank files are read, ~65 bytes a comm row."""
    c = local.comm
    arrays = {f"c_{k}": small_ints(v) if k in _WIDE else v for k, v in c.items() if k not in DICTIONARIES and k not in IDENTITY}
    arrays.update({f"d_{k}": np.asarray(c[k].tolist(), dtype=str) for k in DICTIONARIES})
    arrays.update({f"i_{k}": v for k, v in local.idents.items()})
    arrays.update({f"x_{k}": small_ints(v) if k == "order" else v for k, v in extra.items()})
    arrays = dict(_pack(k, v) if k in _PACKED else (k, v) for k, v in arrays.items())
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.asarray(list(arrays), dtype=str), allow_pickle=False)
        for v in arrays.values():
            np.lib.format.write_array(f, np.ascontiguousarray(v), allow_pickle=False)


# Columns that repeat a few values row after row (message sizes, a rank's number, group sizes, ops,
# phases, the exposed time after backward: mostly 0), kept LZ4-compressed: 12 of the 33 MB a
# partition of the 10^8-event run keeps, compressed to ~0.1 MB in ~3 ms. Writing to the page cache
# cost ~1.4 ms a MB of CPU there (perf: write() was 8% of the summary's first pass).
_PACKED = {"c_bytes", "c_after_backward", "c_rank", "c_group_size", "c_op", "c_phase"}


def _pack(key: str, v: np.ndarray) -> tuple[str, np.ndarray]:
    """(name, bytes) of an array kept compressed: its dtype and length in the name (_unpack)."""
    packed = pa.compress(np.ascontiguousarray(v), codec="lz4", asbytes=True)
    return f"z{v.dtype.str}:{len(v)}:{key}", np.frombuffer(packed, dtype=np.uint8)


def _unpack(name: str, v: np.ndarray) -> tuple[str, np.ndarray]:
    """(key, array) of an entry _pack wrote."""
    dtype, n, key = name[1:].split(":", 2)
    dtype = np.dtype(dtype)
    raw = pa.decompress(v, decompressed_size=int(n) * dtype.itemsize, codec="lz4", asbytes=True)
    return key, np.frombuffer(raw, dtype=dtype).copy()


_WIDE = {"ident": np.int64, "order": np.int64, "op": np.int32, "phase": np.int32, "dtype": np.int32}


def small_ints(v: np.ndarray) -> np.ndarray:
    """Codes and positions in the smallest integer type that holds them (load widens them back)."""
    if v.dtype.kind != "i" or v.dtype.itemsize <= 1 or not len(v):
        return v
    for t in (np.int8, np.int16, np.int32):
        if v.min() >= np.iinfo(t).min and v.max() <= np.iinfo(t).max:
            return v.astype(t) if np.dtype(t).itemsize < v.dtype.itemsize else v
    return v


def load(path: str) -> tuple[dict, dict, dict]:
    """(comm, idents, extra) as save wrote them, as local_pass gave them."""
    with open(path, "rb") as f:
        names = np.lib.format.read_array(f, allow_pickle=False).tolist()
        z = {k: np.lib.format.read_array(f, allow_pickle=False) for k in names}
    z = dict(_unpack(k, v) if k.startswith("z") else (k, v) for k, v in z.items())
    comm = {k[2:]: v for k, v in z.items() if k.startswith("c_")}
    comm.update({k[2:]: v.astype(object) for k, v in z.items() if k.startswith("d_")})
    idents = {k[2:]: v for k, v in z.items() if k.startswith("i_")}
    extra = {k[2:]: v for k, v in z.items() if k.startswith("x_")}
    for d in (comm, extra):
        for k, t in _WIDE.items():
            if k in d and d[k].dtype != t:
                d[k] = d[k].astype(t)
    for k in IDENTITY:
        comm[k] = idents[k][comm["ident"]]
    return comm, idents, extra
