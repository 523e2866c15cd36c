"""What the gradient-ready hooks add to a backward, side by side in one process: no hooks, syncviz's
Python hook (``register_post_accumulate_grad_hook``, one C++ -> Python call per parameter) and its
C++ hook (syncviz/record/native: a post hook on each AccumulateGrad node), on three sets of the same
parameters, blocks alternated round by round so drift hits all three alike.

    python benchmarks/grad_hooks.py                    # 1,200 parameters of 16 floats, 12 rounds
    python benchmarks/grad_hooks.py --params 300 --rounds 20

Prints the median backward's thread CPU time of each set, and each hook's cost per parameter per
backward (its median minus the no-hook median, over the parameters). The C++ hook needs its build
(``python -m syncviz.record.native``; ``syncviz trace`` and ``make install`` build it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=1200, help="parameters per set")
    ap.add_argument("--numel", type=int, default=16, help="elements per parameter")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--backwards", type=int, default=20, help="backwards per block")
    a = ap.parse_args()

    import torch
    from syncviz.record import native
    from syncviz.record.recorder import Recorder
    torch.set_num_threads(1)
    mod = native.load()
    if mod is None:
        print("the C++ hooks are not built here: python -m syncviz.record.native", file=sys.stderr)
        return 2
    torch.manual_seed(0)

    def params():
        return [torch.nn.Parameter(torch.randn(a.numel)) for _ in range(a.params)]

    sets = {"no hooks": params(), "python hook": params(), "c++ hook": params()}
    rec = Recorder(tempfile.mkdtemp(prefix="syncviz-hooks-"), rank=0, world_size=1)
    for i, p in enumerate(sets["python hook"]):
        p.register_post_accumulate_grad_hook(rec.grad_hook(i))
    log = mod.ReadyLog()
    # the C++ hook goes only where someone holds the node for the run (DDP's reducer): held here
    held = [p.view_as(p).grad_fn.next_functions[0][0] for p in sets["c++ hook"]]
    for i, p in enumerate(sets["c++ hook"]):
        log.hook(p, i)

    def block(ps) -> float:
        times = []
        for _ in range(a.backwards):
            loss = sum((p * p).sum() for p in ps)
            t = time.thread_time_ns()
            loss.backward()
            times.append(time.thread_time_ns() - t)
            for p in ps:
                p.grad = None
            rec._ready.clear()
            log.clear()
        return statistics.median(times)

    got: dict[str, list[float]] = {k: [] for k in sets}
    for r in range(a.rounds):
        for k, ps in sets.items():
            got[k].append(block(ps))
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, end="\r")
    base = statistics.median(got["no hooks"])
    print(f"{a.params} parameters of {a.numel} floats, {a.rounds} rounds x {a.backwards} backwards, "
          f"thread CPU time of the backward (median of rounds' medians)")
    print(f"{'set':<12} {'backward ms':>12} {'vs no hooks':>12} {'per parameter':>14}")
    for k, v in got.items():
        m = statistics.median(v)
        per = (m - base) / a.params
        print(f"{k:<12} {m / 1e6:>12.2f} {m / base:>12.3f} {per:>11.0f} ns")
    assert log.hooks() == len(held)        # every hook was in place to the end
    log.remove()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
