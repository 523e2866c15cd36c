"""A user's DDP script (no syncviz import) that also collects two independent measurements of the
same steps: DDP's own runtime-logging timers and a torch.profiler trace. Used by test_crosscheck."""
import json
import os
import sys

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
dist.destroy_process_group()
