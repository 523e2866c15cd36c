"""``syncviz export``: a recorded run in the tools people already use.

\b
  syncviz export tensorboard RUN... --logdir DIR   scalars, histograms, summary text, layout
  syncviz export perfetto RUN -o run.json[.gz]     Chrome trace for ui.perfetto.dev / chrome://tracing
  syncviz export html RUN -o report.html           one self-contained file with the key charts
"""
from __future__ import annotations

from pathlib import Path

import click

from syncviz.trace import TraceError, find_runs, load_run, warn_problems

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _runs(paths: tuple[str, ...]) -> list[Path]:
    """Run directories named on the command line (a directory of runs expands to its runs)."""
    found: list[Path] = []
    for p in paths:
        runs = find_runs(p)
        if not runs:
            raise TraceError(f"{p}: no syncviz run here (a run is a directory with run.json)")
        found += [r for r in runs if r not in found]
    return found


def _one_run(path: str):
    runs = _runs((path,))
    if len(runs) > 1:
        raise click.UsageError(f"{path} holds {len(runs)} runs; name one of them "
                               f"(e.g. {runs[0]})")
    run = load_run(runs[0])
    warn_problems(run)
    return run


def _output(path: str, suffixes: tuple[str, ...]) -> Path:
    out = Path(path)
    if not any(out.name.endswith(s) for s in suffixes):
        raise click.BadParameter(f"{path}: expected a file name ending in {' or '.join(suffixes)}",
                                 param_hint="-o/--output")
    if not out.parent.exists():
        raise click.BadParameter(f"{out.parent}: no such directory", param_hint="-o/--output")
    return out


@click.group("export", context_settings=CONTEXT)
def export_group():
    """Export a run to TensorBoard, Perfetto or a self-contained HTML report."""


@export_group.command("tensorboard", context_settings=CONTEXT,
                      short_help="Scalars, histograms, summary and layout for TensorBoard.")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--logdir", required=True, type=click.Path(file_okay=False),
              help="TensorBoard log directory; each run becomes its sub-directory.")
@click.option("--no-profiler", is_flag=True,
              help="Do not copy the run's torch.profiler traces (<run>/profiler/) into the logdir.")
def tensorboard_command(runs, logdir, no_profiler):
    """Per-step scalars, bucket histograms, a summary table and a custom-scalars layout.

    Several RUNS (or a directory holding runs) go into one logdir to compare them:
    tensorboard --logdir DIR.
    """
    from syncviz.views.export.tensorboard import write_tensorboard

    Path(logdir).mkdir(parents=True, exist_ok=True)
    for path in _runs(runs):
        run = load_run(path)
        warn_problems(run)
        out = write_tensorboard(run, logdir, copy_profiler=not no_profiler)
        profiled = sorted(out.glob("*.pt.trace.json*"))
        note = f" (+{len(profiled)} profiler traces)" if profiled else ""
        click.echo(f"{path} -> {out}{note}")
    click.echo(f"view: tensorboard --logdir {logdir}")


@export_group.command("perfetto", context_settings=CONTEXT,
                      short_help="Chrome trace JSON for Perfetto / chrome://tracing.")
@click.argument("run", type=click.Path())
@click.option("-o", "--output", required=True, help="run.json or run.json.gz")
def perfetto_command(run, output):
    """Chrome trace JSON for https://ui.perfetto.dev and chrome://tracing: a process per rank,
    compute and per-bucket tracks, ready→launch arrows, bytes in flight."""
    from syncviz.views.export.perfetto import write_perfetto

    out = _output(output, (".json", ".json.gz"))
    r = _one_run(run)
    write_perfetto(r, out)
    click.echo(f"{out} ({out.stat().st_size / 1e6:.2f} MB): open it in https://ui.perfetto.dev")


@export_group.command("html", context_settings=CONTEXT,
                      short_help="One self-contained HTML report (summary, timeline, charts).")
@click.argument("run", type=click.Path())
@click.option("-o", "--output", required=True, help="report.html")
@click.option("--timeline-steps", default=3, show_default=True, type=click.IntRange(1),
              help="How many steps the timeline shows.")
def html_command(run, output, timeline_steps):
    """One self-contained HTML file (no server, works offline): summary, timeline, charts."""
    from syncviz.views.export.report import write_html

    out = _output(output, (".html", ".htm"))
    r = _one_run(run)
    write_html(r, out, timeline_steps=timeline_steps)
    click.echo(f"{out} ({out.stat().st_size / 1e6:.2f} MB)")
