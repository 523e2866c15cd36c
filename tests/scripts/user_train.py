"""A user's own DDP training script, with no syncviz import: its own model, gradient accumulation
with no_sync, and its own comm hook (or a built-in one). Used by test_e2e_ddp.

usage: user_train.py --steps N --accum K [--hook mine|builtin-fp16|none] [--die-at STEP] [--save PATH]
"""
import argparse
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--accum", type=int, default=2)
p.add_argument("--hook", default="mine")
p.add_argument("--die-at", type=int, default=-1)
p.add_argument("--save", default="")
a = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1)
model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)),
            bucket_cap_mb=0.5)


def my_mean_hook(state, bucket):
    t = bucket.buffer()
    t.div_(world)
    return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])


if a.hook == "mine":
    model.register_comm_hook(None, my_mean_hook)
    try:
        model.register_comm_hook(None, my_mean_hook)
    except RuntimeError as e:
        print(f"rank {rank}: SECOND_REGISTRATION_REFUSED: {e}", flush=True)
elif a.hook == "builtin-fp16":
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)

opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(a.steps):
    if step == a.die_at and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    for micro in range(a.accum):
        g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
        x, y = torch.randn(32, 256, generator=g), torch.randint(0, 10, (32,), generator=g)
        if micro < a.accum - 1:
            with model.no_sync():
                nn.functional.cross_entropy(model(x), y).backward()
        else:
            nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if rank == 0:
        print(f"USER OUTPUT step {step}", flush=True)
if a.save and rank == 0:
    torch.save(model.module.state_dict(), a.save)
dist.destroy_process_group()
# Run plainly (the untraced half of a bitwise comparison) this script must also survive torch's
# exit race; `syncviz trace` does the same for every traced script (syncviz/record/quiesce.py).
from syncviz.record.quiesce import quiesce  # noqa: E402
quiesce()
