"""What root discovery costs a forward (syncviz.record.discover): a plain nn.Module of many small
submodules (no DDP, so syncviz finds the root itself), one process, interleaved rounds:

- plain:     no recorder;
- global:    torch's global module forward hooks of discovery (every module call pays them);
- root only: the per-root hooks syncviz keeps after the first step (one pre- and post-hook per
             forward, whatever the model's depth).

    python benchmarks/discovery_cost.py [--modules 400] [--rounds 15] [--forwards 20]

Prints the median forward time of each and the extra time per forward and per module call, so
the choice (global hooks only until the first step ends) can be checked on any machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", type=int, default=400, help="small Linear(16, 16) modules in the model")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--forwards", type=int, default=20, help="forwards per round and mode")
    a = ap.parse_args()
    import torch

    from syncviz.record.recorder import Recorder
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(a.modules)])
    x = torch.randn(4, 16)

    def timed() -> float:
        t = time.perf_counter_ns()
        for _ in range(a.forwards):
            model(x).sum().backward()
        return (time.perf_counter_ns() - t) / a.forwards

    times = {"plain": [], "global": [], "root only": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            times["plain"].append(timed())
            os.makedirs(f"{d}/run{r}")
            rec = Recorder(f"{d}/run{r}", rank=0, world_size=1)   # discovery on: global hooks
            times["global"].append(timed())
            rec.end_step()                                         # roots found: per-root hooks only
            times["root only"].append(timed())
            rec.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    calls = a.modules + 1
    print(f"forward+backward of {a.modules} modules, median of {a.rounds} rounds × {a.forwards}:")
    for k, v in med.items():
        extra = v - med["plain"]
        print(f"  {k:10s} {v / 1e6:8.3f} ms   ×{v / med['plain']:.3f}   extra {extra / 1e3:8.1f} µs/forward"
              f"  ({extra / calls / 1e3:6.2f} µs per module call)")


if __name__ == "__main__":
    main()
