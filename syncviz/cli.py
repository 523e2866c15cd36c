"""The ``syncviz`` command. Each subcommand lives in the module that owns its work and is imported
only when used, so ``syncviz --help`` is instant and a broken optional part breaks only itself."""
from __future__ import annotations

import importlib
import sys

import click

from syncviz import __version__

# name -> (module, attribute, one-line help). Order is the order shown in --help.
COMMANDS = {
    "trace": ("syncviz.workloads.tracecmd", "trace_command", "Run a training script under torchrun and record its gradient sync."),
    "demo": ("syncviz.workloads.demo", "demo_command", "Trace the built-in GPT workload on CPU ranks and print the summary."),
    "summary": ("syncviz.views.summary", "summary_command", "Per-step and per-bucket report of a recorded run."),
    "compare": ("syncviz.views.compare", "compare_command", "Compare runs of different strategies on the same model."),
    "dash": ("syncviz.dashboard.app", "dash_command", "Serve the Dash replay app for runs under a directory."),
    "export": ("syncviz.views.export", "export_group", "Export a run to TensorBoard, Perfetto or a self-contained HTML report."),
    "fit": ("syncviz.model.fit", "fit_command", "Fit the α-β cost model to a run's bucket timings."),
    "simulate": ("syncviz.model.simulate", "simulate_command", "Simulate a run at other world sizes, links, bucket caps, strategies."),
    "advise": ("syncviz.model.advise", "advise_command", "Recommend a bucket cap (and strategy) for a recorded run."),
    "lesson": ("syncviz.workloads.lesson", "lesson_command", "A narrated lesson on data parallelism, each step run on real CPU ranks."),
    "plan": ("syncviz.model.plan", "plan_command", "Memory per GPU of DDP and ZeRO-1/2/3/Offload/Infinity: what fits, which to use."),
    "dataparallel": ("syncviz.model.dpvsddp", "dataparallel_command", "DataParallel beside DDP (a model): bytes, step time, GPU 0's load."),
    "sweep": ("syncviz.workloads.sweep", "sweep_command", "Run the workload at several bucket caps: predicted vs measured."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, help_ = COMMANDS[name]
        try:
            cmd = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            @click.command(name=name, help=f"{help_} (unavailable: {e})",
                           context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def unavailable(args, _e=e):
                raise click.ClickException(f"'syncviz {name}' is unavailable here: {_e}")
            return unavailable
        return cmd

    def format_commands(self, ctx, formatter):
        # Short help from the table, without importing every module just to print --help.
        rows = [(n, COMMANDS[n][2]) for n in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="syncviz")
@click.option("--debug", is_flag=True, help="On an error, show the Python traceback (also: SYNCVIZ_DEBUG=1).")
def cli(debug):
    """syncviz: a gradient-synchronization profiler and visualizer for PyTorch data parallelism.

    \b
    Typical use:
      syncviz demo                                   # trace the built-in model on 2 CPU ranks
      syncviz trace --nproc-per-node 2 train.py ...  # your own script, unchanged
      syncviz summary traces/<run>                   # what happened, per step and per bucket
      syncviz dash traces/                           # replay it in the browser
    """
    _state["debug"] = _state["debug"] or debug


_state = {"debug": False}


def main(argv=None):
    """Every error ends as one line on stderr and a non-zero exit; ``--debug`` shows the traceback."""
    import os
    _state["debug"] = os.environ.get("SYNCVIZ_DEBUG", "") not in ("", "0")
    try:
        cli.main(args=argv, prog_name="syncviz", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("syncviz: aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:     # one line, not click's three (usage, hint, error)
        where = e.ctx.command_path if e.ctx else "syncviz"
        click.echo(f"syncviz: error: {e.format_message()} (see: {where} --help)", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        if _state["debug"]:
            import traceback
            traceback.print_exc()
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("syncviz: interrupted", err=True)
        sys.exit(130)
    except SystemExit:
        raise
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except BrokenPipeError:          # `syncviz summary run | head`: not an error
        sys.stderr.close()
        sys.exit(0)
    except Exception as e:           # noqa: BLE001 - the last line of defence: one line, never a traceback
        from syncviz.trace import TraceError
        if _state["debug"]:
            import traceback
            traceback.print_exc()
        if isinstance(e, TraceError):
            click.echo(f"syncviz: error: {e}", err=True)
            sys.exit(2)
        click.echo(f"syncviz: error: {error_line(e)}"
                   + ("" if _state["debug"] else " (run with --debug for the traceback)"), err=True)
        sys.exit(1)


def error_line(e: BaseException) -> str:
    """One line for an unexpected error: its type and the first line of its message, bounded."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, MemoryError):
        text = "out of memory"
    return f"{e.__class__.__name__}: {text[:300]}" if text else e.__class__.__name__


if __name__ == "__main__":
    main()
