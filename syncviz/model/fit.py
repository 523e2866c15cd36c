"""``syncviz fit RUN``: the α-β(-κ) cost model (costmodel.py) fitted to a recorded run's own
collectives, on each collective's service time (analysis.comm_service), so waiting for stragglers
and queueing behind earlier collectives are not mistaken for bandwidth."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import click
import numpy as np
import pandas as pd

from syncviz import analysis as A
from syncviz.model.costmodel import GB, Link, bandwidth_factor, hops
from syncviz.trace import schema as S


# ------------------------------------------------------------------------------------- fit

@dataclass
class Fit:
    """α and β fitted to measured collective times (least squares over comm events)."""
    alpha_s: float              # per-hop latency
    beta_s_per_byte: float      # inverse bus bandwidth (reduction cost folded in)
    r2: float
    rms_residual_s: float
    median_abs_rel_residual: float
    n: int
    duration: str               # which measured time was fitted ("service" or "duration")
    algo: str = "ring"
    ops: tuple[str, ...] = ()
    sizes: int = 0              # distinct (hops, bus bytes) points: 1 means α could not be fitted
    contention: float = 0.0     # κ: the bandwidth term is (1 + κ)× slower while compute runs
    noise: float = 0.0          # spread of measured/fitted (σ of the log, robust): collective-to-collective noise

    @property
    def busbw_gbps(self) -> float:
        return 1.0 / self.beta_s_per_byte / GB if self.beta_s_per_byte > 0 else float("inf")

    def link(self, name: str = "fitted") -> Link:
        bw = self.busbw_gbps if math.isfinite(self.busbw_gbps) else 1e6
        return Link(name, bw, self.alpha_s * 1e6, note=f"fitted to {self.n} events, R² {self.r2:.3f}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["busbw_gbps"] = self.busbw_gbps
        d["ops"] = list(self.ops)
        return d


def fit_table(comm: pd.DataFrame, duration: str = "service", headline: bool = True,
              compute: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rows the fit uses: one per comm event with bytes > 0, with its hop count, bus bytes, the
    measured time (s) and ``busy``, the fraction of it spent under compute (0 without ``compute``).
    ``duration='service'`` uses analysis.comm_service (time after the last rank launched and the
    previous collective finished), 'duration' the raw [launch, done]."""
    rows = comm[(comm["bytes"] > 0) & (comm["group_size"] > 1)].copy()
    if headline and rows["step"].nunique() > 1:
        rows = rows[rows["step"] > rows["step"].min()]
    rows["busy"] = 0.0
    if duration == "service":
        col = "service_ns"
        if col not in rows or (compute is not None and "service_hidden_ns" not in rows):
            svc = A.comm_service(comm, compute)
            rows = rows.drop(columns=[c for c in svc.columns if c in rows]).join(svc)
        if "service_hidden_ns" in rows:
            rows["busy"] = (rows["service_hidden_ns"] / rows[col]).where(rows[col] > 0, 0.0).fillna(0.0)
    elif duration == "duration":
        col = "duration_ns"
    else:
        raise ValueError(f"unknown duration {duration!r} (service | duration)")
    rows = rows[rows[col].notna() & (rows[col] >= 0)]
    p = rows["group_size"].to_numpy(dtype=int)
    ops = rows["op"].astype(str).to_numpy()
    rows["hops"] = [hops(o, int(n)) for o, n in zip(ops, p)]
    rows["bus_bytes"] = rows["bytes"].to_numpy(dtype=float) * np.array(
        [bandwidth_factor(o, int(n)) for o, n in zip(ops, p)])
    rows["t_s"] = rows[col].to_numpy(dtype=float) * 1e-9
    return rows



MIN_GROUP = 3   # events of one (message size, busy or idle) kind before it counts as evidence


def _nonneg_wlstsq(cols: list[np.ndarray], y: np.ndarray, w: np.ndarray, bandwidth: int) -> np.ndarray | None:
    """Weighted least squares; None unless every coefficient is >= 0 (to rounding) and the
    bandwidth one is > 0."""
    sw = np.sqrt(w)
    coef = np.linalg.lstsq(np.column_stack(cols) * sw[:, None], y * sw, rcond=None)[0]
    tol = 1e-9 * np.abs(coef).max()
    if coef[bandwidth] <= 0 or np.any(coef < -tol):
        return None
    return np.maximum(coef, 0.0)


def _solve(X: np.ndarray, busy: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(α, β, κ) for t = α·hops + β·bb·(1 + κ·busy), fitting only what the events can tell apart.

    Events are grouped by (hops, bus bytes, under compute or not) and each group enters with its
    median time, weighted by its size: one odd event (a bucket that happened to run after
    backward) cannot move α. κ needs groups both under compute and outside it; α needs two sizes
    at least 2× apart within one of those kinds. A run usually has one or two bucket sizes, so α
    is often not identifiable: it is then 0 (for megabyte buckets it is second order, while
    contention on CPU ranks, where gloo's threads compete with backward for cores, halves the
    bandwidth)."""
    cls = busy >= 0.5
    g = pd.DataFrame({"hops": X[:, 0], "bb": X[:, 1], "cls": cls, "busy": busy, "t": y})
    g = g.groupby(["hops", "bb", "cls"]).agg(t=("t", "median"), busy=("busy", "mean"), n=("t", "size")).reset_index()
    ok = g[g["n"] >= MIN_GROUP]
    if not len(ok):
        ok = g
    hops, bb, b, t, w = (ok[c].to_numpy(dtype=float) for c in ("hops", "bb", "busy", "t", "n"))
    spread = ok.groupby("cls")["bb"].agg(lambda v: v.max() / max(v.min(), 1.0))
    can_kappa = ok["cls"].nunique() == 2
    can_alpha = bool(spread.max() >= 2.0)      # sizes a few % apart cannot separate α from β
    if can_alpha and can_kappa:
        c = _nonneg_wlstsq([hops, bb, bb * b], t, w, 1)
        if c is not None:
            return float(c[0]), float(c[1]), float(c[2] / c[1])
    if can_kappa:
        c = _nonneg_wlstsq([bb, bb * b], t, w, 0)
        if c is not None:
            return 0.0, float(c[0]), float(c[1] / c[0])
    if can_alpha:
        c = _nonneg_wlstsq([hops, bb], t, w, 1)
        if c is not None:
            return float(c[0]), float(c[1]), 0.0
    c = _nonneg_wlstsq([bb], t, w, 0)                   # all of it is bandwidth
    if c is not None:
        return 0.0, float(c[0]), 0.0
    return float(np.average(t / np.maximum(hops, 1), weights=w)), 0.0, 0.0


def fit_alpha_beta(comm: pd.DataFrame, duration: str = "service", headline: bool = True,
                   compute: pd.DataFrame | None = None) -> Fit:
    """Least squares t = α·hops + β·bus_bytes·(1 + κ·busy) over the run's comm events (ring
    conventions; busy = fraction of the event under compute, so κ measures how much slower the
    link is while compute competes for the device, as gloo threads do for CPU cores). Which of
    α, β, κ are fitted depends on what the events can tell apart (see _solve)."""
    rows = fit_table(comm, duration, headline, compute)
    if len(rows) < 2:
        raise ValueError(f"need at least 2 comm events with bytes to fit (found {len(rows)})")
    X = rows[["hops", "bus_bytes"]].to_numpy(dtype=float)
    y = rows["t_s"].to_numpy()
    busy = rows["busy"].to_numpy(dtype=float)
    a, b, kappa = _solve(X, busy, y)
    pred = X[:, 0] * a + X[:, 1] * b * (1 + kappa * busy)
    res = y - pred
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((res ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(res) / np.where(y > 0, y, np.nan)
        logr = np.log(y / pred)
    logr = logr[np.isfinite(logr)]
    noise = float(1.4826 * np.median(np.abs(logr - np.median(logr)))) if len(logr) else 0.0
    return Fit(alpha_s=a, beta_s_per_byte=b, r2=r2, contention=kappa, noise=noise,
               rms_residual_s=float(np.sqrt((res ** 2).mean())),
               median_abs_rel_residual=float(np.nanmedian(rel)) if np.isfinite(rel).any() else float("nan"),
               n=len(rows), duration=duration, ops=tuple(sorted(set(rows["op"].astype(str)))),
               sizes=int(len(np.unique(X, axis=0))))


def fit_run(run, duration: str = "service", kinds=S.COMM_KINDS) -> tuple[Fit, pd.DataFrame]:
    """Fit a loaded run; returns the fit and the per-event table with predictions."""
    comm = A.comm_metrics(run, kinds=kinds)
    # A collective issued inside a bucket's hook is the bucket itself: count it once.
    comm = comm[(comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)].reset_index(drop=True)
    if not len(comm):
        raise ValueError(f"{run.name}: no bucket or collective events to fit")
    compute = A.compute_intervals(run.events)
    fit = fit_alpha_beta(comm, duration, compute=compute)
    rows = fit_table(comm, duration, compute=compute)
    rows["pred_s"] = rows["hops"] * fit.alpha_s + rows["bus_bytes"] * fit.beta_s_per_byte * (
        1 + fit.contention * rows["busy"])
    return fit, rows


# ------------------------------------------------------------------------------------- CLI

def _size_bins(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.assign(op=rows["op"].astype(str), under=np.where(rows["busy"] >= 0.5, "yes", "no"))
    g = rows.groupby(["op", "group_size", "bytes", "under"], sort=True)
    return g.agg(count=("t_s", "size"), measured=("t_s", "median"), predicted=("pred_s", "median")).reset_index()


@click.command("fit", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path())
@click.option("--duration", type=click.Choice(["service", "duration"]), default="service", show_default=True,
              help="service: time after the last rank launched and the previous collective ended; "
                   "duration: raw launch→done.")
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
def fit_command(run_dir, duration, as_json):
    """Fit latency α and bandwidth β of the cost model to RUN_DIR's bucket/collective timings.

    Model (ring, nccl-tests conventions): t = α·hops + β·bytes·busbw_factor, so 1/β is the bus
    bandwidth. Prints α, β, R² and residuals, and measured vs fitted time per message size."""
    import json

    from rich.console import Console
    from rich.table import Table

    from syncviz.trace import load_run, warn_problems
    run = load_run(run_dir)
    warn_problems(run)
    try:
        fit, rows = fit_run(run, duration)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(fit.as_dict(), indent=1))
        return
    con = Console()
    con.print(f"[bold]{run.name}[/]: fitted {fit.n} comm events ({', '.join(fit.ops)}; {duration} time, "
              f"steps after the first)")
    con.print(f"  α = {fit.alpha_s * 1e6:.1f} µs per hop    β = {fit.beta_s_per_byte * 1e9:.4f} ns/byte "
              f"(bus bandwidth {fit.busbw_gbps:.3f} GB/s)")
    if fit.contention > 0:
        con.print(f"  κ = {fit.contention:.2f}: the bandwidth term is {100 * fit.contention:.0f}% slower while "
                  "compute runs (they compete for the device)")
    con.print(f"  R² = {fit.r2:.3f}   RMS residual {fit.rms_residual_s * 1e3:.3f} ms   "
              f"median |residual| {100 * fit.median_abs_rel_residual:.1f}% of the measured time")
    t = Table(title="Measured (median) vs fitted time per message", title_justify="left")
    for c in ("op", "ranks", "MB", "under compute", "count", "measured ms", "fitted ms", "error"):
        t.add_column(c, justify="right")
    for _, r in _size_bins(rows).iterrows():
        err = (r["predicted"] - r["measured"]) / r["measured"] if r["measured"] > 0 else float("nan")
        t.add_row(r["op"], str(int(r["group_size"])), f"{r['bytes'] / 1e6:.2f}", r["under"], str(int(r["count"])),
                  f"{r['measured'] * 1e3:.3f}", f"{r['predicted'] * 1e3:.3f}", f"{100 * err:+.0f}%")
    con.print(t)
    if fit.sizes < 2:
        con.print("[yellow]Only one message size: α and β cannot be separated, so α is set to 0 and the "
                  "time is charged to bandwidth. Record with another bucket cap to fit both.[/]")
    elif fit.r2 == fit.r2 and fit.r2 < 0.5:
        con.print("[yellow]R² below 0.5: message sizes vary too little or timings are noisy; "
                  "α and β are rough.[/]")
