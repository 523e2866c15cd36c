"""The summary's second pass on one partition's comm rows (partition_local's, kept between the passes),
once every collective's first and last launch over all ranks is known: queue, service and bandwidth
(queueing.service_times, metrics.busbw_factors), and what the summary aggregates of them — spilled
medians, the straggler counts, launch skew, exposed time by collective, the lateness rows: the tables
partials.py combines (tests/test_partitioned.py compares what the summary makes of them, number by
number, with the whole-run functions)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from syncviz.analysis import distributed as D
from syncviz.analysis import eventarrays as E
from syncviz.analysis import keys as K
from syncviz.analysis import queueing as Q
from syncviz.analysis import spill
from syncviz.analysis.metrics import algbw_gbps, coded_busbw_factors
from syncviz.analysis.partition_local import ident_index, is_wire
from syncviz.analysis.tables import BUCKET_MEDIANS

SKEW_KEY = ["step", "micro", "kind", "bucket", "name"]


def comm_times(c: dict, idents: dict, events: pd.DataFrame) -> dict:
    """comm_metrics' per-row numbers of the kept rows, with ``gid``: each row's collective in ``events``
    (partials.combine_events' table, sorted by queueing.EVENT_KEY)."""
    gid = events.index.get_indexer(ident_index(c, idents))[c["ident"]] if len(c["ident"]) else c["ident"]
    launch, end = c["launch"].astype(float), c["end"].astype(float)
    t = Q.service_times(launch, end, c["prev"], events["last"].to_numpy(dtype=float)[gid])
    svc = t["service_ns"]
    algbw = algbw_gbps(c["bytes"], svc)
    factor = coded_busbw_factors(c["op"], c["ops"], c["group_size"])
    t.update(gid=gid, algbw_gbps=algbw, busbw_gbps=algbw * factor, bw_factor=factor, duration_ns=svc,
             span_ns=(c["end"] - c["launch"]).astype(np.int64))
    return t


def every_row(rows: np.ndarray, n: int) -> np.ndarray | slice:
    """``rows`` (ascending row numbers of n rows), or slice(None) where they are all n: a column
    indexed with it is then the column itself, not a copy. A DDP run's comm rows are all wire rows
    and all bucket rows, and the ~25 copies of ~660,000 values a partition of its 10^8-event run made
    of them took ~15 ms of its ~460 ms of pass 2 (cProfile, session 47). Only for columns read, never
    written to."""
    return slice(None) if len(rows) == n and (not n or (rows[0] == 0 and rows[-1] == n - 1)) else rows


def bucket_times(c: dict) -> dict:
    """comm_metrics' hook_to_launch_ns and launch_delay_ns of the bucket rows (in ``bucket_rows`` order)."""
    launch = c["launch"][every_row(c["bucket_rows"], len(c["launch"]))]
    return {"hook_to_launch_ns": (launch - c["hook"]).astype(np.int64),
            "launch_delay_ns": np.where(c["ready"] >= 0, launch - c["ready"], np.nan)}


def int_sums(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums per group (a float bincount loses integers above 2^53)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, codes, values)
    return out


def min_by(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Minimum of ``values`` per group."""
    out = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(out, codes, values)
    return out.astype(values.dtype)


def spill_by(scratch, tag, keys: list, values: list, names: tuple = (), ratios: dict | None = None):
    """spill.write_piece of rows grouped by ``keys`` ((column, strings or None) pairs, sorted by
    value); ``names``: the values' (spill.Piece); ``ratios``: spill.write_groups'."""
    if not len(values[0]):
        return None
    if not keys:
        return spill.write_groups(scratch, tag, [()], np.zeros(len(values[0]), dtype=np.int64), values, names, ratios)
    first, codes = K.group_rows(*(k for k, _ in keys))
    cols = [(names_[k[first]] if names_ is not None else k[first]).tolist() for k, names_ in keys]
    return spill.write_groups(scratch, tag, list(zip(*cols)), codes, values, names, ratios)


def bandwidth_ratios(service: str, nbytes: np.ndarray, factor: np.ndarray) -> dict:
    """comm_times' algbw and busbw as spill.Ratio of the ``service`` column (analysis.spill_file)."""
    return {"algbw_gbps": spill.Ratio(service, nbytes, 1.0),
            "busbw_gbps": spill.Ratio(service, nbytes, factor)}


# The Buckets page's distributions (tables.BUCKET_DISTRIBUTIONS) are read from the bucket rows' spill
# (aggregate), which is grouped by (headline, layout, bucket). Their own spill cost a 10^8-event DDP
# summary ~8 s more (63-64 s against 55-56 s, alternated): this one holds every bucket row, the
# step-0 rows too, in place of the headline rows alone.


def headline_bucket(key: tuple) -> tuple | None:
    """(layout, bucket) of a headline row of the bucket spill: the summary's bucket medians."""
    return key[1:] if key[0] else None


def bucket_of(key: tuple) -> tuple:
    """(bucket,) of any row of the bucket spill: the Buckets page's distributions."""
    return (key[2],)


# The comm rows' values the summary takes medians of, spilled once a partition (aggregate), grouped
# by (which medians the row is in, phase, op, step). Each median selects its groups (spill's
# ``select``): the headline wire rows (one median of all three), busbw per step over every wire row,
# queue and busbw per (phase, op) over the headline collective rows. Three spills of mostly the same
# rows before: 22 MB a partition where this writes 11 MB (1,024-rank ZeRO-3 run, 10^8 events), and
# ~40 ms less CPU a partition of ~290 (pass 2 timed with each spill left out, 6 partitions, 3 rounds).
COMM_VALUES = ("busbw_gbps", "service_ns", "queue_ns")
WIRE, COLLECTIVE_HEADLINE, WIRE_HEADLINE = 1, 2, 4


def headline_wire(key: tuple) -> tuple | None:
    return () if key[0] & WIRE_HEADLINE else None


def wire_by_step(key: tuple) -> tuple | None:
    return (key[3],) if key[0] & WIRE else None


def collective_by_phase_op(key: tuple) -> tuple | None:
    return (key[1], key[2]) if key[0] & COLLECTIVE_HEADLINE else None


def by_identity(c: dict, rows: np.ndarray, idents: dict, keys: tuple) -> tuple[np.ndarray, np.ndarray]:
    """K.group_rows of the rows by identity columns ``keys`` (a part of partition_local.IDENTITY):
    each group's first identity (in ``idents``) and each row's group. The identities the rows have
    are grouped, not the rows: ~94,500 identities against ~660,000 rows in a partition of the
    10^8-event DDP run. The same groups in the same (sorted) order, as both hold the same keys."""
    ids = c["ident"][rows]
    n = len(idents["step"])
    seen = np.zeros(n, dtype=bool)
    seen[ids] = True
    have = np.flatnonzero(seen)
    first, codes = K.group_rows(*(idents[k][have] for k in keys))
    group_of = np.zeros(n, dtype=np.int64)
    group_of[have] = codes
    return have[first], group_of[ids]


def skew_table(c: dict, rows: np.ndarray, idents: dict) -> pd.DataFrame:
    """Earliest and latest launch of each (step, micro, kind, bucket, name) among the rows, grouped
    by_identity: 15.5 -> 10.7 ms a partition of the 10^8-event DDP run (median of 30 calls each,
    alternated in one process with the rows grouped, the same frame; session 47)."""
    at, codes = by_identity(c, rows, idents, ("step", "micro", "kind", "bucket", "name"))
    n = len(at)
    lo, hi = np.full(n, np.iinfo(np.int64).max), np.full(n, np.iinfo(np.int64).min)
    launch = c["launch"][rows]
    np.minimum.at(lo, codes, launch)
    np.maximum.at(hi, codes, launch)
    idx = K.coded_index([idents["step"][at], idents["micro"][at], (idents["kind"][at], E.KIND_NAMES), idents["bucket"][at],
                         (idents["name"][at], c["names"])], SKEW_KEY)
    return pd.DataFrame({"lo": lo, "hi": hi}, index=idx)


def exposed_by_identity(c: dict, rows: np.ndarray, idents: dict) -> pd.DataFrame:
    """headline.exposed_by_identity of the rows: sums per (bucket, name, kind), in order of first
    appearance. The identities are grouped, not the rows (as by_identity): 15.5 -> 12.0 ms a
    partition of the 10^8-event DDP run (measured as skew_table's; session 47)."""
    ids = c["ident"][rows]
    n_id = len(idents["kind"])
    seen = np.full(n_id, len(rows), dtype=np.int64)        # each identity's first place among the rows
    np.minimum.at(seen, ids, np.arange(len(rows)))
    have = np.flatnonzero(seen < len(rows))
    ik = idents["kind"][have]
    codes, n = K.dense_codes(K.group_codes(np.where(ik == E.BUCKET, idents["bucket"][have], -1), idents["name"][have], ik))
    first = np.full(n, len(rows), dtype=np.int64)
    np.minimum.at(first, codes, seen[have])
    order = np.argsort(first, kind="stable")          # groups in order of first appearance
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n)
    group_of = np.zeros(n_id, dtype=np.int64)
    group_of[have] = place[codes]
    g, at = group_of[ids], rows[first[order]]
    b = np.where(c["kind"][at] == E.BUCKET, c["bucket"][at], -1)
    nbytes = np.full(n, np.iinfo(np.int64).min)
    np.maximum.at(nbytes, g, c["bytes"][rows])
    names = c["names"][c["name"][at]]
    kinds = E.KIND_NAMES[c["kind"][at]]
    key = [f"{x}|{y}|{z}" for x, y, z in zip(b.tolist(), names.tolist(), kinds.tolist())]
    return pd.DataFrame({"kind": kinds, "bucket": c["bucket"][at], "name": names, "op": c["ops"][c["op"][at]],
                         "bytes": nbytes,
                         "exposed_ns": int_sums(g, c["exposed"][rows], n),
                         "after_backward_ns": int_sums(g, c["after_backward"][rows], n),
                         "count": np.bincount(g, minlength=n).astype(np.int64)}, index=pd.Index(key, name="_k"))


def stragglers(out: dict, c: dict, t: dict, rows: np.ndarray, events: pd.DataFrame, scratch: str, tag: str) -> None:
    """queueing.straggler_table's inputs from these ranks (``rows``: the headline wire rows in launch
    order, rank by rank): per collective, how many of them launched at its last launch and the waiting
    for peers on it; per rank, its mean lateness; and the (rank, collective, launched last) rows, in a
    scratch file (partials.combine_stragglers adds them up once every collective's counts are known)."""
    ev_id = t["gid"][rows]
    first, last, nranks = (events[k].to_numpy() for k in ("first", "last", "ranks"))
    launch = c["launch"][rows]
    at_max = launch == last[ev_id]
    n_ev = len(events)
    out["n_at_max"] = np.bincount(ev_id, weights=at_max, minlength=n_ev)
    out["wait"] = np.bincount(ev_id, weights=np.nan_to_num(t["wait_peers_ns"][rows], nan=0.0), minlength=n_ev)
    shared = nranks >= 2            # per collective: made by two ranks or more
    keep = shared[ev_id]
    if not keep.any():
        return
    if keep.all():                  # a data-parallel run's: the rows as they are, not copied again
        keep = slice(None)
    rank = c["rank"][rows][keep]
    late = (launch - first[ev_id])[keep]
    inv, n_ranks = K.dense_codes(rank)
    ranks = K.unique_ints(rank)
    out["late"] = pd.Series(int_sums(inv, late, n_ranks) / np.bincount(inv), index=pd.Index(ranks, name="rank"),
                            name="mean_late_ns")
    made = np.zeros(n_ev, dtype=bool)   # the steps of the kept rows, as their collectives' (a step is in the key)
    made[ev_id] = True
    out["strag_steps"] = set(K.unique_ints(events.index.get_level_values("step").to_numpy()[made & shared]).tolist())
    path = str(Path(scratch) / f"st-{tag}.arrays")
    write_straggler_rows(path, rank, ev_id[keep], at_max[keep])
    out["strag"] = path


def write_straggler_rows(path: str, rank: np.ndarray, ev: np.ndarray, at_max: np.ndarray) -> None:
    """The (rank, collective, launched last) rows of a partition, as partials._straggler_rows reads
    them: each rank's collectives as one list, a list kept once however many ranks have it (the ranks
    of a partition mostly share one: every rank of a DDP run joins every bucket's all-reduce), and the
    rows launched last apart. Six .npy arrays in a row (not .npz: no zip to pay for). Every row as
    it was (rank, collective, flag) came to 8.6 MB a partition of the 10^8-event DDP run, 1.26 GB of
    scratch in all, each byte written to fresh memory and read back (session 34); now ~0.4 MB."""
    if (rank[1:] < rank[:-1]).any():          # a rank's rows together, in their order (stable)
        order = np.argsort(rank, kind="stable")
        rank, ev, at_max = rank[order], ev[order], at_max[order]
    starts = np.r_[0, np.flatnonzero(rank[1:] != rank[:-1]) + 1]
    ends = np.r_[starts[1:], len(rank)]
    ev = ev.astype(np.int32 if int(ev.max()) <= np.iinfo(np.int32).max else np.int64)
    seen: dict[bytes, int] = {}
    list_of, lists = [], []
    for a, b in zip(starts.tolist(), ends.tolist()):
        key = ev[a:b].tobytes()
        if key not in seen:
            seen[key] = len(lists)
            lists.append(ev[a:b])
        list_of.append(seen[key])
    last = np.flatnonzero(at_max)
    with open(path, "wb") as f:
        for v in (rank[starts], np.array(list_of, dtype=np.int64), np.array([len(x) for x in lists], dtype=np.int64),
                  np.concatenate(lists), rank[last], ev[last]):
            np.lib.format.write_array(f, np.ascontiguousarray(v), allow_pickle=False)


def lateness(c: dict, t: dict, events: pd.DataFrame, first: pd.Series | None, order: np.ndarray,
             idents: dict) -> pd.DataFrame | None:
    """tables.sync_lateness' rows of these ranks (rank, step, micro, bucket, late_ns, label; no
    launch_ns), plus ``buckets``: whether the row is a bucket's. ``late_ns`` = launch − the earliest
    launch of the same bucket (``first``: pass 1's bucket_first over all ranks), or of the same
    collective in a step without buckets (``events``: partials.combine_events with
    partial_views.with_collective_order's columns), among all ranks. A collective's ``bucket`` is its
    place in its step's order of first launch over all ranks, as sync_lateness numbers it. Rows in
    sync_lateness' order when the partition is the whole run: bucket rows in row order, else by
    (step, rank), each rank's collectives in launch order (``order``: the comm rows in launch order,
    rank by rank). ``label`` categorical (a Python string per row cost ~40 ms a partition). A bucket
    row's earliest launch is looked up once per identity (``idents``: a bucket row's (step, micro,
    bucket) is its identity's) and handed to the rows by their identity, where the ~660,000 bucket
    rows of a 10^8-event DDP partition were grouped by those three columns to look each group up:
    29.5 -> 18.9 ms a partition (measured as skew_table's; session 47)."""
    label = events["label"].array          # with_collective_order's categorical: "" is a category
    labels, label_of = label.categories.to_numpy(dtype=object), label.codes
    empty = label.categories.get_loc("")
    rows, bucket, late, code = [], [], [], []
    if first is not None:
        b = np.flatnonzero(c["kind"] == E.BUCKET)
        ib = np.flatnonzero(idents["kind"] == E.BUCKET)           # the bucket identities
        idx = first.index.get_indexer(pd.MultiIndex.from_arrays([idents[k][ib] for k in ("step", "micro", "bucket")]))
        earliest = np.zeros(len(idents["kind"]), dtype=first.dtype)
        earliest[ib] = first.to_numpy()[idx]
        rows.append(b), bucket.append(c["bucket"][b].astype(np.int64)), late.append(c["launch"][b] - earliest[c["ident"][b]])
        code.append(np.full(len(b), empty))
    n_buckets = sum(len(r) for r in rows)
    w = order[is_wire(c["kind"][order], c["bucket"][order]) & (c["kind"][order] != E.BUCKET)]
    if first is not None and len(w):
        w = w[~np.isin(c["step"][w], first.index.get_level_values("step").unique().to_numpy())]
    if len(w):
        ev_id = t["gid"][w]
        rows.append(w), bucket.append(events["order"].to_numpy()[ev_id])
        late.append(c["launch"][w] - events["first"].to_numpy()[ev_id]), code.append(label_of[ev_id])
    if not rows:
        return None
    rows, bucket, late, code = (np.concatenate(x) if len(x) > 1 else x[0] for x in (rows, bucket, late, code))
    buckets = np.arange(len(rows)) < n_buckets
    if not buckets.all():            # as sync_lateness: by (step, rank)
        keep = K.lexsort((c["rank"][rows], c["step"][rows]))
        rows, bucket, late, code, buckets = rows[keep], bucket[keep], late[keep], code[keep], buckets[keep]
    return pd.DataFrame({"rank": c["rank"][rows], "step": c["step"][rows], "micro": c["micro"][rows], "bucket": bucket,
                         "late_ns": late, "label": pd.Categorical.from_codes(code, labels),
                         "buckets": buckets})


def bucket_frame(c: dict, t: dict) -> pd.DataFrame:
    """comm_metrics' bucket rows (every column, in its order): what ``summary --json`` and the
    TensorBoard export take."""
    rows = c["bucket_rows"]
    bt = bucket_times(c)
    d = lambda v, names: names[v] if len(names) else np.full(len(v), "", dtype=object)  # noqa: E731
    f = {"rank": c["rank"][rows], "step": c["step"][rows], "micro": c["micro"][rows], "kind": E.KIND_NAMES[c["kind"][rows]],
         "bucket": c["bucket"][rows], "name": d(c["name"][rows], c["names"]), "op": d(c["op"][rows], c["ops"]),
         "bytes": c["bytes"][rows], "logical_bytes": c["logical_bytes"], "dtype": d(c["dtype"], c["dtypes"]),
         "group_size": c["group_size"][rows], "layout": c["layout"], "phase": d(c["phase"][rows], c["phases"]),
         "ready_ns": c["ready"], "hook_ns": c["hook"], "launch_ns": c["launch"][rows], "start_ns": c["launch"][rows],
         "end_ns": c["end"][rows]}
    f.update({k: t[k][rows] for k in Q.TIME_COLUMNS})
    f.update(exposed_ns=c["exposed"][rows], after_backward_ns=c["after_backward"][rows],
             hook_to_launch_ns=bt["hook_to_launch_ns"], span_ns=t["span_ns"][rows], duration_ns=t["duration_ns"][rows],
             launch_delay_ns=bt["launch_delay_ns"], algbw_gbps=t["algbw_gbps"][rows], busbw_gbps=t["busbw_gbps"][rows])
    return pd.DataFrame(f)


def bucket_sums(c: dict, rows: np.ndarray, at: np.ndarray) -> pd.DataFrame:
    """Per (layout, bucket) of the bucket rows ``rows`` (``at``: their places in ``bucket_rows``):
    largest bytes and the first row's dtype."""
    first, codes = K.group_rows(c["layout"][at], c["bucket"][rows])
    nbytes = np.full(len(first), np.iinfo(np.int64).min)
    np.maximum.at(nbytes, codes, c["bytes"][rows])
    idx = pd.MultiIndex.from_arrays([c["layout"][at[first]], c["bucket"][rows[first]]], names=["layout", "bucket"])
    return pd.DataFrame({"bytes": nbytes, "dtype": c["dtypes"][c["dtype"][at[first]]]}, index=idx)


def collective_sums(c: dict, t: dict, rows: np.ndarray) -> pd.DataFrame:
    """Per (phase, op) of the rows: calls, bytes, service and exposed time (sums)."""
    first, codes = K.group_rows(c["phase"][rows], c["op"][rows])
    n, at = len(first), rows[first]
    idx = pd.MultiIndex.from_arrays([c["phases"][c["phase"][at]], c["ops"][c["op"][at]]], names=["phase", "op"])
    return pd.DataFrame({"calls": np.bincount(codes, minlength=n).astype(np.int64),
                         "bytes": int_sums(codes, c["bytes"][rows], n),
                         "duration_ns": np.bincount(codes, weights=np.nan_to_num(t["duration_ns"][rows], nan=0.0), minlength=n),
                         "exposed_ns": int_sums(codes, c["exposed"][rows], n)},
                        index=idx)


def aggregate(out: dict, c: dict, t: dict, order: np.ndarray, headline: np.ndarray, events: pd.DataFrame,
              scratch: str, tag: str, idents: dict) -> None:
    """What the summary aggregates of the partition's comm rows (``headline``: rows of headline steps;
    ``order``: the rows in launch order, rank by rank; ``idents``: their identities), into pass 2's
    dict ``out``."""
    kind = c["kind"]
    wire = is_wire(kind, c["bucket"])
    hw = np.flatnonzero(wire & headline)
    out["n_hw"] = len(hw)
    coll = (kind == E.COLLECTIVE) & headline
    flags = wire * np.int8(WIRE) + coll * np.int8(COLLECTIVE_HEADLINE) + (wire & headline) * np.int8(WIRE_HEADLINE)
    r = every_row(np.flatnonzero(flags), len(flags))
    out["comm"] = spill_by(scratch, f"w-{tag}", [(flags[r], None), (c["phase"][r], c["phases"]), (c["op"][r], c["ops"]),
                                                  (c["step"][r], None)], [t[k][r] for k in COMM_VALUES], COMM_VALUES)
    if len(hw):
        out["skew"] = skew_table(c, hw, idents)
        out["exposed"] = exposed_by_identity(c, hw, idents)
        out["exposed_total"] = int(c["exposed"][hw].sum())
        out["rank_steps"] = K.distinct_pairs(c["rank"][hw], c["step"][hw])
        hw_in_order = order[(wire & headline)[order]]
        stragglers(out, c, t, hw_in_order, events, scratch, tag)
    b = c["bucket_rows"]
    out["bucket_n"] = len(b)
    if len(b):     # one spill of every bucket row serves the headline medians and the Buckets page's distributions
        bt = bucket_times(c)
        rows = every_row(b, len(kind))
        head = headline[rows]
        cols = [bt[k] if k in bt else (c["exposed"] if k == "exposed_ns" else t[k])[rows] for k in BUCKET_MEDIANS]
        out["buckets"] = spill_by(scratch, f"b-{tag}", [(head.astype(np.int8), None), (c["layout"], None),
                                                        (c["bucket"][rows], None)], cols, BUCKET_MEDIANS,
                                  bandwidth_ratios("duration_ns", c["bytes"][rows], t["bw_factor"][rows]))
        at = np.flatnonzero(head)       # headline bucket rows, as places in bucket_rows
        if len(at):
            out["bucket_first"] = bucket_sums(c, b[at], at)
    m = np.flatnonzero(coll)
    if len(m):
        out["coll_sums"] = collective_sums(c, t, m)
        out["coll_steps"] = K.distinct_pairs(c["rank"][m], c["step"][m])


def distributed_parts(c: dict, t: dict, extra: dict, hsteps: list[int], headline: np.ndarray) -> tuple[pd.Series, dict]:
    """The Distributed view's inputs from the partition, over the headline steps: distributed.waiting_exposed
    of its (rank, step) pairs (the exposed intervals pass 1 kept, partition_facts.pass2_extras, and the
    wire rows' waits, which need the service times of this pass) and distributed.kinds_part of its wire
    rows (``headline``: which comm rows are of headline steps). partitioned.py combines them
    (distributed.breakdown_of, kinds_of)."""
    w = np.flatnonzero(is_wire(c["kind"], c["bucket"]) & headline)
    x = np.isin(extra["ex_step"], hsteps)
    exposed = tuple(extra[k][x] for k in ("ex_rank", "ex_step", "ex_start", "ex_end"))
    rank, step = c["rank"][w], c["step"][w]
    waiting = D.waiting_exposed_arrays(exposed, rank, step, c["launch"][w], c["end"][w], t["service_ns"][w])
    kinds = D.kinds_part(c["op"][w], np.asarray(c["ops"], dtype=object), c["group_size"][w], rank, step,
                         c["bytes"][w], t["duration_ns"][w])
    return waiting, kinds
