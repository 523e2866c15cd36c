"""GPT-2 small (syncviz.workloads.gpt preset "small", 124M) under DDP on one GPU: the overhead workload.

    torchrun --nproc-per-node 1 gpt_train.py [--steps 12] [--batch 8] [--seq 1024] [--torch-profiler]
    torchrun --nproc-per-node 2 gpt_train.py --device cpu --preset tiny ...   (the CPU self-check)

Prints "step N  loss L  T ms" lines like syncviz.workloads (benchmarks/overhead.py parses them).
The step time ends at a torch.cuda.synchronize() after opt.step(): the script's own wait, after
syncviz's step-end hook, so the GPU work of the step is inside it. bf16 autocast, TF32 matmuls.
Backend from SYNCVIZ_BACKEND (default nccl on CUDA, gloo on CPU).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from syncviz.workloads.gpt import GPT, preset, synthetic_batch

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="small")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--torch-profiler", action="store_true")
ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
a = ap.parse_args()
cuda = a.device == "cuda"
if cuda:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    torch.backends.cuda.matmul.allow_tf32 = True
else:
    torch.set_num_threads(1)
dist.init_process_group(os.environ.get("SYNCVIZ_BACKEND") or ("nccl" if cuda else "gloo"))
rank = dist.get_rank()
device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
torch.manual_seed(0)
cfg = preset(a.preset)
model = DDP(GPT(cfg).to(device))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batches = [tuple(t.to(device) for t in synthetic_batch(cfg, a.batch, a.seq, seed=s * 7 + rank)) for s in range(4)]
prof = None
if a.torch_profiler:
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                  + ([torch.profiler.ProfilerActivity.CUDA] if cuda else []))
    prof.start()
for step in range(a.steps):
    t = time.perf_counter()
    x, y = batches[step % len(batches)]
    with torch.autocast(a.device, dtype=torch.bfloat16, enabled=cuda):
        loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t)
    if rank == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}  {ms:8.1f} ms", flush=True)
    if prof is not None:
        prof.step()
if prof is not None:
    prof.stop()
# gloo's threads releasing Python objects during interpreter teardown abort a rank now and
# then (SIGABRT, once in ~8 runs of engine_cpu here): collect cycles first, skip the teardown after.
import gc  # noqa: E402

gc.collect()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
