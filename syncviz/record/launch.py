"""``syncviz trace``: start the user's ranks through torch's own launcher (torch.distributed.run,
so every torchrun option works with its usual name) with syncviz.record.bootstrap in front of their script.

    syncviz trace [syncviz options] [torchrun options] script.py [script args]
    syncviz trace [syncviz options] [torchrun options] -m package.module [module args]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import click

from syncviz.trace import schema as S

SYNCVIZ_OPTIONS = ("out", "name", "steps", "backend", "profile", "profile_steps", "overwrite", "quiet",
                   "no_collectives", "grad_values", "grad_elements", "hang_timeout")
USAGE = ("syncviz trace [syncviz options] [torchrun options] script.py [script args]\n"
         "       syncviz trace [syncviz options] [torchrun options] -m package.module [module args]")
DESCRIPTION = ("Run a training script on torchrun ranks and record its gradient synchronization. "
               "Every torchrun option is accepted with its usual name.")


def _add_syncviz_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("syncviz options")
    g.add_argument("--out", default=None, help="run directory [default: ./traces/<name>]")
    g.add_argument("--name", default=None, help="run name [default: <script>-<YYYYmmdd-HHMMSS>]")
    g.add_argument("--steps", default="all",
                   help="optimizer steps to record: all (default), A:B (A inclusive, B exclusive) or N,M,...")
    g.add_argument("--backend", default=None, choices=("gloo", "nccl", "mpi", "ucc"),
                   help="backend for init_process_group calls that name none")
    g.add_argument("--profile", action="store_true",
                   help="also run torch.profiler (TensorBoard traces in <run>/profiler/)")
    g.add_argument("--profile-steps", default="2:4", help="steps profiled with --profile, A:B [default: 2:4]")
    g.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    g.add_argument("--quiet", action="store_true", help="no progress lines")
    g.add_argument("--no-collectives", action="store_true",
                   help="time only DDP buckets, not every torch.distributed collective")
    g.add_argument("--grad-values", action="store_true",
                   help="also record each parameter's first K gradient elements and its norm, per rank, "
                        "before and after DDP's all-reduce (grads-<rank>.arrow; off by default)")
    g.add_argument("--grad-elements", type=int, default=4, metavar="K",
                   help="elements per parameter for --grad-values [default: 4]")
    g.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                   help="report a hang (who is stuck in which collective, in <run>/hang.json) and stop the ranks "
                        "when no rank completes a step for S seconds [default: max(60, 10 x the median step)]")


def _parser() -> argparse.ArgumentParser:
    """torchrun's own parser (imports torch: seconds) extended with syncviz's options."""
    from torch.distributed.run import get_args_parser
    p = get_args_parser()
    p.prog, p.usage, p.description = "syncviz trace", USAGE, DESCRIPTION
    _add_syncviz_options(p)
    return p


def help_text() -> str:
    """``syncviz trace --help`` without importing torch (importing torch.distributed.run takes
    3–14 s on a loaded 2-core machine): syncviz's options from our own parser, then torchrun's,
    read from torch's source (torch/distributed/run.py's get_args_parser) with ast."""
    p = argparse.ArgumentParser(prog="syncviz trace", usage=USAGE, description=DESCRIPTION, add_help=False)
    p.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    _add_syncviz_options(p)
    text = p.format_help().rstrip() + "\n\ntorchrun options (passed to torch.distributed.run unchanged):\n"
    width = shutil.get_terminal_size((100, 20)).columns
    for names, help_ in _torchrun_options():
        first = ", ".join(n for n in names if n.startswith("-") and "_" not in n.lstrip("-")) or ", ".join(names)
        text += "  " + first + "\n" + "".join(
            "        " + line + "\n" for line in textwrap.wrap(help_, max(40, width - 10))[:3])
    return text


def _torchrun_options() -> list[tuple[list[str], str]]:
    import ast
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
        src = Path(spec.origin).parent / "distributed" / "run.py"
        fn = next(n for n in ast.walk(ast.parse(src.read_text()))
                  if isinstance(n, ast.FunctionDef) and n.name == "get_args_parser")
    except Exception:   # torch moved things: fall back to its parser (slow, but right)
        return [(list(a.option_strings), a.help or "") for a in _parser()._actions
                if a.option_strings and a.dest not in SYNCVIZ_OPTIONS + ("help",)]

    def text(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(text(v) if isinstance(v, ast.Constant) else "{…}" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return text(node.left) + text(node.right)
        return ""
    rows = []
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if names and names[0].startswith("-"):
                h = next((text(k.value) for k in call.keywords if k.arg == "help"), "")
                rows.append((names, " ".join(h.split())))
    return rows


def wants_help(argv: list[str]) -> bool:
    """-h/--help among the options before the script (after it, they are the script's)."""
    for a in argv:
        if a in ("-h", "--help"):
            return True
        if a in ("-m", "--module") or a.endswith(".py"):
            return False
    return False


def run_trace(argv: list[str]) -> Path:
    """Parse, launch, wait; returns the run directory. Raises click.ClickException on failure."""
    from syncviz.record.options import StepSelection, TraceOptions
    parser = _parser()
    args = parser.parse_args(argv)
    target = args.training_script
    if args.module:
        pass
    elif not os.path.isfile(target):
        raise click.UsageError(f"no such script: {target}")
    try:
        StepSelection(args.steps)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--steps") from None
    if args.grad_elements < 1:
        raise click.BadParameter("K must be >= 1", param_hint="--grad-elements")
    if args.hang_timeout is not None and not 0 < args.hang_timeout <= 10 ** 6:
        raise click.BadParameter("give seconds > 0", param_hint="--hang-timeout")
    if args.profile and not re.fullmatch(r"\d+:\d+", args.profile_steps or ""):
        raise click.BadParameter("use A:B, e.g. 2:4", param_hint="--profile-steps")
    stem = target.rsplit(".", 1)[-1] if args.module else Path(target).stem
    name = args.name or f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(args.out or os.path.join("traces", name))
    # Only node 0 owns the run directory: other nodes' launchers (multi-node runs, possibly
    # sharing one directory) add their ranks' files to it.
    if args.node_rank == 0 and ((out / S.RUN_FILE).exists() or any(out.glob("rank-*.arrow"))):
        if not args.overwrite:
            raise click.ClickException(f"{out} already holds a run; pass --overwrite or choose --out")
        for p in (list(out.glob("rank-*.arrow")) + list(out.glob("layout-*.arrow")) + list(out.glob("grads-*.arrow"))
                  + list(out.glob("inflight-*.json")) + list(out.glob("stacks-*.txt")) + [out / S.RUN_FILE, out / "hang.json"]):
            p.unlink(missing_ok=True)
        shutil.rmtree(out / "profiler", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)

    env = TraceOptions(out=str(out.resolve()), name=name, steps=args.steps, target=target,
                       is_module=bool(args.module), command=["syncviz", "trace", *argv],
                       collectives=not args.no_collectives, backend=args.backend or "",
                       profile=args.profile_steps if args.profile else "",
                       grad_values=args.grad_elements if args.grad_values else 0).to_env()
    hang_timeout = args.hang_timeout
    _build_native(quiet=bool(args.quiet))
    for k in SYNCVIZ_OPTIONS:
        delattr(args, k)
    # The bootstrap runs by file path, not `-m syncviz.record.bootstrap`: with -m the working
    # directory comes first on sys.path, and a `syncviz/` folder there shadowed the package.
    from syncviz.record import bootstrap
    args.training_script, args.module = os.path.abspath(bootstrap.__file__), False
    args.no_python = False
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    stop = threading.Event()
    watcher = None if argv and "--quiet" in argv else threading.Thread(
        target=_progress, args=(out, stop), daemon=True)
    if watcher:
        watcher.start()
    from syncviz.record.hangs import HangWatch, summary_line
    hangs = HangWatch(out, hang_timeout, stop)
    hangs.start()
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import run
        _quiet_torchrun_logs()
        try:
            run(args)
        except ChildFailedError as e:
            if hangs.hung:
                raise click.ClickException(summary_line(hangs.hung, out)) from None
            raise click.ClickException(_failure_line(e, out)) from None
        except (SignalException, KeyboardInterrupt) as e:
            if hangs.hung:
                raise click.ClickException(summary_line(hangs.hung, out)) from None
            sig = getattr(e, "sigval", signal.SIGINT)
            click.echo(f"[syncviz] stopped by {signal.Signals(sig).name}: ranks stopped; completed steps kept in "
                       f"{out}", err=True)
            sys.exit(130 if sig == signal.SIGINT else 128 + int(sig))
    finally:
        stop.set()
        if watcher:
            watcher.join(timeout=2)
        hangs.join(timeout=2)
        for p in out.glob("inflight-*.json"):
            p.unlink(missing_ok=True)
        for p in out.glob("stacks-*.txt"):     # a killed rank's, never asked for: empty (a hang's are kept)
            with contextlib.suppress(OSError):
                if p.stat().st_size == 0:
                    p.unlink()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def _build_native(quiet: bool) -> None:
    """syncviz's C++ recording hooks (record/native: gradient-ready stamps, DDP's bucket timing),
    built here before any rank starts (once per torch and Python; ranks never build). Without them
    the ranks use the Python hooks and group."""
    from syncviz.record import native
    why = native.build(None if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True)))
    if why:
        print(f"[syncviz] C++ recording hooks not built ({why}); the Python ones record the same "
              f"rows with more overhead", file=sys.stderr, flush=True)


def _quiet_torchrun_logs() -> None:
    """torchrun's agent logs several lines per event (death signals, "failed (exitcode: 1)" per
    worker, the OMP_NUM_THREADS banner); syncviz says what happened in one line."""
    import logging
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _failure_line(e, out: Path) -> str:
    """Name the rank that failed first and why (its exception, from the error file the bootstrap's
    torch ``record`` wrapper wrote), not the ranks torchrun killed afterwards (exit −15)."""
    from syncviz.record.failures import failure_line
    return failure_line(getattr(e, "failures", {}) or {}, str(e), out)


def _progress(out: Path, stop: threading.Event) -> None:
    """Print 'step N recorded' as rank 0 flushes steps (from run.json, which it rewrites)."""
    last, last_print = -1, 0.0
    path = out / S.RUN_FILE
    while not stop.wait(0.5):
        try:
            n = int(json.loads(path.read_text()).get("steps_recorded", 0))
        except (OSError, ValueError):
            continue
        if n != last and time.monotonic() - last_print >= 1.0:
            print(f"[syncviz] {n} step{'s' if n != 1 else ''} recorded -> {out}", file=sys.stderr, flush=True)
            last, last_print = n, time.monotonic()
