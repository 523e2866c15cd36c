"""Steps 7 and 8 of ``syncviz lesson`` (syncviz/workloads/lesson.py): asynchronous updates on real
ranks, and torch.nn.DataParallel beside DDP (the model of syncviz/model/dataparallel.py)."""
from __future__ import annotations

import json



def stale(ctx, trace, page: str) -> None:
    """``ctx``: lesson.Ctx; ``trace``: lesson._trace (passed in: lesson.py imports this module)."""
    title = "Asynchronous updates: stale gradients, and the replicas drift apart"
    s, steps = 4, 10 if ctx.fast else 16
    t0 = ctx.begin(title, f"manual_ddp.py --stale {s} (tiny GPT, learnable counting data, lr 0.01) on {ctx.nproc} "
                          f"ranks, {steps} steps, then synchronous DDP on the same batches")
    params = ctx.out / "7-stale-params"
    run, p = trace(ctx, "7-stale", "-m", "syncviz.workloads.manual_ddp", "--preset", "tiny", "--steps", steps,
                    "--stale", s, "--data", "counting", "--lr", "0.01", "--save-params", params)
    log = json.loads((params / "drift.json").read_text())
    sync = [r["loss_sync"] for r in log]
    check = next((l for l in p.stdout.splitlines() if l.startswith("check:")), "")
    last, mid = log[-1], log[len(log) // 2]
    lines = ["Each rank launches the all-reduce of its gradient without waiting (async_op=True) and waits for the",
             f"one it launched {s} steps ago: it steps with its own gradient at once and the others' {s} steps late.",
             "The update no longer waits for the others' gradients (here the per-step drift measurement, a",
             "blocking all-reduce, still lines the ranks up), but the ranks no longer take the same step:",
             f"  after step {mid['step']}: replicas differ by up to {mid['drift_max']:.3g} "
             f"(‖θ_r-θ̄‖/‖θ̄‖ = {mid['drift_rel']:.2g});  after step {last['step']}: {last['drift_max']:.3g} "
             f"({last['drift_rel']:.2g})",
             f"  loss after {len(log)} steps (mean over ranks): stale {last['loss']:.3f}, synchronous {sync[-1]:.3f}; "
             f"mean over the last {len(log) // 2} steps {_tail_mean([r['loss'] for r in log]):.3f} vs "
             f"{_tail_mean(sync):.3f}",
             "Stale gradients point where the weights were, not where they are: the same data buys less progress.",
             f"{check[len('check: '):] if check else ''}. With --stale 0 the same code equals DDP bit for bit.",
             f"Try: torchrun --nproc-per-node 2 -m syncviz.workloads.manual_ddp --stale 2 --data counting "
             f"(the drift per step is in {params.name}/drift.json)"]
    ctx.end(t0, title, lines, f"{page} (7) and Replay, run {run.name}: each all-reduce outlives its step", [run],
            {"stale": s, "steps": [r["step"] for r in log], "loss_stale": [r["loss"] for r in log], "loss_sync": sync,
             "drift_max": [r["drift_max"] for r in log], "drift_rel": [r["drift_rel"] for r in log]})


def _tail_mean(xs: list[float]) -> float:
    """Mean of the second half (a single step's loss is noisy: each is a different batch)."""
    tail = xs[len(xs) - len(xs) // 2:]
    return sum(tail) / len(tail)


def dataparallel(ctx, page: str) -> None:
    from syncviz.model import dataparallel as DP
    from syncviz.model import dpvsddp as V
    title = "DataParallel vs DDP: one process and GPU 0 against one process per GPU"
    t0 = ctx.begin(title, "syncviz dataparallel (GPT-2 medium on PCIe, 2/4/8 GPUs: the model, no GPUs)")
    x = DP.inputs()
    rows = V.table(x)
    lines = ["torch.nn.DataParallel is one Python process with a thread per GPU. Every step it scatters the",
             "inputs from GPU 0, copies the weights from GPU 0 to every GPU, runs the replicas in threads that",
             "share the GIL, gathers the outputs on GPU 0 for the loss, and sums the gradients on GPU 0, where",
             "alone the optimizer runs. DDP: one process per GPU, one all-reduce, hidden under backward.",
             "  GPUs   MB through GPU 0: DP / DDP     step ms: DP / DDP    GPU 0's share of the work: DP / DDP"]
    for r in rows:
        lines.append(f"  {r.gpus:4d}   {r.dp_gpu0_bytes / 1e6:10,.0f} / {r.ddp_bytes / 1e6:6,.0f}"
                     f"        {r.dp_step_s * 1e3:6.1f} / {r.ddp_step_s * 1e3:5.1f}"
                     f"          {100 * r.dp_gpu0_share:3.0f}% / {100 / r.gpus:3.0f}%")
    big = rows[-1]
    ex = {e.name: e for e in big.exchanges}
    lines += [f"At {big.gpus} GPUs DataParallel is {big.dp_step_s / big.ddp_step_s:.1f}x slower. Every step GPU 0 gathers the "
              f"logits ({ex[DP.EXCHANGES[3]].seconds * 1e3:.0f} ms with",
              f"their gradient sent back), sends the weights out ({ex[DP.EXCHANGES[1]].seconds * 1e3:.0f} ms) and sums "
              f"the gradients in ({ex[DP.EXCHANGES[4]].seconds * 1e3:.0f} ms), none of it under backward; the GIL",
              f"runs {big.gpus} threads' Python one at a time ({big.gpus} x {x.spec.layers} layers x "
              f"{x.python_us_per_layer:g} us = {big.gil_s * 1e3:.0f} ms, as long as the forward itself).",
              "Try: syncviz dataparallel --outputs loss  (return the loss, not the logits)  |  --link nvlink"]
    ctx.end(t0, title, lines, f"{page} (8)", [],
            {"gpus": [r.gpus for r in rows], "dp_ms": [r.dp_step_s * 1e3 for r in rows],
             "ddp_ms": [r.ddp_step_s * 1e3 for r in rows], "dp_gpu0_mb": [r.dp_gpu0_bytes / 1e6 for r in rows],
             "ddp_mb": [r.ddp_bytes / 1e6 for r in rows], "dp_gpu0_share": [r.dp_gpu0_share for r in rows],
             "model": x.spec.name, "link": x.link.name})
