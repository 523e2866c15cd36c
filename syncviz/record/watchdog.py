"""Hang forensics, rank side (as PyTorch's Flight Recorder does for NCCL): a light thread per rank
that, every ``PERIOD_S``, reads the recorder's in-flight state (Recorder.inflight(): the current
step and its unfinished collectives and buckets) and writes it to ``inflight-<rank>.json`` in the
run directory, atomically, when it changed and either settled (a stuck rank's state: written within
two polls) or was last written MOVING_WRITE_S ago. It never touches the training hot path; the
launcher (record/hangs.py) reads these files to say who is stuck in what.

A blocking gloo collective releases the GIL while it waits, so this thread keeps running while
its rank is stuck (which is the point).

What the rank's threads are doing comes on demand: a signal (STACKS_SIGNAL) makes faulthandler
write every thread's Python stack to ``stacks-<rank>.txt`` (a C-level handler: it answers even while
the main thread is blocked in C++ with or without the GIL). The launcher sends it when it declares a
hang, so the report says where a rank that is in no collective is stuck. The signal is a real-time
one, not SIGUSR1/SIGUSR2: SLURM's ``--signal`` and Lightning's requeue handler use those, and a
script's own handler must keep working. One the script already handles is left to it (no stacks)."""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import threading
import time
from pathlib import Path

from syncviz.trace import write_json_atomic

PERIOD_S = 1.0
# While the rank moves on, its state changes at every poll; it is written then at most this often,
# and at once when it stops changing (two polls alike: a rank stuck in something). Writing each
# change cost ~2.6 ms of CPU a second on a short-steps rank (~0.25%; mkstemp, fchmod, rename,
# py-spy at 500 Hz); the launcher's hang deadline is ≥ 60 s unless --hang-timeout sets it.
MOVING_WRITE_S = 10.0


# SIGRTMIN + 6: clear of glibc's own real-time signals (Python's SIGRTMIN is past them) and of the
# low ones libraries take first; None where the platform has none (then no stacks).
STACKS_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") and signal.SIGRTMIN + 6 <= signal.SIGRTMAX else None


def inflight_file(rank: int) -> str:
    return f"inflight-{rank}.json"


def stacks_file(rank: int) -> str:
    return f"stacks-{rank}.txt"


class Watchdog:
    def __init__(self, rec, period_s: float = PERIOD_S):
        self.rec, self.period_s = rec, period_s
        self.path = Path(rec.run_dir) / inflight_file(rec.rank)
        self._stop = threading.Event()
        self._last = None              # the state written last (its key)
        self._seen = None              # the state of the previous poll
        self._written_at = float("-inf")
        self._thread = threading.Thread(target=self._loop, name="syncviz-watchdog", daemon=True)
        self._stacks = None            # the open stacks file while STACKS_SIGNAL dumps into it
        self._static = {"pid": os.getpid(), "host": socket.gethostname(),
                        "main_thread": f"0x{threading.main_thread().ident:016x}"}

    def arm_stacks(self) -> bool:
        """Let STACKS_SIGNAL dump every thread's stack to stacks-<rank>.txt; only where the signal
        is free (default disposition), so a script's own handler is never replaced."""
        if STACKS_SIGNAL is None or signal.getsignal(STACKS_SIGNAL) != signal.SIG_DFL:
            return False
        try:
            self._stacks = open(self.path.with_name(stacks_file(self.rec.rank)), "w")  # noqa: SIM115 (held open for the signal)
            faulthandler.register(STACKS_SIGNAL, file=self._stacks, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError):
            self._close_stacks()
            return False
        self._static["stacks"] = int(STACKS_SIGNAL)
        return True

    def _close_stacks(self) -> None:
        if self._stacks is None:
            return
        # unregister restores the action from before register(): only while nobody (the script)
        # installed a handler since, which replaced ours and must stay
        if signal.getsignal(STACKS_SIGNAL) == signal.SIG_DFL:
            with contextlib.suppress(Exception):
                faulthandler.unregister(STACKS_SIGNAL)
        name = self._stacks.name
        with contextlib.suppress(OSError):
            self._stacks.close()
        self._stacks = None
        self._static.pop("stacks", None)
        with contextlib.suppress(OSError):
            if os.path.getsize(name) == 0:     # never asked for: nothing to keep
                os.unlink(name)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def _key(self, state: dict) -> tuple:
        return (state["step"], state["micro"], state["steps_written"],
                tuple((c["op"], c["name"], c["bytes"], c["bucket"], c["launch_ns"]) for c in state["inflight"]))

    def state(self) -> dict:
        """This rank's step and unfinished communication: collectives being called (a blocking
        gloo call waits inside), launched async collectives and DDP buckets not done."""
        from syncviz.record import collectives
        s = self.rec.inflight()
        now = s["now"]
        calls = [(op, name, nb, b, t, "in call") for op, name, nb, b, t in collectives.in_call()]
        calls += [(c.op, c.name, c.nbytes, c.bucket, c.launch, "launched, not done") for c in s["collectives"]]
        calls += [("all_reduce", f"bucket {b.index} ({b.hook})", b.nbytes, b.index, b.launch, "bucket launched, not done")
                  for b in s["buckets"]]
        return {"rank": self.rec.rank, **self._static, "step": s["step"], "micro": s["micro"],
                "steps_written": s["steps_written"],
                "inflight": [{"op": op, "name": name, "bytes": nb, "bucket": b, "launch_ns": t, "state": st,
                              "age_s": round(max(0, now - t) / 1e9, 1)} for op, name, nb, b, t, st in calls]}

    def poll(self) -> bool:
        """Write the state when it changed and settled, or MOVING_WRITE_S after the last write; True when written."""
        state = self.state()
        key = self._key(state)
        settled, self._seen = key == self._seen, key
        now = time.monotonic()
        if key == self._last or not (settled or now - self._written_at >= MOVING_WRITE_S):
            return False
        state["written_unix"] = time.time()
        write_json_atomic(self.path, state)
        self._last, self._written_at = key, now
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            if self.rec.closed:
                break
            with contextlib.suppress(Exception):   # a watchdog never takes its rank down
                self.poll()

    def stop(self) -> None:
        """Stop and remove the file (a rank that closed cleanly is stuck in nothing)."""
        self._stop.set()
        self._close_stacks()
        with contextlib.suppress(OSError):
            self.path.unlink()


def start(rec) -> Watchdog:
    """Start the watchdog of ``rec`` and stop it when the recorder closes."""
    w = Watchdog(rec)
    w.arm_stacks()
    with contextlib.suppress(Exception):
        w.poll()                 # the rank is alive: its file exists from the start
    rec.on_close(lambda _rec: w.stop())
    return w.start()
