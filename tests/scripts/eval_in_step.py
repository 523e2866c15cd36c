"""A nanoGPT-style DDP loop that evaluates inside the training step: gradient accumulation over
K micro-steps (no_sync on all but the last), and on rank 0 only (nanoGPT's ``master_process``)
an evaluation under ``torch.no_grad()`` between micro-steps. No syncviz import.

usage: eval_in_step.py [--steps N] [--accum K] [--evals E]
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--accum", type=int, default=2)
p.add_argument("--evals", type=int, default=3, help="eval forwards per step on rank 0")
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)),
            bucket_cap_mb=0.5)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.no_grad()
def estimate_loss():
    model.eval()
    for i in range(a.evals):
        g = torch.Generator().manual_seed(7 + i)
        model(torch.randn(64, 128, generator=g))
    model.train()


for step in range(a.steps):
    for micro in range(a.accum):
        if micro == a.accum - 1 and rank == 0:
            estimate_loss()
        g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
        x, y = torch.randn(32, 128, generator=g), torch.randint(0, 10, (32,), generator=g)
        if micro < a.accum - 1:
            with model.no_sync():
                nn.functional.cross_entropy(model(x), y).backward()
        else:
            nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
