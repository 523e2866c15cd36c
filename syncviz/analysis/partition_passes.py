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

from syncviz.analysis import jsonrows
from syncviz.analysis import keys as K
from syncviz.analysis import partial_views as PV
from syncviz.analysis import partition_joined as PJ
from syncviz.analysis import partition_facts as PF
from syncviz.analysis import partition_local as PL
from syncviz.analysis import rank_pass
from syncviz.analysis import steplateness

_EVENTS: dict[str, pd.DataFrame] = {}        # per worker process: the run's collectives (pass 2)
_EVENTS_LOCK = threading.Lock()              # a Dask worker may run several partitions in threads


def pass1(run_dir: str, files: dict[int, Path], keep: str | None = None, compare: bool = False) -> dict:
    """step_metrics of the partition's ranks and, per collective, its first and last launch and
    how many of these ranks took part (queueing.EVENT_KEY). ``keep``: a scratch file to keep the
    partition's comm rows in for pass 2 (partition_local.save); ``compare``: also what compare
    measures (analysis.comparison's partition inputs). Where every rank of the partition wrote its
    own first pass when its recording closed (analysis.rank_pass), those are combined instead of
    reading the rank files (the same results: tests/test_rank_pass.py), and nothing is kept: pass 2
    merges them again."""
    found = rank_pass.partition_pass1(files, compare)
    if found is not None:
        return found
    index: dict = {}
    ev, problems, incomplete, errors = PF.read_events(files, index)
    out = PF.empty_pass1(problems, incomplete, errors, PF.span_table(index))
    if ev is None:
        return out
    local = PL.local_pass(ev)
    PF.event_facts(out, ev)
    if compare:
        out["compare"] = PF.compare_partial(ev, local.comm)
    PF.comm_facts(out, local.steps, local.comm, local.idents)
    if keep is not None:
        PL.save(keep, local, PF.pass2_extras(ev, local))
    return out


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
    if kept is not None and Path(kept).exists():
        c, idents, extra = PL.load(kept)
        Path(kept).unlink()
    elif (found := rank_pass.partition_local(files)) is not None:     # pass 1 used them too
        c, idents, extra = found
    else:
        ev, *_ = PF.read_events(files)
        if ev is None:
            c = None
        else:
            local = PL.local_pass(ev)
            c, idents, extra = local.comm, local.idents, PF.pass2_extras(ev, local)
    events = _events(events_path)
    out = {"n_hw": 0, "comm": None, "skew": None, "exposed": None, "exposed_total": 0,
           "rank_steps": 0, "buckets": None, "bucket_first": None, "coll_sums": None,
           "coll_steps": 0, "offload": None, "offload_n": 0, "late": None, "n_at_max": None, "wait": None,
           "strag_steps": set(), "strag": None, "json": None, "lateness": None, "tb_first": None, "tb_medians": None,
           "histograms": None, "replay": None, "origin": None, "bucket_n": 0, "waiting": None, "kinds": None}
    if c is None or not int(extra["rows"][0]):
        return out
    t = PJ.comm_times(c, idents, events)
    tag = f"{part}"
    first = pd.read_pickle(first_path) if first_path is not None else None
    order = extra["order"]          # launch order, rank by rank (queueing.occurrences)
    late = PJ.lateness(c, t, events, first, order, idents)
    out["lateness"] = PV.rank_step_lateness(late)
    if replay_dir is not None:
        try:
            out["replay"] = steplateness.write_piece(Path(replay_dir) / f"lateness-{part:06d}.lat", late)
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
        headline = np.isin(c["step"], hsteps)
        PJ.aggregate(out, c, t, order, headline, events, scratch, tag, idents)
        out["waiting"], out["kinds"] = PJ.distributed_parts(c, t, extra, hsteps, headline)
    hs = np.isin(extra["off_step"], hsteps)
    if hs.any():
        out["offload"] = pd.DataFrame({"name": extra["off_name"][hs].astype(object), "ms": extra["off_ns"][hs] / 1e6})
    s = np.isin(extra["step_step"], hsteps)
    out["offload_n"] = K.distinct_pairs(extra["step_rank"][s], extra["step_step"][s])
    return out
