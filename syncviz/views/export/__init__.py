"""``syncviz export``: a recorded run in the tools people already use.

\b
  syncviz export tensorboard RUN... --logdir DIR   scalars, histograms, summary text, layout
  syncviz export perfetto RUN -o run.json[.gz] [--steps A:B]   Chrome trace for ui.perfetto.dev / chrome://tracing
  syncviz export html RUN -o report.html           one self-contained file with the key charts
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import click

from syncviz.trace import TraceError, find_runs, load_run, warn_problems
from syncviz.trace.read import check_fits_whole
from syncviz.views import refuse_with_whole
from syncviz.views.runcache import kept_spans

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


def _one_path(path: str) -> Path:
    runs = _runs((path,))
    if len(runs) > 1:
        raise click.UsageError(f"{path} holds {len(runs)} runs; name one of them "
                               f"(e.g. {runs[0]})")
    return runs[0]


# Memory of a whole-run Perfetto export over the run's rank-file bytes: the 10^7-event DDP run (529 MB
# of rank files) peaked at 22.0 GB, 42x, its trace's JSON held whole before it is written (2026-11-29).
PERFETTO_FACTOR = 42
# Trace JSON above this is reported as too big for Perfetto's UI in a browser: the UI's trace processor
# runs in WebAssembly with ~2 GB of memory "typical" (perfetto.dev/docs/visualization/large-traces), and
# a 900 MB JSON trace crashed it (google/perfetto#99).
PERFETTO_UI_BYTES = 1 << 30


def _one_run(path: str):
    run = load_run(_one_path(path))
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
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Worker processes per run, one partition of ranks each at a time [CPU count].")
@click.option("--whole", is_flag=True, help="Load each run into memory at once (same event files' numbers; memory "
              "grows with the run). Default: by partitions of ranks, as `syncviz summary`.")
def tensorboard_command(runs, logdir, no_profiler, jobs, whole):
    """Per-step scalars, bucket histograms, a summary table and a custom-scalars layout.

    Several RUNS (or a directory holding runs) go into one logdir to compare them:
    tensorboard --logdir DIR.
    """
    refuse_with_whole(whole, jobs=jobs is not None)
    from syncviz.analysis.partitioned import summarize
    from syncviz.views.export.tensorboard import write_tensorboard

    Path(logdir).mkdir(parents=True, exist_ok=True)
    for path in _runs(runs):
        with tempfile.TemporaryDirectory(prefix="syncviz-tb-") as scratch:
            # by partitions of ranks: the histograms' values wait in scratch files, one step read at a time
            run = load_run(path) if whole else summarize(path, jobs=jobs, export_dir=scratch)
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
@click.option("--steps", "steps_spec", default=None, metavar="A:B",
              help="Only optimizer steps A to B-1 (A inclusive, B exclusive; A: or :B leave a side open). "
                   "Reads just those steps of each rank file, so a slice of a huge run exports quickly "
                   "in little memory. [default: the whole run]")
def perfetto_command(run, output, steps_spec):
    """Chrome trace JSON for https://ui.perfetto.dev and chrome://tracing: a process per rank,
    compute and per-bucket tracks, ready→launch arrows, bytes in flight.

    \b
      syncviz export perfetto traces/my-run -o run.json.gz
      syncviz export perfetto traces/my-run -o steps-10-12.json --steps 10:12
    """
    from syncviz.views.export.perfetto import write_perfetto

    out = _output(output, (".json", ".json.gz"))
    if steps_spec is None:
        path = _one_path(run)
        check_fits_whole(path, PERFETTO_FACTOR, "exported whole to Perfetto",
                         "export a range of steps with --steps A:B (it reads those steps alone)")
        r, steps = _one_run(path), None
    else:
        steps = parse_steps(steps_spec)
        runs = _runs((run,))
        if len(runs) > 1:
            raise click.UsageError(f"{run} holds {len(runs)} runs; name one of them (e.g. {runs[0]})")
        # one step before the range as well: a collective queued behind the previous step's keeps
        # the whole run's numbers (the export shows steps A..B-1 only)
        # spans: where each step lies in the rank files, when `syncviz summary` kept it (a big run)
        r = load_run(runs[0], steps=(max(steps[0] - 1, 0), steps[1]), spans=kept_spans(runs[0]))
        warn_problems(r)
        have = r.events["step"].to_numpy()
        if not ((have >= steps[0]) & (have < steps[1])).any():
            recorded = r.meta.get("steps_recorded")
            more = f" (run.json: {recorded} steps recorded)" if isinstance(recorded, int) else ""
            raise click.BadParameter(f"{steps_spec}: no events of these steps in {runs[0]}{more}",
                                     param_hint="--steps")
    stats = {}
    write_perfetto(r, out, steps=steps, stats=stats)
    what = f" (steps {steps[0]} to {steps[1] - 1})" if steps and steps[0] + 1 < steps[1] < 2 ** 62 else \
        (f" (step {steps[0]})" if steps and steps[1] == steps[0] + 1 else (f" (steps {steps[0]} on)" if steps else ""))
    click.echo(f"{out} ({out.stat().st_size / 1e6:.2f} MB){what}: open it in https://ui.perfetto.dev")
    if stats["json_bytes"] > PERFETTO_UI_BYTES:
        click.echo(f"syncviz: warning: {out.name} holds {stats['json_bytes'] / 1e9:.1f} GB of trace JSON: more than "
                   "Perfetto's UI loads in a browser (its trace processor has ~2 GB of memory there, and a JSON trace "
                   "takes more once loaded). Open it through `trace_processor --httpd` "
                   "(https://perfetto.dev/docs/visualization/large-traces), or export fewer steps with --steps A:B",
                   err=True)


def parse_steps(spec: str) -> tuple[int, int]:
    """'A:B' → (A, B): steps A <= step < B; 'A:' runs to the end, ':B' starts at 0."""
    a, sep, b = spec.strip().partition(":")
    try:
        if not sep:
            raise ValueError
        first, stop = int(a) if a.strip() else 0, int(b) if b.strip() else 2 ** 62
    except ValueError:
        raise click.BadParameter(f"{spec!r}: give A:B (steps A to B-1, e.g. 10:12)", param_hint="--steps") from None
    if first < 0 or stop <= first:
        raise click.BadParameter(f"{spec!r}: need 0 <= A < B (steps A to B-1)", param_hint="--steps")
    return first, stop


@export_group.command("html", context_settings=CONTEXT,
                      short_help="One self-contained HTML report (summary, timeline, charts).")
@click.argument("run", type=click.Path())
@click.option("-o", "--output", required=True, help="report.html")
@click.option("--timeline-steps", default=3, show_default=True, type=click.IntRange(1),
              help="How many steps the timeline shows.")
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Worker processes, one partition of ranks each at a time [CPU count].")
@click.option("--whole", is_flag=True, help="Load the run into memory at once (the same report; memory grows with "
              "the run). Default: by partitions of ranks, as `syncviz summary`; the timeline's steps are read alone.")
def html_command(run, output, timeline_steps, jobs, whole):
    """One self-contained HTML file (no server, works offline): summary, timeline, charts."""
    refuse_with_whole(whole, jobs=jobs is not None)
    from syncviz.views.export.report import write_html

    out = _output(output, (".html", ".htm"))
    if whole:
        write_html(_one_run(run), out, timeline_steps=timeline_steps)
    else:
        from syncviz.analysis.partitioned import summarize
        path = _one_path(run)
        with tempfile.TemporaryDirectory(prefix="syncviz-html-") as scratch:
            tables = summarize(path, jobs=jobs, export_dir=scratch)    # by partitions of ranks
            warn_problems(tables)
            write_html(tables, out, timeline_steps=timeline_steps)
    click.echo(f"{out} ({out.stat().st_size / 1e6:.2f} MB)")
