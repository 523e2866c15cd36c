"""The built-in workload: a GPT (syncviz.workloads.gpt) trained on synthetic tokens with real DDP on gloo,
and ``syncviz demo`` which traces it on CPU ranks.

Run it yourself under torchrun (untraced) or under ``syncviz trace``::

    torchrun --nproc-per-node 2 -m syncviz.workloads --preset tiny --steps 5
    syncviz trace --nproc-per-node 2 -m syncviz.workloads --preset tiny --steps 5

It is an ordinary training script: syncviz instruments it from the outside like any user script.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from syncviz.trace import schema as S


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
    straggler: str = ""             # "RANK:MS": that rank sleeps MS ms before every forward (a slow rank)


SYNC_STRATEGIES = S.SYNC_STRATEGIES + ("ddp",)   # engine syncviz ("ddp" = all_reduce)


def known_strategies(engine: str) -> tuple[str, ...]:
    return S.WORKLOAD_STRATEGIES if engine == "torch" else SYNC_STRATEGIES


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
    p.add_argument("--straggler", default="", metavar="RANK:MS", help="that rank sleeps MS ms before each forward")
    a = p.parse_args(argv)
    try:
        parse_straggler(a.straggler)
    except ValueError as e:
        p.error(str(e))
    return WorkloadConfig(**{k.replace("-", "_"): v for k, v in vars(a).items()})


def parse_straggler(text: str) -> tuple[int, float] | None:
    """"RANK:MS" -> (rank, seconds); "" -> None."""
    if not text:
        return None
    rank, _, ms = str(text).partition(":")
    try:
        r, t = int(rank), float(ms)
    except ValueError:
        raise ValueError(f"--straggler wants RANK:MS, e.g. 1:50 (got {text!r})") from None
    if r < 0 or not t >= 0:
        raise ValueError(f"--straggler wants a rank >= 0 and MS >= 0 (got {text!r})")
    return r, t / 1e3


def build(cfg: WorkloadConfig):
    """Model, wrapped for the strategy, and its optimizer. Same initial weights on every rank."""
    import torch
    import torch.distributed as dist

    from syncviz.workloads.gpt import GPT, preset
    torch.manual_seed(cfg.seed)
    model = GPT(preset(cfg.preset))
    if cfg.engine == "syncviz":
        from syncviz import sync
        engine = sync.DataParallel(model, strategy=cfg.strategy if cfg.strategy != "ddp" else "all_reduce",
                                   bucket_cap_mb=cfg.bucket_cap_mb,
                                   optimizer=lambda ps: torch.optim.AdamW(ps, lr=cfg.lr))
        return engine, engine.optimizer
    if cfg.strategy in S.DS_STRATEGIES:    # DeepSpeed's engine is model and optimizer at once
        from syncviz.workloads import deepspeed_workload
        return deepspeed_workload.wrap(model, cfg)
    try:
        from syncviz.workloads import strategies
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

    from syncviz.workloads.gpt import preset, synthetic_batch
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rank = dist.get_rank()
    slow = parse_straggler(cfg.straggler)
    model, opt = build(cfg)
    deepspeed = hasattr(model, "zero_optimization_stage")   # DeepSpeed's engine scales by accum itself
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
            if slow and slow[0] == rank:
                time.sleep(slow[1])      # a real slow rank: every other rank will wait for it
            if deepspeed:    # engine.backward divides by gradient_accumulation_steps itself
                raw = model(x, y)
                model.backward(raw)
                model.step()     # an optimizer step only at the accumulation boundary
                loss = raw.detach() / cfg.accum
                continue
            ctx = model.no_sync() if (not last and hasattr(model, "no_sync")) else contextlib.nullcontext()
            with ctx:
                loss = model(x, y) / cfg.accum
                loss.backward()
        if not deepspeed:
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
        if deepspeed:
            from syncviz.workloads.deepspeed_workload import full_state_dict
        else:
            from syncviz.workloads.strategies import full_state_dict
        sd = full_state_dict(model)    # gathers FSDP shards: a collective, so every rank calls it
        if rank == 0:
            torch.save(sd, cfg.save_params)
    if deepspeed:
        from syncviz.workloads.deepspeed_workload import cleanup
        cleanup(model)
    return losses


def _recorder():
    """The recorder when this script runs under ``syncviz trace`` (None when run plainly: syncviz's
    recorder is not even imported then, so an untraced run pays nothing)."""
    import sys
    api = sys.modules.get("syncviz.record.api")
    return api.get_recorder() if api is not None else None


def main(argv=None) -> None:
    import torch.distributed as dist
    cfg = parse_args(argv)
    known = known_strategies(cfg.engine)
    if cfg.strategy not in known:
        sys.exit(f"syncviz.workloads: unknown strategy {cfg.strategy!r} for engine {cfg.engine}; "
                 f"choose from {', '.join(known)}")
    if cfg.engine == "syncviz" and cfg.strategy == "ddp":
        cfg.strategy = "all_reduce"
    from syncviz.record.options import TraceOptions
    opts = TraceOptions.from_env()           # under ``syncviz trace --backend``: that backend
    dist.init_process_group(backend=(opts.backend if opts else "") or "gloo")
    try:
        rec = _recorder()
        if rec is not None:
            rec.set_strategy(cfg.strategy if cfg.engine == "torch" else f"syncviz-{cfg.strategy}", engine=cfg.engine)
            rec.annotate(workload={k: v for k, v in vars(cfg).items() if k != "save_params"})
        train(cfg)
    finally:
        dist.destroy_process_group()
        from syncviz.record.quiesce import quiesce
        quiesce()     # let gloo's threads release Python objects before teardown (see quiesce.py)


if __name__ == "__main__":
    main()
