"""Many DDP models, each trained 3 steps, so DDP rebuilds its buckets once per model (the second
step's forward broadcasts the new bucket order through the reducer's process group). Used by
test_reducer_group: under syncviz that broadcast went through the wrapped group holding the GIL
and deadlocked against gloo's worker thread about once in 450 rebuilds (record/reducer_group.py).

usage: many_rebuilds.py [--models N]
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--models", type=int, default=100)
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
for k in range(a.models):
    torch.manual_seed(k)
    ddp = DDP(nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)]), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        ddp(torch.randn(8, 64)).square().mean().backward()
        opt.step()
dist.destroy_process_group()
