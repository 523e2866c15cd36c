"""The summary's numbers for a run of any size: partitions of whole ranks, each read and analysed on
its own (in parallel processes), combined into the same numbers the whole-run functions give.

Why this is exact, metric by metric (definitions stay in metrics / queueing / headline / tables):
- Everything per (rank, step) — step_metrics, a collective's queued time behind its own rank's
  earlier ones, attributed exposed time — needs one rank's events only, so a partition of whole
  ranks gives the whole run's rows for its ranks.
- One number crosses ranks: a collective's last launch over all ranks (``joined``: when service
  can start). Pass 1 reads every partition for each collective's (first, last launch, ranks)
  (queueing.EVENT_KEY, a few numbers per collective); pass 2 computes comm_metrics with it.
- Means over (rank, step) pairs use the concatenated step_metrics table (one row per rank-step:
  small), so they are summed in the same order as before; sums over collectives are of
  integer-valued nanoseconds (exact in any order); medians are exact (analysis.spill).
- Who launched last (queueing.straggler_table) needs, per collective, how many ranks tied at the
  last launch: pass 2 counts them per partition; the combine adds the counts and then reads each
  partition's (rank, collective, launched-last) rows back from scratch files.

- The rank × step lateness map needs each bucket's (or collective's) first launch over all ranks:
  pass 1 collects them, pass 2 sums each (rank, step)'s lateness in integers (partition_joined.py;
  partial_views.py has the exports' pieces and their combines).

How a partition is worked (partition_passes.py): its rank files are read once as one table
(trace.partition_read) and analysed on numpy arrays (eventarrays, partition_local) through the array
cores of the reference functions; pass 1 keeps each comm row's per-rank results in a scratch file,
pass 2 finishes them with the cross-rank numbers (partition_joined). The whole-run functions stay the
reference: tests/test_partitioned.py compares every number, table and report byte with them.

Memory: one partition's events (about 1.5 M rows) per worker, plus per-collective and per-(rank,
step) tables; never the run. ``summarize`` returns a SummaryTables the summary view lays out.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from syncviz.analysis.headline import headline, verdict
from syncviz.analysis import comparison as CM
from syncviz.analysis import distributed as D
from syncviz.analysis import partial_views as PV
from syncviz.analysis import partials as P
from syncviz.analysis import partition_joined as PJ
from syncviz.analysis import queueing as Q
from syncviz.analysis import spill
from syncviz.analysis.metrics import _ms, headline_steps
from syncviz.analysis.summary_pool import process_pool, scratch_dir
from syncviz.analysis.tables import step_table_of
from syncviz.trace import read as R
from syncviz.trace import validate as V

# Events per partition: ~1.5 GB at most in a worker (each worker's ru_maxrss on the 10^8-event runs,
# session 56: DDP from the kept passes 1.52 and 1.01 GB, reading every event 1.50 and 0.88 GB; ZeRO-3
# 0.77 and 0.68 GB). 1.5 M, not the 750,000 of sessions 20-54: a partition's fixed costs (its result,
# its spill pieces, which every median then reads a slice of) paid half as often. Measured 2026-12-03
# (AMD EPYC family 25 model 17, two workers, the simulated 10^8-event runs, sizes alternated:
# `python benchmarks/partition_size.py RUN --rounds 2|3`): DDP from the ranks' kept passes 51.2, 45.0 ->
# 44.1, 44.5 s, peak 3.23 -> 3.48 GB; ZeRO-3 30.1, 29.8, 28.3 -> 26.0, 27.1, 26.5 s, 2.10 -> 2.36 GB;
# DDP reading every event 113.8, 112.5 -> 110.3, 111.8 s, 3.06 -> 3.55 GB. 3 M events a partition
# gained nothing more and peaked at 4.17 GB (over issue 17's 4 GB).
PARTITION_EVENTS = 1_500_000
BYTES_PER_EVENT = 52              # on disk (simulated 1,024-rank ZeRO-3 run: 217 MB for 4.17 M events)


@dataclass
class SummaryTables:
    """What ``syncviz summary`` prints, computed without holding the run."""
    path: Path
    meta: dict
    layouts: pd.DataFrame
    problems: list[str]
    summary: dict                     # headline.run_summary's dict
    steps: pd.DataFrame               # step_metrics rows (one per rank-step)
    step_table: pd.DataFrame          # tables.step_table
    bucket_table: pd.DataFrame        # tables.bucket_layout_table of headline bucket rows
    collective_table: pd.DataFrame    # tables.collective_table of headline collective rows
    offload: pd.DataFrame             # metrics.offload_table over headline steps
    incomplete_ranks: list[int] = field(default_factory=list)
    facts: dict = field(default_factory=dict)   # partials.combine_facts: the dashboard's step index of the run
    spans: pd.DataFrame | None = None           # where each rank file's batches lie (trace.spans), for step reads
    comparison: dict | None = None              # analysis.comparison's measured numbers (summarize(compare=True))
    bucket_json: list = field(default_factory=list)   # summarize(json_dir=): files of bucket rows (jsonrows)
    rank_skew: pd.DataFrame | None = None       # metrics.lateness_matrix of the run (the dashboard's rank_skew)
    export: dict | None = None                  # summarize(export_dir=): the TensorBoard and HTML exports' inputs
    replay: dict | None = None                  # summarize(replay_dir=): what the Replay needs (runcache.put_summary)
    bucket_stats: tuple | None = None           # the dashboard's bucket_stats (partials.combine_bucket_stats)
    op_bytes: pd.DataFrame | None = None        # the dashboard's op_bytes (summarize(compare=True))
    distributed: tuple | None = None            # the dashboard's Distributed page: (rank_breakdown, collective_kinds)
    events_read: int = 0                        # events read from rank files, not from kept first passes

    @property
    def name(self) -> str:
        return self.meta.get("name") or self.path.name

    @property
    def world_size(self) -> int:
        return self.summary["world_size"]


@dataclass
class Measured:
    """What ``syncviz compare`` needs of a run (``measure``: one pass over partitions of ranks)."""
    path: Path
    meta: dict
    problems: list[str]
    incomplete_ranks: list[int]
    world_size: int
    comparison: dict                  # analysis.comparison.combine's dict

    @property
    def name(self) -> str:
        return self.meta.get("name") or self.path.name


def partitions(files: dict[int, Path], target_events: int = PARTITION_EVENTS) -> list[dict[int, Path]]:
    """Consecutive ranks grouped so that each group holds about ``target_events`` events (by size)."""
    out, cur, size = [], {}, 0
    for rank, path in files.items():
        n = R.file_size(path)
        if cur and size + n > target_events * BYTES_PER_EVENT:
            out.append(cur)
            cur, size = {}, 0
        cur[rank] = path
        size += n
    if cur:
        out.append(cur)
    return out


def measure(run_dir, jobs: int | None = None, target_events: int = PARTITION_EVENTS, progress=None) -> Measured:
    """What ``syncviz compare`` shows of a run of any size: summarize's first pass alone (compare's
    numbers need no collective matched across ranks). Raises TraceError like summarize."""
    return summarize(run_dir, jobs, target_events, progress, compare="only")


def summarize(run_dir, jobs: int | None = None, target_events: int = PARTITION_EVENTS, progress=None,
              executor=None, scratch: str | None = None, compare: bool | str = False,
              json_dir: str | None = None, export_dir: str | None = None, replay_dir: str | None = None,
              json_room=None) -> SummaryTables:
    """The summary of a run directory by partitions of ranks (``jobs`` worker processes; 1: in this
    process). ``executor``: any concurrent.futures Executor to run the partitions on instead (a
    Dask cluster's: analysis.cluster; the caller shuts it down); ``scratch``: where the passes'
    scratch files go (workers must reach it; default: the system temp dir); ``compare``: also
    measure what ``syncviz compare`` shows (SummaryTables.comparison); ``json_dir``: write every
    bucket row there as JSON text (SummaryTables.bucket_json, in rank order; ``summary --json``);
    ``json_room(total, written)``: called after each partition's JSON piece with the bytes all the
    pieces will come to (projected from those written, by the rank files' sizes) and the bytes
    written so far; it raises to stop before the pieces fill the disk (views/summary.py);
    ``export_dir``: what the TensorBoard export needs (SummaryTables.export; its pieces stay there);
    ``replay_dir``: what the dashboard's Replay needs to draw a step of this run from the drawn ranks'
    events alone (SummaryTables.replay, None if a piece could not be kept exactly; its lateness pieces
    stay there, analysis.steplateness). Raises TraceError like read.open_run."""
    run_dir = Path(run_dir)
    meta = R.read_meta(run_dir)
    files = R.rank_files(run_dir)
    if not files:
        raise R.TraceError(f"{run_dir}: no rank-<r>.arrow files (the run recorded nothing)")
    mproblems = V.check_meta(meta, list(files))
    mproblems += [f"{p.name}: rank number out of range; ignored" for p in run_dir.glob("rank-*.arrow")
                  if R._RANK_RE.match(p.name) and int(R._RANK_RE.match(p.name).group(1)) >= V.MAX_WORLD][:3]
    parts = partitions(files, target_events)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(parts)))
    say = progress or (lambda msg: None)
    if executor is not None:
        return _summarize(run_dir, meta, files, mproblems, parts, "an external executor", executor, say, scratch,
                          own=False, compare=compare, json_dir=json_dir, export_dir=export_dir, replay_dir=replay_dir,
                          json_room=json_room)
    pool = process_pool(jobs)
    try:
        return _summarize(run_dir, meta, files, mproblems, parts, f"{jobs} processes", pool, say, scratch,
                          compare=compare, json_dir=json_dir, export_dir=export_dir, replay_dir=replay_dir,
                          json_room=json_room)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _summarize(run_dir, meta, files, mproblems, parts, jobs, pool, say, scratch_root=None, own=True,
               compare=False, json_dir=None, export_dir=None, replay_dir=None, json_room=None) -> SummaryTables:
    with scratch_dir(scratch_root, pool if own else None) as scratch:
        say(f"pass 1/2: {len(parts)} partitions of ranks, {jobs}")
        kept = [str(Path(scratch) / f"part-{i}.arrays") for i in range(len(parts))]
        problems, incomplete, errors, last_step, max_rank = [], [], [], {}, -1
        steps_parts, facts, spans, events, rows = [], [], [], None, 0
        if compare == "only":
            kept = [None] * len(parts)        # no second pass to keep the events for
        compared, first, step_first, bucket_steps, kept_ranks, read_rows = [], None, None, set(), 0, 0
        for i, r in enumerate(_map(pool, P.pass1, [(str(run_dir), p, k, bool(compare)) for p, k in zip(parts, kept)])):
            compared.append(r["compare"])
            first = PV.reduce_bucket_first([first, r["bucket_first"]])
            step_first = PV.reduce_step_first([step_first, r["step_first"]])
            if r["bucket_steps"] is not None:
                bucket_steps.update(int(x) for x in r["bucket_steps"])
            problems += r["problems"]
            incomplete += r["incomplete"]
            errors += r["errors"]
            last_step.update(r["last_step"])
            max_rank = max(max_rank, r["max_rank"])
            rows += r["rows"]
            steps_parts.append(r["steps"])
            facts.append(r["facts"])
            spans.append(r["spans"])
            events = P.reduce_events([events, r["events"]])
            kept_ranks += r["kept_ranks"]
            read_rows += 0 if r["kept_ranks"] else r["rows"]      # a partition combines kept passes or reads
            say(f"pass 1/2: {i + 1}/{len(parts)} partitions")
        if kept_ranks:
            say(f"pass 1/2: {kept_ranks:,} of {len(files):,} ranks from the first pass each kept when it closed")
        if errors and not rows:
            more = f" (and {len(errors) - 1} more rank files unreadable)" if len(errors) > 1 else ""
            raise R.TraceError(errors[0][1] + more)
        for rank, e in errors:
            problems.append(f"rank {rank} unreadable, left out: {e}")
            incomplete.append(rank)
        world = meta["world_size"]
        if len(files) < world:
            have = set(files)
            missing = [r for r in range(world) if r not in have]
            shown = ", ".join(map(str, missing[:8])) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
            problems.append(f"ranks {shown} wrote no file")
            incomplete.extend(missing[:10_000])
        incomplete = sorted(set(incomplete))
        crashed = _unfinished(meta, last_step, incomplete)
        layouts, lproblems = R.load_layouts(run_dir)
        problems = ([crashed] if crashed else []) + mproblems + problems + lproblems
        steps = pd.concat(steps_parts, ignore_index=True) if steps_parts else pd.DataFrame()
        del steps_parts
        events = P.combine_events([events])
        events = PV.with_collective_order(events, first)     # once here, not in every partition
        events_path = str(Path(scratch) / "events.pkl")
        events.to_pickle(events_path)
        first_path = None
        if first is not None:
            first_path = str(Path(scratch) / "bucket-first.pkl")
            first.to_pickle(first_path)
        h = headline_steps(steps) if len(steps) else steps
        hsteps = sorted(int(s) for s in h["step"].unique()) if len(h) else []
        comparison = None
        if compare:
            found = [f["steps"] for f in facts if f is not None]
            steady = CM.steady_steps(meta, np.unique(np.concatenate(found)) if found else [])
            comparison = CM.combine([c for c in compared if c is not None], steps, steady)
        if compare == "only":
            return Measured(path=run_dir, meta=meta, problems=problems, incomplete_ranks=incomplete,
                            world_size=_world(meta, max_rank), comparison=comparison)
        say(f"pass 2/2: {len(steps):,} rank-steps, {len(events):,} collectives matched across ranks")
        second, skew = [], None
        json_size = JsonSize(parts) if json_dir is not None and json_room is not None else None
        export = None
        if export_dir is not None:     # tables.bucket_table's headline: bucket steps after the first
            export = {"dir": export_dir, "head": min(bucket_steps) if len(bucket_steps) > 1 else None}
        for i, r in enumerate(_map(pool, P.pass2, [(str(run_dir), p, events_path, hsteps, scratch, i, kept[i],
                                                    json_dir, first_path, export, replay_dir)
                                                   for i, p in enumerate(parts)])):
            skew, r["skew"] = P.reduce_skew([skew, r["skew"]]), None
            second.append(r)
            if json_size is not None:
                json_room(*json_size.after(i, r["json"]))
            say(f"pass 2/2: {i + 1}/{len(parts)} partitions")
        second[0]["skew"] = skew
        # the medians' tasks run on the workers too (a column of a group each, or a batch of small groups)
        map_fn = (lambda fn, tasks: pool.map(fn, tasks)) if pool is not None else map
        tables = _combine(run_dir, meta, layouts, problems, incomplete, steps, h, hsteps, events, second,
                          world_size=_world(meta, max_rank), map_fn=map_fn)
        tables.facts = P.combine_facts(facts, tables.problems, incomplete)
        tables.spans = pd.concat(spans, ignore_index=True) if spans else None
        tables.comparison = comparison
        tables.events_read = read_rows
        tables.op_bytes = CM.headline_op_bytes(compared) if compare else None
        tables.bucket_json = [r["json"] for r in second]
        tables.rank_skew = PV.combine_lateness([r["lateness"] for r in second])
        waiting = [r["waiting"] for r in second if r["waiting"] is not None and len(r["waiting"])]
        tables.distributed = (D.breakdown_of(h, pd.concat(waiting) if waiting else None),
                              D.kinds_of([r["kinds"] for r in second if r["kinds"] is not None], h))
        tables.bucket_stats = P.combine_bucket_stats(second, map_fn)
        if replay_dir is not None and all(r["replay"] is not False for r in second):
            origin = PV.reduce_step_first([r["origin"] for r in second])
            tables.replay = {"dir": replay_dir, "lateness": [r["replay"] for r in second if r["replay"] is not None],
                             "origin": origin if origin is not None else pd.Series(dtype=np.int64),
                             "joined": events["last"].reset_index()}
        if export is not None:
            tables.export = {"bucket_table": PV.combine_bucket_table(second),
                             "bucket_skew": PV.combine_lateness([r["lateness"] for r in second], buckets_only=True),
                             "histograms": [r["histograms"] for r in second],
                             "step_first": step_first if step_first is not None else pd.Series(dtype=np.int64)}
        return tables


class JsonSize:
    """What ``summary --json``'s pieces (one a partition, written by pass 2) will come to: the bytes
    written so far over the share of the run's rank-file bytes their partitions hold. A 10^8-event
    DDP run's pieces came to tens of GB (6.3 GB at 10^7): ``json_room`` is told after each piece,
    so a disk that cannot hold them is known after the first, not when it is full."""

    def __init__(self, parts: list[dict[int, Path]]):
        self.sizes = [sum(R.file_size(p) for p in part.values()) for part in parts]
        self.total = max(sum(self.sizes), 1)
        self.done = self.written = 0

    def after(self, i: int, piece: str | None) -> tuple[int, int]:
        """(projected bytes of every piece, bytes written) once partition ``i``'s piece is in."""
        self.done += self.sizes[i]
        self.written += R.file_size(Path(piece)) if piece else 0
        return (round(self.written * self.total / self.done) if self.done else self.written), self.written


def _combine(run_dir, meta, layouts, problems, incomplete, steps, h, hsteps, events, second, world_size, map_fn=map):
    s = {"name": meta.get("name") or run_dir.name, "strategy": meta.get("strategy", "?"),
         "engine": meta.get("engine", "torch"), "world_size": world_size,
         "steps": int(steps["step"].nunique()) if len(steps) else 0, "headline_steps": hsteps}
    s.update(headline(h))
    # every median of the summary in one map of tasks (spill.group_medians_many)
    comm = [r["comm"] for r in second]       # one spill a partition serves three (partition_joined.COMM_VALUES)
    med, busbw, bucket_med, coll_med = spill.group_medians_many([
        (comm, [], ["busbw_gbps", "service_ns", "queue_ns"], PJ.headline_wire),
        (comm, ["step"], ["busbw_gbps"], PJ.wire_by_step),
        ([r["buckets"] for r in second], ["layout", "bucket"], P.BUCKET_MEDIANS, PJ.headline_bucket),
        (comm, ["phase", "op"], P.COLLECTIVE_MEDIANS, PJ.collective_by_phase_op)], map_fn)
    n_hw = sum(r["n_hw"] for r in second)
    row = med.iloc[0] if len(med) else None
    s["busbw_gbps"] = float(row["busbw_gbps"]) if n_hw else float("nan")
    s["service_ms"] = _ms(row["service_ns"]) if n_hw else float("nan")
    s["queue_ms"] = _ms(row["queue_ns"]) if n_hw else float("nan")
    s["problems"] = list(problems)
    table = P.combine_stragglers(second, events, map_fn)
    s["stragglers"] = table.to_dict(orient="records")
    st = Q.straggler(table, world_size, Q.clock_error_bound(meta))
    s["straggler_detail"] = st
    s["straggler"] = st["rank"] if st else None
    late = table["mean_late_ms"].max() if len(table) else 0.0
    s["max_mean_late_ms"] = float(late) if late == late else 0.0
    s["max_skew_ms"] = P.combine_skew([r["skew"] for r in second])
    s["top_exposed"] = P.combine_top_exposed(second)
    offload = P.combine_offload(second)
    s["offload_ms"] = float(offload["ms_per_step"].sum()) if len(offload) else 0.0
    s["verdict"] = verdict(s)
    step_tab = step_table_of(steps, busbw["busbw_gbps"] if len(busbw) else np.nan) if len(steps) else \
        pd.DataFrame(columns=["step"])
    return SummaryTables(path=run_dir, meta=meta, layouts=layouts, problems=list(problems), summary=s, steps=steps,
                         step_table=step_tab, bucket_table=P.combine_buckets(second, layouts, bucket_med),
                         collective_table=P.combine_collectives(second, coll_med), offload=offload,
                         incomplete_ranks=incomplete)


def _world(meta: dict, max_rank: int) -> int:
    w = meta.get("world_size")
    if isinstance(w, int) and not isinstance(w, bool) and 0 < w <= V.MAX_WORLD:
        return w
    return max_rank + 1 if max_rank >= 0 else 0


def _unfinished(meta: dict, last: dict, incomplete: list[int]) -> str | None:
    """read._unfinished from each rank's last step (partitions never hold the whole table)."""
    if meta.get("finished", True) is not False:
        return None
    where = "; ".join(f"rank {r} " + (f"after step {last[r]}" if r in last else "before its first step")
                      for r in (incomplete or sorted(last))[:8])
    return f"run did not finish (crashed, stopped, or still recording): {where}"


def _map(pool, fn, args):
    if pool is None:
        return (fn(*a) for a in args)
    return pool.map(fn, *zip(*args)) if args else iter(())
