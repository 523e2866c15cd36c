"""compute_intervals, comm_metrics (every comm kind) and exposed_intervals of a few ranks' events of
one step, on numpy arrays: what the dashboard's Replay draws of a step of a big run (the four drawn
ranks' events, with every collective's last launch over all ranks from the summary). The same frames,
column for column and dtype for dtype, as the reference functions give on those events
(tests/test_drawn_ranks.py compares them); the definitions stay theirs, called through the same array
cores (intervals.compute_rows, queueing.stream_prev_done / service_times / owned_arrays /
attributed_arrays, tables.exposed_arrays).

Why: on pandas frames these took ~21 ms of a jump's ~52 ms of drawing on the 10^8-event DDP run
(session 51, AMD EPYC family 25), most of it pandas' own work around a few hundred rows (a
MultiIndex built and reindexed to look up each collective's last launch, categoricals re-coded per
groupby); see ``analyse`` for what it takes now.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz.analysis import eventarrays as E
from syncviz.analysis import keys as K
from syncviz.analysis import queueing as Q
from syncviz.analysis.columns import _STR
from syncviz.analysis.metrics import algbw_gbps, coded_busbw_factors
from syncviz.analysis.partition_local import backward_end, comm_of, compute_rows_of, is_wire, occurrences
from syncviz.analysis.tables import exposed_arrays
from syncviz.trace import schema as S


class Joined:
    """Each collective's last launch over all ranks (a float Series indexed by queueing.EVENT_KEY,
    sorted, as the summary keeps it), looked up one step at a time: a step's slice of it as a dict
    of its identities, not a MultiIndex reindex of the drawn rows."""

    def __init__(self, joined: pd.Series):
        self._steps = joined.index.get_level_values(0).to_numpy()
        # the other levels' values as arrays once: a step's slice of the index's levels cost ~1.5 ms a
        # jump on the 1,024-rank DDP run (py-spy, session 52), these arrays' slices ~0.1 ms
        self._levels = [joined.index.get_level_values(i).to_numpy() for i in range(1, len(Q.EVENT_KEY))]
        self._last = joined.to_numpy(dtype=float)
        self._step: tuple[int, dict] | None = None      # the step looked up last (the dashboard draws from threads)

    def of_step(self, step: int) -> dict:
        """{(micro, kind, bucket, name, occurrence): last launch} of ``step``'s collectives."""
        kept = self._step
        if kept is not None and kept[0] == step:
            return kept[1]
        lo, hi = np.searchsorted(self._steps, step, side="left"), np.searchsorted(self._steps, step, side="right")
        keys = zip(*(v[lo:hi].tolist() for v in self._levels))
        found = dict(zip(keys, self._last[lo:hi].tolist()))
        self._step = (step, found)      # one tuple assigned: a reader sees the old step's or this one's
        return found


def analyse(table: pa.Table, joined: Joined) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(compute_intervals, comm_metrics(kinds=COMM_KINDS, joined=...), exposed_intervals) of the
    events in ``table`` (trace.load_events' table of some ranks, validated), as frames equal to the
    reference functions' on trace.events_frame(table)."""
    ev = E.from_tables([table])
    comp, (crank, cstep, cstart, cend) = _compute(ev)
    rows, launch = comm_of(ev)
    comm = _comm(ev, rows, launch, (crank, cstep, cstart, cend), comp["kind"].to_numpy() == S.BACKWARD, joined)
    cols = ["rank", "step", "start_ns", "end_ns"]
    if not len(rows):
        exposed = pd.DataFrame(columns=cols)
    else:
        exposed = pd.DataFrame(dict(zip(cols, exposed_arrays((crank, cstep, cstart, cend),
                                                             (ev.rank[rows], ev.step[rows], launch, ev.end[rows])))))
    return comp, comm, exposed


def _compute(ev: E.EventArrays) -> tuple[pd.DataFrame, tuple]:
    """intervals.compute_intervals of the events, and its (rank, step, start, end) arrays."""
    k = ev.kind
    src, pos, start, end = compute_rows_of(ev)
    index = pd.RangeIndex(len(src)) if pos is None else pd.Index(pos)
    spans = (ev.rank[src], ev.step[src], start, end)
    frame = pd.DataFrame({"rank": spans[0], "step": spans[1], "micro": ev.micro[src], "kind": _strings(E.KIND_NAMES[k[src]]),
                          "start_ns": start, "end_ns": end})
    frame.index = index
    return frame, spans


def _comm(ev: E.EventArrays, rows: np.ndarray, launch: np.ndarray, comp: tuple, backward: np.ndarray,
          joined: Joined) -> pd.DataFrame:
    """metrics.comm_metrics of the comm rows (every comm kind), each collective's service measured
    from its last launch over all ranks (``joined``)."""
    rank, step, micro, kind, bucket, name = (getattr(ev, c)[rows] for c in ("rank", "step", "micro", "kind", "bucket", "name"))
    hook, end = ev.start[rows], ev.end[rows]
    lf, ef = launch.astype(float), end.astype(float)
    not_wire = (~is_wire(kind, bucket)).astype(np.int64)
    occ, _ = occurrences(rank, step, micro, kind, bucket, name, launch)
    last = np.full(len(rows), np.nan)
    steps, at = np.unique(step, return_inverse=True)
    for i, s in enumerate(steps.tolist()):        # the drawn rows are of one step: one slice of ``joined``
        found = joined.of_step(s)
        mine = np.flatnonzero(at == i)
        names = ev.names[name[mine]] if len(ev.names) else np.full(len(mine), "", dtype=object)
        keys = zip(micro[mine].tolist(), E.KIND_NAMES[kind[mine]].tolist(), bucket[mine].tolist(), names.tolist(),
                   occ[mine].tolist())
        last[mine] = [found.get(key, np.nan) for key in keys]
    t = Q.service_times(lf, ef, Q.stream_prev_done(rank, not_wire, lf, ef), last)
    # queueing.attributed_exposed, with each row's backward compute end per (rank, step)
    s, e = Q.owned_arrays(K.group_codes(rank, step), lf, ef, not_wire)
    exposed, after = Q.attributed_arrays(rank, step, s, e, comp, backward_end(comp, backward, rank, step))
    ready, nbytes = ev.ready[rows], ev.bytes[rows]
    ops = ev.ops[ev.op[rows]] if len(ev.ops) else np.full(len(rows), "", dtype=object)
    f = {"rank": rank, "step": step, "micro": micro, "kind": _strings(E.KIND_NAMES[kind]), "bucket": bucket,
         "name": _categories(name, ev.names), "op": _strings(ops), "bytes": nbytes, "logical_bytes": ev.logical_bytes[rows],
         "dtype": _categories(ev.dtype[rows], ev.dtypes), "group_size": ev.group_size[rows], "layout": ev.layout[rows],
         "phase": _strings(ev.phases[ev.phase[rows]] if len(ev.phases) else np.full(len(rows), "", dtype=object)),
         "ready_ns": ready, "hook_ns": hook, "launch_ns": launch, "start_ns": launch, "end_ns": end}
    f.update({k: t[k] for k in Q.TIME_COLUMNS})
    service = t["service_ns"]
    algbw = algbw_gbps(nbytes.astype(float), service)
    factor = coded_busbw_factors(ev.op[rows], ev.ops, ev.group_size[rows])
    f.update(exposed_ns=np.round(exposed).astype(np.int64), after_backward_ns=np.round(after).astype(np.int64),
             hook_to_launch_ns=(launch - hook).astype(np.int64), span_ns=(end - launch).astype(np.int64),
             duration_ns=service, launch_delay_ns=np.where(ready >= 0, launch - ready, np.nan),
             algbw_gbps=algbw, busbw_gbps=algbw * factor)
    return pd.DataFrame(f)


def _strings(values: np.ndarray) -> pd.Series:
    """A column of str as columns.as_str gives it (pandas' default string dtype)."""
    return pd.Series(values, dtype=_STR)


def _categories(codes: np.ndarray, dictionary: np.ndarray) -> pd.Categorical:
    """A categorical column as trace.events_frame types it: the sorted dictionary as its categories."""
    return pd.Categorical.from_codes(codes, categories=pd.Index(dictionary.tolist(), dtype=_STR))
