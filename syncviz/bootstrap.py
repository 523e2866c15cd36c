"""Runs inside every rank that ``syncviz trace`` starts (as ``python -m syncviz.bootstrap``):
starts the recorder, then runs the user's script or module exactly as ``python script.py`` /
``python -m module`` would, with their arguments. No change to the user's code.

Configuration comes from SYNCVIZ_* environment variables set by syncviz.launch (torchrun passes
the environment to its workers)."""
from __future__ import annotations

import json
import os
import runpy
import sys


def main() -> None:
    target = os.environ["SYNCVIZ_TARGET"]
    is_module = os.environ.get("SYNCVIZ_TARGET_IS_MODULE") == "1"
    args = sys.argv[1:]
    profiler = None
    rank = int(os.environ.get("RANK", "0"))
    out = os.environ["SYNCVIZ_OUT"]
    if os.environ.get("SYNCVIZ_PROFILE"):
        from .profiling import StepProfiler, parse_profile_steps
        profiler = StepProfiler(out, rank, *parse_profile_steps(os.environ["SYNCVIZ_PROFILE"]))
    from . import record
    rec = record.start(out, name=os.environ.get("SYNCVIZ_RUN_NAME"), steps=os.environ.get("SYNCVIZ_STEPS"),
                       command=json.loads(os.environ.get("SYNCVIZ_COMMAND", "null")), profiler=profiler)
    if os.environ.get("SYNCVIZ_COLLECTIVES", "1") == "1":
        try:
            from . import collectives
            collectives.install(rec)
        except ImportError:
            pass
    finished = False
    try:
        if is_module:
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        finished = True
    except SystemExit as e:
        finished = e.code in (None, 0)
        raise
    finally:
        rec.close(finished=finished)
        # Free what the script left in reference cycles (models, process groups, works) now,
        # while Python is fully alive: left to interpreter teardown, gloo's threads may release
        # Python objects after finalization began, which aborts the process ("terminate called
        # without an active exception") after a perfectly good run.
        import gc
        gc.collect()


if __name__ == "__main__":
    main()
