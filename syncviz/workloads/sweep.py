"""``syncviz sweep``: run the built-in workload at several bucket caps for real, fit the cost model
on a reference run, and put predicted next to measured (the model's own check)."""
from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import click


from syncviz.model import fit as FIT
from syncviz.model.advise import PREDICT_STEPS, parse_caps
from syncviz.model.simcore import Jitter, SimConfig
from syncviz.model.simprofile import Profile, profile_from_run
from syncviz.model.simulate import headline_means, predict


# ------------------------------------------------------------------------------------ sweep

def sweep(*, preset="small", caps=(1, 5, 25, 100), steps=6, out="traces/sweep", reference_cap=25.0,
          reference: str | None = None, batch=4, seq=64, reuse=False, log=print) -> dict:
    """Fit on one run (the reference), predict every cap, run every cap, compare. ``reuse`` keeps
    complete runs already under ``out`` (an interrupted sweep resumes)."""
    from syncviz import analysis as A
    from syncviz.trace import TraceError, load_run
    from syncviz.workloads.demo import run_demo
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
    fit, _ = FIT.fit_run(ref)
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
    for stat, title in (("", "syncviz summary's headline (means over ranks and steps after the first)"),
                        ("mean_", "means over ranks and steps after the first (simulate.headline_means)")):
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
    caps = parse_caps(caps)
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
