"""A user's DDP script (no syncviz import) for the CUDA checks, on CPU or CUDA tensors.

    python ddp_train.py OUT [--device cuda] [--steps 8] [--profile-from 2] [--sync-debug-from 2]

Backend from SYNCVIZ_BACKEND (default nccl on CUDA, gloo on CPU). On CUDA every rank uses GPU
LOCAL_RANK % device count, so 2 ranks share one GPU (gloo only: NCCL refuses two ranks on one
device). --profile-from K: torch.profiler (CPU + CUDA activities) from step K to the end, written
to OUT/profile-<rank>.json. --sync-debug-from K: torch.cuda.set_sync_debug_mode("error") from
step K on; a synchronizing call then raises, the script prints "SYNC-ERROR: ..." and exits 3.
The loop itself never synchronizes (no .item(), SGD without momentum), so a raise comes from
whatever is hooked into it.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--width", type=int, default=0, help="Linear width (default: 1024 CPU, 2048 CUDA)")
ap.add_argument("--layers", type=int, default=0, help="Linear layers (default: 4 CPU, 8 CUDA)")
ap.add_argument("--batch", type=int, default=0, help="rows per step (default: 64 CPU, 1024 CUDA)")
ap.add_argument("--bucket-cap-mb", type=float, default=0, help="default: 4 CPU, 25 CUDA")
ap.add_argument("--profile-from", type=int, default=-1)
ap.add_argument("--sync-debug-from", type=int, default=-1)
a = ap.parse_args()
cuda = a.device == "cuda"
width = a.width or (2048 if cuda else 1024)
layers = a.layers or (8 if cuda else 4)
batch = a.batch or (1024 if cuda else 64)
cap = a.bucket_cap_mb or (25 if cuda else 4)

backend = os.environ.get("SYNCVIZ_BACKEND") or ("nccl" if cuda else "gloo")
if cuda:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
dist.init_process_group(backend)
rank = dist.get_rank()
device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
torch.manual_seed(0)
net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
model = DDP(net, bucket_cap_mb=cap)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
gen = torch.Generator(device=device).manual_seed(1000 + rank)
activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
prof = torch.profiler.profile(activities=activities) if a.profile_from >= 0 else None
try:
    for step in range(a.steps):
        if prof is not None and step == a.profile_from:
            prof.start()
        if cuda and step == a.sync_debug_from:
            torch.cuda.set_sync_debug_mode("error")
        x = torch.randn(batch, width, device=device, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
except RuntimeError as e:
    if cuda and torch.cuda.get_sync_debug_mode():
        torch.cuda.set_sync_debug_mode(0)
        print(f"SYNC-ERROR: rank {rank} step {step}: {str(e).splitlines()[0]}", flush=True)
        os._exit(3)    # the collective state is unknown now: no orderly teardown
    raise
if cuda:
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
if prof is not None:
    prof.stop()
    prof.export_chrome_trace(os.path.join(a.out, f"profile-{rank}.json"))
print(f"rank {rank}: {a.steps} steps on {device} ({backend}) done", flush=True)
dist.destroy_process_group()
sys.exit(0)
