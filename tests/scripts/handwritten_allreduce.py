"""A hand-written data-parallel loop, no wrapper: broadcast the parameters from rank 0, then after
each backward all_reduce every parameter's gradient (one call per parameter) and divide by the
world size. Used by tests/test_engines.py under ``syncviz trace``.

usage: handwritten_allreduce.py [--steps N] [--save PATH] [--probe]
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--save", default="")
p.add_argument("--probe", action="store_true", help="rank 0 runs a forward with grad enabled that no backward follows")
a = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)          # different on purpose: the broadcast makes them equal
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
for p_ in model.parameters():
    dist.broadcast(p_.data, src=0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(a.steps):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(64, 128, generator=g), torch.randint(0, 10, (64,), generator=g)
    if a.probe and rank == 0:
        model(x).sum().item()          # grad enabled, never backpropagated: evaluation
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    for p_ in model.parameters():
        dist.all_reduce(p_.grad)
        p_.grad.div_(world)
    opt.step()
    opt.zero_grad(set_to_none=True)
if a.save and rank == 0:
    torch.save(model.state_dict(), a.save)
dist.destroy_process_group()
# Run plainly (the untraced half of a bitwise comparison) this script must also survive torch's
# exit race; `syncviz trace` does the same for every traced script (syncviz/record/quiesce.py).
from syncviz.record.quiesce import quiesce  # noqa: E402
quiesce()
