"""Runs inside every rank that ``syncviz trace`` starts (as ``python <path>/bootstrap.py``):
starts the recorder, then runs the user's script or module exactly as ``python script.py`` /
``python -m module`` would, with their arguments. No change to the user's code.

Configuration comes from one environment variable (options.TraceOptions) set by syncviz.record.launch
(torchrun passes the environment to its workers)."""
from __future__ import annotations

import os
import runpy
import sys

# Run by file path, Python put this file's directory (syncviz/record/) first on sys.path: take it
# off before anything is imported, or its modules (api, events, options, ...) would shadow the
# user's. Not `-m`: that puts the working directory first, and a `syncviz/` folder there broke
# every rank.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]


def main() -> None:
    from syncviz.record.options import TraceOptions
    opts = TraceOptions.from_env()
    if opts is None:
        sys.exit("syncviz.record.bootstrap: run it through `syncviz trace` (no trace options in the environment)")
    args = sys.argv[1:]
    profiler = None
    rank = int(os.environ.get("RANK", "0"))
    if opts.profile:
        from syncviz.record.profiling import StepProfiler, parse_profile_steps
        profiler = StepProfiler(opts.out, rank, *parse_profile_steps(opts.profile))
    from syncviz.record import api
    rec = api.start(opts.out, name=opts.name or None, steps=opts.steps, command=opts.command or None,
                    profiler=profiler, backend=opts.backend)
    if opts.grad_values:
        from syncviz.record import grads
        grads.install(rec, opts.grad_values)
    if opts.collectives:
        from syncviz.record import collectives
        collectives.install(rec)
    from syncviz.record import gather, watchdog
    watchdog.start(rec)
    gather.install(rec)
    target, is_module = opts.target, opts.is_module
    finished = False
    try:
        if is_module:
            sys.argv = [target, *args]
            sys.path.insert(0, os.getcwd())          # as `python -m module` does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))   # as `python script.py`
            runpy.run_path(target, run_name="__main__")
        finished = True
    except SystemExit as e:
        finished = e.code in (None, 0)
        raise
    except KeyboardInterrupt:        # Ctrl-C reaches every rank: the launcher says it once
        sys.exit(130)
    finally:
        rec.close(finished=finished)     # which also lets gloo's threads finish (record/quiesce.py)


def _main_recorded() -> None:
    """main() under torch's error recorder: an exception in the script (a SyntaxError too) goes
    to torchrun's error file with a timestamp, so the launcher can name the rank that failed first."""
    try:
        from torch.distributed.elastic.multiprocessing.errors import record
    except ImportError:
        return main()
    return record(main)()


if __name__ == "__main__":
    _main_recorded()
