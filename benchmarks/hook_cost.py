"""Cost of syncviz's hooks per call, measured in one process (world size 1, gloo), plain vs traced
interleaved: a DDP model of many small parameters (every parameter fires a gradient-ready hook,
every bucket a comm hook and an all_reduce through the collective wrapper).

    python benchmarks/hook_cost.py [--params 1000] [--rounds 30] [--steps 5]

Prints the median extra time per traced step, per hook call (grad-ready + bucket + collective),
and the traced/plain ratio with its 10–90% range over the paired rounds. Run it on two checkouts to
compare implementations (the number is per call, so it does not depend on the model's compute).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=1000, help="parameter tensors (each a gradient-ready hook)")
    ap.add_argument("--bucket-cap-mb", type=float, default=0.01, help="DDP bucket cap (small: many buckets)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=5, help="steps per round and mode")
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import syncviz
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)

    class Many(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(16)) for _ in range(n)])

        def forward(self, x):
            return sum((w * x).sum() for w in self.ws)

    x = torch.randn(16)

    def build():
        torch.manual_seed(0)
        m = DDP(Many(a.params), bucket_cap_mb=a.bucket_cap_mb)
        return m, torch.optim.SGD(m.parameters(), lr=1e-3)

    def run_steps(m, opt):
        t0 = time.perf_counter_ns()
        for _ in range(a.steps):
            opt.zero_grad()
            m(x).backward()
            opt.step()
        return (time.perf_counter_ns() - t0) / a.steps

    plain_m, plain_opt = build()
    out = tempfile.mkdtemp(prefix="syncviz-hookcost-")
    rec = syncviz.record.start(out) if hasattr(syncviz, "record") else None
    import syncviz.record as R
    rec = R.start(out)
    try:
        from syncviz.record import collectives
    except ImportError:
        import syncviz.collectives as collectives
    collectives.install(rec)
    traced_m, traced_opt = build()
    collectives.uninstall()
    # warm-up: DDP rebuilds its buckets after the first step
    run_steps(plain_m, plain_opt)
    collectives.install(rec)
    run_steps(traced_m, traced_opt)
    nbuckets = len(traced_m.reducer._get_zeros_like_grad_buckets()) if hasattr(
        traced_m.reducer, "_get_zeros_like_grad_buckets") else None
    collectives.uninstall()
    diffs, ratios = [], []
    for _ in range(a.rounds):
        p = run_steps(plain_m, plain_opt)
        collectives.install(rec)
        t = run_steps(traced_m, traced_opt)
        collectives.uninstall()
        diffs.append(t - p)
        ratios.append(t / p)
    rec.close()
    dist.destroy_process_group()
    diffs.sort()
    ratios.sort()
    q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))]  # noqa: E731
    med = statistics.median(diffs)
    calls = a.params + 2 * (nbuckets or 0)
    print(f"params {a.params}, buckets {nbuckets}, {a.rounds} rounds × {a.steps} steps")
    print(f"extra per traced step: median {med / 1e3:.0f} µs (p10 {q(diffs, .1) / 1e3:.0f}, p90 {q(diffs, .9) / 1e3:.0f})")
    print(f"per hook call (grad-ready + bucket + collective = {calls} calls/step): {med / max(calls, 1):.0f} ns")
    print(f"traced/plain ratio: median {statistics.median(ratios):.3f} (p10 {q(ratios, .1):.3f}, p90 {q(ratios, .9):.3f})")


if __name__ == "__main__":
    sys.exit(main())
