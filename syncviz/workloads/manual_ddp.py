"""Data parallelism by hand: what DistributedDataParallel does, in a page you can read.

    torchrun --nproc-per-node 2 -m syncviz.workloads.manual_ddp --steps 4 --check
    syncviz trace --nproc-per-node 2 -m syncviz.workloads.manual_ddp --steps 4        # see it in the dashboard

Three ideas make synchronous data parallelism:
  1. every rank starts from the same weights: broadcast rank 0's parameters;
  2. every rank computes gradients on its own slice of the batch;
  3. before the optimizer step, every gradient is replaced by the mean over ranks:
     all-reduce (sum) each gradient, then divide by N. Every rank then takes the same step, so the
     replicas stay identical without ever sending weights again.

``--check`` then trains torch's DDP from the same weights on the same batches and compares the
parameters: on 2 ranks they are equal bit for bit (DDP computes Σ g_r·(1/N); ×0.5 is exact, so
that equals (Σ g_r)/2). ``--overlap`` launches each gradient's all-reduce from its
post-accumulate-grad hook, while backward is still running: the idea DDP adds on top (in buckets).
Under ``syncviz trace`` the model's forward/backward and every all_reduce are recorded, so the
dashboard shows the naive version's communication after backward, and --overlap's under it.

``--sync-every K`` relaxes idea 3 (local SGD): every rank steps on its own gradients and the
weights are averaged only every K steps. It prints how far the replicas drift apart in between
(largest weight difference across ranks), and how the averaging pulls them together again.

``--stale S`` makes it asynchronous instead (syncviz/workloads/stale.py): each gradient all-reduce is
launched with async_op=True and waited S steps later; a rank steps with its own fresh gradient and
the others' S steps old. It prints the replicas' drift per step and the loss against synchronous DDP.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist


def average_gradients(model: torch.nn.Module) -> None:
    """Idea 3, naive: one all-reduce per parameter after backward, then divide by N."""
    n = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(n)


class OverlappedAverage:
    """Idea 3, overlapped: start each gradient's all-reduce as soon as autograd has accumulated it
    (backward is still computing the earlier layers), wait for all of them before the step."""

    def __init__(self, model: torch.nn.Module):
        self.works: list = []
        self.n = dist.get_world_size()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self._launch)

    def _launch(self, p: torch.Tensor) -> None:
        self.works.append((dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True), p))

    def wait(self) -> None:
        for work, p in self.works:
            work.wait()
            p.grad.div_(self.n)
        self.works.clear()


def average_weights(model: torch.nn.Module) -> None:
    """Local SGD's synchronization: every rank takes the mean of the ranks' weights."""
    n = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.data, op=dist.ReduceOp.SUM)
        p.data.div_(n)


def batches(args, rank: int, cfg):
    from syncviz.workloads.gpt import synthetic_batch
    for step in range(args.steps):   # each rank its own slice of the global batch
        seed = args.seed * 1_000_003 + step * 1009 + rank
        if getattr(args, "data", "random") == "counting":
            from syncviz.workloads.stale import counting_batch
            yield counting_batch(cfg, args.batch, args.seq, seed=seed)
        else:
            yield synthetic_batch(cfg, args.batch, args.seq, seed=seed)


def train_manual(args, cfg) -> torch.nn.Module:
    from syncviz.workloads.gpt import GPT
    rank = dist.get_rank()
    torch.manual_seed(args.seed + rank)              # deliberately different on every rank...
    model = GPT(cfg)
    before = _spread(model)
    for p in model.parameters():                     # ...idea 1 makes them equal
        dist.broadcast(p.data, src=0)
    after = _spread(model)                           # a collective: every rank calls it
    if rank == 0:
        print(f"broadcast: weights differed by up to {before:.3g} across ranks, now by {after:.3g}", flush=True)
    _trace_module(model, args.overlap)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    overlap = OverlappedAverage(model) if args.overlap else None
    for step, (x, y) in enumerate(batches(args, rank, cfg)):
        loss = model(x, y)                           # idea 2: local forward and backward
        loss.backward()
        if args.sync_every > 1:
            pass                                     # local SGD: each rank keeps its own gradient
        elif overlap:
            overlap.wait()
        else:
            average_gradients(model)                 # idea 3
        opt.step()
        opt.zero_grad(set_to_none=True)
        note = ""
        if args.sync_every > 1:
            drift = _spread(model)
            synced = (step + 1) % args.sync_every == 0
            if synced:
                average_weights(model)
            note = f"  replicas differ by up to {drift:.3g}" + (f", averaged -> {_spread(model):.3g}" if synced else "")
        if rank == 0:
            print(f"step {step}  loss {loss.item():.4f}  (rank 0's slice){note}", flush=True)
    return model


def train_ddp(args, cfg) -> torch.nn.Module:
    """The reference: torch's DDP from rank 0's initial weights on the same batches."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from syncviz.workloads.gpt import GPT
    torch.manual_seed(args.seed)
    ddp = DDP(GPT(cfg))
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    for x, y in batches(args, dist.get_rank(), cfg):
        ddp(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return ddp.module


def compare(a: torch.nn.Module, b: torch.nn.Module) -> tuple[int, int, float]:
    """(parameters equal bit for bit, parameters, largest absolute difference)."""
    pairs = [(p.detach(), q.detach()) for p, q in zip(a.parameters(), b.parameters())]
    equal = sum(torch.equal(p, q) for p, q in pairs)
    return equal, len(pairs), max(float((p - q).abs().max()) for p, q in pairs)


def _spread(model) -> float:
    """Largest difference of any weight between ranks (max over ranks − min over ranks)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return float((hi - lo).max())


def _trace_module(model, overlap: bool) -> None:
    """Under ``syncviz trace``: record this plain module's forward/backward like a DDP model's."""
    from syncviz.record import get_recorder
    rec = get_recorder()
    if rec is not None:
        rec.set_strategy("manual" + ("-overlap" if overlap else ""), "manual")
        rec.instrument_module(model)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m syncviz.workloads.manual_ddp", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", help="built-in GPT shape (syncviz.gpt): tiny | mini")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overlap", action="store_true", help="all-reduce each gradient as soon as it is ready")
    p.add_argument("--check", action="store_true", help="also train torch's DDP and compare the parameters")
    p.add_argument("--sync-every", type=int, default=1, metavar="K",
                   help="local SGD: no gradient averaging; average the weights every K steps and print the drift")
    p.add_argument("--data", choices=("random", "counting"), default="random",
                   help="random tokens (nothing to learn), or counting sequences t, t+1, ... (learnable: the loss falls)")
    p.add_argument("--stale", type=int, default=None, metavar="S",
                   help="asynchronous: the others' gradients arrive S steps late (all-reduce waited S steps later); "
                        "prints replica drift and the loss vs synchronous DDP")
    p.add_argument("--save-params", metavar="DIR", help="with --stale: save every rank's parameters after each step "
                                                          "(DIR/params-rank<r>.pt) and the printed drift (DIR/drift.json)")
    a = p.parse_args(argv)
    if a.stale is not None and (a.stale < 0 or a.sync_every > 1 or a.overlap):
        p.error("--stale S wants S >= 0 and goes without --sync-every and --overlap")
    if a.save_params and a.stale is None:
        p.error("--save-params goes with --stale")
    if a.sync_every < 1:
        p.error("--sync-every must be >= 1")
    if a.sync_every > 1 and (a.check or a.overlap):
        p.error("--sync-every K > 1 trains a different algorithm: it cannot be --check'ed against DDP or --overlap'ped")
    if a.steps < 1 or a.batch < 1 or a.seq < 1:
        p.error("--steps, --batch and --seq must be >= 1")
    return a


def main(argv=None) -> None:
    args = parse_args(argv)
    from syncviz.workloads.gpt import preset
    try:
        cfg = preset(args.preset)
    except ValueError as e:
        sys.exit(f"manual_ddp: {e}")
    dist.init_process_group(backend=os.environ.get("SYNCVIZ_BACKEND") or "gloo")
    try:
        if args.stale is not None:
            stale_main(args, cfg)
            return
        manual = train_manual(args, cfg)
        if args.check:
            from syncviz.record import get_recorder
            rec = get_recorder()
            if rec is not None:       # the reference run is not part of the recorded lesson
                from syncviz.record import StepSelection
                rec.selection = StepSelection(f"0:{args.steps}")
            equal, total, diff = compare(manual, train_ddp(args, cfg))
            if rec is not None:       # run.json describes the manual loop, not the reference
                rec.meta_extra.pop("ddp", None)
                rec.set_strategy("manual" + ("-overlap" if args.overlap else ""))
                rec.write_meta()
            if dist.get_rank() == 0:
                verdict = "bit for bit" if equal == total else f"max |difference| {diff:.3g}"
                print(f"check: after {args.steps} steps on {dist.get_world_size()} ranks, {equal}/{total} "
                      f"parameters equal DDP's ({verdict})", flush=True)
            if equal != total and dist.get_world_size() == 2:
                sys.exit(1)   # on 2 ranks the manual loop must equal DDP bit for bit
    finally:
        dist.destroy_process_group()
        from syncviz.record.quiesce import quiesce
        quiesce()     # let gloo's threads release Python objects before teardown (see quiesce.py)


def stale_main(args, cfg) -> None:
    """--stale S: the asynchronous loop, then synchronous DDP on the same batches as the reference."""
    from syncviz.workloads import stale as ST
    model, log = ST.train_stale(args, cfg, batches, _trace_module)
    rec = _recorder()
    if rec is not None:           # the reference run is not part of the recorded run
        from syncviz.record import StepSelection
        rec.selection = StepSelection(f"0:{args.steps}")
    ref, sync_losses = ST.train_sync(args, cfg, batches)
    if rec is not None:
        rec.meta_extra.pop("ddp", None)
        rec.set_strategy("manual-stale")
        rec.write_meta()
    equal, total, diff = compare(model, ref)
    if dist.get_rank() == 0:
        ST.report(args, log, sync_losses, equal, total, diff)
        if args.save_params:
            ST.save_log(args.save_params, log, sync_losses)
    if args.stale == 0 and equal != total and dist.get_world_size() == 2:
        sys.exit(1)               # S = 0 is synchronous averaging: on 2 ranks it must equal DDP bit for bit


def _recorder():
    from syncviz.record import get_recorder
    return get_recorder()


if __name__ == "__main__":
    main()
