"""What pass 1 reports of a partition besides its comm rows, shared by the two ways of getting it
(partition_passes.pass1 reads the rank files; rank_pass combines the ranks' own first passes): the
read itself, the partition's facts from every row and from its comm rows, and what pass 2 needs of
its other rows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from syncviz.analysis import eventarrays as E
from syncviz.analysis import keys as K
from syncviz.analysis import partial_views as PV
from syncviz.analysis import partition_joined as PJ
from syncviz.analysis import partition_local as PL
from syncviz.analysis.tables import exposed_arrays
from syncviz.trace import read as R
from syncviz.trace import spans as SP
from syncviz.trace.partition_read import read_partition


def read_events(files: dict[int, Path], index: dict | None = None):
    """The partition's validated events as arrays (None: no rows read) and read_ranks' problems,
    incomplete ranks and errors: read as one table when no file needs validation's repairs."""
    found: dict | None = {} if index is not None else None
    fast = read_partition(files, found)
    if fast is None:
        tables, problems, incomplete, errors = R.read_ranks(files, index=index)
        return (E.from_tables(tables) if tables else None), problems, incomplete, errors
    table, decoded, problems, incomplete, errors = fast
    if index is not None:
        index.update(found)
    return (E.from_tables([table], decoded) if table is not None else None), problems, incomplete, errors


def span_table(index: dict) -> pd.DataFrame:
    """read_ranks' spans.index of each file as one table (trace.spans.COLUMNS: one row per batch)."""
    parts = [np.column_stack([np.full(len(rows), rank), rows, np.full(len(rows), prefix)])
             for rank, found in index.items() if found is not None for prefix, rows in [found]]
    data = np.concatenate(parts) if parts else np.zeros((0, len(SP.COLUMNS)), dtype=np.int64)
    return pd.DataFrame(data.astype(np.int64), columns=SP.COLUMNS)


def empty_pass1(problems: list, incomplete: list, errors: list, spans: pd.DataFrame) -> dict:
    """pass1's result of a partition before its rows are analysed."""
    return {"problems": problems, "incomplete": incomplete, "errors": errors, "rows": 0, "last_step": {},
            "max_rank": -1, "steps": pd.DataFrame(), "events": None, "facts": None, "spans": spans,
            "compare": None, "bucket_first": None, "step_first": None, "bucket_steps": None, "kept_ranks": 0}


def event_facts(out: dict, ev: E.EventArrays) -> None:
    """pass1's numbers that need every row of the partition: the rows, the step facts, each rank's
    last step, the highest rank and each step's first start (the TensorBoard export's wall time)."""
    out["rows"] = len(ev)
    out["facts"] = step_facts(ev)
    if len(ev):
        codes, n = K.ordered_codes(ev.rank)
        last = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(last, codes, ev.step)
        first = np.zeros(n, dtype=np.int64)
        first[codes] = np.arange(len(codes))
        out["last_step"] = {int(r): int(s) for r, s in zip(ev.rank[first], last)}
        out["max_rank"] = int(ev.rank.max())
    st = np.flatnonzero(ev.kind == E.STEP)
    out["step_first"] = min_by_step(ev.step[st], ev.start[st], "start_ns")


def comm_facts(out: dict, steps: pd.DataFrame, c: dict, idents: dict) -> None:
    """pass1's numbers from the first pass's results: step_metrics, every bucket's first launch,
    the steps with buckets and the per-collective table."""
    out["steps"] = steps
    b = np.flatnonzero(c["kind"] == E.BUCKET)
    if len(b):      # grouped by identity (a bucket row's step, micro and bucket are its identity's)
        at, codes = PJ.by_identity(c, b, idents, ("step", "micro", "bucket"))
        out["bucket_first"] = pd.Series(PJ.min_by(codes, c["launch"][b], len(at)), name="launch_ns",
                                        index=pd.MultiIndex.from_arrays([idents[k][at] for k in ("step", "micro", "bucket")],
                                                                        names=PV.LATE_KEY))
    out["bucket_steps"] = K.unique_ints(idents["step"][idents["kind"] == E.BUCKET])     # the rows' steps
    out["events"] = PL.collective_table(c, idents)


def min_by_step(step: np.ndarray, values: np.ndarray, name: str) -> pd.Series:
    """``values`` grouped by step, minimum (a Series indexed by step, as groupby("step").min() gives)."""
    return by_step(step, [values], [name], [np.minimum])[0]


def by_step(step: np.ndarray, values: list, names: list, reduce: list) -> list[pd.Series]:
    """Each of ``values`` grouped by step and reduced by its ufunc (np.minimum or np.maximum)."""
    if not len(step):
        empty = pd.Index(np.zeros(0, dtype=step.dtype), name="step")
        return [pd.Series(np.zeros(0, dtype=v.dtype), index=empty, name=n) for v, n in zip(values, names)]
    first, codes = K.group_rows(step)
    index = pd.Index(step[first], name="step")
    out = []
    for v, n, f in zip(values, names, reduce):
        r = np.full(len(first), np.iinfo(np.int64).max if f is np.minimum else np.iinfo(np.int64).min, dtype=np.int64)
        f.at(r, codes, v)
        out.append(pd.Series(r.astype(v.dtype), index=index, name=n))
    return out


def step_facts(ev: E.EventArrays) -> dict:
    """What the dashboard's step index (dashboard/data/stepindex.py) finds in these ranks' rows:
    the ranks, the highest bucket index, every step (>= 0) and, per step with valid rows, its first
    start and last end (ns). partials.combine_facts turns several partitions' into the run's."""
    steps, start, end = ev.step, ev.start, ev.end
    valid = (start >= 0) & (end >= start) & (steps >= 0)
    first, last = by_step(steps[valid], [start[valid], end[valid]], ["start", "end"], [np.minimum, np.maximum])
    return {"ranks": K.unique_ints(ev.rank), "top_bucket": int(ev.bucket.max()) if len(ev) else -1,
            "steps": K.unique_ints(steps[steps >= 0]), "first": first, "last": last}


def pass2_extras(ev: E.EventArrays, local: PL.Local) -> dict:
    """What pass 2 needs of the partition's other rows: how many rows there were, each step's
    timeline origin (views.timeline.step_origin: the earliest compute or comm start), the offload
    rows, the (rank, step) pairs that have a step row, and the exposed intervals (tables.exposed_arrays,
    for the Distributed view's waiting time: distributed.waiting_exposed)."""
    comp = local.comp
    steps = np.r_[comp[1], local.comm["step"]]
    origin = min_by_step(steps, np.r_[comp[2], local.comm["launch"]], "start_ns")
    off = np.flatnonzero((ev.kind == E.OFFLOAD) & (ev.end >= ev.start) & (ev.start >= 0))
    st = np.flatnonzero(ev.kind == E.STEP)
    c = local.comm
    ex = exposed_arrays(comp, (c["rank"], c["step"], c["launch"], c["end"]))
    return {"rows": np.array([len(ev)]), "order": local.order, "origin_step": origin.index.to_numpy(), "origin": origin.to_numpy(),
            "off_step": ev.step[off], "off_name": np.asarray(ev.names[ev.name[off]].tolist(), dtype=str),
            "off_ns": ev.end[off] - ev.start[off], "step_rank": ev.rank[st], "step_step": ev.step[st],
            "ex_rank": ex[0], "ex_step": ex[1], "ex_start": ex[2], "ex_end": ex[3]}


def compare_partial(ev: E.EventArrays, c: dict) -> dict:
    """analysis.comparison's inputs of one partition (see comparison.combine): per (rank, step, op)
    wire calls and bytes, per step the bucket rows' count and byte sums, the steps with a blocking
    collective, and step_metrics of every row but the buckets (a compression hook's own collectives)."""
    w = np.flatnonzero(PL.is_wire(c["kind"], c["bucket"]))
    pairs = None
    if len(w):
        first, codes = K.group_rows(c["rank"][w], c["step"][w], c["op"][w])
        at, n = w[first], len(first)
        idx = pd.MultiIndex.from_arrays([c["rank"][at], c["step"][at], c["ops"][c["op"][at]]], names=["rank", "step", "op"])
        pairs = pd.DataFrame({"calls": np.bincount(codes, minlength=n).astype(np.int64),
                              "bytes": PJ.int_sums(codes, c["bytes"][w], n)}, index=idx)
    b = np.flatnonzero(ev.kind == E.BUCKET)
    buckets = sums_by_step(ev.step[b], {"n": np.ones(len(b), dtype=np.int64), "logical_bytes": ev.logical_bytes[b],
                                        "bytes": ev.bytes[b]})
    blocked = PL.blocking(ev)
    return {"pairs": pairs, "buckets": buckets, "blocking": set(ev.step[blocked].tolist()),
            "coll_steps": PL.step_metrics_of(ev.take(ev.kind != E.BUCKET))}


def sums_by_step(step: np.ndarray, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """Exact integer sums of ``columns`` per step (index "step", in step order; no rows: an empty
    frame of int64 columns): compare_partial's bucket sums of a partition's rows, and of its ranks'
    own sums when rank_pass combines their kept passes."""
    if not len(step):
        return pd.DataFrame({k: pd.Series(dtype=np.int64) for k in columns}, index=pd.Index([], dtype=np.int64, name="step"))
    first, codes = K.group_rows(step)
    n = len(first)
    return pd.DataFrame({k: PJ.int_sums(codes, v, n) for k, v in columns.items()}, index=pd.Index(step[first], name="step"))
