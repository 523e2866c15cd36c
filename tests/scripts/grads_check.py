"""DDP on gloo that writes, after each backward, the first 4 elements of every parameter's .grad
(what DDP left there) to <out>/dotgrad-<rank>.json: tests compare them with the "after" values
`syncviz trace --grad-values` recorded inside the comm hook."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)),
            bucket_cap_mb=0.001)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
names = [n for n, _ in model.module.named_parameters()]
seen = []
for step in range(3):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 3, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    seen.append({n: p.grad.reshape(-1)[:4].tolist() for n, p in zip(names, model.module.parameters())})
    opt.step()
    opt.zero_grad()
with open(os.path.join(out, f"dotgrad-{rank}.json"), "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
