"""The per-partition halves of analysis.partitioned (run in worker processes) and the functions that
combine their results. Each pass reads one partition of whole ranks and returns small tables; the
reasons each combination equals the whole-run number are in partitioned.py's docstring."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz.analysis.headline import exposed_by_identity, top_exposed_rows
from syncviz.analysis import comparison as CM
from syncviz.analysis import jsonrows
from syncviz.analysis import partial_views as PV
from syncviz.analysis import queueing as Q
from syncviz.analysis import spill
from syncviz.analysis import steplateness
from syncviz.analysis.intervals import comm_rows, compute_intervals, wire_mask
from syncviz.analysis.metrics import _ms, comm_metrics, step_metrics
from syncviz.analysis.tables import BUCKET_MEDIANS, with_params
from syncviz.trace import read as R
from syncviz.trace import schema as S
from syncviz.trace import spans as SP
from syncviz.analysis.columns import as_str

SKEW_KEY = ["step", "micro", "kind", "bucket", "name"]
_EVENTS: dict[str, pd.DataFrame] = {}        # per worker process: the run's collectives (pass 2)
_EVENTS_LOCK = threading.Lock()              # a Dask worker may run several partitions in threads


def _read(run_dir: str, files: dict[int, Path], index: dict | None = None):
    tables, problems, incomplete, errors = R.read_ranks(files, index=index)
    ev = R.events_frame(pa.concat_tables(tables)) if tables else None
    return ev, tables, problems, incomplete, errors


def span_table(index: dict) -> pd.DataFrame:
    """read_ranks' spans.index of each file as one table (trace.spans.COLUMNS: one row per batch)."""
    parts = [np.column_stack([np.full(len(rows), rank), rows, np.full(len(rows), prefix)])
             for rank, found in index.items() if found is not None for prefix, rows in [found]]
    data = np.concatenate(parts) if parts else np.zeros((0, len(SP.COLUMNS)), dtype=np.int64)
    return pd.DataFrame(data.astype(np.int64), columns=SP.COLUMNS)


def pass1(run_dir: str, files: dict[int, Path], keep: str | None = None, compare: bool = False) -> dict:
    """step_metrics of the partition's ranks and, per collective, its first and last launch and
    how many of these ranks took part (queueing.EVENT_KEY). ``keep``: a scratch file to keep the
    partition's events in for pass 2 (a pickle of the frame reloads in a fraction of the time that
    reading and validating the rank files again takes); ``compare``: also what compare measures
    (analysis.comparison.partial)."""
    index: dict = {}
    ev, tables, problems, incomplete, errors = _read(run_dir, files, index)
    del tables
    if keep is not None and ev is not None:
        ev.to_pickle(keep)
    out = {"problems": problems, "incomplete": incomplete, "errors": errors, "rows": 0, "last_step": {},
           "max_rank": -1, "steps": pd.DataFrame(), "events": None, "facts": None, "spans": span_table(index),
           "compare": None, "bucket_first": None, "step_first": None, "bucket_steps": None}
    if ev is None:
        return out
    out["rows"] = len(ev)
    out["facts"] = step_facts(ev)
    if len(ev):
        last = ev.groupby("rank")["step"].max()
        out["last_step"] = {int(r): int(s) for r, s in last.items()}
        out["max_rank"] = int(ev["rank"].max())
    out["steps"] = step_metrics(ev)
    comm = comm_rows(ev)
    if compare:
        out["compare"] = CM.partial(ev, comm)
    out["bucket_first"] = PV.bucket_first(comm)
    # for the TensorBoard export: each step's first start (its wall time) and the steps with buckets
    out["step_first"] = ev[(ev["kind"] == S.STEP).to_numpy()].groupby("step")["start_ns"].min()
    out["bucket_steps"] = np.unique(comm.loc[(comm["kind"] == S.BUCKET).to_numpy(), "step"].to_numpy())
    if len(comm):
        c = Q.occurrences(comm)
        g = c.assign(op=as_str(comm["op"]).reindex(c.index).to_numpy()).groupby(Q.EVENT_KEY, observed=True, sort=False)
        # op: of the lowest rank's row (c is in rank order), as tables.sync_lateness labels a collective
        out["events"] = g["launch_ns"].agg(["min", "max", "size"]).assign(op=g["op"].first())
    return out


def step_facts(ev: pd.DataFrame) -> dict:
    """What the dashboard's step index (dashboard/data/stepindex.py) finds in these ranks' rows:
    the ranks, the highest bucket index, every step (>= 0) and, per step with valid rows, its first
    start and last end (ns). combine_facts turns several partitions' into the run's."""
    steps = ev["step"].to_numpy()
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    valid = (start >= 0) & (end >= start) & (steps >= 0)
    g = pd.DataFrame({"step": steps[valid], "start": start[valid], "end": end[valid]}).groupby("step")
    return {"ranks": np.unique(ev["rank"].to_numpy()), "top_bucket": int(ev["bucket"].max()) if len(ev) else -1,
            "steps": np.unique(steps[steps >= 0]), "first": g["start"].min(), "last": g["end"].max()}


def combine_facts(parts: list[dict], problems: list[str], incomplete: list[int]) -> dict:
    """The run's facts as the dashboard caches them (LoadedRun._facts): the same values its step
    index gives when it reads the whole run (tests/test_runcache.py compares them)."""
    parts = [p for p in parts if p is not None]
    ranks = sorted({int(r) for p in parts for r in p["ranks"]})
    steps = sorted({int(s) for p in parts for s in p["steps"]})
    top = max((p["top_bucket"] for p in parts), default=-1)
    first = pd.concat([p["first"] for p in parts]).groupby(level=0).min() if parts else pd.Series(dtype=np.int64)
    last = pd.concat([p["last"] for p in parts]).groupby(level=0).max() if parts else pd.Series(dtype=np.int64)
    ext = sorted(first.index.tolist())
    return {"problems": list(problems), "incomplete_ranks": list(incomplete), "ranks": ranks,
            "n_buckets": max(1, top + 1), "steps": steps, "extent_steps": [int(k) for k in ext],
            "extent_ms": [(int(last[k]) - int(first[k])) / 1e6 for k in ext]}


def reduce_events(parts: list) -> pd.DataFrame | None:
    """pass 1's per-collective (min, max, size) of several partitions as one such table; folded
    as partitions finish, so the parent holds one table per collective, not one per partition
    (at 10^8 events: 133 partitions × 58,000 collectives)."""
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    g = pd.concat(parts).groupby(level=list(range(len(Q.EVENT_KEY))), sort=True)
    # parts in rank order (partitions are consecutive ranks, folded in order): "first" is the lowest rank's op
    return pd.DataFrame({"min": g["min"].min(), "max": g["max"].max(), "size": g["size"].sum(), "op": g["op"].first()})


def combine_events(parts: list) -> pd.DataFrame:
    """Per collective (index EVENT_KEY, sorted): ``first``/``last`` launch (ns), ``ranks`` and the
    ``op`` of the lowest rank's call."""
    r = reduce_events(parts)
    if r is None:
        idx = pd.MultiIndex.from_tuples([], names=Q.EVENT_KEY)
        return pd.DataFrame({"first": pd.Series(dtype=np.int64), "last": pd.Series(dtype=np.int64),
                             "ranks": pd.Series(dtype=np.int64), "op": pd.Series(dtype=object)}, index=idx)
    out = r.rename(columns={"min": "first", "max": "last", "size": "ranks"}).sort_index()
    out.index.names = Q.EVENT_KEY
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
    copy of the partition's events; ``json_dir``: write the partition's bucket rows there as JSON
    text (``syncviz summary --json``: analysis.jsonrows); ``first_path``: every bucket's earliest
    launch over all ranks (pass 1's bucket_first, pickled), for the rank × step lateness;
    ``export``: {"dir": where the TensorBoard export's pieces go, "head": the first bucket step of
    tables.bucket_table's headline (None: every step)}; ``replay_dir``: keep what the dashboard's
    Replay needs of these ranks to draw one step without reading every rank (steplateness: the
    lateness rows, and each step's earliest compute or comm start)."""
    if kept is not None and Path(kept).exists():
        ev = pd.read_pickle(kept)
        Path(kept).unlink()
    else:
        ev, *_ = _read(run_dir, files)
    events = _events(events_path)
    out = {"n_hw": 0, "hw": None, "step_busbw": None, "skew": None, "exposed": None, "exposed_total": 0,
           "rank_steps": 0, "buckets": None, "bucket_first": None, "coll": None, "coll_sums": None,
           "coll_steps": 0, "offload": None, "offload_n": 0, "late": None, "n_at_max": None, "wait": None,
           "strag_steps": set(), "strag": None, "json": None, "lateness": None, "tb_first": None, "tb_medians": None,
           "histograms": None, "replay": None, "origin": None}
    if ev is None or not len(ev):
        return out
    joined = events["last"].astype(float)
    intervals = (compute_intervals(ev), comm_rows(ev))
    comm = comm_metrics(ev, kinds=S.COMM_KINDS, joined=joined, intervals=intervals)
    tag = f"{part}"
    first = pd.read_pickle(first_path) if first_path is not None else None
    is_wire = wire_mask(comm) if len(comm) else np.zeros(0, dtype=bool)
    wire = comm[is_wire]
    # occurrence numbers of every wire row, once: a step's rows are numbered alone (whole identity
    # groups), so the headline steps' rows of it are exactly occurrences(hw) (the stragglers)
    occ = Q.occurrences(wire) if len(wire) else None
    late = PV.lateness_rows(comm, events, first, occ)
    out["lateness"] = PV.rank_step_lateness(late)
    if replay_dir is not None:
        try:
            out["replay"] = steplateness.write_piece(Path(replay_dir) / f"lateness-{part:06d}.arrow", late)
        except steplateness.NotKept:      # the summary then keeps no Replay tables (never some ranks' only)
            out["replay"] = False
        out["origin"] = PV.step_origins(*intervals)
    if export is not None:
        PV.export_pieces(out, comm, export, tag)
    if json_dir is not None:
        out["json"] = jsonrows.write(Path(json_dir) / f"buckets-{part:06d}.json", PV.bucket_rows(comm))
    if len(comm):
        hw = _where(wire, wire["step"].isin(hsteps))
        out["n_hw"] = len(hw)
        out["hw"] = spill.write_piece(scratch, f"hw-{tag}", hw, [], ["busbw_gbps", "service_ns", "queue_ns"])
        out["step_busbw"] = spill.write_piece(scratch, f"sb-{tag}", wire, ["step"], ["busbw_gbps"])
        if len(hw):
            sk = hw.assign(name=as_str(hw["name"])).groupby(SKEW_KEY, observed=True)["launch_ns"]
            out["skew"] = pd.DataFrame({"lo": sk.min(), "hi": sk.max()})
            out["exposed"] = exposed_by_identity(hw)
            out["exposed_total"] = int(hw["exposed_ns"].sum())
            out["rank_steps"] = hw[["rank", "step"]].drop_duplicates().shape[0]
            _stragglers(out, hw, events, scratch, tag, occ[occ["step"].isin(hsteps).to_numpy()])
        buckets = _where(comm, (comm["kind"] == S.BUCKET) & comm["step"].isin(hsteps))
        if len(buckets):
            out["buckets"] = spill.write_piece(scratch, f"b-{tag}", buckets, ["layout", "bucket"], BUCKET_MEDIANS)
            out["bucket_first"] = buckets.groupby(["layout", "bucket"]).agg(bytes=("bytes", "max"),
                                                                             dtype=("dtype", "first"))
        coll = _where(comm, (comm["kind"] == S.COLLECTIVE) & comm["step"].isin(hsteps))
        if len(coll):
            out["coll"] = spill.write_piece(scratch, f"c-{tag}", coll, ["phase", "op"], ["queue_ns", "busbw_gbps"])
            out["coll_sums"] = coll.groupby(["phase", "op"]).agg(
                calls=("bytes", "size"), bytes=("bytes", "sum"), duration_ns=("duration_ns", "sum"),
                exposed_ns=("exposed_ns", "sum"))
            out["coll_steps"] = coll[["rank", "step"]].drop_duplicates().shape[0]
    off = ev[ev["kind"] == S.OFFLOAD]
    off = off[(off["end_ns"] >= off["start_ns"]) & (off["start_ns"] >= 0)]
    off = off[off["step"].isin(hsteps)]
    if len(off):
        out["offload"] = pd.DataFrame({"name": as_str(off["name"]).to_numpy(),
                                       "ms": ((off["end_ns"] - off["start_ns"]) / 1e6).to_numpy()})
    out["offload_n"] = ev[ev["step"].isin(hsteps) & (ev["kind"] == S.STEP)].groupby(["rank", "step"]).ngroups
    return out


def _where(df: pd.DataFrame, mask: pd.Series) -> pd.DataFrame:
    """``df[mask]``, without copying ~30 columns when every row is kept (the usual case: most
    steps are headline steps, and a ZeRO-3 run's comm rows are all collectives). Rows, index and
    values are the same either way; nothing here writes into the result (copy-on-write anyway)."""
    m = mask.to_numpy(dtype=bool)
    return df if m.all() else df[m]


def _stragglers(out: dict, hw: pd.DataFrame, events: pd.DataFrame, scratch: str, tag: str,
                c: pd.DataFrame | None = None) -> None:
    """queueing.straggler_table's per-collective counts for these ranks, and their rows (spilled);
    ``c``: Q.occurrences(hw) when the caller has it."""
    c = Q.occurrences(hw) if c is None else c
    ev_id = events.index.get_indexer(pd.MultiIndex.from_frame(c[Q.EVENT_KEY]))
    first, last, nranks = (events[k].to_numpy() for k in ("first", "last", "ranks"))
    launch = c["launch_ns"].to_numpy(dtype=np.int64)
    at_max = launch == last[ev_id]
    n_ev = len(events)
    out["n_at_max"] = np.bincount(ev_id, weights=at_max, minlength=n_ev)
    waits = hw.loc[c.index, "wait_peers_ns"].fillna(0).to_numpy(dtype=float)
    out["wait"] = np.bincount(ev_id, weights=waits, minlength=n_ev)
    keep = nranks[ev_id] >= 2
    if not keep.any():
        return
    k = c[keep].assign(late=(launch - first[ev_id])[keep])
    out["late"] = k.groupby("rank").agg(mean_late_ns=("late", "mean"))["mean_late_ns"]
    out["strag_steps"] = set(int(s) for s in k["step"].unique())
    path = str(Path(scratch) / f"st-{tag}.npz")
    np.savez(path, rank=k["rank"].to_numpy(), ev=ev_id[keep], at_max=at_max[keep])
    out["strag"] = path


def combine_stragglers(second: list[dict], events: pd.DataFrame) -> pd.DataFrame:
    cols = ["rank", "events", "last", "last_pct", "mean_late_ms", "waited_for_ms_per_step"]
    done = [r for r in second if r["strag"]]
    if not done:
        return pd.DataFrame(columns=cols)
    n_at_max = sum(r["n_at_max"] for r in second if r["n_at_max"] is not None)
    event_wait = sum(r["wait"] for r in second if r["wait"] is not None)
    unique = n_at_max == 1
    frames = []
    for r in done:
        a = np.load(r["strag"])
        rank, ev, at_max = a["rank"], a["ev"], a["at_max"]
        is_last = at_max & unique[ev]
        ranks, inv = np.unique(rank, return_inverse=True)
        frames.append(pd.DataFrame({
            "events": np.bincount(inv, weights=unique[ev]).astype(np.int64),
            "last": np.bincount(inv, weights=is_last).astype(np.int64),
            "mean_late_ns": r["late"].reindex(ranks).to_numpy(),
            "wait_ns": np.bincount(inv, weights=np.where(is_last, event_wait[ev], 0.0))},
            index=pd.Index(ranks, name="rank")))
    per = pd.concat(frames).sort_index()
    nsteps = max(1, len(set().union(*(r["strag_steps"] for r in done))))
    return Q.straggler_rows(per, nsteps)


def reduce_skew(parts: list) -> pd.DataFrame | None:
    """Earliest and latest launch per collective identity (SKEW_KEY) over several partitions."""
    parts = [p for p in parts if p is not None and len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else None
    g = pd.concat(parts).groupby(level=list(range(len(SKEW_KEY))))
    return pd.DataFrame({"lo": g["lo"].min(), "hi": g["hi"].max()})


def combine_skew(parts: list) -> float:
    r = reduce_skew(parts)
    return 0.0 if r is None else _ms((r["hi"] - r["lo"]).max())


def combine_top_exposed(second: list[dict]) -> list[dict]:
    parts = [r["exposed"] for r in second if r["exposed"] is not None]
    if not parts:
        return []
    g = pd.concat(parts).groupby(level=0, sort=False)
    agg = g.agg(kind=("kind", "first"), bucket=("bucket", "first"), name=("name", "first"), op=("op", "first"),
                bytes=("bytes", "max"), exposed_ns=("exposed_ns", "sum"), after_backward_ns=("after_backward_ns", "sum"),
                count=("count", "sum"))
    return top_exposed_rows(agg, sum(r["exposed_total"] for r in second), sum(r["rank_steps"] for r in second))


def combine_buckets(second: list[dict], layouts: pd.DataFrame) -> pd.DataFrame:
    firsts = [r["bucket_first"] for r in second if r["bucket_first"] is not None]
    if not firsts:
        return pd.DataFrame()
    g = pd.concat(firsts).groupby(level=[0, 1], sort=True)
    out = pd.DataFrame({"bytes": g["bytes"].max(), "dtype": g["dtype"].first()})
    med = spill.group_medians([r["buckets"] for r in second], ["layout", "bucket"], BUCKET_MEDIANS)
    out = out.join(med)
    out.index.names = ["layout", "bucket"]
    return with_params(out, layouts)


def combine_collectives(second: list[dict]) -> pd.DataFrame:
    sums = [r["coll_sums"] for r in second if r["coll_sums"] is not None]
    if not sums:
        return pd.DataFrame()
    g = pd.concat(sums).groupby(level=[0, 1], sort=True).sum()
    med = spill.group_medians([r["coll"] for r in second], ["phase", "op"], ["queue_ns", "busbw_gbps"])
    out = g.join(med)[["calls", "bytes", "duration_ns", "exposed_ns", "queue_ns", "busbw_gbps"]]
    nsteps = max(1, sum(r["coll_steps"] for r in second))
    per = ["calls", "bytes", "duration_ns", "exposed_ns"]
    out[per] = out[per] / nsteps
    return out


def combine_offload(second: list[dict]) -> pd.DataFrame:
    parts = [r["offload"] for r in second if r["offload"] is not None]
    if not parts:
        return pd.DataFrame(columns=["name", "ms_per_step", "calls_per_step"])
    off = pd.concat(parts, ignore_index=True)
    n = sum(r["offload_n"] for r in second) or 1
    g = off.groupby("name")
    return pd.DataFrame({"ms_per_step": g["ms"].sum() / n, "calls_per_step": g.size() / n}).reset_index()


__all__ = ["pass1", "pass2", "step_facts", "combine_facts", "combine_events", "combine_stragglers", "combine_skew", "combine_top_exposed",
           "combine_buckets", "combine_collectives", "combine_offload"]
