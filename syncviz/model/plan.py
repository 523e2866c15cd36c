"""``syncviz plan``: which data-parallel strategy fits a model on N GPUs, and what it costs.

For Ψ parameters on N GPUs it prints, per strategy (DDP, ZeRO-1/2/3, ZeRO-Offload, ZeRO-Infinity),
the model-state memory per GPU, what moves over the network and over PCIe/NVMe per step, whether
it fits, the fewest GPUs it would need, and a recommendation with its reason.

Every number comes from the one memory model (costmodel.MemorySpec / memory_per_gpu) and the one
collective model (costmodel.comm_bytes_per_step, bandwidth_factor, collective_time); this module
only chooses the inputs and lays out the answer. Convention (always printed): fp16/bf16 parameters
and gradients, 2 bytes each; optimizer state K bytes per parameter, K = 8 for Adam's m and v in
fp32, K = 12 with an fp32 master copy of the weights as in the ZeRO paper. Activations, buffers and
fragmentation are not modelled: "fits" means the model states fit, with the rest left for them.

The classic 70B / 8-GPU table (K = 8): DDP 840 GB, ZeRO-1 350, ZeRO-2 227.5, ZeRO-3 105 GB per
GPU. Tables that print 210 GB for ZeRO-2 have dropped ZeRO-2's sharded gradient term (2Ψ/N).
"""
from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass

import click

from syncviz.model import costmodel as CM

GB = 1e9

# Preference order, most to least attractive when it fits (why, in REASONS).
ORDER = ("ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload")
LABELS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
          "zero2-offload": "ZeRO-Offload", "zero3-offload": "ZeRO-Infinity"}
REASONS = {
    "ddp": "nothing is sharded, one gradient all-reduce per step and it all overlaps backward",
    "zero1": "optimizer states sharded; the same bytes as DDP (reduce-scatter + all-gather instead of "
             "an all-reduce), but the parameter all-gather follows the optimizer step, where backward "
             "cannot hide it",
    "zero2": "optimizer states and gradients sharded; the same bytes as DDP (reduce-scatter + all-gather)",
    "zero3": "everything sharded; parameters are all-gathered in forward and again in backward: "
             "1.5x DDP's bytes",
    "zero2-offload": "gradients and optimizer states in host memory, the optimizer step runs on the CPU; "
                     "PCIe traffic every step",
    "zero3-offload": "parameters too leave the GPU and are streamed in layer by layer; "
                     "PCIe (and NVMe) traffic every step",
}


@dataclass(frozen=True)
class PlanRow:
    strategy: str
    label: str
    memory: CM.Memory            # per GPU (and host/NVMe per rank for offload)
    offload_to: str              # "" | "cpu" | "nvme"
    wire_bytes: float            # bytes each GPU sends per step (Σ message × ring bus factor)
    wire_seconds: float          # those collectives on the chosen link, back to back
    pcie_bytes: float            # host <-> GPU bytes per GPU per step (offload only)
    fits: bool
    min_gpus: int | None         # fewest GPUs for which the model states fit (None: never)


@dataclass(frozen=True)
class Plan:
    params: int
    gpus: int
    gpu_mem_gb: float
    optimizer_bytes: int
    offload: str | None
    link: CM.Link
    rows: tuple[PlanRow, ...]
    choice: str | None
    reason: str


def parse_count(text) -> int:
    """70e9, 70B, 7.5B, 125M, 1.3e9, 70_000_000_000 -> int."""
    s = str(text).strip().replace("_", "").replace(",", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)", s)
    if not m:
        raise ValueError(f"cannot read a parameter count from {text!r} (try 70e9 or 70B)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    if not (value >= 1 and math.isfinite(value)):
        raise ValueError(f"parameter count must be >= 1 (got {text!r})")
    return int(round(value))


def memory_spec(params: int, optimizer_bytes: int) -> CM.MemorySpec:
    """K = 8: Adam m and v in fp32; K = 12: the same plus an fp32 master copy (ZeRO paper)."""
    if optimizer_bytes not in (8, 12):
        raise ValueError(f"optimizer bytes must be 8 (Adam m, v in fp32) or 12 (+ fp32 master copy), "
                         f"got {optimizer_bytes}")
    return CM.MemorySpec(params=params, optimizer_bytes=8.0,
                         master_bytes=4.0 if optimizer_bytes == 12 else 0.0).validate()


def wire(strategy: str, spec: CM.MemorySpec, n: int, link: CM.Link) -> tuple[float, float]:
    """Bytes one GPU sends per step on a ring (message × nccl-tests bus factor) and the seconds
    the collectives take on ``link`` one after another (no overlap assumed)."""
    msgs = CM.comm_bytes_per_step(strategy, spec.grad_bytes * spec.params, spec.param_bytes * spec.params)
    sent = sum(b * CM.bandwidth_factor(op, n) for op, b in msgs.items())
    secs = sum(float(CM.collective_time(op, b, n, link, "ring")) for op, b in msgs.items())
    return sent, secs


def pcie(strategy: str, spec: CM.MemorySpec, n: int, offload_to: str) -> float:
    """Host <-> GPU bytes per GPU per step. ZeRO-Offload (Ren et al. 2021, sec. 4): fp16 gradients
    down and fp16 parameters back, 2Ψ + 2Ψ, each rank its 1/N. ZeRO-Infinity also streams its
    parameter shard in for forward and again for backward (2 × 2Ψ/N) and the gradients out; with
    NVMe the optimizer states (KΨ/N) are read and written back each step on top."""
    psi = float(spec.params)
    if strategy == "zero2-offload":
        return (spec.grad_bytes + spec.param_bytes) * psi / n
    if strategy == "zero3-offload":
        moved = (2 * spec.param_bytes + spec.grad_bytes) * psi / n
        return moved + (2 * spec.k * psi / n if offload_to == "nvme" else 0.0)
    return 0.0


def min_gpus(spec: CM.MemorySpec, strategy: str, gpu_bytes: float, limit: int = 1 << 40) -> int | None:
    """Fewest N with memory_per_gpu(N).gpu <= gpu_bytes (memory falls as N grows: bisection)."""
    def fits(n):
        return CM.memory_per_gpu(spec, strategy, n).gpu <= gpu_bytes
    if not fits(limit):
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def make_plan(params, gpus: int, gpu_mem_gb: float = 80.0, optimizer_bytes: int = 8,
              offload: str | None = None, link: str = "nvlink") -> Plan:
    params = parse_count(params)
    if int(gpus) != gpus or gpus < 1:
        raise ValueError(f"--gpus must be a whole number >= 1 (got {gpus})")
    if not (gpu_mem_gb > 0 and math.isfinite(gpu_mem_gb)):
        raise ValueError(f"--gpu-mem-gb must be > 0 (got {gpu_mem_gb})")
    if offload not in (None, "cpu", "nvme"):
        raise ValueError(f"--offload must be cpu or nvme (got {offload!r})")
    spec, lk, cap = memory_spec(params, optimizer_bytes), CM.get_link(link), gpu_mem_gb * GB
    rows = []
    for s in ORDER:
        m = CM.memory_per_gpu(spec, s, gpus)
        to = {"zero2-offload": "cpu", "zero3-offload": offload or "cpu"}.get(s, "")
        sent, secs = wire(s, spec, gpus, lk)
        rows.append(PlanRow(s, LABELS[s], m, to, sent, secs, pcie(s, spec, gpus, to), m.gpu <= cap,
                            min_gpus(spec, s, cap)))
    allowed = [r for r in rows if r.fits and (not r.offload_to or offload)]
    if allowed:
        best = allowed[0]
        why = f"the least sharding whose model states fit in {gpu_mem_gb:g} GB: {REASONS[best.strategy]}"
        before = [LABELS[r.strategy] for r in rows[:rows.index(best)] if not r.fits]
        if before:
            why += f"; {', '.join(before)} {'does' if len(before) == 1 else 'do'} not fit"
        return Plan(params, gpus, gpu_mem_gb, optimizer_bytes, offload, lk, tuple(rows), best.strategy, why)
    z3 = rows[ORDER.index("zero3")].min_gpus
    if offload is None and any(r.fits for r in rows):
        why = (f"nothing fits in {gpu_mem_gb:g} GB per GPU without offload; "
               f"ZeRO-3 needs {z3} GPUs, or pass --offload cpu|nvme to use host memory")
    else:
        why = f"nothing fits in {gpu_mem_gb:g} GB per GPU" + (f"; ZeRO-3 needs {z3} GPUs" if z3 else "")
    return Plan(params, gpus, gpu_mem_gb, optimizer_bytes, offload, lk, tuple(rows), None, why)


def _gb(x: float) -> str:
    return "-" if x == 0 else f"{x / GB:,.4g}"


def render(p: Plan) -> str:
    k = "Adam m and v in fp32" if p.optimizer_bytes == 8 else "Adam m and v + fp32 master weights"
    out = [f"{p.params / 1e9:g}B parameters on {p.gpus} GPUs of {p.gpu_mem_gb:g} GB  "
           f"(model states only; activations not included)",
           f"bytes per parameter: params 2 (fp16/bf16), grads 2, optimizer K = {p.optimizer_bytes} ({k})",
           ""]
    head = ("strategy", "params", "grads", "optim", "GPU GB", "host GB", "sent/GPU GB", f"{p.link.name} s",
            "PCIe GB", "fits", "min GPUs")
    body = []
    for r in p.rows:
        m = r.memory
        host = _gb(m.host) + (f" ({r.offload_to})" if r.offload_to and m.host else "")
        body.append((r.label, _gb(m.params), _gb(m.grads), _gb(m.optimizer), f"{m.gpu / GB:,.4g}", host,
                     f"{r.wire_bytes / GB:,.4g}", f"{r.wire_seconds:.3g}", _gb(r.pcie_bytes),
                     "yes" if r.fits else "no", "never" if r.min_gpus is None else str(r.min_gpus)))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = lambda row: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)   # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths)))
    out += [fmt(head), fmt(tuple("-" * w for w in widths))] + [fmt(b) for b in body]
    notes = [f"sent/GPU: bytes each GPU sends per step on a ring (all-reduce 2(N-1)/N x message, "
             f"reduce-scatter and all-gather (N-1)/N); {p.link.name} s: those collectives back to back at "
             f"{p.link.busbw_gbps:g} GB/s bus bandwidth. PCIe: host <-> GPU bytes per GPU per step.",
             f"ZeRO-Offload keeps gradients and optimizer states in CPU memory; ZeRO-Infinity also the "
             f"parameters, in {'NVMe' if p.offload == 'nvme' else 'CPU memory'}; its GPU column leaves out "
             f"the layer being computed (streamed in), so it always 'fits'.",
             f"recommendation: {LABELS[p.choice] if p.choice else 'none fits'} -- {p.reason}."]
    out.append("")
    for n in notes:
        out += textwrap.wrap(n, 100, subsequent_indent="  ") + [""]
    return "\n".join(out).rstrip()


@click.command("plan", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--params", "params", required=True, help="Model parameters: 70e9, 70B, 7.5B, 125M.")
@click.option("--gpus", default=8, show_default=True, type=int, help="Data-parallel GPUs.")
@click.option("--gpu-mem-gb", default=80.0, show_default=True, type=float, help="Memory per GPU (GB = 1e9 B).")
@click.option("--optimizer-bytes", default=8, show_default=True, type=int,
              help="Optimizer state per parameter: 8 = Adam m and v in fp32; 12 = + fp32 master copy (ZeRO paper).")
@click.option("--offload", default=None, metavar="cpu|nvme",
              help="Allow offload (ZeRO-Offload to CPU; ZeRO-Infinity to CPU or NVMe) in the recommendation.")
@click.option("--link", default="nvlink", show_default=True,
              help=f"Link preset for the communication time column: {', '.join(CM.LINKS)}.")
def plan_command(params, gpus, gpu_mem_gb, optimizer_bytes, offload, link):
    """Memory per GPU and communication per step of DDP, ZeRO-1/2/3, ZeRO-Offload and
    ZeRO-Infinity for a model of PARAMS parameters, what fits, and which to use.

    \b
    Example (the classic table: 840 / 350 / 227.5 / 105 GB per GPU):
      syncviz plan --params 70e9 --gpus 8 --optimizer-bytes 8
    """
    try:
        p = make_plan(params, gpus, gpu_mem_gb, optimizer_bytes, offload, link)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(render(p))
