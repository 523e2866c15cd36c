"""The classic data-parallel comparison, measured: baseline DDP, ZeRO-1, ZeRO-2, ZeRO-3,
ZeRO-Offload and ZeRO-Infinity on one model, DeepSpeed's implementation beside torch's where
torch has one. ``syncviz demo --compare --deepspeed`` traces them and prints it; ``syncviz
compare`` adds this table whenever DeepSpeed runs are among its runs.

Per strategy: time per step, communication per step as bus traffic (Σ bytes × nccl-tests' busbw
factor, per rank) measured and derived (syncviz.model.theory / ds_theory), and memory per rank split
into device, host and NVMe, measured and derived. Numbers come from compare.run_comparison
(which takes them from syncviz.analysis); theory from syncviz.model.theory.
"""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from syncviz import analysis as A
from syncviz.model import ds_theory as DT

CLASSIC = ("ddp", "zero1", "ds-zero1", "zero2", "ds-zero2", "zero3", "ds-zero3", "ds-offload", "ds-infinity")
LABEL = {"ddp": "DDP (baseline)", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
         "ds-zero1": "ZeRO-1", "ds-zero2": "ZeRO-2", "ds-zero3": "ZeRO-3", "ds-offload": "ZeRO-Offload",
         "ds-infinity": "ZeRO-Infinity"}
IMPL = {"ddp": "torch DDP", "zero1": "torch ZeroRedundancyOptimizer", "zero2": "torch FSDP2 (no reshard)",
        "zero3": "torch FSDP2", "ds-zero1": "DeepSpeed stage 1", "ds-zero2": "DeepSpeed stage 2",
        "ds-zero3": "DeepSpeed stage 3", "ds-offload": "DeepSpeed stage 2 + CPU Adam",
        "ds-infinity": "DeepSpeed stage 3 + NVMe"}


def bus_traffic(ops: dict[str, float], n: int) -> float:
    """Bytes on the bus per rank and step: Σ bytes × busbw factor (DESIGN.md)."""
    return sum(b * A.busbw_factor(op, n) for op, b in ops.items() if b)


def placement(c: dict) -> dict:
    """Measured and derived device / host / NVMe bytes of the largest rank. Torch's strategies
    hold everything on the device: params + grads + optimizer state."""
    mem = c["memory"]
    ranks = mem.get("per_rank") or []
    keys = ("device_bytes", "host_bytes", "nvme_bytes")

    def largest(rows):
        rows = [r for r in rows if r]
        return {k: max((r.get(k) or 0) for r in rows) for k in keys} if rows else {}

    if c["strategy"] in DT.DS_STRATEGIES:
        measured = largest(ranks)
        expected = {k: (mem.get("expected") or {}).get(k) for k in keys}
    else:
        def on_device(m):
            parts = [m.get(k) for k in ("params_bytes", "grads_bytes", "optimizer_bytes")]
            return None if any(p is None for p in parts) else {"device_bytes": sum(parts), "host_bytes": 0,
                                                                 "nvme_bytes": 0}
        measured = largest([on_device(r) for r in ranks])
        e = mem.get("expected") or {}
        expected = on_device(e) or {}
    return {"measured": measured, "expected": expected}


def rows(comparisons: list[dict]) -> list[dict]:
    """One row per run, in the classic order (others after), JSON-ready."""
    order = {s: i for i, s in enumerate(CLASSIC)}
    out = []
    for c in sorted(comparisons, key=lambda c: order.get(c["strategy"], len(order))):
        n = c["world_size"]
        measured = {o["op"]: o["measured_bytes"] for o in c["ops"]}
        expected = {o["op"]: o["expected_bytes"] for o in c["ops"] if o["expected_bytes"] is not None}
        textbook = {o["op"]: o["textbook_bytes"] for o in c["ops"] if o["textbook_bytes"] is not None}
        out.append({"strategy": c["strategy"], "stage": LABEL.get(c["strategy"], c["strategy"]),
                    "implementation": IMPL.get(c["strategy"], c["strategy"]), "step_ms": c["step_ms"],
                    "exposed_ms": c["exposed_ms"], "bus_measured": bus_traffic(measured, n),
                    "bus_theory": bus_traffic(expected, n) if expected else None,
                    "bus_textbook": bus_traffic(textbook, n) if textbook else None, **placement(c)})
    return out


def _mb(b):
    return "–" if b is None else f"{b / 1e6:.2f}"


def _pair(m, e):
    if m is None:
        return "–"
    if e is None:
        return _mb(m)
    return _mb(m) if abs(m - e) <= 0.005 * max(e, 1) else f"{_mb(m)} ({_mb(e)})"


def render(comparisons: list[dict], console: Console) -> None:
    if not any(c["strategy"] in DT.DS_STRATEGIES for c in comparisons):
        return
    t = Table(title="The classic comparison, per rank: time per step (ms), communication per step as bus traffic "
                    "(MB; theory for the implementation, textbook), memory after step 0 by place (MB; "
                    "theory in parentheses where it differs; on a CPU machine 'device' is DeepSpeed's placement, "
                    "host RAM too)", title_justify="left")
    for col in ("stage", "implementation", "step", "exposed", "bus MB", "theory", "textbook", "device", "host", "NVMe"):
        t.add_column(col, justify="left" if col in ("stage", "implementation") else "right")
    for r in rows(comparisons):
        m, e = r["measured"], r["expected"]
        t.add_row(r["stage"], r["implementation"], f"{r['step_ms']:.1f}", f"{r['exposed_ms']:.1f}",
                  _mb(r["bus_measured"]), _mb(r["bus_theory"]), _mb(r["bus_textbook"]),
                  *(_pair(m.get(k), e.get(k)) for k in ("device_bytes", "host_bytes", "nvme_bytes")))
    console.print(t)


def notes(c: dict) -> list[str]:
    """Where DeepSpeed's implementation departs from the textbook (and from torch's), measured."""
    s = c["strategy"]
    if s not in DT.DS_STRATEGIES:
        return []
    ops = {o["op"]: o for o in c["ops"]}
    out = []
    stage = DT.STAGE[s]
    if stage in (1, 2):
        ar = ops.get("all_reduce", {})
        out.append(f"DeepSpeed 0.19 all-reduces the gradients bucket by bucket ({ar.get('calls_per_step', 0):.0f} "
                   "all_reduces per step) and each rank keeps its partition (use_multi_rank_bucket_allreduce, "
                   "default on): twice the bus traffic of the textbook's reduce-scatter; torch's FSDP2 "
                   "reduce-scatters.")
        out.append("one all_gather_into_tensor of the whole flat parameter group after the optimizer "
                   "(allgather_bucket_size does not split it where all_gather_into_tensor exists).")
    else:
        out.append("every module's own parameters are gathered before its forward and again before its "
                   "backward; a parameter two modules use (GPT's tied embedding and head) is gathered once per "
                   "module. Steps 0-1 also broadcast DeepSpeed's module-trace checks: bytes are from step 2 on.")
    if s == "ds-offload":
        out.append("optimizer states and the fp32 master partition live on the host and DeepSpeedCPUAdam "
                   "updates them there ('offload' rows); communication is stage 2's.")
    if s == "ds-infinity":
        out.append(f"DeepSpeed swaps to NVMe only tensors of at least {DT.MIN_AIO_BYTES // 2**20} MiB "
                   "(MIN_AIO_BYTES): smaller partitions stay in host memory.")
    return out

