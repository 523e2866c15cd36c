"""Clocks: one monotonic ns clock per rank, aligned to rank 0 by a timestamp exchange.

Each rank reads CLOCK_MONOTONIC (time.monotonic_ns). On one host all ranks share it, so the
measured offsets are ~0; across hosts they differ by an unknown constant (boot times), which the
ping-pong exchange below estimates NTP-style: offset = t_rank0 − (t_send + t_recv)/2 with error
bound (t_recv − t_send)/2, keeping the round with the smallest round trip.

SYNCVIZ_CLOCK_SKEW_NS adds a constant to this rank's clock: tests use it to fake a node whose
clock is off, which alignment must recover.
"""
from __future__ import annotations

import os
import time

ROUNDS = 8


def _skew() -> int:
    try:
        return int(os.environ.get("SYNCVIZ_CLOCK_SKEW_NS", "0"))
    except ValueError:
        return 0


_SKEW = _skew()


def skew_ns() -> int:
    """SYNCVIZ_CLOCK_SKEW_NS: what local_ns adds to time.monotonic_ns (0 outside tests)."""
    return _SKEW


def skewed() -> bool:
    """True when SYNCVIZ_CLOCK_SKEW_NS shifts this rank's clock (local_ns is then not monotonic_ns)."""
    return _SKEW != 0


def local_ns() -> int:
    """This rank's raw clock (monotonic ns, plus the test skew if any)."""
    return time.monotonic_ns() + _SKEW


def estimate_offsets(group=None, rounds: int = ROUNDS) -> tuple[int, int]:
    """Collective over ``group`` (every rank must call it): returns (offset_ns, error_ns) such
    that rank0_clock ≈ local_clock + offset_ns. Rank 0 gets (0, 0). Uses CPU tensors, so the
    group must be a gloo group."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    buf = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        for peer in range(1, world):
            gpeer = dist.get_global_rank(group, peer) if group is not None else peer
            for _ in range(rounds):
                dist.recv(buf, src=gpeer, group=group)
                buf[0] = local_ns()
                dist.send(buf, dst=gpeer, group=group)
        return 0, 0
    g0 = dist.get_global_rank(group, 0) if group is not None else 0
    best = None
    for _ in range(rounds):
        t1 = local_ns()
        buf[0] = t1
        dist.send(buf, dst=g0, group=group)
        dist.recv(buf, src=g0, group=group)
        t3 = local_ns()
        t2 = int(buf[0])
        rtt = t3 - t1
        if best is None or rtt < best[0]:
            best = (rtt, t2 - (t1 + t3) // 2)
    return best[1], best[0] // 2


def broadcast_int(value: int, group=None) -> int:
    """Rank 0's ``value`` on every rank."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([value], dtype=torch.int64)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(t, src=src, group=group)
    return int(t[0])
