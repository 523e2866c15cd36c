"""Name a failed run right: the rank that failed first and its exit reason, from torchrun's
ChildFailedError (one ProcessFailure per rank: exit code, timestamp, and the error file that the
bootstrap's ``torch.distributed.elastic.multiprocessing.errors.record`` wrapper wrote with the
exception). Ranks torchrun killed after the first failure (exit −15) are not the cause."""
from __future__ import annotations

import re
import signal
from pathlib import Path


def _reason(f) -> str:
    msg = getattr(f, "message", "") or ""
    if isinstance(msg, dict):
        msg = msg.get("message", "") or ""
    text = str(msg).strip()
    if text and text != "<N/A>" and not text.startswith("To enable traceback"):
        # record() stores "ExcType: message" (tracebacks live in extraInfo): keep the first line
        return text.splitlines()[0][:240]
    code = getattr(f, "exitcode", None)
    if isinstance(code, int) and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# An exception like these is usually the consequence of a peer that died first (gloo/NCCL
# report a closed connection or a timeout on every surviving rank).
_CONSEQUENCE = re.compile(r"Connection (closed|reset)|DistBackendError|ProcessGroup|[Gg]loo|NCCL|[Tt]imed out|"
                          r"Broken pipe|peer")


# What a rank stopped by torchrun records (SignalException): "Signal 15 (SIGTERM) received by PID 6395".
_TERMINATED = re.compile(r"(\w+: )?Signal \d+ \(SIG(TERM|INT|HUP)\) received")


def first_failure(failures: dict) -> tuple[int, object] | None:
    """(rank, failure) of the cause. Ranked: a rank's own exception or a death by a signal other
    than SIGTERM/SIGINT (SIGKILL from the OOM killer, SIGSEGV, ...) first; then communication
    errors (the consequence of a dead peer); last the ranks torchrun terminated (SIGTERM) after
    the first failure. Within a rank class: earliest timestamp (seconds), then the lowest rank."""
    if not failures:
        return None

    def key(item):
        rank, f = item
        code = getattr(f, "exitcode", 0)
        if _has_message(f) and _TERMINATED.match(_reason(f)):
            cls = 2          # the rank's own record of torchrun stopping it
        elif _has_message(f):
            cls = 1 if _CONSEQUENCE.search(_reason(f)) else 0
        elif isinstance(code, int) and -code in (signal.SIGTERM, signal.SIGINT):
            cls = 2
        else:
            cls = 0
        return (cls, getattr(f, "timestamp", 0) or 0, rank)
    return min(failures.items(), key=key)


def _has_message(f) -> bool:
    msg = getattr(f, "message", "")
    if isinstance(msg, dict):
        msg = msg.get("message", "")
    return bool(str(msg).strip()) and str(msg).strip() != "<N/A>"


def steps_kept(out: Path) -> int:
    """Complete steps in the run directory (0 when nothing is readable)."""
    try:
        from syncviz.trace import load_run
        run = load_run(out)
        return int(run.events.loc[run.events["kind"] == "step", "step"].nunique())
    except Exception:   # noqa: BLE001 - this only decides what to suggest
        return 0


def failure_line(failures: dict, text: str, out: Path) -> str:
    first = first_failure(failures)
    if first is None:
        what = text.strip().splitlines()[0] if text.strip() else "a rank failed"
    else:
        rank, f = first
        others = sorted(r for r in failures if r != rank)
        same = [r for r in others if _reason(failures[r]) == _reason(f)]
        rest = [r for r in others if r not in same]
        what = f"rank {rank} failed first: {_reason(f)}"
        notes = ([f"rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same[:8]))} failed the same way"] if same else []) \
            + ([f"then rank{'s' if len(rest) > 1 else ''} {', '.join(map(str, rest[:8]))} stopped"] if rest else [])
        if notes:
            what += f" ({'; '.join(notes)})"
    n = steps_kept(out)
    if n:
        return f"training failed: {what}. {n} complete steps kept in {out} (see: syncviz summary {out})"
    return f"training failed: {what}. No complete step was recorded (the run directory {out} holds no usable trace)"
