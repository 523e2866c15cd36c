"""``syncviz demo``: trace the built-in workload (train.py) on CPU ranks through ``syncviz trace``
and print the summary; ``--compare`` runs DDP, ZeRO-2 and ZeRO-3 and compares them;
``--compare --deepspeed`` the classic table (views/ds_compare.py)."""
from __future__ import annotations

import os

import click

from pathlib import Path

from syncviz.workloads.train import known_strategies


@click.command("demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--preset", default="mini", show_default=True,
              help="Model shape: tiny, mini (3M params), small (GPT-2 124M), medium (GPT-2 355M).")
@click.option("--steps", default=6, show_default=True, type=click.IntRange(1))
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(1), help="CPU ranks.")
@click.option("--out", default=None, help="Run directory [default: traces/demo-<preset>-<strategy>].")
@click.option("--strategy", default="ddp", show_default=True,
              help="ddp | ddp-fp16 | ddp-bf16 | powersgd | zero1 | zero2 | zero3 (engine torch); "
                   "ds-zero1 | ds-zero2 | ds-zero3 | ds-offload | ds-infinity (DeepSpeed's engine); "
                   "all_reduce | reduce_scatter (engine syncviz).")
@click.option("--engine", default="torch", show_default=True, type=click.Choice(["torch", "syncviz"]))
# 1 MB on the 10.5 MB mini GPT gives 7 buckets, ~80% of them hidden under backward (2 CPU ranks);
# DDP's own 25 MB default puts a small model in one bucket that can only start after backward.
@click.option("--bucket-cap-mb", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="DDP bucket cap (DDP's own default is 25).")
@click.option("--batch", default=4, show_default=True, type=click.IntRange(1))
@click.option("--seq", default=64, show_default=True, type=click.IntRange(1))
@click.option("--accum", default=1, show_default=True, type=click.IntRange(1), help="Micro-steps per step.")
@click.option("--compare", is_flag=True, help="Run DDP, ZeRO-2 and ZeRO-3 and print the comparison.")
@click.option("--deepspeed", "with_deepspeed", is_flag=True,
              help="With --compare: the classic table, DDP, ZeRO-1/2/3 (torch and DeepSpeed), ZeRO-Offload and "
                   "ZeRO-Infinity (DeepSpeed).")
@click.option("--profile", is_flag=True, help="Also run torch.profiler on steps 2-3.")
@click.option("--straggler", default="", metavar="RANK:MS",
              help="Make RANK slow: it sleeps MS ms before every forward (the others wait in the all-reduce).")
def demo_command(preset, steps, nproc, out, strategy, engine, bucket_cap_mb, batch, seq, accum, compare, profile,
                 straggler, with_deepspeed):
    """Trace the built-in GPT on CPU ranks (gloo) and print the summary."""
    from syncviz.workloads.gpt import PRESETS
    if preset not in PRESETS:
        raise click.BadParameter(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}", param_hint="--preset")
    if with_deepspeed and not compare:
        raise click.UsageError("--deepspeed goes with --compare")
    if compare:
        extra = {}
        if with_deepspeed:
            from syncviz.views.ds_compare import CLASSIC
            extra["strategies"] = CLASSIC
        return demo_compare(preset=preset, steps=steps, nproc=nproc, out=out, bucket_cap_mb=bucket_cap_mb,
                            batch=batch, seq=seq, **extra)
    known = known_strategies(engine)
    if strategy not in known:
        raise click.BadParameter(f"unknown strategy {strategy!r} for engine {engine}; choose from {', '.join(known)}",
                                 param_hint="--strategy")
    from syncviz.workloads.train import parse_straggler
    try:
        slow = parse_straggler(straggler)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if slow and slow[0] >= nproc:
        raise click.ClickException(f"--straggler rank {slow[0]} does not exist with --nproc {nproc}")
    run_dir = run_demo(preset=preset, steps=steps, nproc=nproc, out=out, strategy=strategy, engine=engine,
                       bucket_cap_mb=bucket_cap_mb, batch=batch, seq=seq, accum=accum, profile=profile,
                       extra=("--straggler", straggler) if straggler else ())
    from syncviz.views.summary import print_summary
    from syncviz.trace import load_run
    from syncviz.workloads.tracecmd import analyse_for_views
    analyse_for_views(run_dir)    # the dashboard's tables, cached beside the run (opening it reads them)
    print_summary(load_run(run_dir))


def run_demo(*, preset="tiny", steps=6, nproc=2, out=None, strategy="ddp", engine="torch", bucket_cap_mb=25.0,
             batch=4, seq=64, accum=1, profile=False, quiet=False, extra=()):
    """Trace the workload through ``syncviz trace`` (torchrun underneath); returns the run dir."""
    from syncviz.record.launch import run_trace
    if strategy.startswith("ds-"):    # DeepSpeed's JIT ops: built once, here, with a message
        from syncviz.workloads.ds_build import ensure_ops
        ensure_ops(strategy)
    name = f"demo-{preset}-{strategy}" if engine == "torch" else f"demo-{preset}-syncviz-{strategy}"
    out = out or os.path.join("traces", name)
    argv = ["--nproc-per-node", str(nproc), "--out", out, "--name", os.path.basename(out.rstrip("/")),
            "--overwrite"]
    if profile:
        argv += ["--profile", "--profile-steps", "2:4"]
    if quiet:
        argv += ["--quiet"]
    argv += ["-m", "syncviz.workloads", "--preset", preset, "--steps", str(steps), "--strategy", strategy,
             "--engine", engine, "--bucket-cap-mb", str(bucket_cap_mb), "--batch", str(batch), "--seq", str(seq),
             "--accum", str(accum), *extra]
    return run_trace(argv)


def demo_compare(preset="tiny", steps=6, nproc=2, out=None, bucket_cap_mb=25.0, batch=4, seq=64,
                 strategies=("ddp", "zero2", "zero3")) -> list[Path]:
    """Trace the built-in model once per strategy (runs land under ``out``, default traces/) and
    print the comparison."""
    from syncviz.views.compare import load_runs, render, run_comparison, wide_console
    root = Path(out or "traces")
    dirs = []
    for s in strategies:
        click.echo(f"[syncviz] tracing {preset} with {s} on {nproc} ranks ...", err=True)
        dirs.append(run_demo(preset=preset, steps=steps, nproc=nproc, strategy=s, bucket_cap_mb=bucket_cap_mb,
                             batch=batch, seq=seq, out=os.fspath(root / f"demo-{preset}-{s}"), quiet=True))
    render([run_comparison(r) for r in load_runs(dirs)], wide_console())
    return dirs
