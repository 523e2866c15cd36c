"""A plain DDP script with a sparse embedding (nn.Embedding(sparse=True), as recommendation models
use), no syncviz import: its buckets must be timed and its bytes be what gloo moves (test_reducer_group).

usage: ddp_sparse.py --steps N --save PATH   (rank 0 saves the parameters)
"""
import argparse
import gc

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--save", default="")
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 32, sparse=True)
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.body(self.emb(x).mean(1))


model = DDP(Net(), bucket_cap_mb=0.01)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(a.steps):
    g = torch.Generator().manual_seed(step * 10 + rank)
    x, y = torch.randint(0, 1000, (16, 8), generator=g), torch.randint(0, 4, (16,), generator=g)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
if rank == 0 and a.save:
    torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, a.save)
# DDP goes before its process group, and the ranks leave together: as this script ended before
# (destroy_process_group under a live DDP, rank 0 still saving), a rank aborted at exit in 5-6 of 30
# plain torchrun runs here ("terminate called without an active exception", SIGABRT; torch 2.13,
# gloo); with DDP deleted and collected and a barrier first, 0 of 30.
model = opt = None
gc.collect()
dist.barrier()
dist.destroy_process_group()
