"""Trace a real ``torch.nn.DataParallel`` step on the GPUs of this machine: its five exchanges as
timed phases, the bytes each moved through GPU 0 (counted from the tensors torch passes to
torch.nn.parallel.comm), and the same bytes from syncviz's model (syncviz/model/dataparallel.py).

    python -m syncviz.workloads.dataparallel_trace --preset mini --steps 5 [--outputs logits|loss]
        [--gpus N] [--out DIR]     # DIR/dataparallel.json (+ DIR/profile.json: torch.profiler, Perfetto)

Needs at least 2 CUDA devices (DataParallel on one device calls the module directly).
How it is timed: DataParallel's own methods (scatter, replicate, parallel_apply, gather) are
overridden in a subclass, and torch.nn.parallel.comm's reduce_add_coalesced and scatter (which
the backward of the parameter broadcast and of the output gather call) are wrapped for the step.
Each phase is also a torch.profiler ``record_function`` range named ``syncviz.dp.<phase>``. Every
phase boundary synchronizes all GPUs, so each time is the phase's full cost and the step runs
without the host running ahead: the times are upper bounds of an unsynchronized step's phases.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import comm

PHASES = ("scatter inputs", "replicate", "parallel apply", "gather outputs", "loss", "backward compute",
          "backward: scatter output grads", "backward: reduce gradients", "optimizer")


class Phases:
    """Per step: seconds and bytes through GPU 0 (sent to or received from another GPU) per phase."""

    def __init__(self, devices: list[int]):
        self.devices, self.steps, self.cur = devices, [], None
        self.in_backward = self.replicating = False

    def sync(self) -> None:
        for d in self.devices:
            torch.cuda.synchronize(d)

    @contextlib.contextmanager
    def phase(self, name: str):
        self.sync()
        t0 = time.perf_counter()
        with torch.profiler.record_function(f"syncviz.dp.{name}"):
            yield
        self.sync()
        self.cur["seconds"][name] = self.cur["seconds"].get(name, 0.0) + time.perf_counter() - t0

    def count(self, name: str, nbytes: int) -> None:
        self.cur["gpu0_bytes"][name] = self.cur["gpu0_bytes"].get(name, 0) + int(nbytes)


def _off_device(tensors, device) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t.device != device)


def timed_dataparallel(module: torch.nn.Module, devices: list[int], ph: Phases) -> torch.nn.DataParallel:
    """nn.DataParallel whose scatter / replicate / parallel_apply / gather are timed phases."""

    class Timed(torch.nn.DataParallel):
        def scatter(self, inputs, kwargs, device_ids):
            with ph.phase("scatter inputs"):
                out = super().scatter(inputs, kwargs, device_ids)
            flat = [t for chunk in out[0] for t in chunk if torch.is_tensor(t)]
            ph.count("scatter inputs", _off_device(flat, self.src_device_obj))
            return out

        def replicate(self, module, device_ids):
            ph.replicating = True        # comm.broadcast_coalesced counts the bytes (see comm_exchanges)
            try:
                with ph.phase("replicate"):
                    return super().replicate(module, device_ids)
            finally:
                ph.replicating = False

        def parallel_apply(self, replicas, inputs, kwargs):
            with ph.phase("parallel apply"):
                return super().parallel_apply(replicas, inputs, kwargs)

        def gather(self, outputs, output_device):
            with ph.phase("gather outputs"):
                out = super().gather(outputs, output_device)
            flat = [o for o in outputs if torch.is_tensor(o)]
            ph.count("gather outputs", _off_device(flat, torch.device("cuda", output_device)))
            return out

    return Timed(module, device_ids=devices)


@contextlib.contextmanager
def comm_exchanges(ph: Phases, src: torch.device):
    """Wrap torch.nn.parallel.comm for the run: replicate's parameter and buffer copies
    (comm.broadcast_coalesced: bytes × the other devices), and the backward's exchanges,
    Broadcast.backward → comm.reduce_add_coalesced (gradients to GPU 0) and Gather.backward →
    comm.scatter (output gradients back to the GPUs), timed as phases."""
    reduce_orig, scatter_orig, bcast_orig = comm.reduce_add_coalesced, comm.scatter, comm.broadcast_coalesced

    def broadcast_coalesced(tensors, devices, buffer_size=10485760):
        if ph.replicating:
            others = len([d for d in devices if torch.device("cuda", d) != src]) if devices else 0
            ph.count("replicate", others * sum(t.numel() * t.element_size() for t in tensors))
        return bcast_orig(tensors, devices, buffer_size)

    def reduce_add_coalesced(inputs, destination=None, buffer_size=10485760):
        with ph.phase("backward: reduce gradients"):
            out = reduce_orig(inputs, destination, buffer_size)
        ph.count("backward: reduce gradients", _off_device([t for per in inputs for t in per], src))
        return out

    def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
        if not ph.in_backward:
            return scatter_orig(tensor, devices, chunk_sizes, dim, streams, out=out)
        with ph.phase("backward: scatter output grads"):
            res = scatter_orig(tensor, devices, chunk_sizes, dim, streams, out=out)
        ph.count("backward: scatter output grads", _off_device(res, src))
        return res

    comm.reduce_add_coalesced, comm.scatter, comm.broadcast_coalesced = reduce_add_coalesced, scatter, broadcast_coalesced
    try:
        yield
    finally:
        comm.reduce_add_coalesced, comm.scatter, comm.broadcast_coalesced = reduce_orig, scatter_orig, bcast_orig


def run(args) -> dict:
    from syncviz.workloads.gpt import GPT, num_params, preset, synthetic_batch
    n = args.gpus or torch.cuda.device_count()
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or n < 2 or n > torch.cuda.device_count():
        raise SystemExit(f"dataparallel_trace: needs 2 or more CUDA devices (found {torch.cuda.device_count()}, "
                         f"asked for {args.gpus or 'all'})")
    devices, cfg = list(range(n)), preset(args.preset)
    torch.manual_seed(0)
    model = GPT(cfg).cuda(0)
    ph = Phases(devices)
    dp = timed_dataparallel(model, devices, ph)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    src = torch.device("cuda", 0)
    with comm_exchanges(ph, src), contextlib.ExitStack() as stack:
        prof = None
        if args.out:
            prof = stack.enter_context(torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                                          torch.profiler.ProfilerActivity.CUDA]))
        for step in range(args.steps):
            ph.cur = {"step": step, "seconds": {}, "gpu0_bytes": {}}
            x, y = synthetic_batch(cfg, args.batch * n, args.seq, seed=step, device=src)
            ph.sync()
            t0 = time.perf_counter()
            if args.outputs == "loss":
                out = dp(x, y)                  # each replica returns its loss: N scalars gathered
                with ph.phase("loss"):
                    loss = out.mean()
            else:
                logits = dp(x)                  # the logits of the whole batch gathered on GPU 0
                with ph.phase("loss"):
                    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            ph.in_backward = True
            with ph.phase("backward compute"):
                loss.backward()
            ph.in_backward = False
            with ph.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            ph.cur["step_seconds"] = time.perf_counter() - t0
            # the backward's exchanges ran inside "backward compute": take them out of it
            s = ph.cur["seconds"]
            s["backward compute"] -= s.get("backward: reduce gradients", 0) + s.get("backward: scatter output grads", 0)
            ph.steps.append(ph.cur)
        if prof is not None:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(Path(args.out) / "profile.json"))
    return {"gpus": n, "device": torch.cuda.get_device_name(0), "preset": args.preset, "params": num_params(model),
            "outputs": args.outputs, "batch_per_gpu": args.batch, "seq": args.seq, "steps": ph.steps,
            "formula_gpu0_bytes": formula_bytes(model, cfg, args, n)}


def formula_bytes(model, cfg, args, n: int) -> dict[str, float]:
    """syncviz.model.dataparallel's bytes through GPU 0 for this module and batch, by traced phase
    (the model's gather counts the forward gather and the backward scatter together: half each).
    The model counts a returned loss as 0 bytes (it is one scalar per GPU)."""
    from syncviz.model import costmodel as CM
    from syncviz.model import dataparallel as DP
    from syncviz.model.simprofile import ModelSpec
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    spec = ModelSpec("traced", sum(p.numel() for p in model.parameters()), cfg.n_layer, args.batch * args.seq, 1.0,
                     param_dtype=dtype, grad_dtype=dtype)
    x = DP.DPInputs(spec, CM.LINKS["pcie"], cfg.vocab_size if args.outputs == "logits" else 0,
                    input_bytes_per_token=8 * (2 if args.outputs == "loss" else 1))   # int64 ids (+ targets)
    ex = DP.exchanges(x, n)
    return {"scatter inputs": ex[0].gpu0_bytes, "replicate": ex[1].gpu0_bytes, "gather outputs": ex[3].gpu0_bytes / 2,
            "backward: scatter output grads": ex[3].gpu0_bytes / 2, "backward: reduce gradients": ex[4].gpu0_bytes}



def report(res: dict) -> str:
    steps = res["steps"][1:] or res["steps"]           # the first step includes CUDA warm-up
    lines = [f"nn.DataParallel on {res['gpus']} x {res['device']}: GPT {res['preset']} ({res['params']:,} parameters), "
             f"outputs {res['outputs']}, {len(steps)} steps after the first (each phase synchronized)",
             f"{'phase':34s} {'ms (mean)':>10s} {'MB through GPU 0':>17s} {'formula MB':>11s}"]
    for name in PHASES:
        ms = sum(s["seconds"].get(name, 0.0) for s in steps) / len(steps) * 1e3
        mb = steps[-1]["gpu0_bytes"].get(name)
        f = res["formula_gpu0_bytes"].get(name)
        lines.append(f"{name:34s} {ms:10.2f} {'' if mb is None else f'{mb / 1e6:.3f}':>17s} "
                     f"{'' if f is None else f'{f / 1e6:.3f}':>11s}")
    lines.append(f"{'step':34s} {sum(s['step_seconds'] for s in steps) / len(steps) * 1e3:10.2f}")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m syncviz.workloads.dataparallel_trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="mini", help="built-in GPT shape: tiny | mini")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8, help="sequences per GPU")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use [all visible]")
    p.add_argument("--outputs", choices=("logits", "loss"), default="logits",
                   help="the module returns logits (gathered on GPU 0, loss there) or its loss")
    p.add_argument("--out", help="write DIR/dataparallel.json and a torch.profiler trace DIR/profile.json")
    a = p.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.seq < 1:
        p.error("--steps, --batch and --seq must be >= 1")
    return a


def main(argv=None) -> None:
    args = parse_args(argv)
    from syncviz.workloads.gpt import preset
    try:
        preset(args.preset)
    except ValueError as e:
        sys.exit(f"dataparallel_trace: {e}")
    res = run(args)
    print(report(res), flush=True)
    if args.out:
        (Path(args.out) / "dataparallel.json").write_text(json.dumps(res, indent=1))
        print(f"wrote {args.out}/dataparallel.json and {args.out}/profile.json (open in https://ui.perfetto.dev)")


if __name__ == "__main__":
    main()
