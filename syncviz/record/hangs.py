"""Hang forensics, launcher side: ``syncviz trace`` watches the ranks' progress (run.json's
steps_recorded and each rank's ``inflight-<rank>.json``, see watchdog.py). When no rank completes
a step for the deadline — max(60 s, 10 × the median step) unless ``--hang-timeout`` sets it — it
says which ranks are stuck in which collective (op, bytes, bucket, step, since when) and which
ranks never launched it, writes that to ``hang.json`` in the run directory and stops the ranks.
Before stopping them it asks each rank on this host for its threads' Python stacks (a real-time
signal, see watchdog.py): a rank that is in no collective is stuck somewhere only its stack can say."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

from syncviz.trace import schema as S
from syncviz.trace import write_json_atomic

MIN_DEADLINE_S = 60.0
STEP_FACTOR = 10.0
HANG_FILE = "hang.json"
STACKS_WAIT_S = 3.0     # how long the launcher waits for the ranks' stack dumps
TOP_FRAMES = 4          # innermost frames of each rank's main thread printed with the report
_OWN = os.sep + os.path.join("syncviz", "record") + os.sep
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")


def read_inflight(out: Path) -> dict[int, dict]:
    states = {}
    for p in out.glob("inflight-*.json"):
        try:
            d = json.loads(p.read_text())
            states[int(d["rank"])] = d
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return states


def report(states: dict[int, dict], world: int | None, now: float) -> dict:
    """Who is stuck in what: one entry per distinct in-flight collective (op, name, bytes, bucket,
    step), the ranks in it with since when, and the ranks that never launched it."""
    known = sorted(states)
    everyone = list(range(world)) if world and world <= 4096 else known
    stuck: dict[tuple, dict] = {}
    for rank, st in sorted(states.items()):
        for c in st.get("inflight", []):
            key = (st.get("step"), c.get("op"), c.get("name"), c.get("bytes"), c.get("bucket"))
            e = stuck.setdefault(key, {"step": st.get("step"), "op": c.get("op"), "name": c.get("name"),
                                       "bytes": c.get("bytes"), "bucket": c.get("bucket"), "ranks": {}})
            since = float(st.get("written_unix", now)) - float(c.get("age_s", 0))
            e["ranks"][rank] = {"state": c.get("state"), "since_unix": since, "waiting_s": round(now - since, 1)}
    entries = []
    for e in stuck.values():
        e["never_launched_by"] = [r for r in everyone if r not in e["ranks"]]
        e["ranks"] = {str(r): v for r, v in e["ranks"].items()}
        entries.append(e)
    entries.sort(key=lambda e: -max(v["waiting_s"] for v in e["ranks"].values()))
    ranks = {str(r): {"step": st.get("step"), "steps_written": st.get("steps_written"), "pid": st.get("pid"),
                      "in_flight": len(st.get("inflight", []))} for r, st in sorted(states.items())}
    silent = [r for r in everyone if r not in states]
    return {"detected_unix": now, "stuck": entries, "ranks": ranks, "ranks_without_state": silent}


def request_stacks(out: Path, states: dict[int, dict], wait_s: float = STACKS_WAIT_S) -> dict[int, str]:
    """The signal each rank of this host armed (its state's ``stacks``, watchdog.py) to every such
    rank; their faulthandler dumps, by rank. A rank that does not answer in ``wait_s`` (gone, or not
    ours) is left out."""
    from syncviz.record.watchdog import stacks_file
    host, asked = socket.gethostname(), {}
    for rank, st in states.items():
        sig = st.get("stacks")
        if type(sig) is not int or st.get("host") != host or not st.get("pid"):
            continue
        path = out / stacks_file(rank)
        with contextlib.suppress(OSError, ValueError):
            before = path.stat().st_size
            os.kill(int(st["pid"]), sig)
            asked[rank] = (path, before)
    got: dict[int, str] = {}
    sizes: dict[int, int] = {}
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        time.sleep(0.1)
        for rank, (path, before) in list(asked.items()):
            try:
                size = path.stat().st_size
                if size > before and sizes.get(rank) == size:      # grew, then unchanged for 0.1 s
                    got[rank] = path.read_bytes()[before:].decode(errors="replace")
                    del asked[rank]
            except OSError:        # removed meanwhile (the rank closed): nothing to read
                del asked[rank]
                continue
            sizes[rank] = size
    return got


def main_frames(dump: str, thread: str | None) -> list[str]:
    """The frames of ``thread`` (``0x...``, else the dump's "Current thread") in a faulthandler
    dump, innermost first, as "file:line in func"."""
    frames, mine = [], False
    for ln in dump.splitlines():
        m = _THREAD.match(ln)
        if m:
            if frames:
                break
            mine = (m.group(1) == thread) if thread else ln.startswith("Current")
            continue
        if mine and ln.strip().startswith("File "):
            f = re.match(r'\s*File "(.*)", line (\d+) in (.*)', ln)
            frames.append(f"{f.group(1)}:{f.group(2)} in {f.group(3)}" if f else ln.strip())
    return frames


def add_stacks(rep: dict, states: dict[int, dict], dumps: dict[int, str]) -> None:
    """The dumps into the report: whole text per rank, and each main thread's frames."""
    rep["stacks"] = {str(r): d for r, d in sorted(dumps.items())}
    rep["main_thread"] = {str(r): main_frames(d, states.get(r, {}).get("main_thread"))
                          for r, d in sorted(dumps.items())}


def lines(rep: dict, deadline: float) -> list[str]:
    out = [f"[syncviz] hang: no rank completed a step for {deadline:.0f} s"]
    for e in rep["stuck"][:6]:
        who = ", ".join(f"{r} (for {v['waiting_s']:.0f} s)" for r, v in e["ranks"].items())
        what = f"{e['op']} '{e['name']}' {e['bytes'] / 1e6:.2f} MB" + (f" bucket {e['bucket']}" if e["bucket"] >= 0 else "")
        never = e["never_launched_by"]
        out.append(f"[syncviz]   step {e['step']}: {what}: ranks {who} are in it; "
                   + (f"ranks {', '.join(map(str, never))} never launched it" if never else "every rank launched it"))
    if not rep["stuck"]:
        out.append("[syncviz]   no rank is inside a collective (stuck in compute, data loading or a deadlock "
                   "outside torch.distributed)")
    for r, st in rep["ranks"].items():
        if not st["in_flight"]:
            # the watchdog's view: a Python thread, so behind when the rank is stuck holding the GIL
            out.append(f"[syncviz]   rank {r}: last seen at step {st['step']}, in no collective")
    if rep["ranks_without_state"]:
        out.append(f"[syncviz]   ranks {', '.join(map(str, rep['ranks_without_state'][:16]))}: no state written")
    for r, frames in list(rep.get("main_thread", {}).items())[:8]:
        # syncviz's own wrappers and runpy's frames say nothing about the user's code: left out here
        frames = [f for f in frames if not (_OWN in f or f.startswith("<frozen runpy>"))]
        if frames:
            out.append(f"[syncviz]   rank {r}'s main thread (innermost first; all threads in hang.json):")
            out += [f"[syncviz]     {f}" for f in frames[:TOP_FRAMES]]
    pids = [(r, st["pid"]) for r, st in rep["ranks"].items() if st.get("pid")][:4]
    if pids and not rep["stuck"]:
        # how this session found a deadlock inside C++ (record/reducer_group.py): native frames and locks
        out.append("[syncviz]   stuck inside C++ (a lock, the GIL)? rerun with a longer --hang-timeout and, while it "
                   "hangs, run py-spy dump --native --pid PID (" + ", ".join(f"rank {r}: {p}" for r, p in pids) + ")")
    return out


class HangWatch(threading.Thread):
    """Polls progress; on a hang writes hang.json, prints the report and SIGTERMs this process
    (torchrun's agent then stops every rank and raises SignalException in the main thread)."""

    def __init__(self, out: Path, timeout_s: float | None, stop: threading.Event, poll_s: float = 0.5):
        super().__init__(name="syncviz-hangwatch", daemon=True)
        self.out, self.timeout_s, self.stop, self.poll_s = out, timeout_s, stop, poll_s
        self.hung: dict | None = None
        self.deadline_s = timeout_s or MIN_DEADLINE_S

    def _progress(self, states) -> tuple:
        try:
            n = json.loads((self.out / S.RUN_FILE).read_text()).get("steps_recorded", 0)
        except (OSError, ValueError, AttributeError):
            n = None
        return (n, tuple(sorted((r, st.get("steps_written"), st.get("step")) for r, st in states.items())))

    def run(self) -> None:
        last, since, intervals = None, None, []
        while not self.stop.wait(self.poll_s):
            states = read_inflight(self.out)
            if not states:              # ranks still starting (importing torch): no clock yet
                continue
            now = time.time()
            key = self._progress(states)
            if key != last:
                if since is not None and last is not None and key[0] != last[0]:
                    intervals.append(now - since)
                last, since = key, now
                if self.timeout_s is None and intervals:
                    self.deadline_s = max(MIN_DEADLINE_S, STEP_FACTOR * statistics.median(intervals[-50:]))
                continue
            if now - since < self.deadline_s:
                continue
            # Before the first step only a rank waiting in a collective is a hang: starting up
            # (imports, loading data, init_process_group) may take longer than any deadline.
            started = bool(key[0]) or any(st.get("steps_written") for st in states.values())
            if not started and not any(st.get("inflight") for st in states.values()):
                continue
            world = None
            try:
                world = int(json.loads((self.out / S.RUN_FILE).read_text()).get("world_size"))
            except (OSError, ValueError, TypeError, AttributeError):
                pass
            rep = report(states, world or int(os.environ.get("WORLD_SIZE", 0)) or None, now)
            rep["deadline_s"] = self.deadline_s
            with contextlib.suppress(Exception):       # forensics never block stopping the ranks
                add_stacks(rep, states, request_stacks(self.out, states))
            try:
                write_json_atomic(self.out / HANG_FILE, rep)
            except OSError:
                pass
            for ln in lines(rep, self.deadline_s):
                print(ln, file=sys.stderr, flush=True)
            self.hung = rep
            os.kill(os.getpid(), signal.SIGTERM)
            return


def summary_line(rep: dict, out: Path) -> str:
    if rep["stuck"]:
        e = rep["stuck"][0]
        who = ",".join(e["ranks"])
        never = e["never_launched_by"]
        return (f"hang: ranks {who} stuck in {e['op']} ({e['bytes'] / 1e6:.2f} MB) at step {e['step']}"
                + (f", never launched by ranks {','.join(map(str, never))}" if never else "")
                + f"; ranks stopped, report in {out / HANG_FILE}, completed steps kept in {out}")
    return f"hang: no rank completed a step for {rep['deadline_s']:.0f} s; ranks stopped, report in {out / HANG_FILE}"
