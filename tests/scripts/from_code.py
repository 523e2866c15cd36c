"""Ranks launched by the user (torch.multiprocessing), traced from code with syncviz.tracing()
and syncviz.instrument(). usage: from_code.py OUT_DIR MODE(tracing|instrument)"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import syncviz


def train(model, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()


def worker(rank, out, mode, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 64))
    if mode == "tracing":
        with syncviz.tracing(out):
            dist.init_process_group("gloo", rank=rank, world_size=2)
            train(DDP(net, bucket_cap_mb=0.05))
            dist.destroy_process_group()
    else:
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = syncviz.instrument(DDP(net, bucket_cap_mb=0.05), out=out)
        train(model)
        syncviz.record.get_recorder().close()
        dist.destroy_process_group()


if __name__ == "__main__":
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2], port), nprocs=2)
