"""One rank skips a collective: rank 1 does not join step SKIP's gradient all-reduce and goes on
with something else (here: sleeping), so rank 0 waits in that all_reduce until gloo's 30-minute
timeout. Used by test_hang: `syncviz trace --hang-timeout S` must report it and stop the ranks.

usage: hang_skip.py [--steps N] [--skip STEP] [--step-sleep S]
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--skip", type=int, default=3)
p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of 'compute' per step")
a = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(a.steps):
    time.sleep(a.step_sleep)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    nn.functional.cross_entropy(model(x), y).backward()
    flat = torch.cat([q.grad.flatten() for q in model.parameters()])
    if step == a.skip and rank == 1:
        time.sleep(3600)          # this rank never launches the all_reduce below
    dist.all_reduce(flat)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
