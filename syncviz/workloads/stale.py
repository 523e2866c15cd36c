"""Stale (asynchronous) gradient averaging on real ranks, and how far the replicas drift apart.

    torchrun --nproc-per-node 2 -m syncviz.workloads.manual_ddp --stale 2
    syncviz trace --nproc-per-node 2 -m syncviz.workloads.manual_ddp --stale 2     # collectives visible

The scheme (``--stale S``): every step each rank launches the all-reduce of its gradient with
async_op=True and does not wait for it; it waits for the one launched S steps ago and steps with
(Σ_q g_q(t−S) − g_r(t−S) + g_r(t)) / N: its own gradient at once, the others' S steps late.
S = 0 is synchronous averaging exactly (bit for bit DDP on 2 ranks); with S ≥ 1 each rank steps on
a different gradient, so the replicas drift apart by what the others have not seen yet.

Each step it prints the global loss (mean over ranks), max_r max|θ_r − θ̄| and max_r ‖θ_r − θ̄‖/‖θ̄‖
(θ̄ = mean of the replicas, gathered with all-reduces in float64), then trains torch's DDP
synchronously from the same weights on the same batches and prints both losses side by side.
Those measurements are blocking all-reduces every step: they line the ranks up again, so this run
shows what staleness does to the weights and the loss, not the time an asynchronous run would save
(in Replay the async all-reduce overlaps that measurement wait and is drawn as exposed).
"""
from __future__ import annotations

import contextlib
import json
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist


class StaleAverage:
    """Gradients averaged S steps late: one flattened all-reduce per step, in flight for S steps."""

    def __init__(self, model: torch.nn.Module, stale: int):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.stale, self.n = stale, dist.get_world_size()
        self.inflight: deque = deque()          # (work, summed flat gradient, this rank's flat gradient)

    def apply(self) -> None:
        """After backward: launch this step's all-reduce, then set every p.grad to the stale estimate."""
        own = torch.cat([p.grad.detach().reshape(-1) for p in self.params])
        total = own.clone()
        self.inflight.append((dist.all_reduce(total, op=dist.ReduceOp.SUM, async_op=True), total, own))
        if len(self.inflight) > self.stale:     # the sum launched S steps ago has arrived (or we wait for it)
            work, total, old = self.inflight.popleft()
            work.wait()
            # (Σ_q g_q(t−S))/N + (g_r(t) − g_r(t−S))/N; S = 0: the second term is exactly 0
            est = total.div_(self.n).add_(own.sub(old).div_(self.n))
        else:                                   # the first S steps: nobody else's gradient has arrived
            est = own.div(self.n)
        offset = 0
        for p in self.params:
            k = p.numel()
            p.grad.copy_(est[offset:offset + k].view_as(p.grad))
            offset += k

    def drain(self) -> None:
        """Wait for the all-reduces still in flight (their gradients are never applied)."""
        while self.inflight:
            self.inflight.popleft()[0].wait()


def counting_batch(config, batch: int, seq: int, *, seed: int):
    """Learnable tokens (inputs, next-token targets): each row counts t, t+1, t+2, ... mod the
    vocabulary from a random t, so the loss falls within a few steps and a stale update shows."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, config.vocab_size, (batch, 1), generator=g)
    data = (start + torch.arange(seq + 1)) % config.vocab_size
    return data[:, :-1], data[:, 1:]


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _measuring():
    """The drift and loss all-reduces measure the run, they are not its training communication:
    under ``syncviz trace`` they are not recorded (their time stays in the step, between phases)."""
    from syncviz.record import get_recorder
    rec = get_recorder()
    return rec.own_collectives() if rec is not None else contextlib.nullcontext()


def drift(model: torch.nn.Module) -> tuple[float, float]:
    """(max over ranks of max|θ_r − θ̄|, max over ranks of ‖θ_r − θ̄‖ / ‖θ̄‖), in float64."""
    with _measuring():
        return _drift(model)


def _drift(model: torch.nn.Module) -> tuple[float, float]:
    theta = flat(model).double()
    mean = theta.clone()
    dist.all_reduce(mean, op=dist.ReduceOp.SUM)
    mean /= dist.get_world_size()
    dev = theta - mean
    out = torch.tensor([float(dev.abs().max()), float(dev.norm() / mean.norm())], dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out[0]), float(out[1])


def global_loss(loss: torch.Tensor) -> float:
    x = loss.detach().double().reshape(1).clone()
    with _measuring():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return float(x) / dist.get_world_size()


def train_stale(args, cfg, batches, trace_module) -> tuple[torch.nn.Module, list[dict]]:
    """The manual loop of manual_ddp.py with StaleAverage in place of the synchronous average."""
    from syncviz.workloads.gpt import GPT
    rank = dist.get_rank()
    torch.manual_seed(args.seed + rank)
    model = GPT(cfg)
    for p in model.parameters():                 # the same weights on every rank to start
        dist.broadcast(p.data, src=0)
    trace_module(model, False)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    stale = StaleAverage(model, args.stale)
    saved, log = [], []
    for step, (x, y) in enumerate(batches(args, rank, cfg)):
        loss = model(x, y)
        loss.backward()
        stale.apply()
        opt.step()
        opt.zero_grad(set_to_none=True)
        d_max, d_rel = drift(model)
        log.append({"step": step, "loss": global_loss(loss), "drift_max": d_max, "drift_rel": d_rel})
        if args.save_params:
            saved.append(flat(model).clone())
        if rank == 0:
            print(f"step {step}  loss {log[-1]['loss']:.6f} (mean over ranks)  replicas apart: max|θ_r-θ̄| "
                  f"{d_max:.6g}, ‖θ_r-θ̄‖/‖θ̄‖ {d_rel:.6g}", flush=True)
    stale.drain()
    if args.save_params:
        out = Path(args.save_params)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(torch.stack(saved), out / f"params-rank{rank}.pt")
    return model, log


def save_log(directory, log: list[dict], sync_losses: list[float]) -> None:
    """Rank 0: DIR/drift.json, one row per step: loss (stale), loss_sync, drift_max, drift_rel."""
    rows = [{**row, "loss_sync": ls} for row, ls in zip(log, sync_losses)]
    (Path(directory) / "drift.json").write_text(json.dumps(rows, indent=1))


def train_sync(args, cfg, batches) -> tuple[torch.nn.Module, list[float]]:
    """The synchronous reference: torch's DDP from rank 0's initial weights on the same batches."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from syncviz.workloads.gpt import GPT
    torch.manual_seed(args.seed)
    ddp = DDP(GPT(cfg))
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    losses = []
    for x, y in batches(args, dist.get_rank(), cfg):
        loss = ddp(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(global_loss(loss))
    return ddp.module, losses


def report(args, log: list[dict], sync_losses: list[float], equal: int, total: int, diff: float) -> None:
    """Rank 0: stale vs synchronous loss per step, and the final parameters against DDP's."""
    print(f"stale S={args.stale} vs synchronous DDP on the same batches (loss = mean over ranks):", flush=True)
    print("  step   loss stale   loss sync   stale-sync   max|θ_r-θ̄|", flush=True)
    for row, ls in zip(log, sync_losses):
        print(f"  {row['step']:4d}   {row['loss']:10.6f}  {ls:10.6f}   {row['loss'] - ls:+10.6f}   "
              f"{row['drift_max']:.3g}", flush=True)
    verdict = "bit for bit" if equal == total else f"max |difference| {diff:.3g}"
    print(f"check: after {args.steps} steps on {dist.get_world_size()} ranks, rank 0's replica has {equal}/{total} "
          f"parameters equal to synchronous DDP's ({verdict})", flush=True)
