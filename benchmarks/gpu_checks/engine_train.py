"""syncviz.sync's engine against torch DDP on the same model, data and device (rank script).

    torchrun --nproc-per-node N engine_train.py OUT.json [--device cuda] [--steps 5]

Backend from SYNCVIZ_BACKEND (default nccl on CUDA, gloo on CPU); on CUDA every rank uses GPU
LOCAL_RANK % device count. Trains the tiny GPT from one seed with the same per-rank batches under
DDP + AdamW, the engine's all_reduce + AdamW and its reduce_scatter (sharded AdamW), and writes
the largest parameter difference to DDP for each (rank 0; every rank checks it holds the same
parameters as rank 0). Expected, as tests/test_sync.py: all_reduce bitwise equal to DDP (both put
grad × 1/N in a bucket and sum); reduce_scatter within rtol 1e-5, atol 1e-6 (AdamW on flat shards
instead of per-parameter tensors: same element-wise math, possibly other vectorized tails).
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
ap.add_argument("--steps", type=int, default=5)
a = ap.parse_args()
cuda = a.device == "cuda"
if cuda:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)   # same math in both runs
dist.init_process_group(os.environ.get("SYNCVIZ_BACKEND") or ("nccl" if cuda else "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
torch.set_num_threads(1)
LR, CAP_MB = 1e-2, 0.05

from syncviz.workloads.gpt import GPT, preset, synthetic_batch  # noqa: E402


def train(make):
    torch.manual_seed(0)
    model = GPT(preset("tiny")).to(device)
    wrapped, opt = make(model)
    for step in range(a.steps):
        x, y = synthetic_batch(preset("tiny"), 4, 32, seed=1000 * step + rank)
        wrapped(x.to(device), y.to(device)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}


def ddp(model):
    from torch.nn.parallel import DistributedDataParallel as DDP
    m = DDP(model, bucket_cap_mb=CAP_MB)
    return m, torch.optim.AdamW(m.parameters(), lr=LR)


def ours(strategy):
    def make(model):
        from syncviz.sync import DataParallel
        e = DataParallel(model, bucket_cap_mb=CAP_MB, strategy=strategy,
                         optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR))
        return e, e.optimizer
    return make


def max_diff(x, y):
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def same_as_rank0(params) -> bool:
    flat = torch.cat([p.reshape(-1) for p in params.values()]).to(device)
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    return bool(torch.equal(flat, ref))


res = {"device": str(device), "backend": dist.get_backend(), "world_size": world, "steps": a.steps}
base = train(ddp)
init = train(lambda m: (m, torch.optim.SGD(m.parameters(), lr=0.0)))
res["ddp_moved_from_init"] = max_diff(base, init)       # the comparison is not vacuous
for strategy in ("all_reduce", "reduce_scatter"):
    try:
        p = train(ours(strategy))
        ok = True
        for k in base:
            ok = ok and torch.allclose(p[k], base[k], rtol=1e-5, atol=1e-6)
        res[strategy] = {"max_abs_diff": max_diff(p, base), "bitwise": all(torch.equal(p[k], base[k]) for k in base),
                         "close": ok, "replicas_agree": same_as_rank0(p)}
    except Exception as e:   # noqa: BLE001 - reported, e.g. a collective a backend lacks on CUDA
        res[strategy] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
if rank == 0:
    with open(a.out, "w") as f:
        json.dump(res, f)
# gloo's threads releasing Python objects during interpreter teardown abort a rank now and
# then (SIGABRT, once in ~8 runs of engine_cpu here): collect cycles first, skip the teardown after.
import gc  # noqa: E402

gc.collect()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
