"""The built-in workload: a GPT (syncviz.gpt) trained on synthetic tokens with real DDP on gloo,
and ``syncviz demo`` which traces it on CPU ranks.

Run it yourself under torchrun (untraced) or under ``syncviz trace``::

    torchrun --nproc-per-node 2 -m syncviz.workloads --preset tiny --steps 5
    syncviz trace --nproc-per-node 2 -m syncviz.workloads --preset tiny --steps 5

It is an ordinary training script: syncviz instruments it from the outside like any user script.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import click


@dataclass
class WorkloadConfig:
    """One training run of the built-in model."""
    preset: str = "tiny"            # model shape: tiny | mini | small (GPT-2 124M) | medium (355M)
    steps: int = 5                  # optimizer steps
    batch: int = 4                  # sequences per rank per micro-step
    seq: int = 64                   # tokens per sequence
    accum: int = 1                  # micro-steps per optimizer step (gradient accumulation, no_sync)
    lr: float = 1e-3
    seed: int = 0
    bucket_cap_mb: float = 25.0     # DDP bucket cap (DDP's default is 25)
    strategy: str = "ddp"           # see STRATEGIES
    engine: str = "torch"           # torch (DDP/ZeRO/FSDP) | syncviz (syncviz.sync engine)
    save_params: str = ""           # rank 0 saves final parameters here (tests compare runs)
    threads: int = 0                # torch intra-op threads per rank (0 = leave torch's choice)
    torch_profiler: bool = False    # run torch.profiler over every step (benchmarks/overhead.py)


STRATEGIES = ("ddp",)   # extended by syncviz.strategies when present
SYNC_STRATEGIES = ("all_reduce", "reduce_scatter", "ddp")   # engine syncviz ("ddp" = all_reduce)


def _strategies() -> tuple[str, ...]:
    try:
        from . import strategies
        return tuple(strategies.STRATEGIES)
    except ImportError:
        return STRATEGIES


def parse_args(argv=None) -> WorkloadConfig:
    p = argparse.ArgumentParser(prog="python -m syncviz.workloads",
                                description="Train the built-in GPT with data parallelism on synthetic tokens.")
    d = WorkloadConfig()
    p.add_argument("--preset", default=d.preset)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--seq", type=int, default=d.seq)
    p.add_argument("--accum", type=int, default=d.accum)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb)
    p.add_argument("--strategy", default=d.strategy)
    p.add_argument("--engine", default=d.engine, choices=("torch", "syncviz"))
    p.add_argument("--save-params", default="")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--torch-profiler", action="store_true")
    a = p.parse_args(argv)
    return WorkloadConfig(**{k.replace("-", "_"): v for k, v in vars(a).items()})


def build(cfg: WorkloadConfig):
    """Model, wrapped for the strategy, and its optimizer. Same initial weights on every rank."""
    import torch
    import torch.distributed as dist

    from .gpt import GPT, preset
    torch.manual_seed(cfg.seed)
    model = GPT(preset(cfg.preset))
    if cfg.engine == "syncviz":
        from . import sync
        engine = sync.DataParallel(model, strategy=cfg.strategy if cfg.strategy != "ddp" else "all_reduce",
                                   bucket_cap_mb=cfg.bucket_cap_mb,
                                   optimizer=lambda ps: torch.optim.AdamW(ps, lr=cfg.lr))
        return engine, engine.optimizer
    try:
        from . import strategies       # every strategy (DDP too): adds run.json's strategy facts
    except ImportError:
        strategies = None
    if strategies is not None:
        return strategies.wrap(model, cfg)
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model, bucket_cap_mb=cfg.bucket_cap_mb, process_group=dist.group.WORLD)
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=cfg.lr)


def train(cfg: WorkloadConfig) -> list[float]:
    """The training loop (called on every rank after init_process_group). Returns losses."""
    import contextlib

    import torch
    import torch.distributed as dist

    from .gpt import preset, synthetic_batch
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rank = dist.get_rank()
    model, opt = build(cfg)
    losses = []
    prof = None
    if cfg.torch_profiler:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.start()
    for step in range(cfg.steps):
        t = time.perf_counter()
        for micro in range(cfg.accum):
            x, y = synthetic_batch(preset(cfg.preset), cfg.batch, cfg.seq,
                                   seed=cfg.seed * 1_000_003 + (step * cfg.accum + micro) * 1009 + rank)
            last = micro == cfg.accum - 1
            ctx = model.no_sync() if (not last and hasattr(model, "no_sync")) else contextlib.nullcontext()
            with ctx:
                loss = model(x, y) / cfg.accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item() * cfg.accum)
        if rank == 0:
            print(f"step {step:4d}  loss {losses[-1]:.4f}  {1e3 * (time.perf_counter() - t):8.1f} ms", flush=True)
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    if cfg.save_params:
        from .strategies import full_state_dict
        sd = full_state_dict(model)    # gathers FSDP shards: a collective, so every rank calls it
        if rank == 0:
            torch.save(sd, cfg.save_params)
    return losses


def main(argv=None) -> None:
    import torch.distributed as dist
    cfg = parse_args(argv)
    known = _strategies() if cfg.engine == "torch" else SYNC_STRATEGIES
    if cfg.strategy not in known:
        sys.exit(f"syncviz.workloads: unknown strategy {cfg.strategy!r} for engine {cfg.engine}; "
                 f"choose from {', '.join(known)}")
    if cfg.engine == "syncviz" and cfg.strategy == "ddp":
        cfg.strategy = "all_reduce"
    dist.init_process_group(backend=os.environ.get("SYNCVIZ_BACKEND") or "gloo")
    try:
        from .record import get_recorder
        rec = get_recorder()
        if rec is not None:
            rec.strategy = cfg.strategy if cfg.engine == "torch" else f"syncviz-{cfg.strategy}"
            rec.engine = cfg.engine
            rec.meta_extra["workload"] = {k: v for k, v in vars(cfg).items() if k != "save_params"}
        train(cfg)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ syncviz demo

@click.command("demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--preset", default="tiny", show_default=True,
              help="Model shape: tiny, mini, small (GPT-2 124M), medium (GPT-2 355M).")
@click.option("--steps", default=6, show_default=True, type=click.IntRange(1))
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(1), help="CPU ranks.")
@click.option("--out", default=None, help="Run directory [default: traces/demo-<preset>-<strategy>].")
@click.option("--strategy", default="ddp", show_default=True, help="ddp | ddp-fp16 | ddp-bf16 | powersgd | zero1 | zero2 | zero3 (engine torch); all_reduce | reduce_scatter (engine syncviz).")
@click.option("--engine", default="torch", show_default=True, type=click.Choice(["torch", "syncviz"]))
@click.option("--bucket-cap-mb", default=25.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--batch", default=4, show_default=True, type=click.IntRange(1))
@click.option("--seq", default=64, show_default=True, type=click.IntRange(1))
@click.option("--accum", default=1, show_default=True, type=click.IntRange(1), help="Micro-steps per step.")
@click.option("--compare", is_flag=True, help="Run DDP, ZeRO-2 and ZeRO-3 and print the comparison.")
@click.option("--profile", is_flag=True, help="Also run torch.profiler on steps 2-3.")
def demo_command(preset, steps, nproc, out, strategy, engine, bucket_cap_mb, batch, seq, accum, compare, profile):
    """Trace the built-in GPT on CPU ranks (gloo) and print the summary."""
    from .gpt import PRESETS
    if preset not in PRESETS:
        raise click.BadParameter(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}", param_hint="--preset")
    if compare:
        from .compare import demo_compare
        return demo_compare(preset=preset, steps=steps, nproc=nproc, out=out, bucket_cap_mb=bucket_cap_mb,
                            batch=batch, seq=seq)
    known = _strategies() if engine == "torch" else SYNC_STRATEGIES
    if strategy not in known:
        raise click.BadParameter(f"unknown strategy {strategy!r} for engine {engine}; choose from {', '.join(known)}",
                                 param_hint="--strategy")
    run_dir = run_demo(preset=preset, steps=steps, nproc=nproc, out=out, strategy=strategy, engine=engine,
                       bucket_cap_mb=bucket_cap_mb, batch=batch, seq=seq, accum=accum, profile=profile)
    from .summary import print_summary
    from .trace import load_run
    print_summary(load_run(run_dir))


def run_demo(*, preset="tiny", steps=6, nproc=2, out=None, strategy="ddp", engine="torch", bucket_cap_mb=25.0,
             batch=4, seq=64, accum=1, profile=False, quiet=False, extra=()):
    """Trace the workload through ``syncviz trace`` (torchrun underneath); returns the run dir."""
    from .launch import run_trace
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


if __name__ == "__main__":
    main()
