"""``torch.nn.DataParallel`` next to DDP on the same model: the formulas, defined once here.

DataParallel is one Python process driving N GPUs of one machine with N threads. Every step
(torch/nn/parallel/data_parallel.py, torch 2.x) it runs five exchanges, all through GPU 0:

  1. scatter inputs    the batch (on GPU 0) is cut in N chunks, chunk k copied to GPU k
  2. replicate         every parameter broadcast from GPU 0 to the N−1 other GPUs (a fresh replica
                       per step, because only GPU 0's copy is updated by the optimizer)
  3. parallel apply    N threads run forward; the Python part of each layer holds the GIL, so the
                       N threads' per-layer Python overhead runs one after another
  4. gather outputs    the N outputs copied to GPU 0, where the loss is computed; backward of the
                       gather scatters the output gradients back (the same bytes again)
  5. reduce gradients  backward of the broadcast sums the N replicas' gradients into GPU 0
                       (comm.reduce_add_coalesced); only GPU 0 runs the optimizer

DDP (N processes) does one exchange: an all-reduce of the gradients, in buckets, under backward.

Bytes: "through GPU 0" counts every byte that starts or ends at GPU 0 (sent + received); "per
other GPU" is what GPU k ≠ 0 sends + receives. For N GPUs, P parameter bytes, G gradient bytes, I
input bytes and O output bytes of the whole batch:

  scatter inputs      GPU 0: (N−1)/N·I        other GPU: I/N
  replicate           GPU 0: (N−1)·P          other GPU: P
  gather outputs      GPU 0: 2(N−1)/N·O       other GPU: 2·O/N      (forward gather + backward scatter)
  reduce gradients    GPU 0: (N−1)·G          other GPU: G
  DDP all-reduce      every GPU: 2 · 2(N−1)/N·G  (ring: sends 2(N−1)/N·G and receives as much)

Time of one DataParallel step (phases run one after another; nothing overlaps):
  scatter (N−1)·α + (N−1)/N·I·β_p2p  +  broadcast (N−1)·α + P·β  +  forward max(F, N·L·h)
  + gather 2·[(N−1)·α + (N−1)/N·O·β_p2p]  +  loss 3·O/HBM  +  backward B  +  reduce (N−1)·α + G·β
  + optimizer (on GPU 0 only).
Broadcast and reduce use NCCL when it is available (torch/csrc/cuda/comm.cpp), which pipelines
them along a chain of GPUs: ~P·β, not (N−1)·P·β, though every byte starts or ends at GPU 0.
Scatter and gather are peer-to-peer copies out of / into GPU 0. α, β: the link preset of the
cost model (costmodel.LINKS: pcie 22 GB/s, nvlink 400 GB/s); F, B, optimizer and HBM: the model
description's (simprofile.profile_from_spec). GPU 0's share of the work = (F + B + loss +
optimizer) / (N·(F + B) + loss + optimizer) in DataParallel, 1/N in DDP. Not modelled: replicate's
Python work (copying module objects), buffers (BatchNorm's running stats are broadcast too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from syncviz.model import costmodel as CM
from syncviz.model.simprofile import MODELS, ModelSpec, profile_from_spec

# Python + dispatch + kernel-launch time of one transformer block's forward, per thread. Order of
# magnitude: ~20 eager ops per block at ~5 µs each on a fast host CPU. Measured on this project's
# 2 shared CPU cores (torch 2.13, 1-token input so the compute is negligible): 480 µs per block of
# the tiny GPT; a teacher's workstation is several times faster, hence the default.
PYTHON_US_PER_LAYER = 100.0

# Vocabulary of the model presets: a GPT's output is its logits, tokens × vocab.
VOCAB = {"gpt2-medium": 50257, "llama-70b": 128256}
EXCHANGES = ("scatter inputs", "replicate (broadcast params)", "parallel apply (forward, GIL)",
             "gather outputs (+ backward scatter)", "reduce gradients to GPU 0")


@dataclass(frozen=True)
class DPInputs:
    """One model on N GPUs of one machine, per-GPU batch fixed (the same for DP and DDP)."""
    spec: ModelSpec
    link: CM.Link
    vocab: int                        # output width per token (logits); 0 when the module returns the loss
    input_bytes_per_token: float = 8  # int64 token ids
    python_us_per_layer: float = PYTHON_US_PER_LAYER

    def validate(self) -> "DPInputs":
        self.spec.validate()
        self.link.validate()
        if self.vocab < 0:
            raise ValueError(f"vocabulary (output width) must be >= 0 (got {self.vocab})")
        if not (self.python_us_per_layer >= 0 and math.isfinite(self.python_us_per_layer)):
            raise ValueError(f"Python time per layer must be >= 0 µs (got {self.python_us_per_layer})")
        return self


@dataclass(frozen=True)
class Exchange:
    name: str
    gpu0_bytes: float      # sent + received by GPU 0
    other_bytes: float     # sent + received by one GPU k != 0
    seconds: float


@dataclass(frozen=True)
class Row:
    """DataParallel and DDP on N GPUs."""
    gpus: int
    exchanges: tuple[Exchange, ...]
    dp_step_s: float
    dp_gpu0_share: float
    gil_s: float            # forward's serialized Python time N·L·h
    loss_s: float           # GPU 0's loss on the gathered outputs
    ddp_bytes: float        # sent + received by every GPU
    ddp_step_s: float

    @property
    def dp_gpu0_bytes(self) -> float:
        return sum(e.gpu0_bytes for e in self.exchanges)

    @property
    def dp_other_bytes(self) -> float:
        return sum(e.other_bytes for e in self.exchanges)


def sizes(x: DPInputs) -> dict[str, float]:
    """Bytes of the whole batch's inputs and outputs, the parameters and the gradients, per step,
    with N GPUs each processing spec.tokens_per_gpu tokens (multiply I and O by N)."""
    s = x.spec
    item = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
    return {"tokens": s.tokens_per_gpu, "I_per_gpu": s.tokens_per_gpu * x.input_bytes_per_token,
            "O_per_gpu": s.tokens_per_gpu * x.vocab * item[s.param_dtype],
            "P": s.params * item[s.param_dtype], "G": s.params * item[s.grad_dtype]}


def exchanges(x: DPInputs, n: int) -> tuple[Exchange, ...]:
    """The five exchanges of one DataParallel step on n GPUs: bytes and seconds."""
    if int(n) != n or n < 2:
        raise ValueError(f"DataParallel needs at least 2 GPUs (got {n})")
    z, lk, prof = sizes(x), x.link, profile_from_spec(x.spec)
    inp, out = n * z["I_per_gpu"], n * z["O_per_gpu"]
    p2p = lambda nbytes: (n - 1) * lk.alpha + (n - 1) / n * nbytes * lk.beta if nbytes else 0.0   # noqa: E731
    gil = n * x.spec.layers * x.python_us_per_layer * 1e-6
    return (Exchange(EXCHANGES[0], (n - 1) / n * inp, inp / n, p2p(inp)),
            Exchange(EXCHANGES[1], (n - 1) * z["P"], z["P"], float(CM.collective_time("broadcast", z["P"], n, lk, "ring"))),
            Exchange(EXCHANGES[2], 0.0, 0.0, max(prof.forward_ns * 1e-9, gil)),
            Exchange(EXCHANGES[3], 2 * (n - 1) / n * out, 2 * out / n, 2 * p2p(out)),
            Exchange(EXCHANGES[4], (n - 1) * z["G"], z["G"], float(CM.collective_time("reduce", z["G"], n, lk, "ring"))))


def ddp_step_s(x: DPInputs, n: int) -> float:
    """DDP's step on the same model from the simulator (buckets overlapping backward, no jitter)."""
    from syncviz.model.simcore import Jitter, SimConfig
    from syncviz.model.simulate import predict
    cfg = SimConfig(world_size=n, steps=4, link=x.link, algo="ring", jitter=Jitter.none()).validate()
    return predict(profile_from_spec(x.spec), cfg)["step_ms"] / 1e3


def row(x: DPInputs, n: int) -> Row:
    x.validate()
    ex, prof, z = exchanges(x, n), profile_from_spec(x.spec), sizes(x)
    fwd, bwd, opt = prof.forward_ns * 1e-9, prof.backward_ns * 1e-9, prof.optimizer_ns * 1e-9
    # cross-entropy on GPU 0 reads the N chunks of logits, writes their gradient and reads it back
    loss = 3 * n * z["O_per_gpu"] / (x.spec.hbm_gbps * 1e9)
    step = sum(e.seconds for e in ex) + loss + bwd + opt
    share = (fwd + bwd + loss + opt) / (n * (fwd + bwd) + loss + opt)
    return Row(n, ex, step, share, n * x.spec.layers * x.python_us_per_layer * 1e-6, loss,
               2 * CM.bandwidth_factor("all_reduce", n) * z["G"], ddp_step_s(x, n))


def inputs(model: str = "gpt2-medium", link: str = "pcie", vocab: int | None = None, tokens: int | None = None,
           python_us: float = PYTHON_US_PER_LAYER, outputs: str = "logits") -> DPInputs:
    """DPInputs from a model preset (simprofile.MODELS), a link preset and overrides."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
    if outputs not in ("logits", "loss"):
        raise ValueError(f"outputs must be logits or loss (got {outputs!r})")
    spec = MODELS[model]
    if tokens is not None:
        if int(tokens) != tokens or tokens < 1:
            raise ValueError(f"tokens per GPU must be a whole number >= 1 (got {tokens})")
        spec = replace(spec, tokens_per_gpu=int(tokens))
    v = 0 if outputs == "loss" else (VOCAB.get(model, 0) if vocab is None else vocab)
    return DPInputs(spec, CM.get_link(link), v, python_us_per_layer=python_us).validate()
