"""``syncviz dataparallel``: torch.nn.DataParallel beside DDP on the same model, for 2/4/8 GPUs.
The formulas are syncviz.model.dataparallel's; this module only lays them out."""
from __future__ import annotations

import textwrap

import click

from syncviz.model import costmodel as CM
from syncviz.model import dataparallel as DP
from syncviz.model.simprofile import MODELS

MB = 1e6


def table(x: DP.DPInputs, gpus=(2, 4, 8)) -> list[DP.Row]:
    return [DP.row(x, n) for n in gpus]


def render(x: DP.DPInputs, rows: list[DP.Row]) -> str:
    z, s = DP.sizes(x), x.spec
    out = [f"{s.name}: {s.params / 1e6:,.0f}M parameters ({s.param_dtype}), {s.tokens_per_gpu:,} tokens per GPU, "
           f"{s.layers} layers; link {x.link.name} ({x.link.busbw_gbps:g} GB/s, {x.link.latency_us:g} us); "
           f"outputs {'logits, ' + format(x.vocab, ',') + ' per token' if x.vocab else 'the loss (a scalar)'}",
           f"per step: parameters P = {z['P'] / MB:,.1f} MB, gradients G = {z['G'] / MB:,.1f} MB, inputs "
           f"{z['I_per_gpu'] / MB:,.3f} MB and outputs {z['O_per_gpu'] / MB:,.1f} MB per GPU", ""]
    head = ("GPUs", "DDP MB/GPU", "DDP ms", "DP MB GPU 0", "DP MB other", "DP ms", "DP/DDP", "GPU 0 share: DP",
            "DDP")
    body = [(str(r.gpus), f"{r.ddp_bytes / MB:,.0f}", f"{r.ddp_step_s * 1e3:,.1f}", f"{r.dp_gpu0_bytes / MB:,.0f}",
             f"{r.dp_other_bytes / MB:,.0f}", f"{r.dp_step_s * 1e3:,.1f}", f"{r.dp_step_s / r.ddp_step_s:.2f}x",
             f"{100 * r.dp_gpu0_share:.0f}%", f"{100 / r.gpus:.0f}%") for r in rows]
    out += _grid(head, body)
    last = rows[-1]
    out += ["", f"DataParallel's exchanges on {last.gpus} GPUs (MB sent + received per step, time):"]
    body = [(e.name, f"{e.gpu0_bytes / MB:,.1f}", f"{e.other_bytes / MB:,.1f}", f"{e.seconds * 1e3:,.2f}")
            for e in last.exchanges]
    body += [("loss on GPU 0 (gathered outputs)", "-", "-", f"{last.loss_s * 1e3:,.2f}")]
    out += _grid(("exchange", "GPU 0 MB", "other GPU MB", "ms"), body)
    notes = ["MB: sent + received per step. DDP: each GPU all-reduces G on a ring (2·2(N-1)/N·G), under backward; "
             "its time is the simulator's (syncviz simulate, no jitter). DP: every byte starts or ends at GPU 0; "
             "broadcast and reduce go through NCCL's chain (~P/bandwidth), scatter and gather are copies out of "
             "and into GPU 0.",
             f"GIL: forward's Python runs on {last.gpus} threads one at a time: {last.gpus} x {s.layers} layers x "
             f"{x.python_us_per_layer:g} us = {last.gil_s * 1e3:.1f} ms, against the GPU's own forward "
             f"(--python-us-per-layer; measured 480 us per block on 2 busy shared CPU cores).",
             "GPU 0 share: of all GPU compute in a step (forward, backward, loss, optimizer), the part GPU 0 does.",
             "Why DDP: one process per GPU (no GIL), one exchange (the all-reduce) hidden under backward, every "
             "GPU doing the same work; DataParallel sends the weights every step and funnels everything through GPU 0."]
    out.append("")
    for n in notes:
        out += textwrap.wrap(n, 110, subsequent_indent="  ")
    return "\n".join(out)


def _grid(head, body) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)   # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return [fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, body)]


def parse_gpus(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(g) for g in str(text).split(",") if g.strip())
    except ValueError:
        raise ValueError(f"--gpus wants whole numbers like 2,4,8 (got {text!r})") from None
    if not gpus or any(g < 2 for g in gpus):
        raise ValueError(f"--gpus: DataParallel needs at least 2 GPUs each (got {text!r})")
    return gpus


@click.command("dataparallel", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--model", "model", default="gpt2-medium", show_default=True, type=click.Choice(list(MODELS)),
              help="Model description preset (the simulator's).")
@click.option("--gpus", default="2,4,8", show_default=True, help="GPU counts to compare, comma-separated (>= 2).")
@click.option("--link", default="pcie", show_default=True, type=click.Choice(list(CM.LINKS)),
              help="Link between the GPUs (cost-model preset); DataParallel is one machine: pcie or nvlink.")
@click.option("--tokens", type=int, help="Tokens per GPU per step [the preset's].")
@click.option("--outputs", default="logits", show_default=True, type=click.Choice(["logits", "loss"]),
              help="What the module returns: logits (gathered to GPU 0) or the loss (a scalar per GPU).")
@click.option("--python-us-per-layer", default=DP.PYTHON_US_PER_LAYER, show_default=True, type=float,
              help="Python + launch time of one layer's forward per thread (serialized by the GIL).")
def dataparallel_command(model, gpus, link, tokens, outputs, python_us_per_layer):
    """torch.nn.DataParallel beside DDP on the same model: bytes moved per step (per GPU and
    through GPU 0), time per step and GPU 0's share of the work, for 2, 4 and 8 GPUs. A model,
    no GPUs needed (formulas: syncviz/model/dataparallel.py).

    \b
    Example:
      syncviz dataparallel                          # GPT-2 medium on PCIe, 2/4/8 GPUs
      syncviz dataparallel --link nvlink --outputs loss
    """
    try:
        x = DP.inputs(model, link, tokens=tokens, python_us=python_us_per_layer, outputs=outputs)
        rows = table(x, parse_gpus(gpus))
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(render(x, rows))
