"""``syncviz trace``: run a training script under torchrun with recording on (record.launch does
that), then analyse the run once and say what happened.

The analysis at the end is the dashboard's whole-run analysis (dashboard.data.loaded.LoadedRun,
the same functions ``syncviz summary`` uses), written to the run's disk cache
(views/runcache.py): the first ``syncviz dash`` page then reads it instead of analysing the run
(1M events: ~0.2 s of server CPU instead of ~5 s per page, benchmarks/dashboard.py --pages-only).
It lives here, above the dashboard, because the recorder's stage may not import views.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click

from syncviz.record.launch import USAGE, help_text, run_trace, wants_help
from syncviz.trace import schema as S


@click.command("trace", add_help_option=False, context_settings={"ignore_unknown_options": True,
                                                               "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def trace_command(argv):
    """Run a training script under torchrun and record its gradient sync (see: syncviz trace --help)."""
    argv = list(argv)
    if wants_help(argv):
        click.echo(help_text())
        return
    if not argv:
        click.echo("usage: " + USAGE, err=True)
        raise click.UsageError("give a training script (or -m module) to run")
    out = run_trace(argv)
    if not (out / S.RUN_FILE).exists() and any(out.glob("rank-*.arrow")):
        click.echo(f"[syncviz] this node's ranks are done; node 0's run directory holds the run "
                   f"(copies of this node's files stay in {out})", err=True)
        return
    from syncviz.trace import TraceError
    try:
        s = analyse_for_views(out)
    except TraceError as e:
        raise click.ClickException(f"the recorded run could not be read: {e}") from None
    for p in s["problems"]:
        click.echo(f"[syncviz] warning: {p}", err=True)
    if not s["steps"]:
        raise click.ClickException(f"the script ran but no complete step was recorded in {out} (did it call "
                                   "optimizer.step() under torch.distributed?)")
    click.echo(f"[syncviz] {out}: {s['steps']} steps, {s['world_size']} ranks. {s['verdict']}", err=True)
    click.echo(f"[syncviz] next: syncviz summary {out}   |   syncviz dash {out.parent}", err=True)


def analyse_for_views(run_dir: Path, echo=None) -> dict:
    """The run's summary (analysis.run_summary), with every whole-run table the dashboard draws
    computed now and written to the run's disk cache. A run bigger than the dashboard opens whole
    (store.default_max_run_bytes) is summarized in partitions instead, and what that finds is cached
    as `syncviz summary` caches it (runcache.put_summary). Raises
    TraceError like the trace reader."""
    from syncviz.dashboard.data.loaded import LoadedRun
    from syncviz.dashboard.data.store import default_max_run_bytes
    from syncviz.views import runcache as RC
    run_dir = Path(run_dir)
    sig = RC.signature(run_dir)
    size = sum(n for name, n, _ in sig if name.startswith("rank-"))
    if size > default_max_run_bytes():   # the dashboard opens it from what the partitioned summary keeps
        with tempfile.TemporaryDirectory(prefix="syncviz-replay-") as replay_dir:   # as `syncviz summary` keeps it
            tables = RC.summarize_to_keep(run_dir, replay_dir)
            RC.put_summary(run_dir, tables, sig)
        return tables.summary
    say = echo or (lambda msg: click.echo(msg, err=True))
    t = time.perf_counter()
    run = LoadedRun(run_dir.name, run_dir, sig)
    run.warm()
    took = time.perf_counter() - t
    if took > 2.0:       # a line only when it was noticeable (a small run takes a fraction of a second)
        say(f"[syncviz] analysed the run for the dashboard and summary in {took:.1f} s "
            f"(kept in {run_dir / RC.CACHE_DIR}; opening it in `syncviz dash` reads it)")
    return run.summary()
