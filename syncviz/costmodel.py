"""Cost model of gradient synchronization: α-β(-γ) models of ring and tree collectives, a memory
model per data-parallel strategy, and ``syncviz fit RUN`` (α and β from a recorded run).

Collective time on p ranks for a message of n bytes (n = the whole, unsharded array, as in
DESIGN.md's busbw convention), link latency α (s per hop), inverse bus bandwidth β (s/byte) and
reduction cost γ (s/byte):

    ring all_reduce      2(p−1)·α  + 2(p−1)/p·n·β + (p−1)/p·n·γ      (reduce-scatter + all-gather)
    ring reduce_scatter   (p−1)·α  +  (p−1)/p·n·β + (p−1)/p·n·γ
    ring all_gather       (p−1)·α  +  (p−1)/p·n·β
    tree all_reduce     2⌈log2 p⌉α + 2·n·β       +        n·γ        (pipelined reduce + broadcast)
    tree reduce_scatter  ⌈log2 p⌉α +  (p−1)/p·n·β + (p−1)/p·n·γ      (recursive halving)
    tree all_gather      ⌈log2 p⌉α +  (p−1)/p·n·β                    (recursive doubling)
    broadcast          hops·α      +          n·β

The ring bandwidth factors are exactly nccl-tests' busbw factors (syncviz.analysis.busbw_factor),
so 1/β is the bus bandwidth that ``syncviz summary`` reports for large messages: a link preset's
``busbw_gbps`` is what nccl-tests would print on that link, and a fitted β converts back the same
way. "auto" takes the faster of ring and tree, as NCCL's tuner roughly does.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import click
import numpy as np
import pandas as pd

from . import analysis as A
from . import schema as S

GB = 1e9
MIB = 1024 * 1024


# ------------------------------------------------------------------------------------ links

@dataclass(frozen=True)
class Link:
    """One interconnect as the cost model sees it."""
    name: str
    busbw_gbps: float          # bus bandwidth (GB/s, 1e9 B) a large collective reaches: 1/β
    latency_us: float          # α: per-hop latency of one collective step (µs)
    gamma_gbps: float = 0.0    # reduction throughput (GB/s); 0 = reduction free (folded into β)
    note: str = ""

    @property
    def alpha(self) -> float:
        return self.latency_us * 1e-6

    @property
    def beta(self) -> float:
        return 1.0 / (self.busbw_gbps * GB)

    @property
    def gamma(self) -> float:
        return 1.0 / (self.gamma_gbps * GB) if self.gamma_gbps > 0 else 0.0

    def validate(self) -> "Link":
        if not (self.busbw_gbps > 0 and math.isfinite(self.busbw_gbps)):
            raise ValueError(f"link {self.name}: bandwidth must be > 0 GB/s (got {self.busbw_gbps})")
        if not (self.latency_us >= 0 and math.isfinite(self.latency_us)):
            raise ValueError(f"link {self.name}: latency must be >= 0 µs (got {self.latency_us})")
        if self.gamma_gbps < 0:
            raise ValueError(f"link {self.name}: reduction throughput must be >= 0 (got {self.gamma_gbps})")
        return self


# Round numbers of what nccl-tests typically prints (busbw, large messages) per GPU on each link;
# for your own cluster, run `syncviz fit` on a recorded run and use --link-gbps/--link-latency-us.
LINKS: dict[str, Link] = {
    "nvlink": Link("nvlink", 400.0, 3.0, note="H100 SXM, NVLink 4 through NVSwitch, 8 GPUs in a node"),
    "nvlink-a100": Link("nvlink-a100", 230.0, 3.0, note="A100 SXM, NVLink 3 through NVSwitch"),
    "pcie": Link("pcie", 22.0, 5.0, note="PCIe 4.0 x16 peer-to-peer, no NVLink"),
    "ib-400": Link("ib-400", 45.0, 6.0, note="InfiniBand NDR 400 Gb/s, one NIC per GPU (multi-node)"),
    "ib-200": Link("ib-200", 23.0, 6.0, note="InfiniBand HDR 200 Gb/s, one NIC per GPU (multi-node)"),
    "ethernet-100g": Link("ethernet-100g", 11.0, 20.0, note="100 GbE, TCP sockets"),
    "ethernet-25g": Link("ethernet-25g", 2.8, 30.0, note="25 GbE, TCP sockets"),
}


def get_link(name: str | None = None, *, busbw_gbps: float | None = None, latency_us: float | None = None,
             gamma_gbps: float | None = None) -> Link:
    """A preset, optionally with its numbers overridden; ``name`` None or "custom" needs both numbers."""
    if name and name != "custom":
        if name not in LINKS:
            raise ValueError(f"unknown link {name!r}; choose from {', '.join(LINKS)} or custom")
        link = LINKS[name]
    else:
        if busbw_gbps is None or latency_us is None:
            raise ValueError("a custom link needs both a bandwidth (GB/s) and a latency (µs)")
        link = Link("custom", float(busbw_gbps), float(latency_us))
    changes = {k: float(v) for k, v in (("busbw_gbps", busbw_gbps), ("latency_us", latency_us),
                                        ("gamma_gbps", gamma_gbps)) if v is not None}
    if changes and link.name != "custom":
        link = replace(link, name=f"{link.name}*", **changes)
    return link.validate()


# ------------------------------------------------------------------------------- collectives

ALGOS = ("ring", "tree", "auto")


def hops(op: str, p: int, algo: str = "ring") -> int:
    """Latency terms (α multiples) of one collective."""
    if p <= 1:
        return 0
    lg = math.ceil(math.log2(p))
    if op == "all_reduce":
        return 2 * (p - 1) if algo == "ring" else 2 * lg
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return p - 1 if algo == "ring" else lg
    return lg if algo == "tree" else p - 1          # broadcast, reduce: pipelined chain or tree


def bandwidth_factor(op: str, p: int, algo: str = "ring") -> float:
    """Multiple of n·β: nccl-tests' busbw factor for rings; a pipelined tree all-reduce moves n up
    and n down."""
    if p <= 1:
        return 0.0
    if op == "all_reduce" and algo == "tree":
        return 2.0
    return A.busbw_factor(op, p)


def reduction_factor(op: str, p: int, algo: str = "ring") -> float:
    """Multiple of n·γ (bytes each rank reduces)."""
    if p <= 1 or op not in ("all_reduce", "reduce_scatter", "reduce"):
        return 0.0
    if op == "all_reduce" and algo == "tree":
        return 1.0
    return (p - 1) / p


def collective_time(op: str, nbytes, p: int, link: Link, algo: str = "auto"):
    """Seconds for one collective of ``nbytes`` (scalar or array) on ``p`` ranks."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; choose from {', '.join(ALGOS)}")
    if p < 1:
        raise ValueError(f"world size must be >= 1 (got {p})")
    n = np.asarray(nbytes, dtype=float)
    if np.any(n < 0):
        raise ValueError("message size must be >= 0 bytes")
    if algo == "auto":
        return np.minimum(collective_time(op, n, p, link, "ring"), collective_time(op, n, p, link, "tree"))
    t = hops(op, p, algo) * link.alpha + n * (bandwidth_factor(op, p, algo) * link.beta
                                            + reduction_factor(op, p, algo) * link.gamma)
    return np.where(n > 0, t, 0.0) if t.ndim else (float(t) if n > 0 else 0.0)


def choose_algo(op: str, nbytes: float, p: int, link: Link) -> str:
    ring = collective_time(op, nbytes, p, link, "ring")
    tree = collective_time(op, nbytes, p, link, "tree")
    return "ring" if ring <= tree else "tree"


# ---------------------------------------------------------------------------- memory model

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload")


@dataclass(frozen=True)
class MemorySpec:
    """Bytes per parameter of each kind of training state (activations are not modelled).

    Convention (DESIGN.md): fp16/bf16 parameters and gradients, 2 bytes each; Adam's two moments in
    fp32 are 8 bytes/param (K = 8). Mixed-precision training as in the ZeRO paper also keeps an
    fp32 master copy of the weights: ``master_bytes=4`` makes K = 12."""
    params: int
    param_bytes: float = 2.0
    grad_bytes: float = 2.0
    optimizer_bytes: float = 8.0     # Adam m and v in fp32
    master_bytes: float = 0.0        # fp32 master weights (4 with mixed precision, as ZeRO's K=12)

    @property
    def k(self) -> float:
        return self.optimizer_bytes + self.master_bytes

    def validate(self) -> "MemorySpec":
        if self.params <= 0:
            raise ValueError(f"parameter count must be > 0 (got {self.params})")
        for f in ("param_bytes", "grad_bytes", "optimizer_bytes", "master_bytes"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f.replace('_', ' ')} must be >= 0 (got {getattr(self, f)})")
        return self


@dataclass(frozen=True)
class Memory:
    """Per-GPU (and per-rank host) bytes of one strategy."""
    strategy: str
    world_size: int
    params: float
    grads: float
    optimizer: float          # optimizer states incl. master weights
    host: float = 0.0         # CPU memory per rank (offload)

    @property
    def gpu(self) -> float:
        return self.params + self.grads + self.optimizer


def memory_per_gpu(spec: MemorySpec, strategy: str, world_size: int) -> Memory:
    """ZeRO's partitioning: ZeRO-1 shards optimizer states over N ranks, ZeRO-2 also gradients,
    ZeRO-3 also parameters. Offload (ZeRO-Offload / -Infinity) moves the sharded gradients and
    optimizer states (and for zero3-offload the parameters) to host memory."""
    spec.validate()
    if world_size < 1:
        raise ValueError(f"world size must be >= 1 (got {world_size})")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    n, psi = world_size, float(spec.params)
    p, g, o = spec.param_bytes * psi, spec.grad_bytes * psi, spec.k * psi
    if strategy == "ddp":
        return Memory(strategy, n, p, g, o)
    if strategy == "zero1":
        return Memory(strategy, n, p, g, o / n)
    if strategy == "zero2":
        return Memory(strategy, n, p, g / n, o / n)
    if strategy == "zero3":
        return Memory(strategy, n, p / n, g / n, o / n)
    if strategy == "zero2-offload":
        return Memory(strategy, n, p, 0.0, 0.0, host=(g + o) / n)
    return Memory(strategy, n, 0.0, 0.0, 0.0, host=(p + g + o) / n)          # zero3-offload


def comm_bytes_per_step(strategy: str, grad_bytes: float, param_bytes: float) -> dict[str, float]:
    """Textbook collectives per step and their message bytes (whole arrays): DDP all-reduces the
    gradients; ZeRO-1/2 reduce-scatter them and all-gather the updated parameters; ZeRO-3
    all-gathers parameters in forward and again in backward, and reduce-scatters gradients."""
    base = strategy.replace("-offload", "")
    if base == "ddp":
        return {"all_reduce": grad_bytes}
    if base in ("zero1", "zero2"):
        return {"reduce_scatter": grad_bytes, "all_gather": param_bytes}
    if base == "zero3":
        return {"all_gather": 2 * param_bytes, "reduce_scatter": grad_bytes}
    raise ValueError(f"unknown strategy {strategy!r}")


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

    from .trace import load_run
    run = load_run(run_dir)
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
