"""Cost of one call of each recorder hook on the training hot path, in ns, measured directly:
the gradient-ready hook (one per parameter per micro-step), the collective wrapper around a real
``dist.all_reduce`` (world size 1, gloo; wrapped minus unwrapped), and a forward pre/post pair.

    python benchmarks/hook_cost.py                          # this checkout
    python benchmarks/hook_cost.py --compare ../other-tree  # and another checkout, interleaved

With --compare, both checkouts run in alternating subprocesses (``--rounds`` each) and the table
shows the median per call and the ratio, side by side from one run. It also understands the
pre-layout recorder (syncviz/record.py with underscored hooks), so it compares across that move.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import timeit


def measure(reps: int) -> dict[str, float]:
    """One round in this process: ns per call of each hook."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 300))
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:                                   # the layout with record/ as a package
        from syncviz.record import api, collectives
        rec = api.start(tempfile.mkdtemp(prefix="syncviz-hook-"))
        grad_hook, fwd_pre, fwd_post = rec.grad_hook, rec.forward_pre, rec.forward_post
    except ImportError:                    # the flat layout before it
        from syncviz import collectives, record
        rec = record.start(tempfile.mkdtemp(prefix="syncviz-hook-"))
        grad_hook, fwd_pre, fwd_post = rec._grad_hook, rec._forward_pre, rec._forward_post
    dist.init_process_group("gloo", rank=0, world_size=1)
    p = torch.nn.Parameter(torch.zeros(4))
    m, y, t = torch.nn.Identity(), torch.zeros(1), torch.zeros(16)
    hook = grad_hook(0)

    def pair():
        fwd_pre(m, ())
        fwd_post(m, (), y)

    def best(fn, number):   # ns per call, best of 9 repeats (other processes only ever add time)
        return min(timeit.repeat(fn, number=number, repeat=9)) / number * 1e9
    out = {"grad_ready": best(lambda: hook(p), reps), "forward_pair": best(pair, reps // 5)}
    rec.micro = -1
    n = max(100, reps // 100)
    plain = best(lambda: dist.all_reduce(t), n)
    collectives.install(rec)
    wrapped = best(lambda: dist.all_reduce(t), n)
    collectives.uninstall()
    out["collective_wrapper"] = wrapped - plain
    dist.destroy_process_group()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50000, help="calls per hook per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per checkout")
    ap.add_argument("--compare", default=None, help="another checkout of syncviz to measure beside this one")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # a subprocess's single round
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.reps)))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here} | ({"other": os.path.abspath(a.compare)} if a.compare else {})
    results: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(a.rounds):
        for label, tree in trees.items():    # interleaved: machine noise hits both alike
            env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--reps", str(a.reps)],
                                 env=env, cwd=tree, capture_output=True, text=True, timeout=600)
            if res.returncode:
                sys.exit(f"{label} ({tree}) failed: {res.stderr.strip().splitlines()[-1:]}")
            results[label].append(json.loads(res.stdout.strip().splitlines()[-1]))
    keys = list(results["this"][0])
    # the minimum over rounds: on a shared 2-core machine other processes only ever add time
    med = {label: {k: min(r[k] for r in rs) for k in keys} for label, rs in results.items()}
    print(f"ns per call, best of {a.rounds} rounds × {a.reps} calls" + (f"; other = {a.compare}" if a.compare else ""))
    print(f"{'hook':<20}" + "".join(f"{label:>12}" for label in trees) + ("   this/other" if a.compare else ""))
    for k in keys:
        row = f"{k:<20}" + "".join(f"{med[label][k]:>12.0f}" for label in trees)
        if a.compare and med["other"][k] > 0:
            row += f"   {med['this'][k] / med['other'][k]:>10.2f}"
        print(row)


if __name__ == "__main__":
    main()
