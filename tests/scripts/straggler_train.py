"""A user's DDP script (no syncviz import) with one rank slowed on purpose: it sleeps before each
forward. Four small buckets per step, so a run has enough collectives to tell a consistent
straggler from chance. Used by test_straggler.

usage: straggler_train.py SLOW_RANK SLEEP_MS [STEPS]
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

slow, sleep_ms = int(sys.argv[1]), float(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
# 4 layers of 64 KiB of fp32 weights; a 0.06 MB cap puts each in its own bucket
model = DDP(nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)]), bucket_cap_mb=0.06)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 128)
for step in range(steps):
    if rank == slow:
        time.sleep(sleep_ms / 1e3)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
