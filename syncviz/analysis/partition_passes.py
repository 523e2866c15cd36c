"""The two passes of analysis.partitioned over one partition of whole ranks, as worker processes run
them: read and validate the rank files once, do everything per rank on arrays (partition_local), keep
the comm rows for the second pass, which finishes them with every collective's launches over all ranks
(partition_joined). partials.py combines what they return; the reasons each combination equals the
whole-run number are in partitioned.py's docstring.

This replaced passes written on pandas frames (the whole-run functions are still the reference every
number is tested against): a partition of 820,512 events (1,024-rank simulated ZeRO-3 run) took 2.1 s
+ 1.4 s of CPU in them, most of it pandas' bookkeeping (see eventarrays.py).
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd

from syncviz.analysis import eventarrays as E
from syncviz.analysis import jsonrows
from syncviz.analysis import keys as K
from syncviz.analysis import partial_views as PV
from syncviz.analysis import partition_joined as PJ
from syncviz.analysis import partition_local as PL
from syncviz.analysis import steplateness
from syncviz.trace import read as R
from syncviz.trace import spans as SP
from syncviz.trace.partition_read import read_partition

_EVENTS: dict[str, pd.DataFrame] = {}        # per worker process: the run's collectives (pass 2)
_EVENTS_LOCK = threading.Lock()              # a Dask worker may run several partitions in threads


def _read(files: dict[int, Path], index: dict | None = None):
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


def pass1(run_dir: str, files: dict[int, Path], keep: str | None = None, compare: bool = False) -> dict:
    """step_metrics of the partition's ranks and, per collective, its first and last launch and
    how many of these ranks took part (queueing.EVENT_KEY). ``keep``: a scratch file to keep the
    partition's comm rows in for pass 2 (partition_local.save); ``compare``: also what compare
    measures (analysis.comparison's partition inputs). Where every rank of the partition wrote its
    own first pass when its recording closed (analysis.rank_pass), those are combined instead of
    reading the rank files (the same results: tests/test_rank_pass.py), and nothing is kept: pass 2
    merges them again."""
    if not compare:
        from syncviz.analysis import rank_pass
        found = rank_pass.partition_pass1(files)
        if found is not None:
            return found
    index: dict = {}
    ev, problems, incomplete, errors = _read(files, index)
    out = empty_pass1(problems, incomplete, errors, span_table(index))
    if ev is None:
        return out
    local = PL.local_pass(ev)
    event_facts(out, ev)
    if compare:
        out["compare"] = compare_partial(ev, local.comm)
    comm_facts(out, local.steps, local.comm, local.idents)
    if keep is not None:
        PL.save(keep, local, _extras(ev, local))
    return out


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
    out["step_first"] = _min_by_step(ev.step[st], ev.start[st], "start_ns")


def comm_facts(out: dict, steps: pd.DataFrame, c: dict, idents: dict) -> None:
    """pass1's numbers from the first pass's results: step_metrics, every bucket's first launch,
    the steps with buckets and the per-collective table."""
    out["steps"] = steps
    b = np.flatnonzero(c["kind"] == E.BUCKET)
    if len(b):
        first, codes = PJ.group_rows(c["step"][b], c["micro"][b], c["bucket"][b])
        at = b[first]
        out["bucket_first"] = pd.Series(PJ.min_by(codes, c["launch"][b], len(first)), name="launch_ns",
                                        index=pd.MultiIndex.from_arrays([c["step"][at], c["micro"][at], c["bucket"][at]],
                                                                        names=PV.LATE_KEY))
    out["bucket_steps"] = K.unique_ints(c["step"][b])
    out["events"] = PL.collective_table(c, idents)


def _min_by_step(step: np.ndarray, values: np.ndarray, name: str) -> pd.Series:
    """``values`` grouped by step, minimum (a Series indexed by step, as groupby("step").min() gives)."""
    return _by_step(step, [values], [name], [np.minimum])[0]


def _by_step(step: np.ndarray, values: list, names: list, reduce: list) -> list[pd.Series]:
    """Each of ``values`` grouped by step and reduced by its ufunc (np.minimum or np.maximum)."""
    if not len(step):
        empty = pd.Index(np.zeros(0, dtype=step.dtype), name="step")
        return [pd.Series(np.zeros(0, dtype=v.dtype), index=empty, name=n) for v, n in zip(values, names)]
    first, codes = PJ.group_rows(step)
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
    first, last = _by_step(steps[valid], [start[valid], end[valid]], ["start", "end"], [np.minimum, np.maximum])
    return {"ranks": K.unique_ints(ev.rank), "top_bucket": int(ev.bucket.max()) if len(ev) else -1,
            "steps": K.unique_ints(steps[steps >= 0]), "first": first, "last": last}


def compare_partial(ev: E.EventArrays, c: dict) -> dict:
    """analysis.comparison's inputs of one partition (see comparison.combine): per (rank, step, op)
    wire calls and bytes, per step the bucket rows' count and byte sums, the steps with a blocking
    collective, and step_metrics of every row but the buckets (a compression hook's own collectives)."""
    w = np.flatnonzero(PL.is_wire(c["kind"], c["bucket"]))
    pairs = None
    if len(w):
        first, codes = PJ.group_rows(c["rank"][w], c["step"][w], c["op"][w])
        at, n = w[first], len(first)
        idx = pd.MultiIndex.from_arrays([c["rank"][at], c["step"][at], c["ops"][c["op"][at]]], names=["rank", "step", "op"])
        pairs = pd.DataFrame({"calls": np.bincount(codes, minlength=n).astype(np.int64),
                              "bytes": PJ.int_sums(codes, c["bytes"][w], n)}, index=idx)
    b = np.flatnonzero(ev.kind == E.BUCKET)
    if len(b):
        first, codes = PJ.group_rows(ev.step[b])
        n = len(first)
        buckets = pd.DataFrame({"n": np.bincount(codes, minlength=n).astype(np.int64),
                                "logical_bytes": PJ.int_sums(codes, ev.logical_bytes[b], n),
                                "bytes": PJ.int_sums(codes, ev.bytes[b], n)}, index=pd.Index(ev.step[b][first], name="step"))
    else:
        buckets = pd.DataFrame({k: pd.Series(dtype=np.int64) for k in ("n", "logical_bytes", "bytes")},
                               index=pd.Index([], dtype=np.int64, name="step"))
    blocked = PL.blocking(ev)
    return {"pairs": pairs, "buckets": buckets, "blocking": set(ev.step[blocked].tolist()),
            "coll_steps": PL.step_metrics_of(ev.take(ev.kind != E.BUCKET))}


def _extras(ev: E.EventArrays, local: PL.Local) -> dict:
    """What pass 2 needs of the partition's other rows: how many rows there were, each step's
    timeline origin (views.timeline.step_origin: the earliest compute or comm start), the offload
    rows and the (rank, step) pairs that have a step row."""
    comp = local.comp
    steps = np.r_[comp[1], local.comm["step"]]
    origin = _min_by_step(steps, np.r_[comp[2], local.comm["launch"]], "start_ns")
    off = np.flatnonzero((ev.kind == E.OFFLOAD) & (ev.end >= ev.start) & (ev.start >= 0))
    st = np.flatnonzero(ev.kind == E.STEP)
    return {"rows": np.array([len(ev)]), "order": local.order, "origin_step": origin.index.to_numpy(), "origin": origin.to_numpy(),
            "off_step": ev.step[off], "off_name": np.asarray(ev.names[ev.name[off]].tolist(), dtype=str),
            "off_ns": ev.end[off] - ev.start[off], "step_rank": ev.rank[st], "step_step": ev.step[st]}


def _events(path: str) -> pd.DataFrame:
    with _EVENTS_LOCK:
        if path not in _EVENTS:
            _EVENTS.clear()
            _EVENTS[path] = pd.read_pickle(path)
        return _EVENTS[path]


def pass2(run_dir: str, files: dict[int, Path], events_path: str, hsteps: list[int], scratch: str, part: int,
          kept: str | None = None, json_dir: str | None = None, first_path: str | None = None,
          export: dict | None = None, replay_dir: str | None = None) -> dict:
    """comm_metrics of the partition with every collective's last launch over all ranks, reduced
    to what the summary aggregates: sums, spilled medians, straggler counts. ``kept``: pass 1's
    comm rows of the partition; ``json_dir``: write the partition's bucket rows there as JSON
    text (``syncviz summary --json``: analysis.jsonrows); ``first_path``: every bucket's earliest
    launch over all ranks (pass 1's bucket_first, pickled), for the rank × step lateness;
    ``export``: {"dir": where the TensorBoard export's pieces go, "head": the first bucket step of
    tables.bucket_table's headline (None: every step)}; ``replay_dir``: keep what the dashboard's
    Replay needs of these ranks to draw one step without reading every rank (steplateness: the
    lateness rows, and each step's earliest compute or comm start)."""
    from syncviz.analysis import rank_pass
    if kept is not None and Path(kept).exists():
        c, idents, extra = PL.load(kept)
        Path(kept).unlink()
    elif (found := rank_pass.partition_local(files)) is not None:     # pass 1 used them too
        c, idents, extra = found
    else:
        ev, *_ = _read(files)
        if ev is None:
            c = None
        else:
            local = PL.local_pass(ev)
            c, idents, extra = local.comm, local.idents, _extras(ev, local)
    events = _events(events_path)
    out = {"n_hw": 0, "hw": None, "step_busbw": None, "skew": None, "exposed": None, "exposed_total": 0,
           "rank_steps": 0, "buckets": None, "bucket_first": None, "coll": None, "coll_sums": None,
           "coll_steps": 0, "offload": None, "offload_n": 0, "late": None, "n_at_max": None, "wait": None,
           "strag_steps": set(), "strag": None, "json": None, "lateness": None, "tb_first": None, "tb_medians": None,
           "histograms": None, "replay": None, "origin": None}
    if c is None or not int(extra["rows"][0]):
        return out
    t = PJ.comm_times(c, idents, events)
    tag = f"{part}"
    first = pd.read_pickle(first_path) if first_path is not None else None
    order = extra["order"]          # launch order, rank by rank (queueing.occurrences)
    late = PJ.lateness(c, t, events, first, order)
    out["lateness"] = PV.rank_step_lateness(late)
    if replay_dir is not None:
        try:
            out["replay"] = steplateness.write_piece(Path(replay_dir) / f"lateness-{part:06d}.arrow", late)
        except steplateness.NotKept:      # the summary then keeps no Replay tables (never some ranks' only)
            out["replay"] = False
        out["origin"] = pd.Series(extra["origin"], index=pd.Index(extra["origin_step"], name="step"), name="start_ns")
    if export is not None or json_dir is not None:
        frame = PJ.bucket_frame(c, t)
        if export is not None:
            PV.export_pieces(out, frame, export, tag)
        if json_dir is not None:
            out["json"] = jsonrows.write(Path(json_dir) / f"buckets-{part:06d}.json", PV.bucket_rows(frame))
    if len(c["step"]):
        PJ.aggregate(out, c, t, order, np.isin(c["step"], hsteps), events, scratch, tag)
    hs = np.isin(extra["off_step"], hsteps)
    if hs.any():
        out["offload"] = pd.DataFrame({"name": extra["off_name"][hs].astype(object), "ms": extra["off_ns"][hs] / 1e6})
    s = np.isin(extra["step_step"], hsteps)
    out["offload_n"] = PJ.distinct_pairs(extra["step_rank"][s], extra["step_step"][s])
    return out
