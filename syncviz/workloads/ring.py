"""Ring all-reduce for real: reduce-scatter then all-gather, written with send/recv between gloo
ranks, next to the two naive schemes it replaces, with the bytes each rank sent counted twice:
by the algorithm (payload handed to isend) and by the kernel (/proc/self/io ``wchar``, which
counts every byte this process wrote to its sockets; gloo adds a ~96-byte header per message).

    torchrun --nproc-per-node 4 -m syncviz.workloads.ring --mb 4 --out traces/ring

Why a ring: with D bytes on N ranks, cut the array into N chunks. In N−1 steps every rank sends
one chunk to its right neighbour and adds the chunk arriving from its left (reduce-scatter): now
rank r holds the full sum of chunk r+1. In N−1 more steps the summed chunks travel once around
the ring (all-gather). Every rank sends 2(N−1) chunks of D/N: 2(N−1)/N·D, under 2D however many
ranks there are. Sending every rank's whole array to every other rank (all-to-all) costs
(N−1)·D per rank; a parameter server receives and sends (N−1)·D itself. O(1) vs O(N) per rank.

Each chunk transfer is recorded (phase, step, chunk, src → dst, bytes, start/end on the host's
monotonic clock, shared by all ranks of one machine) and rank 0 writes them, with the byte counts
and the check against ``dist.all_reduce``, to ``<out>/ring-N<n>.json`` (the dashboard's Lesson
page animates it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from syncviz.analysis.ring import formulas, ring_states  # noqa: F401  (re-exported)


def wchar() -> int:
    """Bytes this process has written with write()/send() so far (Linux /proc/self/io)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def ring_all_reduce(t: torch.Tensor, log: list | None = None) -> int:
    """Sum ``t`` over all ranks in place with a ring; returns the payload bytes this rank sent.
    Appends one record per chunk this rank sent to ``log``."""
    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return 0
    parts = torch.tensor_split(t.view(-1), n)           # views: writing a part writes t
    right, left = (r + 1) % n, (r - 1) % n
    sent = 0
    for phase, steps in (("reduce-scatter", range(n - 1)), ("all-gather", range(n - 1))):
        for s in steps:
            if phase == "reduce-scatter":    # send what I accumulated last step, add what arrives
                send_c, recv_c = (r - s) % n, (r - s - 1) % n
                inbox = torch.empty_like(parts[recv_c])
            else:                             # pass the finished chunks around once
                send_c, recv_c = (r + 1 - s) % n, (r - s) % n
                inbox = parts[recv_c]
            start = time.monotonic_ns()
            reqs = [dist.isend(parts[send_c], right), dist.irecv(inbox, left)]
            for q in reqs:
                q.wait()
            if phase == "reduce-scatter":
                parts[recv_c].add_(inbox)
            nbytes = parts[send_c].numel() * parts[send_c].element_size()
            sent += nbytes
            if log is not None:
                log.append({"phase": phase, "step": s, "chunk": send_c, "src": r, "dst": right,
                            "bytes": nbytes, "start_ns": start, "end_ns": time.monotonic_ns()})
    return sent


def all_to_all_reduce(t: torch.Tensor) -> int:
    """Naive: every rank sends its whole array to every other rank and sums what it gets."""
    n, r = dist.get_world_size(), dist.get_rank()
    inboxes = {p: torch.empty_like(t) for p in range(n) if p != r}
    reqs = [dist.isend(t, p) for p in inboxes] + [dist.irecv(b, p) for p, b in inboxes.items()]
    for q in reqs:
        q.wait()
    total = torch.zeros_like(t)
    for p in range(n):                                  # rank order, as the ring's check needs none
        total += t if p == r else inboxes[p]
    t.copy_(total)
    return (n - 1) * t.numel() * t.element_size()


def parameter_server_reduce(t: torch.Tensor, server: int = 0) -> int:
    """Naive: workers send their arrays to one server, which sums and sends the result back."""
    n, r = dist.get_world_size(), dist.get_rank()
    nb = t.numel() * t.element_size()
    if r == server:
        inboxes = {p: torch.empty_like(t) for p in range(n) if p != r}
        for q in [dist.irecv(b, p) for p, b in inboxes.items()]:
            q.wait()
        for b in inboxes.values():
            t += b
        for q in [dist.isend(t, p) for p in inboxes]:
            q.wait()
        return (n - 1) * nb
    dist.send(t, server)
    dist.recv(t, server)
    return nb


def measure(elements: int, seed: int = 0) -> dict:
    """Run every scheme on the same data; per rank: payload bytes, kernel bytes, same result."""
    r = dist.get_rank()
    g = torch.Generator().manual_seed(seed * 1009 + r)
    # integer-valued floats: every summation order gives the same bits, so "same sum" is exact
    data = torch.randint(-1000, 1000, (elements,), generator=g).to(torch.float32)
    reference = data.clone()
    dist.all_reduce(reference)
    out: dict = {"rank": r, "transfers": []}
    for name, fn in (("ring", lambda x: ring_all_reduce(x, out["transfers"])), ("all_to_all", all_to_all_reduce),
                     ("parameter_server", parameter_server_reduce), ("torch_all_reduce", _torch_all_reduce)):
        x = data.clone()
        dist.barrier()
        w0 = wchar()
        payload = fn(x)
        w1 = wchar()
        dist.barrier()
        out[name] = {"payload_bytes": payload, "kernel_bytes": (w1 - w0) if w0 >= 0 else -1,
                     "same_as_all_reduce": bool(torch.equal(x, reference))}
    # the same ring on random floats: equal to gloo's all_reduce up to summation order
    f = torch.randn(elements, generator=g)
    ref = f.clone()
    dist.all_reduce(ref)
    ring_all_reduce(f)
    out["float_max_abs_diff"] = float((f - ref).abs().max())
    return out


def _torch_all_reduce(x: torch.Tensor) -> int:
    dist.all_reduce(x)
    return -1        # gloo's own algorithm: only the kernel count is known


def run(args) -> dict | None:
    n = dist.get_world_size()
    elements = max(n, int(args.mb * 1e6) // 4)
    per_rank = measure(elements, args.seed)
    gathered = [None] * n
    dist.all_gather_object(gathered, per_rank)
    if dist.get_rank() != 0:
        return None
    d = elements * 4
    result = {"world_size": n, "bytes": d, "elements": elements, "formulas": formulas(n, d),
              "ranks": [{k: v for k, v in g.items() if k != "transfers"} for g in gathered],
              "transfers": sorted((t for g in gathered for t in g["transfers"]), key=lambda t: t["start_ns"])}
    t0 = min((t["start_ns"] for t in result["transfers"]), default=0)
    for t in result["transfers"]:
        t["start_ns"] -= t0
        t["end_ns"] -= t0
    return result


def report(res: dict) -> str:
    n, d = res["world_size"], res["bytes"]
    f, ranks = res["formulas"], res["ranks"]
    mb = lambda x: f"{x / 1e6:.3f}"   # noqa: E731
    worst = lambda s, k: max(r[s][k] for r in ranks)   # noqa: E731
    lines = [f"all-reduce of D = {mb(d)} MB on N = {n} ranks (bytes sent per rank, MB; "
             f"'kernel' = /proc/self/io wchar, max over ranks)",
             f"  ring          formula 2(N-1)/N*D = {mb(f['ring']):>8}   algorithm {mb(worst('ring', 'payload_bytes')):>8}"
             f"   kernel {mb(worst('ring', 'kernel_bytes')):>8}   {2 * (n - 1)} steps of {mb(d / n)} MB",
             f"  all-to-all    formula   (N-1)*D  = {mb(f['all_to_all']):>8}   algorithm "
             f"{mb(worst('all_to_all', 'payload_bytes')):>8}   kernel {mb(worst('all_to_all', 'kernel_bytes')):>8}",
             f"  param server  formula   (N-1)*D  = {mb(f['parameter_server']):>8}   algorithm "
             f"{mb(worst('parameter_server', 'payload_bytes')):>8}   kernel "
             f"{mb(worst('parameter_server', 'kernel_bytes')):>8}   (server; workers send D)",
             f"  gloo all_reduce (torch)                          kernel "
             f"{mb(worst('torch_all_reduce', 'kernel_bytes')):>8}"]
    same = all(r[s]["same_as_all_reduce"] for r in ranks for s in ("ring", "all_to_all", "parameter_server"))
    lines.append(f"  every scheme gives dist.all_reduce's sum bit for bit: {'yes' if same else 'NO'} "
                 f"(integer-valued data); random floats, ring vs all_reduce: max |diff| "
                 f"{max(r['float_max_abs_diff'] for r in ranks):.3g}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m syncviz.workloads.ring", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=4.0, help="array size D in MB (1e6 bytes; fp32) [4]")
    p.add_argument("--out", default="", help="directory for ring-N<n>.json (rank 0) [none]")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not args.mb > 0:
        sys.exit("syncviz.workloads.ring: --mb must be > 0")
    dist.init_process_group(backend="gloo")
    try:
        res = run(args)
        if res is not None:
            print(report(res), flush=True)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                path = Path(args.out) / f"ring-N{res['world_size']}.json"
                path.write_text(json.dumps(res, indent=1))
                print(f"  transfers of every chunk: {path}", flush=True)
    finally:
        dist.destroy_process_group()
        from syncviz.record.quiesce import quiesce
        quiesce()     # let gloo's threads release Python objects before teardown (see quiesce.py)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

