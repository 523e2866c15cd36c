"""``syncviz advise RUN``: which DDP bucket cap (and first-bucket cap) minimizes the predicted step
time of a recorded run, the predicted exposed communication of each candidate, and whether a
compression hook or a ZeRO strategy would pay off. ``syncviz sweep``: runs the built-in workload
at several caps and prints predicted vs measured.

Predictions come from syncviz.model.simulate.predict: the run's own compute timeline (per-gradient
ready times, forward, optimizer, and how much the ranks' compute differs within a step) replayed
through the DDP pipeline under the α-β(-κ) cost model fitted to the run's own buckets, and
measured with the same analysis functions as a real run.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

import click

from syncviz.model import costmodel as CM

from syncviz.model import fit as FIT
from syncviz.model.simcore import Jitter, SimConfig
from syncviz.model.simprofile import profile_from_run
from syncviz.model.simulate import (OPTIMIZER_STATE_OPTION, memory_for, optimizer_state_bytes, predict,
                                    with_optimizer_state_bytes)

DEFAULT_CAPS = (1, 2, 5, 10, 25, 50, 100, 250)
# Simulated steps per prediction: the run's measured rank-to-rank compute spread is replayed as
# noise (a slower rank makes the others wait), so medians need a few dozen steps to settle.
PREDICT_STEPS = 41
FIRST_CAPS = (1,)      # DDP's own default first bucket (1 MiB), tried besides "same as the cap"


def parse_caps(text: str) -> list[float]:
    try:
        caps = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated MB values, got {text!r}", param_hint="--caps")
    if not caps or any(not (c > 0) for c in caps):
        raise click.BadParameter("bucket caps must be > 0 MB", param_hint="--caps")
    return caps


def _row(p: dict, **kw) -> dict:
    return dict(kw, step_ms=p["step_ms"], comm_ms=p["comm_busy_ms"], exposed_ms=p["exposed_ms"],
                buckets=p["buckets"])


def advise(run, caps=DEFAULT_CAPS, world_size: int | None = None, link: CM.Link | None = None,
           optimizer_state_bytes_per_param: float | None = None) -> dict:
    """Predictions for every candidate; the best cap; compression and strategy alternatives.
    Memory figures count ``optimizer_state_bytes_per_param`` (K; default 8, costmodel)."""
    from syncviz import analysis as A
    fit, _ = FIT.fit_run(run)
    prof = with_optimizer_state_bytes(profile_from_run(run), optimizer_state_bytes_per_param)
    ddp = run.meta.get("ddp") or {}
    cur_cap = float(ddp.get("bucket_cap_mb") or 25.0)
    cur_first = float(ddp.get("first_bucket_cap_mb") or cur_cap)
    world = world_size or run.world_size
    same = link is None and world == run.world_size
    link = link or fit.link()
    base = SimConfig(world_size=world, steps=PREDICT_STEPS, bucket_cap_mb=cur_cap, first_bucket_cap_mb=cur_first,
                     link=link, jitter=Jitter.measured(prof, fit.noise if same else 0.0),
                     contention=fit.contention if same else 0.0)
    current = predict(prof, base)
    measured = A.run_summary(run)
    rows = []
    for cap in sorted(set(caps) | {cur_cap}):
        for first in sorted({cap, *[f for f in FIRST_CAPS if f < cap]}):
            p = predict(prof, replace(base, bucket_cap_mb=cap, first_bucket_cap_mb=first))
            rows.append(_row(p, cap_mb=cap, first_mb=first, current=(cap, first) == (cur_cap, cur_first)))
    best = min(rows, key=lambda r: (round(r["step_ms"], 3), r["exposed_ms"], r["buckets"]))
    best_cfg = replace(base, bucket_cap_mb=best["cap_mb"], first_bucket_cap_mb=best["first_mb"])
    options = []
    if run.meta.get("strategy", "ddp") == "ddp":
        hooks = ["fp16", "bf16", "powersgd"] if prof.grad_itemsize > 2 else ["powersgd"]
        for h in hooks:
            options.append(_row(predict(prof, replace(best_cfg, compression=h)), option=f"ddp + {h} hook"))
    for strat in ("zero1", "zero2", "zero3"):
        p = predict(prof, replace(best_cfg, strategy=strat))
        options.append(_row(p, option=strat, memory_gb=memory_for(prof, strat, world).gpu / 1e9))
    return {"run": run.name, "world_size": world, "link": link.name, "fit": fit.as_dict(),
            "measured": {"step_ms": measured["step_ms"], "exposed_ms": measured["exposed_ms"],
                         "comm_ms": measured["comm_busy_ms"]},
            "current": _row(current, cap_mb=cur_cap, first_mb=cur_first),
            "candidates": rows, "best": best, "options": options,
            "memory_gb": {"ddp": memory_for(prof, "ddp", world).gpu / 1e9},
            "optimizer_state_bytes_per_param": optimizer_state_bytes(prof)}


def _pct(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.0f}%" if b and math.isfinite(a) and math.isfinite(b) else "–"


@click.command("advise", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("run_dir", type=click.Path())
@click.option("--caps", default=",".join(str(c) for c in DEFAULT_CAPS), show_default=True,
              help="Bucket caps to try (MiB, comma-separated).")
@click.option("--world-size", type=int, help="Advise for another world size [the run's].")
@click.option("--link", "link_name", type=click.Choice(list(CM.LINKS)), help="Advise for another link [fitted].")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
@OPTIMIZER_STATE_OPTION
def advise_command(run_dir, caps, world_size, link_name, as_json, k_bytes):
    """Recommend a DDP bucket cap (and first-bucket cap) for RUN_DIR, and say whether a
    compression hook or a ZeRO strategy would pay off (predicted with the fitted cost model)."""
    from rich.console import Console
    from rich.table import Table

    from syncviz.trace import load_run, warn_problems
    caps = parse_caps(caps)
    if world_size is not None and world_size < 1:
        raise click.BadParameter("world size must be >= 1", param_hint="--world-size")
    if world_size is not None and world_size > 1 << 20:
        raise click.BadParameter("world size must be <= 1048576", param_hint="--world-size")
    run = load_run(run_dir)
    warn_problems(run)
    try:
        adv = advise(run, caps, world_size, CM.LINKS[link_name] if link_name else None, float(k_bytes))
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(adv, indent=1, default=float))
        return
    con = Console()
    cur, best, m, f = adv["current"], adv["best"], adv["measured"], adv["fit"]
    con.print(f"[bold]{adv['run']}[/] · {adv['world_size']} ranks · link {adv['link']} "
              f"(α {f['alpha_s'] * 1e6:.0f} µs, busbw {f['busbw_gbps']:.3g} GB/s, κ {f['contention']:.2f}, "
              f"R² {f['r2']:.2f})")
    con.print(f"now: cap {cur['cap_mb']:g} MB (first {cur['first_mb']:g}): measured step {m['step_ms']:.1f} ms, "
              f"exposed {m['exposed_ms']:.1f} ms; the model replays it as {cur['step_ms']:.1f} ms "
              f"({_pct(cur['step_ms'], m['step_ms'])}), exposed {cur['exposed_ms']:.1f} ms")
    t = Table(title="Bucket caps (predicted, median step)", title_justify="left")
    for c in ("cap MB", "first MB", "buckets", "step ms", "comm ms", "exposed ms", "vs now"):
        t.add_column(c, justify="right")
    for r in adv["candidates"]:
        mark = " ←best" if r is best else (" (now)" if r["current"] else "")
        t.add_row(f"{r['cap_mb']:g}", f"{r['first_mb']:g}", str(r["buckets"]), f"{r['step_ms']:.1f}",
                  f"{r['comm_ms']:.1f}", f"{r['exposed_ms']:.1f}", _pct(r["step_ms"], cur["step_ms"]) + mark)
    con.print(t)
    t = Table(title=f"Other options at cap {best['cap_mb']:g} MB (predicted; states/GPU = parameters, gradients and "
                    f"{CM.k_note(adv['optimizer_state_bytes_per_param'])})", title_justify="left")
    for c in ("option", "step ms", "comm ms", "exposed ms", "vs best", "states/GPU"):
        t.add_column(c, justify="right")
    for r in adv["options"]:
        mem = f"{r['memory_gb']:.2f} GB" if "memory_gb" in r else f"{adv['memory_gb']['ddp']:.2f} GB"
        t.add_row(r["option"], f"{r['step_ms']:.1f}", f"{r['comm_ms']:.1f}", f"{r['exposed_ms']:.1f}",
                  _pct(r["step_ms"], best["step_ms"]), mem)
    con.print(t)
    gain = cur["step_ms"] - best["step_ms"]
    if gain > 0.01 * cur["step_ms"]:
        con.print(f"Advice: bucket_cap_mb={best['cap_mb']:g} (first bucket {best['first_mb']:g} MB) saves "
                  f"{gain:.1f} ms per step ({100 * gain / cur['step_ms']:.0f}%), exposed comm "
                  f"{cur['exposed_ms']:.1f} → {best['exposed_ms']:.1f} ms.")
        if best["first_mb"] != best["cap_mb"]:
            con.print("  (torch's DDP makes the first bucket 1 MiB only when bucket_cap_mb is left unset; "
                      "an explicit bucket_cap_mb makes it as big as the others)")
    else:
        con.print("Advice: the current bucket cap is within 1% of the best the model finds; leave it.")
    better = [r for r in adv["options"] if r["step_ms"] < best["step_ms"] * 0.97]
    for r in better:
        note = " (PowerSGD's compute and its effect on convergence are not modelled)" if "powersgd" in r["option"] else \
            " (mostly its optimizer step on a 1/N shard; per-layer hook overheads and contention are not modelled)" \
            if r["option"] == "zero3" else ""
        con.print(f"  {r['option']} would cut the step to {r['step_ms']:.1f} ms "
                  f"({_pct(r['step_ms'], best['step_ms'])}){note}.")
    if not better:
        con.print("  Neither compression nor a ZeRO strategy would speed it up by 3% or more; "
                  "ZeRO is for memory (see the last column).")
