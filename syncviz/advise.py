"""``syncviz advise RUN``: which DDP bucket cap (and first-bucket cap) minimizes the predicted step
time of a recorded run, the predicted exposed communication of each candidate, and whether a
compression hook or a ZeRO strategy would pay off. ``syncviz sweep``: runs the built-in workload
at several caps and prints predicted vs measured.

Predictions come from syncviz.simulate.predict: the run's own compute timeline (per-gradient
ready times, forward, optimizer, and how much the ranks' compute differs within a step) replayed
through the DDP pipeline under the α-β(-κ) cost model fitted to the run's own buckets, and
measured with the same analysis functions as a real run.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import click

from . import costmodel as CM
from .simcore import Jitter, SimConfig
from .simprofile import Profile, profile_from_run
from .simulate import headline_means, memory_for, predict

DEFAULT_CAPS = (1, 2, 5, 10, 25, 50, 100, 250)
# Simulated steps per prediction: the run's measured rank-to-rank compute spread is replayed as
# noise (a slower rank makes the others wait), so medians need a few dozen steps to settle.
PREDICT_STEPS = 41
FIRST_CAPS = (1,)      # DDP's own default first bucket (1 MiB), tried besides "same as the cap"


def _caps(text: str) -> list[float]:
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


def advise(run, caps=DEFAULT_CAPS, world_size: int | None = None, link: CM.Link | None = None) -> dict:
    """Predictions for every candidate; the best cap; compression and strategy alternatives."""
    from . import analysis as A
    fit, _ = CM.fit_run(run)
    prof = profile_from_run(run)
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
            "memory_gb": {"ddp": memory_for(prof, "ddp", world).gpu / 1e9}}


def _pct(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.0f}%" if b and math.isfinite(a) and math.isfinite(b) else "–"


@click.command("advise", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("run_dir", type=click.Path())
@click.option("--caps", default=",".join(str(c) for c in DEFAULT_CAPS), show_default=True,
              help="Bucket caps to try (MiB, comma-separated).")
@click.option("--world-size", type=int, help="Advise for another world size [the run's].")
@click.option("--link", "link_name", type=click.Choice(list(CM.LINKS)), help="Advise for another link [fitted].")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
def advise_command(run_dir, caps, world_size, link_name, as_json):
    """Recommend a DDP bucket cap (and first-bucket cap) for RUN_DIR, and say whether a
    compression hook or a ZeRO strategy would pay off (predicted with the fitted cost model)."""
    from rich.console import Console
    from rich.table import Table

    from .trace import load_run
    caps = _caps(caps)
    if world_size is not None and world_size < 1:
        raise click.BadParameter("world size must be >= 1", param_hint="--world-size")
    run = load_run(run_dir)
    try:
        adv = advise(run, caps, world_size, CM.LINKS[link_name] if link_name else None)
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
    t = Table(title=f"Other options at cap {best['cap_mb']:g} MB (predicted)", title_justify="left")
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


# ------------------------------------------------------------------------------------ sweep

def sweep(*, preset="small", caps=(1, 5, 25, 100), steps=6, out="traces/sweep", reference_cap=25.0,
          reference: str | None = None, batch=4, seq=64, reuse=False, log=print) -> dict:
    """Fit on one run (the reference), predict every cap, run every cap, compare. ``reuse`` keeps
    complete runs already under ``out`` (an interrupted sweep resumes)."""
    from . import analysis as A
    from .trace import TraceError, load_run
    from .workloads import run_demo
    out = Path(out)

    def complete(path: Path) -> bool:
        try:
            r = load_run(path)
        except TraceError:
            return False
        return bool(r.meta.get("finished")) and r.events["step"].nunique() >= steps and not r.problems

    def run_cap(cap: float) -> Path:
        path = out / f"cap-{cap:g}"
        if reuse and complete(path):
            log(f"  reusing {path}")
            return path
        t0 = time.perf_counter()
        try:
            run_demo(preset=preset, steps=steps, nproc=2, out=str(path), bucket_cap_mb=cap, batch=batch,
                     seq=seq, quiet=True)
        except click.ClickException as e:
            # A rank that dies at exit after writing every step (seen: gloo aborting in teardown)
            # leaves a complete trace: measure it, and say so.
            if not complete(path):
                raise
            log(f"  warning: {e.format_message()}; all {steps} steps were recorded, using them")
        log(f"  ran cap {cap:g} MB: {steps} steps in {time.perf_counter() - t0:.0f} s -> {path}")
        return path

    ref_path = Path(reference) if reference else run_cap(reference_cap)
    ref = load_run(ref_path)
    fit, _ = CM.fit_run(ref)
    prof: Profile = profile_from_run(ref)
    ref_cap = float((ref.meta.get("ddp") or {}).get("bucket_cap_mb") or reference_cap)
    cfg = SimConfig(world_size=ref.world_size, steps=PREDICT_STEPS, link=fit.link(), contention=fit.contention,
                    jitter=Jitter.measured(prof, fit.noise))
    rows = []
    for cap in caps:
        # DDP given an explicit bucket_cap_mb (as the workload does) makes the first bucket as big
        ref_first = float((ref.meta.get("ddp") or {}).get("first_bucket_cap_mb") or 1.0)
        first = cap if math.isclose(ref_first, ref_cap, rel_tol=1e-3) else ref_first
        p = predict(prof, replace(cfg, bucket_cap_mb=cap, first_bucket_cap_mb=first))
        same = math.isclose(cap, ref_cap, rel_tol=1e-3)   # the recorder stores whole bytes
        path = ref_path if same and not reference else run_cap(cap)
        run = load_run(path)
        m = dict(A.run_summary(run), **headline_means(run))
        row = {"cap_mb": cap, "buckets": p["buckets"], "run": str(path),
               # compute does not depend on the cap: a change here is the machine, not the model
               "pred_compute_ms": p["compute_ms"], "meas_compute_ms": m["compute_ms"]}
        for stat, key in (("", "step_ms"), ("", "exposed_ms"), ("mean_", "step_mean_ms"),
                          ("mean_", "exposed_mean_ms")):
            name = key.replace("_mean", "").replace("_ms", "")
            pred, meas = p[key], m[key]
            row[f"pred_{stat}{name}_ms"], row[f"meas_{stat}{name}_ms"] = pred, meas
            row[f"{stat}{name}_err_pct"] = 100 * (pred - meas) / meas if meas else float("nan")
        rows.append(row)
    return {"preset": preset, "reference": str(ref_path), "fit": fit.as_dict(), "rows": rows}


def print_sweep(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    f = res["fit"]
    con = Console(width=140)
    con.print(f"fit on {res['reference']}: α {f['alpha_s'] * 1e6:.0f} µs, busbw {f['busbw_gbps']:.3g} GB/s, "
              f"κ {f['contention']:.2f}")
    for stat, title in (("", "medians over ranks and steps after the first (as syncviz summary)"),
                        ("mean_", "means over ranks and steps after the first")):
        t = Table(title=f"Predicted vs measured, {title}", title_justify="left")
        for c in ("cap MB", "buckets", "step pred ms", "step meas ms", "error", "exposed pred ms",
                  "exposed meas ms", "error") + (("compute meas/pred",) if not stat else ()):
            t.add_column(c, justify="right")
        for r in res["rows"]:
            extra = (f"{r['meas_compute_ms'] / r['pred_compute_ms']:.2f}",) if not stat else ()
            t.add_row(f"{r['cap_mb']:g}", str(r["buckets"]), f"{r[f'pred_{stat}step_ms']:.0f}",
                      f"{r[f'meas_{stat}step_ms']:.0f}", f"{r[f'{stat}step_err_pct']:+.1f}%",
                      f"{r[f'pred_{stat}exposed_ms']:.0f}", f"{r[f'meas_{stat}exposed_ms']:.0f}",
                      f"{r[f'{stat}exposed_err_pct']:+.1f}%", *extra)
        con.print(t)


@click.command("sweep", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--preset", default="small", show_default=True, help="Built-in GPT preset (see syncviz demo).")
@click.option("--caps", default="1,5,25,100", show_default=True, help="Bucket caps to run (MiB).")
@click.option("--steps", default=6, show_default=True, type=click.IntRange(2), help="Steps per run.")
@click.option("--reference-cap", default=25.0, show_default=True, type=float,
              help="Cap of the run the model is fitted on.")
@click.option("--reference", type=click.Path(), help="Fit on this recorded run instead of running one.")
@click.option("--batch", default=4, show_default=True, type=click.IntRange(1))
@click.option("--seq", default=64, show_default=True, type=click.IntRange(1))
@click.option("--out", default="traces/sweep", show_default=True, help="Parent directory of the runs.")
@click.option("--reuse", is_flag=True, help="Keep complete runs already under --out instead of re-running them.")
@click.option("--json", "as_json", is_flag=True)
def sweep_command(preset, caps, steps, reference_cap, reference, batch, seq, out, reuse, as_json):
    """Run the built-in workload (2 gloo CPU ranks) at several bucket caps and print the cost
    model's predicted step time and exposed comm next to the measured ones."""
    caps = _caps(caps)
    if not reference_cap > 0:
        raise click.BadParameter("must be > 0", param_hint="--reference-cap")
    try:
        res = sweep(preset=preset, caps=caps, steps=steps, out=out, reference_cap=reference_cap,
                    reference=reference, batch=batch, seq=seq, reuse=reuse, log=lambda m: click.echo(m, err=True))
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(res, indent=1, default=float))
    else:
        print_sweep(res)
