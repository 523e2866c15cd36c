"""Cost model of gradient synchronization: α-β(-γ) models of ring and tree collectives, a memory
model per data-parallel strategy. Fitting α and β to a recorded run is fit.py (``syncviz fit RUN``).

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
from dataclasses import dataclass, replace

import numpy as np

from syncviz import analysis as A
from syncviz.trace import schema as S

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

STRATEGIES = S.MODEL_STRATEGIES


# Optimizer-state bytes per parameter (K): one convention for the cost model, the simulator and
# every CLI, printed next to every memory figure. 8 = Adam's m and v in fp32 (the default: 70B
# with bf16 weights/grads on 8 GPUs, ZeRO-2 = 227.5 GB per GPU); 12 = also an fp32 master copy of
# the weights, as the ZeRO paper counts mixed-precision training (same case: 262.5 GB).
OPTIMIZER_STATE_BYTES = {8: "Adam m and v in fp32", 12: "Adam m, v and an fp32 master copy (ZeRO paper)"}
DEFAULT_OPTIMIZER_STATE_BYTES = 8


def optimizer_split(k: float) -> tuple[float, float]:
    """(optimizer_bytes, master_bytes) of MemorySpec for K bytes of optimizer state per parameter."""
    if k < 8:
        return float(k), 0.0
    return 8.0, float(k) - 8.0


def k_note(k: float) -> str:
    """How a memory figure counts optimizer state, e.g. 'optimizer state K = 8 B/param (Adam m and v in fp32)'."""
    what = OPTIMIZER_STATE_BYTES.get(int(k)) if float(k).is_integer() else None
    return f"optimizer state K = {k:g} B/param" + (f" ({what})" if what else "")


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
