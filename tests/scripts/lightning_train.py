"""A PyTorch Lightning user's script: a LightningModule trained by ``Trainer(strategy="ddp")`` on
CPU, with a validation loop every 2 steps (and Lightning's sanity check before training). No
syncviz import. Lightning's automatic optimization calls ``optimizer.step(closure)``: forward and
backward run inside the optimizer's step. Run under ``syncviz trace --nproc-per-node 2``
(torchrun's environment: Lightning joins the existing ranks instead of spawning).

usage: lightning_train.py [--steps N] [--accum K]
"""
import argparse
import os

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--accum", type=int, default=1)
a = p.parse_args()


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 4, (n,), generator=g)),
                      batch_size=32)


L.seed_everything(0, verbose=False)
trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 2)),
                    max_steps=a.steps, accumulate_grad_batches=a.accum, val_check_interval=2 * a.accum,
                    limit_val_batches=2, num_sanity_val_steps=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Net(), data(32 * 4 * a.steps * a.accum, 1), data(64, 2))
