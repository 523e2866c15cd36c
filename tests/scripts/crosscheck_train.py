"""A user's DDP script (no syncviz import) that also collects two independent measurements of the
same steps: DDP's own runtime-logging timers and a torch.profiler trace. Used by test_crosscheck."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

out = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
# ~16 MB of fp32 gradients in 4 Linear layers → several 4 MB buckets that overlap backward
net = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)])
model = DDP(net, bucket_cap_mb=4)
model._set_ddp_runtime_logging_sample_rate(1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ddp_times = []
prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
for step in range(steps):
    if step == 2:
        prof.start()
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(step * 10 + rank))
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    d = model._get_ddp_logging_data()
    ddp_times.append({k: d.get(k) for k in ("forward_compute_time", "backward_compute_time", "backward_comm_time",
                                            "backward_compute_comm_overlap_time", "avg_forward_compute_time",
                                            "avg_backward_compute_time", "avg_backward_comm_time")})
    if step == steps - 1:
        prof.stop()
prof.export_chrome_trace(os.path.join(out, f"profile-{rank}.json"))
with open(os.path.join(out, f"ddp-timers-{rank}.json"), "w") as f:
    json.dump(ddp_times, f)
# A standalone all_reduce of each bucket's size in the same job, after training: the bandwidth a
# collective gets when nothing else runs (benchmarks/crosscheck.py compares busbw on service time).
# (with a 4 MB cap every bucket here is one Linear layer: 4,198,400 bytes; DDP's logging data
# reports the buckets before its rebuild, one 16.8 MB bucket, so it is not used)
sizes = [sum(p.numel() * p.element_size() for p in net[0].parameters())]
# Timed as nccl-tests does: back-to-back calls after a barrier, total / calls, so a rank leaving
# the barrier late adds little; the median of 5 batches of 5.
probe = {}
for nbytes in sizes:
    buf = torch.ones(nbytes // 4)
    dist.all_reduce(buf)              # warm-up
    batches = []
    for _ in range(5):
        dist.barrier()
        t0 = time.perf_counter_ns()
        for _ in range(5):
            dist.all_reduce(buf)
        batches.append((time.perf_counter_ns() - t0) / 5)
    probe[nbytes] = sorted(batches)[len(batches) // 2]
with open(os.path.join(out, f"probe-{rank}.json"), "w") as f:
    json.dump({"world_size": dist.get_world_size(), "median_ns": probe}, f)
dist.destroy_process_group()
