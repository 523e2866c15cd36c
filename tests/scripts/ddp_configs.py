"""A plain DDP script under one of DDP's configurations, with no syncviz import: the buckets of
each must be timed, numbered and mapped to parameters as DDP itself has them (test_reducer_group).

usage: ddp_configs.py --config NAME --steps N --save PATH [--device cuda]

Configurations: default, unused (find_unused_parameters with a layer that takes no part),
static (static_graph), view (gradient_as_bucket_view), accum (no_sync micro-steps, then one
synced), join (uneven inputs under DDP's join context: rank 1 runs out of batches first),
buffers (BatchNorm: its buffers broadcast at every forward), regroup (after step 1 DDP is moved to
a new process group with _update_process_group, as elastic and fault-tolerant wrappers do: DDP resets
its reducer and rebuilds its buckets again). Rank 0 saves the parameters and
DDP's own bucket layout (its logging data: rebuilt_per_bucket_param_indices) to --save.
--device cuda: the model and batches on GPU LOCAL_RANK % count (backend SYNCVIZ_BACKEND, default nccl;
gloo lets two ranks share one GPU).
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--config", default="default")
p.add_argument("--steps", type=int, default=4)
p.add_argument("--save", default="")
p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
a = p.parse_args()
cuda = a.device == "cuda"


class Net(nn.Module):
    def __init__(self, unused: bool, bn: bool):
        super().__init__()
        self.inp = nn.Linear(64, 96)
        self.norm = nn.BatchNorm1d(96) if bn else nn.Identity()
        self.body = nn.Sequential(*[nn.Linear(96, 96) for _ in range(5)])
        self.spare = nn.Linear(96, 96) if unused else None
        self.out = nn.Linear(96, 8)

    def forward(self, x):
        return self.out(self.body(torch.relu(self.norm(self.inp(x)))))


if cuda:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
dist.init_process_group(os.environ.get("SYNCVIZ_BACKEND") or ("nccl" if cuda else "gloo"))
rank = dist.get_rank()
device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
torch.manual_seed(0)
cfg = a.config
model = DDP(Net(cfg == "unused", cfg == "buffers").to(device), bucket_cap_mb=0.05,
            find_unused_parameters=cfg == "unused", static_graph=cfg == "static",
            gradient_as_bucket_view=cfg == "view")
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(16, 64, generator=g).to(device), torch.randint(0, 8, (16,), generator=g).to(device)


def loss(x, y):
    return nn.functional.cross_entropy(model(x), y)


if cfg == "join":
    steps = a.steps - (1 if rank == 1 else 0)     # rank 1 runs out first; DDP shadows its all-reduces
    with Join([model]):
        for step in range(steps):
            loss(*batch(step)).backward()
            opt.step()
            opt.zero_grad()
else:
    for step in range(a.steps):
        if cfg == "accum":
            with model.no_sync():
                loss(*batch(step, 1)).backward()
        loss(*batch(step)).backward()
        opt.step()
        opt.zero_grad()
        if cfg == "regroup" and step == 1:
            model._update_process_group(dist.new_group([0, 1]))

if rank == 0 and a.save:
    log = model._get_ddp_logging_data()
    torch.save({"params": {k: v.detach().cpu().clone() for k, v in model.module.state_dict().items()},
                "rebuilt": log.get("rebuilt_per_bucket_param_indices", ""),
                "names": [n for n, _ in model.module.named_parameters()]}, a.save)
# DDP goes before its process group, and the ranks leave together: as this script ended before
# (destroy_process_group under a live DDP, rank 0 still saving), a rank aborted at exit in 5-6 of 30
# plain torchrun runs here ("terminate called without an active exception", SIGABRT; torch 2.13,
# gloo); with DDP deleted and collected and a barrier first, 0 of 30.
model = opt = None
gc.collect()
dist.barrier()
dist.destroy_process_group()
