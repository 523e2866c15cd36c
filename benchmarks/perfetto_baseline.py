"""Baseline for benchmarks/export.py: the Perfetto exporter as it was before issue 12 (a Python dict
per trace event, json.dumps of the whole list), kept verbatim so the speed-up is measured side by
side in one run. Not used by syncviz itself."""
from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict, namedtuple
from pathlib import Path

import numpy as np
import pandas as pd

from syncviz import analysis as A
from syncviz.trace import schema as S
from syncviz.trace import Run

FLOW_CAT = "syncviz.ready_to_launch"


def _us(ns) -> float:
    return float(ns) / 1000.0


def assign_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane per interval such that intervals sharing a lane are nested or disjoint."""
    order = np.lexsort((-ends, starts))          # by start, the longer one first on ties
    lanes = np.zeros(len(starts), dtype=np.int64)
    stacks: list[list[int]] = []                 # per lane: ends of the still-open slices
    for i in order:
        s, e = starts[i], ends[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lanes[i] = lane
                break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes


class _Tracks:
    """Thread ids of named tracks inside one process, with Chrome metadata to name and order them."""

    def __init__(self, pid: int):
        self.pid = pid
        self.tids: dict[str, int] = {}
        self.order: dict[str, tuple] = {}

    def tid(self, name: str, sort_key: tuple) -> int:
        if name not in self.tids:
            self.tids[name] = len(self.tids) + 1
            self.order[name] = sort_key
        return self.tids[name]

    def metadata(self) -> list[dict]:
        out = []
        for rank_in_order, name in enumerate(sorted(self.tids, key=lambda n: self.order[n])):
            tid = self.tids[name]
            out.append({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid,
                        "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": self.pid, "tid": tid,
                        "args": {"sort_index": rank_in_order}})
        return out


def _rows(frame: pd.DataFrame) -> list:
    """Rows as namedtuples of plain Python values: DataFrame.itertuples iterates Arrow-backed
    string columns element by element, which was most of the export time (100k events: 16 s
    before, 10 s after on a loaded 2-core machine; the rest is building and encoding the JSON)."""
    Row = namedtuple("Row", list(frame.columns))
    return [Row._make(v) for v in zip(*(frame[c].tolist() for c in frame.columns))]


def _slices(frame: pd.DataFrame, tracks: _Tracks, track_of, names, args_of) -> tuple[list[dict], list]:
    """X events for the rows of one rank's frame, and the tid each row landed on (by position).
    ``track_of(row) -> (name, sort_key)`` picks the track; rows on one track are laned so they nest."""
    rows = _rows(frame)
    out, tid_of = [], [0] * len(rows)
    if not rows:
        return out, tid_of
    keys = [track_of(r) for r in rows]
    sort_keys = dict(keys)
    by_track: dict[str, list[int]] = defaultdict(list)
    for i, (track, _) in enumerate(keys):
        by_track[track].append(i)
    starts, ends = frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy()
    for track, idx in by_track.items():
        idx = np.asarray(idx)
        for i, lane in zip(idx.tolist(), assign_lanes(starts[idx], ends[idx]).tolist()):
            row = rows[i]
            name = track if lane == 0 else f"{track} · {lane + 1}"
            tid = tid_of[i] = tracks.tid(name, sort_keys[track] + (lane,))
            out.append({"ph": "X", "name": names(row), "cat": str(row.kind), "pid": tracks.pid,
                        "tid": tid, "ts": _us(row.start_ns), "dur": _us(row.end_ns - row.start_ns),
                        "args": args_of(row)})
    return out, tid_of


def _bucket_name(row) -> str:
    return f"bucket {row.bucket} {row.op} {row.bytes / 1e6:.1f} MB"


def _comm_track(row) -> tuple[str, tuple]:
    if row.bucket >= 0:
        return f"bucket {row.bucket}", (3, int(row.bucket))
    return f"{row.op or row.name} (collectives)", (4, str(row.op or row.name))


def _comm_args(row) -> dict:
    args = {"step": int(row.step), "micro": int(row.micro), "bucket": int(row.bucket), "op": row.op,
            "bytes": int(row.bytes), "dtype": row.dtype, "group_size": int(row.group_size),
            "phase": row.phase, "duration_ms": row.duration_ns / 1e6,
            "exposed_ms": row.exposed_ns / 1e6, "busbw_GBps": _num(row.busbw_gbps),
            "algbw_GBps": _num(row.algbw_gbps)}
    if row.launch_ns >= 0:
        args["launch_ns"] = int(row.launch_ns)
    if row.ready_ns >= 0:
        args["ready_ns"] = int(row.ready_ns)
        args["launch_delay_ms"] = _num(row.launch_delay_ns / 1e6)
    if row.logical_bytes and row.logical_bytes != row.bytes:
        args["logical_bytes"] = int(row.logical_bytes)
    return args


def _num(x) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None     # JSON has no NaN/inf


def chrome_trace(run: Run) -> dict:
    """The whole run as a Chrome trace JSON object (a dict ready for json.dump)."""
    ev = run.events
    valid = (ev["start_ns"] >= 0) & (ev["end_ns"] >= ev["start_ns"])
    comm = A.comm_metrics(run, kinds=S.COMM_KINDS)
    inflight = A.bytes_in_flight(run)
    ev_by_rank = dict(tuple(ev[valid].groupby("rank", sort=False)))
    comm_by_rank = dict(tuple(comm.groupby("rank", sort=False)))
    inflight_by_rank = dict(tuple(inflight.groupby("rank", sort=False)))
    hosts = {int(r.get("rank", -1)): r for r in run.meta.get("ranks") or [] if isinstance(r, dict)}
    out: list[dict] = []
    flow_id = 0
    for rank in run.ranks:
        pid = rank + 1              # pid 0 is special to some trace tools; labels carry the rank
        tracks = _Tracks(pid)
        r_ev = ev_by_rank.get(rank, ev.iloc[:0])
        info = hosts.get(rank, {})
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                    "args": {"sort_index": rank}})
        if info:
            out.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                        "args": {"labels": f"{info.get('host', '?')} pid {info.get('pid', '?')}"}})

        steps = r_ev[r_ev["kind"] == S.STEP]
        out += _slices(steps, tracks, lambda r: ("steps", (0,)), lambda r: f"step {r.step}",
                       lambda r: {"step": int(r.step)})[0]
        compute = r_ev[r_ev["kind"].isin(S.COMPUTE_KINDS)]
        out += _slices(compute, tracks, lambda r: ("compute", (1,)),
                       lambda r: f"{r.kind}" if r.micro == 0 else f"{r.kind} (micro {r.micro})",
                       lambda r: {"step": int(r.step), "micro": int(r.micro)})[0]

        ready_tid = None
        for r in _rows(r_ev[r_ev["kind"] == S.GRAD_READY]):
            ready_tid = ready_tid or tracks.tid("grad ready", (2,))
            out.append({"ph": "i", "s": "t", "name": f"{r.name} ready", "cat": S.GRAD_READY,
                        "pid": pid, "tid": ready_tid, "ts": _us(r.start_ns),
                        "args": {"step": int(r.step), "micro": int(r.micro), "bucket": int(r.bucket)}})

        r_comm = comm_by_rank.get(rank, comm.iloc[:0])
        comm_slices, comm_tid = _slices(
            r_comm, tracks, _comm_track,
            lambda r: _bucket_name(r) if r.kind == S.BUCKET else f"{r.op or r.name} {r.bytes / 1e6:.1f} MB",
            _comm_args)
        out += comm_slices

        # "bucket k ready" → its collective: a zero-length slice at the ready time for the arrow
        # to leave from, and the arrow's end bound to the collective's slice (bp "e": enclosing).
        for pos, r in enumerate(_rows(r_comm)):
            if r.kind != S.BUCKET or r.ready_ns < 0:
                continue
            ready_tid = ready_tid or tracks.tid("grad ready", (2,))
            flow_id += 1
            ts = _us(r.ready_ns)
            common = {"name": "ready → launch", "cat": FLOW_CAT, "pid": pid, "id": flow_id}
            out.append({"ph": "X", "name": f"bucket {r.bucket} ready", "cat": "bucket_ready",
                        "pid": pid, "tid": ready_tid, "ts": ts, "dur": 0.0,
                        "args": {"step": int(r.step), "micro": int(r.micro), "bucket": int(r.bucket)}})
            out.append({**common, "ph": "s", "tid": ready_tid, "ts": ts})
            out.append({**common, "ph": "f", "bp": "e", "tid": comm_tid[pos],
                        "ts": _us(r.start_ns)})

        f = inflight_by_rank.get(rank, inflight.iloc[:0])
        for t, b in zip(f["t_ns"].tolist(), f["bytes"].tolist()):
            out.append({"ph": "C", "name": "bytes in flight", "pid": pid, "tid": 0, "ts": _us(t),
                        "args": {"bytes": int(b)}})
        out += tracks.metadata()
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": run_metadata(run)}


def run_metadata(run: Run) -> dict:
    """Flat run facts for the trace's metadata panel (Perfetto "Info and stats", catapult "M")."""
    m = run.meta
    ddp = m.get("ddp") or {}
    facts = {"syncviz_run": run.name, "run_id": m.get("run_id"), "created": m.get("created"),
             "strategy": m.get("strategy"), "engine": m.get("engine"),
             "world_size": run.world_size, "backend": m.get("backend"), "device": m.get("device"),
             "torch_version": m.get("torch_version"), "syncviz_version": m.get("syncviz_version"),
             "bucket_cap_mb": ddp.get("bucket_cap_mb"), "comm_hook": ddp.get("comm_hook"),
             "command": " ".join(map(str, m.get("command") or [])) or None,
             "clock": "ns since run start (rank 0's clock), shown in µs",
             "problems": "; ".join(run.problems) or None}
    return {k: v for k, v in facts.items() if v is not None}


def write_perfetto(run: Run, path: str | Path) -> Path:
    """Write the Chrome trace to ``path``; gzip-compressed when it ends with .gz."""
    path = Path(path)
    data = json.dumps(chrome_trace(run), separators=(",", ":"), allow_nan=False).encode()
    if path.suffix == ".gz":
        with gzip.open(path, "wb", compresslevel=6) as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path
