"""A user's FSDP2 loop: ``fully_shard`` on each block and on the root, AdamW, an evaluation under
``torch.inference_mode()`` every other step. No syncviz import.

usage: fsdp2_train.py [--steps N] [--reshard 0|1]
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--reshard", type=int, default=1)
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
blocks = [nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128)) for _ in range(3)]
model = nn.Sequential(*blocks, nn.Linear(128, 10))
for b in blocks:
    fully_shard(b, reshard_after_forward=bool(a.reshard))
fully_shard(model, reshard_after_forward=bool(a.reshard))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(a.steps):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(32, 128, generator=g), torch.randint(0, 10, (32,), generator=g)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if step % 2 == 1:
        with torch.inference_mode():
            model(x)
dist.destroy_process_group()
