"""A user's own DDP training script, as benchmarks/overhead.py runs it under each tool.

Plain PyTorch: nothing of syncviz is imported unless the case is the built-in GPT (the model
definition only). Each case stresses one thing a profiler's hooks pay for:

    many-params    1,200 small parameter tensors (600 Linear(24, 24)): per-parameter hooks
    short-steps    a 4-layer MLP whose step is a few ms: fixed per-step costs
    large-buckets  8 Linear(1024, 1024) (32 MiB of gradients) in one 100 MB bucket: per-byte costs
    accumulation   the short-steps model with 4 micro-batches under no_sync(): per-micro-step costs
    gpt2-small     syncviz's built-in GPT at GPT-2 small shapes (124 M parameters), 25 MB buckets

Rank 0 writes the wall time and the process CPU time (all threads, gloo's included) of every
measured step to --out as JSON (on CUDA also "enqueued": when opt.step() returned, before
torch.cuda.synchronize(): a step whose enqueue time is near its wall time is bound by the host,
where every microsecond a tool adds to the host shows). With --gate the script runs one block of --steps each time the
driver writes "go" to its FIFO and answers "done", so several tools' jobs can stay alive and take
turns block by block (benchmarks/overhead.py). --torch-profiler records every step with torch.profiler (CPU activities,
and CUDA's on a GPU); --traceml wraps every step in TraceML's trace_step (run it under `traceml run`).

--device cuda (one rank per GPU, NCCL): the model and batches on the GPU, bf16 autocast and TF32 matmuls
as a user of a GPU trains, gpt2-small at batch 8 x 1024 tokens (GPT-2's own context); a step's time
ends at torch.cuda.synchronize() after opt.step(), so the GPU work of the step is inside it.
"""
import argparse
import contextlib
import itertools
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CASES = ("many-params", "short-steps", "large-buckets", "accumulation", "gpt2-small")


class _LM(nn.Module):
    """Wraps the built-in GPT so every case is called as model(x) -> loss."""

    def __init__(self):
        super().__init__()
        from syncviz.workloads.gpt import GPT, preset
        self.cfg = preset("small")
        self.gpt = GPT(self.cfg)

    def forward(self, xy):
        return self.gpt(*xy)


def build(case: str, cuda: bool = False):
    """(model, bucket_cap_mb, micro-batches per step, batch maker)"""
    g = torch.Generator().manual_seed(0)
    if case == "many-params":
        model = nn.Sequential(*[nn.Linear(24, 24) for _ in range(600)])
        return model, 25, 1, lambda: torch.randn(16, 24, generator=g)
    if case in ("short-steps", "accumulation"):
        model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())])
        return model, 25, 4 if case == "accumulation" else 1, lambda: torch.randn(64, 512, generator=g)
    if case == "large-buckets":
        model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)])
        return model, 100, 1, lambda: torch.randn(32, 1024, generator=g)
    if case == "gpt2-small":
        from syncviz.workloads.gpt import synthetic_batch
        model = _LM()
        # CPU: one short sequence (a 124M step on 1 thread is ~1 s); GPU: batch 8 x 1024 tokens
        batch, seq = (8, 1024) if cuda else (1, 64)
        return model, 25, 1, lambda: synthetic_batch(model.cfg, batch, seq, seed=0)
    raise SystemExit(f"overhead_script: unknown case {case!r}; choose from {', '.join(CASES)}")


def loss_of(model, batch):
    out = model(batch)
    return out if out.dim() == 0 else out.square().mean()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=CASES, required=True)
    ap.add_argument("--steps", type=int, default=30, help="measured steps (per block with --gate)")
    ap.add_argument("--gate", help="folder with FIFOs go-<rank> / done-<rank>: run a block of --steps per 'go'")
    ap.add_argument("--warmup", type=int, default=5, help="steps run first and not measured")
    ap.add_argument("--out", required=True, help="JSON file for rank 0's step times")
    ap.add_argument("--torch-profiler", action="store_true")
    ap.add_argument("--traceml", action="store_true")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo")
    model, cap, micro, make = build(a.case, cuda)
    if cuda:
        dev = torch.device("cuda", torch.cuda.current_device())
        model = model.to(dev)
        made = [make() for _ in range(4)]     # made once: a host-to-device copy a step is not the user's cost
        moved = [tuple(t.to(dev) for t in b) if isinstance(b, tuple) else b.to(dev) for b in made]
        batch = itertools.cycle(moved).__next__
    else:
        batch = make
    ddp = DDP(model, bucket_cap_mb=cap)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    step_ctx = contextlib.nullcontext
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    if a.traceml:
        import traceml_ai as traceml
        step_ctx = lambda: traceml.trace_step(ddp)  # noqa: E731
    prof = None
    if a.torch_profiler:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                      + ([torch.profiler.ProfilerActivity.CUDA] if cuda else []))
        prof.start()
    def one_step():
        t, c = time.perf_counter(), time.process_time()
        with step_ctx():
            opt.zero_grad(set_to_none=True)
            for m in range(micro):
                ctx = ddp.no_sync() if m < micro - 1 else contextlib.nullcontext()
                with ctx:
                    with amp():
                        loss = loss_of(ddp, batch()) / micro
                    loss.backward()
            opt.step()
        if cuda:   # the host's share: when it has queued the step (the GPU may still be running it)
            enqueued.append(time.perf_counter() - t)
            torch.cuda.synchronize()
        if prof is not None:
            prof.step()
        return time.perf_counter() - t, time.process_time() - c

    enqueued = []          # on CUDA: seconds from the step's start until opt.step() returned
    for _ in range(a.warmup):
        one_step()
    del enqueued[:]
    blocks = []            # one list of (wall, cpu) per block
    if a.gate:             # the driver says when to run a block, so tools take turns
        rank = dist.get_rank()
        with open(os.path.join(a.gate, f"go-{rank}")) as go, open(os.path.join(a.gate, f"done-{rank}"), "w") as done:
            while go.readline().strip() == "go":
                blocks.append([one_step() for _ in range(a.steps)])
                done.write("done\n")
                done.flush()
    else:
        blocks.append([one_step() for _ in range(a.steps)])
    if prof is not None:
        prof.stop()
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump({"case": a.case, "blocks": blocks, "enqueued": enqueued}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
