"""``syncviz simulate``: write a simulated run (any world size, link, bucket cap, strategy) from a
recorded run or a model description, and ``predict``: the same simulation measured in memory with
syncviz.analysis (used by ``syncviz advise`` and ``syncviz sweep``).

    syncviz simulate --preset gpt2-medium-8                 # teaching presets (SCENARIOS)
    syncviz simulate traces/demo-small-ddp --world-size 64 --link ib-200 --bucket-cap-mb 50
    syncviz simulate --params 7e9 --layers 32 --tokens 4096 --tflops 350 --strategy zero2
"""
from __future__ import annotations

import math
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import click

from syncviz.model import costmodel as CM

from syncviz.model import fit as FIT
from syncviz.model import simtrace as ST
from syncviz.model.simcore import COMPRESSION, STRATEGIES, Jitter, SimConfig, Timeline
from syncviz.model.simprofile import MODELS, SCENARIOS, ModelSpec, Profile, profile_from_run, profile_from_spec

GPU_MEMORY_GB = 80.0   # H100/A100-80GB: the teaching presets warn when model states exceed it


def optimizer_state_bytes(profile: Profile) -> float:
    """K of a profile: set by --optimizer-state-bytes, else its model spec's, else the default 8."""
    if profile.source.get("optimizer_state_bytes") is not None:
        return float(profile.source["optimizer_state_bytes"])
    spec = profile.source.get("model") or {}
    return float(spec.get("optimizer_bytes", 8.0) + spec.get("master_bytes", 0.0)) if spec \
        else float(CM.DEFAULT_OPTIMIZER_STATE_BYTES)


def with_optimizer_state_bytes(profile: Profile, k: float | None) -> Profile:
    if k is None:
        return profile
    return replace(profile, source={**profile.source, "optimizer_state_bytes": float(k)})


def memory_for(profile: Profile, strategy: str, world_size: int) -> CM.Memory:
    mspec = CM.MemorySpec(profile.params, profile.param_itemsize, profile.grad_itemsize,
                          *CM.optimizer_split(optimizer_state_bytes(profile)))
    return CM.memory_per_gpu(mspec, strategy, world_size)


OPTIMIZER_STATE_OPTION = click.option(
    "--optimizer-state-bytes", "k_bytes", type=click.Choice(["8", "12"]), default="8", show_default=True,
    help="Optimizer state per parameter in memory figures: 8 = Adam m and v in fp32; "
         "12 = plus an fp32 master copy of the weights (mixed precision, as the ZeRO paper counts).")


def run_meta(name: str, tl: Timeline, extra: dict | None = None) -> dict:
    """run.json of a simulated run: the ordinary keys plus the cost-model parameters."""
    from syncviz import __version__
    from syncviz.trace import new_meta
    p, cfg = tl.p, tl.cfg
    gpn = cfg.gpus_per_node
    strategy = cfg.strategy if cfg.compression == "none" else \
        {"fp16": "ddp-fp16", "bf16": "ddp-bf16", "powersgd": "powersgd"}[cfg.compression]
    mem = memory_for(p, cfg.strategy, cfg.world_size)
    meta = new_meta(name, cfg.world_size, nodes=math.ceil(cfg.world_size / gpn), backend=p.backend,
                    device=p.device, strategy=strategy, engine="simulated", syncviz_version=__version__,
                    command=["syncviz", "simulate", *sys.argv[2:]] if sys.argv[1:2] == ["simulate"] else None,
                    model={"name": p.name, "params": p.params, "bytes": p.params * p.param_itemsize,
                           "grad_bytes": p.params * p.grad_itemsize},
                    ddp={"bucket_cap_mb": cfg.bucket_cap_mb, "first_bucket_cap_mb": cfg.first_bucket_cap_mb,
                         "gradient_as_bucket_view": False, "static_graph": False,
                         "find_unused_parameters": False, "comm_hook": getattr(tl, "hook", "fsdp")},
                    memory={"params_bytes": mem.params, "grads_bytes": mem.grads, "optimizer_bytes": mem.optimizer,
                            "peak_allocated_bytes": None, "host_bytes": mem.host,
                            "optimizer_state_bytes_per_param": optimizer_state_bytes(p)},
                    ranks=[{"rank": r, "host": f"sim-node{r // gpn}", "pid": 0, "local_rank": r % gpn,
                            "node": r // gpn, "clock_offset_ns": 0, "clock_error_ns": 0}
                           for r in range(cfg.world_size)])
    meta["simulated"] = {
        "link": asdict(cfg.link), "algo": cfg.algo, "contention": cfg.contention, "strategy": cfg.strategy,
        "compression": cfg.compression,
        "jitter": asdict(cfg.jitter), "gpus_per_node": gpn, "buckets": int(len(getattr(tl, "x", []))),
        "units": int(getattr(tl, "units", 0)),
        "profile": {"name": p.name, "forward_ns": p.forward_ns, "pre_backward_ns": p.pre_backward_ns,
                    "backward_ns": p.backward_ns,
                    "optimizer_ns": p.optimizer_ns, "gap_ns": p.gap_ns, "post_comm_ns": p.post_comm_ns,
                    "hook_ns": p.hook_ns, "copy_ns_per_byte": p.copy_ns_per_byte,
                    "compute_cv": p.compute_cv, "tensors": len(p.tensor_names),
                    "grad_dtype": p.grad_dtype,
                    "param_dtype": p.param_dtype, **p.source},
        **(extra or {})}
    return meta


def simulate(profile: Profile, cfg: SimConfig, out, *, name: str | None = None, grad_ready: str = "param",
             workers: int | None = None, steps_per_batch: int | None = None, extra: dict | None = None) -> dict:
    """Simulate and write a run directory; returns timings {rows, simulate_s, write_s}."""
    t0 = time.perf_counter()
    tl = Timeline(profile, cfg)
    t1 = time.perf_counter()
    meta = run_meta(name or Path(out).name, tl, extra)
    rows = ST.write(out, tl, meta, grad_ready=grad_ready, workers=workers, steps_per_batch=steps_per_batch)
    t2 = time.perf_counter()
    return {"rows": rows, "simulate_s": t1 - t0, "write_s": t2 - t1, "timeline": tl}


def predict(profile: Profile, cfg: SimConfig, ranks=None) -> dict:
    """Run the simulation in memory and measure it with analysis.run_summary (same definitions as
    for a recorded run): step_ms, exposed_ms, comm_busy_ms, … plus the bucket count."""
    from syncviz import analysis as A
    from syncviz.trace import Run
    tl = Timeline(profile, cfg)
    if ranks is None:
        ranks = range(cfg.world_size) if cfg.world_size <= 8 else [0, cfg.world_size - 1]
    ev = ST.events_frame(tl, ranks=ranks, grad_ready="none")
    run = Run(path=Path("<simulated>"), meta=run_meta("predicted", tl), events=ev,
              layouts=ev.iloc[:0][["rank"]])
    s = A.run_summary(run)
    s.update(headline_means(ev))
    s["buckets"] = int(len(getattr(tl, "x", [])))
    s["comm_ns_per_step"] = float(tl.comm_ns.sum())
    return s


def headline_means(run_or_events) -> dict:
    """Means over the headline (rank, step) rows of step time and exposed comm, in ms: since
    issue 11 the same aggregate as run_summary's headline (medians were fragile when exposed comm
    is bimodal: on 2 ranks the faster one waits for the slower one every step, the slower one
    does not)."""
    from syncviz import analysis as A
    h = A.headline_steps(A.step_metrics(run_or_events))
    return {"step_mean_ms": float(h["step_ns"].mean()) / 1e6, "exposed_mean_ms": float(h["exposed_ns"].mean()) / 1e6}


# -------------------------------------------------------------------------------------- CLI

def _link(name, gbps, latency_us, fitted: CM.Link | None, default: str) -> CM.Link:
    if name is None and gbps is None and latency_us is None and fitted is not None:
        return fitted
    if name is None and (gbps is not None or latency_us is not None):
        base = fitted or CM.LINKS[default]
        return CM.get_link(None, busbw_gbps=gbps if gbps is not None else base.busbw_gbps,
                           latency_us=latency_us if latency_us is not None else base.latency_us)
    return CM.get_link(name or default, busbw_gbps=gbps, latency_us=latency_us)


def _straggler(text: str | None) -> tuple[int, float]:
    if not text:
        return -1, 0.0
    try:
        rank, frac = text.split(":")
        return int(rank), float(frac)
    except ValueError:
        raise click.BadParameter(f"expected RANK:SLOWDOWN, e.g. 3:0.2 (got {text!r})", param_hint="--straggler")


@click.command("simulate", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("source_run", required=False, type=click.Path())
@click.option("--preset", type=click.Choice(list(SCENARIOS)), help="Teaching preset (model, GPUs, link, strategy).")
@click.option("--model", "model_name", type=click.Choice(list(MODELS)), help="Model description preset.")
@click.option("--params", type=float, help="Model description: parameter count (e.g. 7e9).")
@click.option("--layers", type=int, help="Model description: transformer blocks.")
@click.option("--tokens", type=int, help="Model description: tokens per GPU per step.")
@click.option("--tflops", type=float, help="Model description: achieved TFLOP/s per GPU.")
@click.option("--world-size", type=int, help="Ranks (GPUs) [source run's, or preset's].")
@click.option("--link", "link_name", type=click.Choice(list(CM.LINKS) + ["custom"]),
              help="Interconnect preset [fitted to the source run; nvlink otherwise].")
@click.option("--link-gbps", type=float, help="Bus bandwidth in GB/s (overrides the preset's).")
@click.option("--link-latency-us", type=float, help="Per-hop latency in µs (overrides the preset's).")
@click.option("--algo", type=click.Choice(CM.ALGOS), default="auto", show_default=True)
@click.option("--strategy", type=click.Choice(STRATEGIES), help="[ddp, or the preset's]")
@click.option("--compression", type=click.Choice(COMPRESSION), default="none", show_default=True,
              help="DDP comm hook: fp16/bf16 halve fp32 bytes; powersgd sends rank-4 factors.")
@click.option("--bucket-cap-mb", type=float, help="DDP bucket cap in MiB [source run's, or 25].")
@click.option("--first-bucket-cap-mb", type=float, help="First bucket's cap in MiB [source run's, or 1].")
@click.option("--steps", type=int, help="Steps to simulate [20, or the preset's].")
@click.option("--jitter/--no-jitter", default=True, show_default=True, help="Per-rank compute and start noise.")
@click.option("--straggler", help="RANK:SLOWDOWN, e.g. 3:0.2 makes rank 3 20% slower.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--grad-ready", type=click.Choice(ST.GRAD_READY_MODES), default="param", show_default=True,
              help="grad_ready rows per parameter, per bucket (its last gradient) or none.")
@click.option("--out", type=click.Path(), help="Run directory [traces/sim-<name>-<strategy>-<N>].")
@click.option("--overwrite", is_flag=True, help="Replace an existing run directory's trace files.")
@click.option("--workers", type=int, help="Writer processes [by size, up to the CPU count].")
@click.option("--steps-per-batch", type=click.IntRange(1, 127), default=None,
              help="Steps per Arrow record batch: 1 is what syncviz trace writes [1 up to 20,000 rank-steps, else up to "
                   "127: fewer, bigger batches write faster, but a reader of one step then decodes its neighbours too].")
@OPTIMIZER_STATE_OPTION
def simulate_command(source_run, preset, model_name, params, layers, tokens, tflops, world_size, link_name,
                     link_gbps, link_latency_us, algo, strategy, compression, bucket_cap_mb, first_bucket_cap_mb,
                     steps, jitter, straggler, seed, gpus_per_node, grad_ready, out, overwrite, workers, steps_per_batch,
                     k_bytes):
    """Simulate a run and write it as an ordinary syncviz trace (every view works on it).

    The source is a recorded run (SOURCE_RUN: its measured gradient-ready times, compute phases
    and fitted α/β), a teaching --preset, a --model preset, or a model description
    (--params --layers --tokens --tflops)."""
    try:
        scen, fitted, extra = None, None, {}
        if source_run and (preset or model_name or params):
            raise click.ClickException("give either SOURCE_RUN or a preset/model description, not both")
        if source_run:
            from syncviz.trace import load_run
            run = load_run(source_run)
            profile = profile_from_run(run)
            fit, _ = FIT.fit_run(run)
            fitted = fit.link()
            extra["fit"] = fit.as_dict()
            defaults = dict(world=run.world_size, strategy="ddp",
                            cap=(run.meta.get("ddp") or {}).get("bucket_cap_mb") or 25.0,
                            first=(run.meta.get("ddp") or {}).get("first_bucket_cap_mb") or 1.0, steps=20)
        else:
            if preset:
                scen = SCENARIOS[preset]
                model_name = model_name or scen.model
            spec = MODELS[model_name] if model_name else None
            custom = {k: v for k, v in (("params", params), ("layers", layers), ("tokens_per_gpu", tokens),
                                        ("tflops", tflops)) if v is not None}
            if spec is None:
                missing = [o for o, k in (("--params", "params"), ("--layers", "layers"),
                                          ("--tokens", "tokens_per_gpu"), ("--tflops", "tflops")) if k not in custom]
                if missing:
                    raise click.ClickException("give SOURCE_RUN, --preset, --model, or a model description "
                                           f"(missing {', '.join(missing)})")
                spec = ModelSpec("custom", int(custom.pop("params")), **custom)
            else:
                spec = replace(spec, **{k: (int(v) if k == "params" else v) for k, v in custom.items()})
            profile = profile_from_spec(spec)
            defaults = dict(world=scen.world_size if scen else 8, strategy=scen.strategy if scen else "ddp",
                            cap=scen.bucket_cap_mb if scen else 25.0, first=1.0, steps=scen.steps if scen else 20)
            extra["preset"] = preset
        profile = with_optimizer_state_bytes(profile, float(k_bytes))
        link = _link(link_name, link_gbps, link_latency_us, fitted, scen.link if scen else "nvlink")
        # contention was measured with the recorded link and devices; it does not carry to others
        contention = extra["fit"]["contention"] if fitted is not None and link is fitted else 0.0
        srank, slow = _straggler(straggler)
        jit = replace(Jitter(), seed=seed, straggler=srank, straggler_slowdown=slow) if jitter else \
            replace(Jitter.none(), seed=seed, straggler=srank, straggler_slowdown=slow)
        cfg = SimConfig(world_size=world_size if world_size is not None else defaults["world"],
                        steps=steps if steps is not None else defaults["steps"],
                        strategy=strategy or defaults["strategy"],
                        bucket_cap_mb=bucket_cap_mb if bucket_cap_mb is not None else defaults["cap"],
                        first_bucket_cap_mb=first_bucket_cap_mb if first_bucket_cap_mb is not None else defaults["first"],
                        link=link, algo=algo, compression=compression, jitter=jit,
                        gpus_per_node=gpus_per_node, contention=contention).validate()
        out = Path(out or f"traces/sim-{preset or profile.name}-{cfg.strategy}-{cfg.world_size}")
        _prepare_out(out, overwrite)
        res = simulate(profile, cfg, out, grad_ready=grad_ready, workers=workers, steps_per_batch=steps_per_batch,
                       extra=extra)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    _report(out, res, cfg, profile)
    if scen is not None:
        click.echo(f"preset {preset}: {scen.note}")


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise click.ClickException(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise click.ClickException(f"{out} already exists; pass --overwrite or another --out")
        from syncviz.trace import is_run_dir
        if not is_run_dir(out):
            raise click.ClickException(f"{out} is not a syncviz run directory; refusing to overwrite it")
        for f in out.iterdir():   # only trace files: never remove what a user put there
            if f.name == "run.json" or (f.suffix == ".arrow" and f.name.startswith(("rank-", "layout-"))):
                f.unlink()
            elif f.is_dir() and f.name == "profiler":
                shutil.rmtree(f)


def _report(out: Path, res: dict, cfg: SimConfig, profile: Profile) -> None:
    from syncviz import analysis as A
    from syncviz.trace import load_run
    tl = res["timeline"]
    total = res["simulate_s"] + res["write_s"]
    ranks = None if cfg.world_size <= 8 else [0, cfg.world_size - 1]
    s = A.run_summary(load_run(out, ranks=ranks))
    mem = memory_for(profile, cfg.strategy, cfg.world_size)
    unit = f"{len(tl.x)} buckets" if hasattr(tl, "x") else f"{tl.units} ZeRO-3 units (one per block)"
    click.echo(f"simulated {profile.name}: {cfg.world_size} ranks × {cfg.steps} steps, {cfg.strategy}"
               f"{'' if cfg.compression == 'none' else ' + ' + cfg.compression}, {unit}, link {cfg.link.name} "
               f"({cfg.link.busbw_gbps:g} GB/s busbw, {cfg.link.latency_us:g} µs)")
    click.echo(f"wrote {res['rows']:,} events to {out} in {total:.2f} s "
               f"({res['rows'] / max(total, 1e-9) / 1e6:.1f} M events/s)")
    where = "all ranks" if ranks is None else f"ranks {ranks[0]} and {ranks[1]}"
    click.echo(f"predicted ({where}, steps after the first): step {s['step_ms']:.2f} ms, compute {s['compute_ms']:.2f} ms, "
               f"comm busy {s['comm_busy_ms']:.2f} ms, exposed {s['exposed_ms']:.2f} ms "
               f"({s['exposed_pct']:.0f}% of comm)")
    gb = mem.gpu / 1e9
    warn = f"  — more than {GPU_MEMORY_GB:.0f} GB: does not fit" if gb > GPU_MEMORY_GB and profile.device == "cuda" else ""
    click.echo(f"model states per GPU ({cfg.strategy}; {CM.k_note(optimizer_state_bytes(profile))}): "
               f"params {mem.params / 1e9:.2f} GB, grads {mem.grads / 1e9:.2f} GB, "
               f"optimizer {mem.optimizer / 1e9:.2f} GB = {gb:.2f} GB{warn}")
    click.echo(f"look at it: syncviz summary {out}   |   syncviz dash {out.parent}")
