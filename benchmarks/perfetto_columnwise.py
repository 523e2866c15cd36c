"""The Perfetto exporter as it was at main 8dfa507 (column-wise with Arrow string kernels, 0.56-0.62 M
events per CPU-second on the 128-rank sample), kept as the baseline benchmarks/export.py times the
current exporter against. Same output bytes as the current one (tests/test_export_steps.py checks it).

A syncviz run as Chrome trace JSON (opens in https://ui.perfetto.dev and chrome://tracing).

Layout: one process per rank; inside it, tracks (threads) for steps, compute (forward, backward,
optimizer), gradient-ready moments, one track per gradient bucket and one per kind of collective
issued outside a bucket. Flow arrows join "bucket k ready" to the bucket's collective; a counter
shows bytes in flight. Times are the trace's own nanoseconds: ts and dur are written as exact
decimal microseconds ("123.045"), and displayTimeUnit is "ns".

Chrome's format requires the complete ("X") slices of one track to nest: two slices either are
disjoint or one contains the other. Tracks are split into lanes ("compute", "compute · 2", ...)
whenever real data would break that (overlapping collectives of the same kind, for instance).

Speed: every event is written column-wise with Arrow string kernels (no Python dict or json.dumps
per event), so the 128-rank sample (184k trace events) is written in a fraction of a second where
the per-event version took 11.8 s; benchmarks/export.py measures both side by side.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from syncviz import analysis as A
from syncviz.analysis.lanes import lanes
from syncviz.trace import Run
from syncviz.trace import schema as S

FLOW_CAT = "syncviz.ready_to_launch"
# tid = code * _CODE + key * _KEY + lane + 1: the track kind (0 steps, 1 compute, 2 grad ready,
# 3 bucket k, 4 collectives of one op) and its key; ordering by tid orders the tracks.
_CODE, _KEY = 10 ** 8, 10 ** 4
STEPS, COMPUTE, READY, BUCKETS, OPS, EXPOSED = range(6)


def assign_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane per interval such that intervals sharing a lane are nested or disjoint."""
    return lanes(starts, ends, nested=True)


# ----------------------------------------------------------------- column-wise JSON pieces

def _cat(*parts) -> pa.Array:
    """Element-wise concatenation of string arrays and literal strings."""
    return pc.binary_join_element_wise(*parts, "")


def _s(values) -> pa.Array:
    return pc.cast(pa.array(np.asarray(values)), pa.string())


def _us(ns) -> pa.Array:
    """Nanoseconds as exact decimal microseconds: 1234567 -> "1234.567"."""
    whole, frac = np.divmod(np.asarray(ns, dtype=np.int64), 1000)
    return _cat(_s(whole), ".", pc.utf8_lpad(_s(frac), 3, "0"))


def _num(x) -> pa.Array:
    """Floats as JSON numbers, null where not finite (JSON has no NaN)."""
    x = np.asarray(x, dtype=float)
    ok = np.isfinite(x)
    return pc.if_else(pa.array(ok), pc.cast(pa.array(np.where(ok, x, 0.0)), pa.string()), "null")


def _text(values, quoted: bool = True) -> pa.Array:
    """JSON string literals (escaped once per distinct value; quotes left off with quoted=False)."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object).astype(str))
    lit = [json.dumps(u) if quoted else json.dumps(u)[1:-1] for u in uniques]
    return pa.array(lit, pa.string()).take(pa.array(codes))


def _when(cond, piece) -> pa.Array:
    return pc.if_else(pa.array(np.asarray(cond, dtype=bool)), piece, "")


def _mb(nbytes) -> pa.Array:
    """Bytes as MB (1e6 bytes) with one decimal."""
    tenths = np.rint(np.asarray(nbytes, dtype=float) / 1e5).astype(np.int64)
    return _cat(_s(tenths // 10), ".", _s(tenths % 10))


def _x(pid, tid, name, cat, start, end, args) -> pa.Array:
    start = np.asarray(start, dtype=np.int64)
    return _cat('{"ph":"X","name":', name, ',"cat":', cat, ',"pid":', _s(pid), ',"tid":', _s(tid),
                ',"ts":', _us(start), ',"dur":', _us(np.asarray(end, dtype=np.int64) - start),
                ',"args":{', args, "}},\n")


class _Tracks:
    """Lanes, tids and names of the tracks slices land on."""

    def __init__(self):
        self.seen: list[pd.DataFrame] = []

    def place(self, pid, code: int, key, start, end, names) -> np.ndarray:
        """tid per row: rows of one (pid, code, key) are laned so that their slices nest."""
        pid, key = np.asarray(pid, dtype=np.int64), np.asarray(key, dtype=np.int64)
        base = code * _CODE + key * _KEY + 1
        lane = lanes(start, end, groups=pid * (8 * _CODE) + base, nested=True)
        tid = base + lane
        _, first = np.unique(pid * (8 * _CODE) + tid, return_index=True)
        names = np.broadcast_to(np.asarray(names, dtype=object), pid.shape)
        self.seen.append(pd.DataFrame({"pid": pid[first], "tid": tid[first], "name": names[first],
                                       "lane": lane[first]}))
        return tid

    def metadata(self) -> pa.Array:
        """thread_name and thread_sort_index events of every track seen."""
        if not self.seen:
            return pa.array([], pa.string())
        t = pd.concat(self.seen).drop_duplicates(["pid", "tid"])
        lane = t["lane"].to_numpy()
        label = _text(np.where(lane == 0, t["name"].astype(str),
                               t["name"].astype(str) + " · " + (lane + 1).astype(str).astype(object)))
        pid, tid = _s(t["pid"].to_numpy()), _s(t["tid"].to_numpy())
        return _cat('{"ph":"M","name":"thread_name","pid":', pid, ',"tid":', tid, ',"args":{"name":', label,
                    '}},\n{"ph":"M","name":"thread_sort_index","pid":', pid, ',"tid":', tid,
                    ',"args":{"sort_index":', tid, "}},\n")


# ------------------------------------------------------------------------------ the trace

def _compute_parts(ev: pd.DataFrame, kind: np.ndarray, tracks: _Tracks) -> list[pa.Array]:
    out = []
    st = ev[kind == S.STEP]
    pid = st["rank"].to_numpy() + 1
    step = _s(st["step"].to_numpy())
    tid = tracks.place(pid, STEPS, 0, st["start_ns"], st["end_ns"], "steps")
    out.append(_x(pid, tid, _cat('"step ', step, '"'), '"step"', st["start_ns"], st["end_ns"],
                  _cat('"step":', step)))

    cp = ev[np.isin(kind, S.COMPUTE_KINDS)]
    pid, k = cp["rank"].to_numpy() + 1, _s(cp["kind"].astype(str).to_numpy())
    micro = cp["micro"].to_numpy()
    tid = tracks.place(pid, COMPUTE, 0, cp["start_ns"], cp["end_ns"], "compute")
    name = _cat('"', k, _when(micro != 0, _cat(" (micro ", _s(micro), ")")), '"')
    out.append(_x(pid, tid, name, _cat('"', k, '"'), cp["start_ns"], cp["end_ns"],
                  _cat('"step":', _s(cp["step"].to_numpy()), ',"micro":', _s(micro))))

    gr = ev[kind == S.GRAD_READY]
    if len(gr):
        pid = gr["rank"].to_numpy() + 1
        tid = tracks.place(pid, READY, 0, gr["start_ns"], gr["start_ns"], "grad ready")
        out.append(_cat('{"ph":"i","s":"t","name":', _text(gr["name"].astype(str) + " ready"),
                        f',"cat":"{S.GRAD_READY}","pid":', _s(pid), ',"tid":', _s(tid),
                        ',"ts":', _us(gr["start_ns"]), ',"args":{"step":', _s(gr["step"]),
                        ',"micro":', _s(gr["micro"]), ',"bucket":', _s(gr["bucket"]), "}},\n"))
    return out


def _factor(*cols) -> tuple[pa.Array, np.ndarray]:
    """Codes of the distinct combinations of cols (as an Arrow index array for take) and the row
    where each combination first occurs: per-collective facts (op, bytes, dtype, ...) repeat for
    every step and rank, so their JSON is built once per combination and copied with take."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    for col in cols:
        c, u = pd.factorize(np.asarray(col))
        code = code * (len(u) + 1) + c
    codes, uniq = pd.factorize(code)
    first = np.full(len(uniq), -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes))[::-1]
    return pa.array(codes), first


def _pid_tid(pid, tid) -> pa.Array:
    codes, first = _factor(pid, tid)
    return pa.array([f'"pid":{pid[i]},"tid":{tid[i]}' for i in first.tolist()], pa.string()).take(codes)


def _comm_static(kind, bucket, label, op, nbytes, logical, dtype, group_size, phase) -> str:
    """Name, category and the args that do not change from one step to the next."""
    name = f"bucket {bucket} {label}" if bucket >= 0 else label
    args = {"bucket": bucket, "op": op, "bytes": nbytes,
            "dtype": dtype, "group_size": group_size, "phase": phase}
    if logical and logical != nbytes:
        args["logical_bytes"] = logical
    return (f'"name":{json.dumps(f"{name} {nbytes / 1e6:.1f} MB")},"cat":{json.dumps(kind)},'
            f'"args":{json.dumps(args, separators=(",", ":"))[:-1]}')


def _comm_parts(comm: pd.DataFrame, tracks: _Tracks) -> list[pa.Array]:
    c = comm
    pid = c["rank"].to_numpy() + 1
    bucket = c["bucket"].to_numpy()
    kind = c["kind"].astype(str).to_numpy()
    op = c["op"].astype(str).to_numpy()
    label = np.where(op != "", op, c["name"].astype(str).to_numpy()).astype(object)
    in_bucket = bucket >= 0
    key = bucket.astype(np.int64)
    if not in_bucket.all():
        codes, uniq = pd.factorize(label[~in_bucket], sort=True)
        key[~in_bucket] = codes
    start, end = c["start_ns"].to_numpy(), c["end_ns"].to_numpy()
    tid = np.zeros(len(c), dtype=np.int64)
    for code, m in ((BUCKETS, in_bucket), (OPS, ~in_bucket)):
        if m.any():
            names = ("bucket " + bucket[m].astype(str).astype(object)) if code == BUCKETS else label[m] + " (collectives)"
            tid[m] = tracks.place(pid[m], code, key[m], start[m], end[m], names)
    cols = (kind, bucket, label, op, c["bytes"].to_numpy(), c["logical_bytes"].to_numpy(), c["dtype"].astype(str).to_numpy(),
            c["group_size"].to_numpy(), c["phase"].astype(str).to_numpy())
    codes, first = _factor(*cols)
    static = pa.array([_comm_static(*(col[i].item() if hasattr(col[i], "item") else col[i] for col in cols))
                       for i in first.tolist()], pa.string()).take(codes)
    launch, ready = c["launch_ns"].to_numpy(), c["ready_ns"].to_numpy()
    step, micro = _s(c["step"]), _s(c["micro"])
    out = [_cat('{"ph":"X",', _pid_tid(pid, tid), ',"ts":', _us(start), ',"dur":', _us(end - start), ",",
                static, ',"step":', step, ',"micro":', micro, ',"exposed_ms":', _num(c["exposed_ns"] / 1e6),
                ',"duration_ms":', _num(c["duration_ns"] / 1e6), ',"queue_ms":', _num(c["queue_ns"] / 1e6),
                ',"wait_peers_ms":', _num(c["wait_peers_ns"] / 1e6), ',"queued_ms":', _num(c["queued_ns"] / 1e6),
                ',"hook_to_launch_ms":', _num(c["hook_to_launch_ns"] / 1e6),
                ',"busbw_GBps":', _num(c["busbw_gbps"]), ',"algbw_GBps":', _num(c["algbw_gbps"]),
                _when(launch >= 0, _cat(',"launch_ns":', _s(launch))),
                _when(ready >= 0, _cat(',"ready_ns":', _s(ready), ',"launch_delay_ms":',
                                       _num(c["launch_delay_ns"] / 1e6))),
                "}},\n")]

    # "bucket k ready" → its collective: a zero-length slice at the ready time for the arrow to
    # leave from, and the arrow's end bound to the collective's slice (bp "e": enclosing).
    f = (kind == S.BUCKET) & (ready >= 0)
    if f.any():
        fp, fb, fr = pid[f], bucket[f], ready[f]
        rtid = tracks.place(fp, READY, 0, fr, fr, "grad ready")
        at_ready, ts = _pid_tid(fp, rtid), _us(fr)
        ids = _s(np.arange(1, int(f.sum()) + 1))
        common = f'"name":"ready → launch","cat":"{FLOW_CAT}","id":'
        bname = pa.array([f'"bucket {b} ready"' for b in range(int(fb.max()) + 1)], pa.string()).take(pa.array(fb))
        out.append(_cat('{"ph":"X","name":', bname, ',"cat":"bucket_ready",', at_ready, ',"ts":', ts,
                        ',"dur":0.000,"args":{"step":', step.filter(pa.array(f)), ',"micro":', micro.filter(pa.array(f)),
                        ',"bucket":', _s(fb), "}},\n"))
        out.append(_cat('{"ph":"s",', common, ids, ",", at_ready, ',"ts":', ts, "},\n"))
        out.append(_cat('{"ph":"f","bp":"e",', common, ids, ",", _pid_tid(fp, tid[f]), ',"ts":',
                        _us(start[f]), "},\n"))
    return out


def _process_metadata(run: Run) -> list[str]:
    hosts = {int(r.get("rank", -1)): r for r in run.meta.get("ranks") or [] if isinstance(r, dict)}
    out = []
    for rank in run.ranks:
        pid = rank + 1              # pid 0 is special to some trace tools; labels carry the rank
        out.append(f'{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":"rank {rank}"}}}}')
        out.append(f'{{"ph":"M","name":"process_sort_index","pid":{pid},"tid":0,"args":{{"sort_index":{rank}}}}}')
        info = hosts.get(rank)
        if info:
            labels = json.dumps(f"{info.get('host', '?')} pid {info.get('pid', '?')}")
            out.append(f'{{"ph":"M","name":"process_labels","pid":{pid},"tid":0,"args":{{"labels":{labels}}}}}')
    return out


def _chunks(parts: list[pa.Array]) -> list[memoryview]:
    """The events' bytes straight from the Arrow string buffers (no Python str per event); each
    event already ends with ",\n"."""
    chunks = []
    for arr in parts:
        if len(arr):
            offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
            chunks.append(memoryview(arr.buffers()[2])[offsets[0]:offsets[-1]])
    return chunks


def _trace_chunks(run: Run) -> list:
    """The Chrome trace JSON as a list of byte chunks (written out without joining them)."""
    ev = run.events
    ev = ev[((ev["start_ns"] >= 0) & (ev["end_ns"] >= ev["start_ns"])
             & ev["kind"].isin((S.STEP, S.GRAD_READY) + S.COMPUTE_KINDS)).to_numpy()]
    kind = ev["kind"].astype(str).to_numpy()
    tracks = _Tracks()
    parts = _compute_parts(ev, kind, tracks)
    comm = A.comm_metrics(run, kinds=S.COMM_KINDS)
    parts += _comm_parts(comm, tracks) if len(comm) else []
    exposed = A.exposed_intervals(run) if len(comm) else comm
    if len(exposed):   # where no compute hides communication: the same marking as the dashboard's
        pid = exposed["rank"].to_numpy() + 1
        tid = tracks.place(pid, EXPOSED, 0, exposed["start_ns"], exposed["end_ns"], "exposed comm")
        parts.append(_x(pid, tid, '"exposed comm"', '"exposed"', exposed["start_ns"], exposed["end_ns"],
                        _cat('"step":', _s(exposed["step"].to_numpy()))))
    inflight = A.bytes_in_flight(run)
    if len(inflight):
        parts.append(_cat('{"ph":"C","name":"bytes in flight","pid":', _s(inflight["rank"].to_numpy() + 1),
                          ',"tid":0,"ts":', _us(inflight["t_ns"]), ',"args":{"bytes":',
                          _s(inflight["bytes"].to_numpy()), "}},\n"))
    parts.append(tracks.metadata())
    meta = ",\n".join(_process_metadata(run))
    tail = json.dumps(run_metadata(run), separators=(",", ":"), allow_nan=False)
    return [b'{"traceEvents":[\n', *_chunks(parts),
            f'{meta}],"displayTimeUnit":"ns","otherData":{tail}}}'.encode()]


def chrome_trace_json(run: Run) -> bytes:
    """The whole run as Chrome trace JSON (UTF-8 bytes)."""
    return b"".join(_trace_chunks(run))


def chrome_trace(run: Run) -> dict:
    """The whole run as a Chrome trace JSON object (parsed; for tests and scripts)."""
    return json.loads(chrome_trace_json(run))


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
             "clock": "ns since run start (rank 0's clock)",
             "sizes": "MB = 1e6 bytes",
             "problems": "; ".join(run.problems) or None}
    return {k: v for k, v in facts.items() if v is not None}


def write_perfetto(run: Run, path: str | Path) -> Path:
    """Write the Chrome trace to ``path``; gzip-compressed when it ends with .gz (level 1: 29 MB
    of JSON compress to about a tenth at level 1 as well as at 6, in a fraction of the time)."""
    path = Path(path)
    opener = (lambda: gzip.open(path, "wb", compresslevel=1)) if path.suffix == ".gz" else (lambda: open(path, "wb"))
    chunks = _trace_chunks(run)
    with opener() as f:
        for chunk in chunks:
            f.write(chunk)
    return path
