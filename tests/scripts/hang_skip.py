"""One rank skips a collective: rank 1 does not join step SKIP's gradient all-reduce and goes on
with something else (here: sleeping), so rank 0 waits in that all_reduce until gloo's 30-minute
timeout. Used by test_hang: `syncviz trace --hang-timeout S` must report it and stop the ranks.

With --ddp the model is DDP's and rank 1 skips step SKIP's backward: rank 0 waits in DDP's bucket
all-reduce (its reducer's, timed by syncviz's process group).

usage: hang_skip.py [--steps N] [--skip STEP] [--step-sleep S] [--ddp]
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
p.add_argument("--ddp", action="store_true", help="DDP's buckets instead of a hand-written all_reduce")
a = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
if a.ddp:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(a.steps):
    time.sleep(a.step_sleep)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    loss = nn.functional.cross_entropy(model(x), y)
    if a.ddp and step == a.skip and rank == 1:
        time.sleep(3600)          # this rank never launches the bucket all-reduces of its backward
    loss.backward()
    if not a.ddp:
        flat = torch.cat([q.grad.flatten() for q in model.parameters()])
        if step == a.skip and rank == 1:
            time.sleep(3600)      # this rank never launches the all_reduce below
        dist.all_reduce(flat)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
