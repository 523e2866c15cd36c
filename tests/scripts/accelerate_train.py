"""A Hugging Face ``accelerate`` user's loop with gradient accumulation: ``accelerator.prepare``
wraps the model (DDP on several processes), ``accelerator.accumulate`` skips the gradient sync
and the optimizer step on all but every K-th batch, ``accelerator.backward`` runs backward. No
syncviz import. Run under ``syncviz trace --nproc-per-node 2`` (accelerate reads torchrun's
environment).

usage: accelerate_train.py [--steps N] [--accum K]
"""
import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--accum", type=int, default=2)
a = p.parse_args()

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=a.accum)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
n = 32 * a.steps * a.accum * accelerator.num_processes
data = DataLoader(TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 4, (n,), generator=g)), batch_size=32)
model, opt, data = accelerator.prepare(model, opt, data)
model.train()
for x, y in data:
    with accelerator.accumulate(model):
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
accelerator.print(f"ACCELERATE distributed_type={accelerator.distributed_type} processes={accelerator.num_processes}")
accelerator.end_training()
