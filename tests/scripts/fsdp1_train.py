"""A user's FSDP1 loop: ``FullyShardedDataParallel`` (the wrapper class) around a small model,
auto-wrapping its blocks, on CPU with gloo. No syncviz import.

usage: fsdp1_train.py [--steps N] [--sharding FULL_SHARD|SHARD_GRAD_OP|NO_SHARD]
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--sharding", default="FULL_SHARD")
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Block(nn.Sequential):
    pass


model = nn.Sequential(*[Block(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128)) for _ in range(3)], nn.Linear(128, 10))
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"),
             sharding_strategy=ShardingStrategy[a.sharding])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(a.steps):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(32, 128, generator=g), torch.randint(0, 10, (32,), generator=g)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
