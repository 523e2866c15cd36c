"""Inputs of the simulator: a model's compute timeline for one step (Profile), measured in a
recorded run (profile_from_run) or derived from a model description (ModelSpec,
profile_from_spec), and the teaching presets (MODELS, SCENARIOS)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import numpy as np

ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


# ----------------------------------------------------------------------------- model inputs

@dataclass(frozen=True)
class ModelSpec:
    """A model described by its size instead of a measured run."""
    name: str
    params: int                   # total parameters
    layers: int                   # transformer blocks (gradients become ready block by block)
    tokens_per_gpu: int           # tokens each GPU processes per optimizer step
    tflops: float                 # achieved TFLOP/s per GPU (6·params·tokens FLOPs per step)
    embedding_params: int = 0     # (tied) embedding: its gradient is ready last
    param_dtype: str = "bfloat16"
    grad_dtype: str = "bfloat16"  # gradient dtype on the wire
    optimizer_bytes: float = 8.0  # Adam m, v in fp32
    master_bytes: float = 0.0     # fp32 master weights: 4 makes K = 12 (costmodel.OPTIMIZER_STATE_BYTES)
    hbm_gbps: float = 2000.0      # memory bandwidth the optimizer step streams at

    def validate(self) -> "ModelSpec":
        checks = [(self.params > 0, f"parameter count must be > 0 (got {self.params})"),
                  (self.layers >= 1, f"layers must be >= 1 (got {self.layers})"),
                  (self.tokens_per_gpu > 0, f"tokens per GPU must be > 0 (got {self.tokens_per_gpu})"),
                  (self.tflops > 0, f"compute throughput must be > 0 TFLOP/s (got {self.tflops})"),
                  (0 <= self.embedding_params < self.params,
                   f"embedding parameters must be >= 0 and < the total (got {self.embedding_params})"),
                  (self.hbm_gbps > 0, f"memory bandwidth must be > 0 GB/s (got {self.hbm_gbps})"),
                  (self.param_dtype in ITEMSIZE and self.grad_dtype in ITEMSIZE,
                   f"dtypes must be one of {', '.join(ITEMSIZE)}")]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        return self


MODELS = {
    # GPT-2 medium: 24 blocks of 12·1024² (+biases/norms), tied 50257×1024 embedding + positions
    "gpt2-medium": ModelSpec("gpt2-medium", 354_823_168, 24, 8 * 1024, 300.0, embedding_params=52_511_744,
                             grad_dtype="float32"),
    # Llama-style 70B: 80 blocks, 128k vocabulary in and out (untied)
    "llama-70b": ModelSpec("llama-70b", 70_553_706_496, 80, 4096, 400.0, embedding_params=2_101_346_304),
}


@dataclass(frozen=True)
class Scenario:
    """A teaching preset: model + cluster + strategy."""
    model: str
    world_size: int
    link: str
    strategy: str
    bucket_cap_mb: float = 25.0
    steps: int = 20
    note: str = ""


SCENARIOS = {
    "gpt2-medium-8": Scenario("gpt2-medium", 8, "nvlink", "ddp",
                              note="GPT-2 medium, DDP on one 8-GPU NVLink node: comm hides under backward"),
    "llama70b-8": Scenario("llama-70b", 8, "nvlink", "zero3", steps=10,
                           note="70B on one node, ZeRO-3: model states alone are 141 GB per GPU (bf16 "
                                "weights and grads, fp32 master + Adam), more than an 80 GB GPU holds"),
    "llama70b-1024": Scenario("llama-70b", 1024, "ib-400", "zero3", steps=6,   # 2.5M events: dashboard-sized
                              note="70B on 1,024 GPUs over InfiniBand, ZeRO-3: the per-layer all-gathers "
                                   "and reduce-scatters outlast the compute"),
}


@dataclass
class Profile:
    """One rank's compute timeline for one step, the simulator's input. Tensors are in the order
    their gradients become ready (DDP's rebuilt bucket order)."""
    name: str
    tensor_names: list[str]
    numel: np.ndarray             # int64 per tensor
    ready_ns: np.ndarray          # float: gradient ready, from backward start
    layer: np.ndarray             # int per tensor (ZeRO-3 units); -1 = outside the blocks
    param_index: np.ndarray       # index in model.parameters()
    forward_ns: float
    optimizer_ns: float           # unsharded optimizer step
    pre_backward_ns: float = 0.0  # forward end → backward start (loss, .backward() call)
    gap_ns: float = 0.0           # between optimizer end and the next forward (data, zero_grad)
    post_comm_ns: float = 0.0     # after the last bucket, before the optimizer (copy-back)
    hook_ns: float = 20_000.0     # launch overhead of a bucket after its last gradient is ready
    copy_ns_per_byte: float = 0.0  # + DDP copying that last gradient into the bucket buffer
    compute_cv: float = 0.0       # measured rank-to-rank spread of compute time within a step (σ of log)
    grad_dtype: str = "float32"
    param_dtype: str = "float32"
    device: str = "cuda"
    backend: str = "nccl"
    source: dict = field(default_factory=dict)

    @property
    def backward_ns(self) -> float:
        return float(self.ready_ns.max()) if len(self.ready_ns) else 0.0

    @property
    def params(self) -> int:
        return int(self.numel.sum())

    @property
    def grad_itemsize(self) -> int:
        return ITEMSIZE.get(self.grad_dtype, 4)

    @property
    def param_itemsize(self) -> int:
        return ITEMSIZE.get(self.param_dtype, 4)


def profile_from_spec(spec: ModelSpec) -> Profile:
    """Forward 2·P·T and backward 4·P·T FLOPs at the given throughput; each block's gradients
    ready in reverse block order, paced by its share of the parameters (matmul FLOPs ∝ params);
    the optimizer streams params, grads, states and master weights through HBM once."""
    spec.validate()
    flops_per_ns = spec.tflops * 1e3
    fwd = 2.0 * spec.params * spec.tokens_per_gpu / flops_per_ns
    bwd = 2.0 * fwd
    per_layer = (spec.params - spec.embedding_params) / spec.layers
    shares = {"attn": 3, "proj": 1, "fc": 4, "fc_proj": 4}            # a block's 12·d² weights
    names, numel, layer = [], [], []
    for i in reversed(range(spec.layers)):
        for t, w in reversed(shares.items()):
            names.append(f"layers.{i}.{t}.weight")
            numel.append(round(per_layer * w / 12))
            layer.append(i)
    numel = np.array(numel, dtype=np.int64)
    ready = bwd * np.cumsum(numel) / numel.sum()
    if spec.embedding_params:
        names.append("embedding.weight")
        numel = np.r_[numel, spec.embedding_params]
        ready = np.r_[ready, bwd]
        layer.append(-1)
    pbytes, gbytes = ITEMSIZE[spec.param_dtype], ITEMSIZE[spec.grad_dtype]
    traffic = 2 * (pbytes + spec.master_bytes + spec.optimizer_bytes) + gbytes
    opt = spec.params * traffic / spec.hbm_gbps           # bytes / (GB/s) = ns
    n = len(names)
    return Profile(spec.name, names, numel, ready.astype(float), np.array(layer), np.arange(n)[::-1].copy(),
                   forward_ns=fwd, optimizer_ns=opt, gap_ns=0.002 * (fwd + bwd),
                   hook_ns=20_000.0, grad_dtype=spec.grad_dtype, param_dtype=spec.param_dtype,
                   source={"model": asdict(spec)})


def _median(x) -> float:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else 0.0


def profile_from_run(run) -> Profile:
    """Median compute timeline of a recorded run's headline steps (all ranks): forward, per-
    gradient ready offsets from backward start, optimizer, gaps, and the bucket hook overhead."""
    from syncviz import analysis as A
    from syncviz.trace import schema as S
    ev = run.events
    steps = sorted(ev["step"].unique())
    if len(steps) > 1:
        ev = ev[ev["step"] > steps[0]]
    if (ev["micro"] > 0).any():
        raise ValueError(f"{run.name}: gradient accumulation (micro-steps) is not simulated; record with --accum 1")
    kind = ev["kind"].astype(str)
    first = lambda k, col="start_ns": ev[kind == k].groupby(["rank", "step"])[col].min()  # noqa: E731
    last = lambda k: ev[kind == k].groupby(["rank", "step"])["end_ns"].max()              # noqa: E731
    opt_rows = A.innermost_optimizer_rows(ev[kind == S.OPTIMIZER]) if hasattr(A, "innermost_optimizer_rows") \
        else ev[kind == S.OPTIMIZER]
    fwd = last(S.FORWARD) - first(S.FORWARD)
    opt = opt_rows.groupby(["rank", "step"])["end_ns"].max() - opt_rows.groupby(["rank", "step"])["start_ns"].min()
    bstart = first(S.BACKWARD)
    pre = bstart - last(S.FORWARD).reindex(bstart.index)
    if not len(fwd) or not len(bstart):
        raise ValueError(f"{run.name}: no forward/backward events in steps after the first")
    lay = run.layouts
    if not len(lay):
        raise ValueError(f"{run.name}: no bucket layout recorded (layout-<r>.arrow)")
    lay = lay[(lay["rank"] == lay["rank"].min()) & (lay["layout"] == lay["layout"].max())]
    lay = lay.drop_duplicates("param")
    ready = ev[kind == S.GRAD_READY].join(bstart.rename("b0"), on=["rank", "step"])
    offsets = (ready["end_ns"] - ready["b0"]).groupby(ready["name"].astype(str)).median()
    if not len(offsets):   # no per-gradient rows: every parameter is ready when its bucket is
        b = A.bucket_metrics(ev).join(bstart.rename("b0"), on=["rank", "step"])
        per_bucket = (b["ready_ns"] - b["b0"]).groupby(b["bucket"]).median()
        offsets = lay.set_index("param")["bucket"].map(per_bucket)
    lay = lay.assign(ready=lay["param"].map(offsets)).dropna(subset=["ready"])
    if not len(lay):
        raise ValueError(f"{run.name}: gradient-ready times do not match the layout's parameter names")
    lay = lay.sort_values(["ready", "param_index"], ascending=[True, False])
    buckets = A.bucket_metrics(ev)
    bucket_end = buckets.groupby(["rank", "step"])["end_ns"].max()
    opt_start = ev[kind == S.OPTIMIZER].groupby(["rank", "step"])["start_ns"].min()
    post = (opt_start - bucket_end.reindex(opt_start.index)).clip(lower=0)
    bwd_end = ev[kind == S.GRAD_READY].groupby(["rank", "step"])["end_ns"].max()   # backward compute ends
    bwd_end = bwd_end if len(bwd_end) else last(S.BACKWARD)
    busy = fwd.add(bwd_end - bstart, fill_value=0)
    spread = max(_rank_spread(busy), _arrival_spread(buckets, _median(busy)))
    step_rows = ev[kind == S.STEP].sort_values(["rank", "step"])
    gaps = step_rows.groupby("rank")["start_ns"].shift(-1) - step_rows["end_ns"]
    dtype = str(lay["dtype"].iloc[0]).replace("torch.", "")
    hook, copy = _launch_delay(buckets, lay, ITEMSIZE.get(dtype, 4))
    layer = lay["param"].astype(str).map(lambda n: int(m.group(1)) if (m := re.search(r"\.(\d+)\.", n)) else -1)
    return Profile(run.name, lay["param"].astype(str).tolist(), lay["numel"].to_numpy(dtype=np.int64),
                   np.maximum(lay["ready"].to_numpy(dtype=float), 0.0), layer.to_numpy(),
                   lay["param_index"].to_numpy(), forward_ns=_median(fwd), optimizer_ns=_median(opt),
                   pre_backward_ns=max(_median(pre), 0.0),
                   gap_ns=max(_median(gaps), 0.0), post_comm_ns=_median(post),
                   hook_ns=hook, copy_ns_per_byte=copy,
                   grad_dtype=dtype, param_dtype=dtype, device=run.meta.get("device") or "cpu",
                   backend=run.meta.get("backend") or "gloo", compute_cv=spread if np.isfinite(spread) else 0.0,
                   source={"run": str(run.path), "run_id": run.meta.get("run_id"),
                           "world_size": run.world_size, "steps": [int(s) for s in steps]})


def _rank_spread(busy) -> float:
    """σ of log compute time across ranks within a step (per (rank, step) Series): the slower
    rank makes the others wait in every collective, which a noise-free replay would miss."""
    logs = np.log(busy[busy > 0]).unstack("rank")
    n = logs.shape[1]
    if n < 2:
        return 0.0
    spread = float(np.nanstd(logs.sub(logs.mean(axis=1), axis=0).to_numpy()) * np.sqrt(n / (n - 1)))
    return spread if np.isfinite(spread) else 0.0


def _launch_delay(buckets, lay, itemsize: int) -> tuple[float, float]:
    """Bucket launch delay (launch − its last gradient ready) as h0 + h1·(bytes of that last
    gradient): without gradient_as_bucket_view DDP copies each gradient into the bucket buffer
    when it is ready, so the bucket holding a big last gradient (a tied embedding) launches tens
    of ms late on CPU. Fitted by least squares over the median delay of each bucket."""
    if not len(buckets):
        return 20_000.0, 0.0
    delay = buckets.groupby("bucket")["launch_delay_ns"].median().dropna()
    last = lay.groupby("bucket").tail(1).set_index("bucket")["numel"] * itemsize     # lay is in ready order
    x = last.reindex(delay.index).to_numpy(dtype=float)
    y = delay.to_numpy(dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(np.unique(x)) >= 2 and x.max() >= 2 * x.min():
        h1, h0 = np.linalg.lstsq(np.c_[x, np.ones_like(x)], y, rcond=None)[0]
        if h1 > 0 and h0 >= 0:
            return float(h0), float(h1)
        if h1 > 0:
            return 0.0, float(np.linalg.lstsq(x[:, None], y, rcond=None)[0][0])
    return max(_median(y), 0.0), 0.0


def _arrival_spread(buckets, busy_ns: float) -> float:
    """The same spread seen where it matters: how far apart the ranks launch the last bucket of a
    step (σ across ranks, median over steps, as a fraction of forward + backward). On a shared
    machine a preempted rank arrives late even when its compute took as long as the others'."""
    if not len(buckets) or busy_ns <= 0 or buckets["rank"].nunique() < 2:
        return 0.0
    last = buckets[buckets["bucket"] == buckets["bucket"].max()]
    sd = last.groupby("step")["launch_ns"].std(ddof=1).dropna()
    # the median of a sample σ of normal draws is ≈ 0.6745 σ for two ranks; close enough for more
    return float(_median(sd) / 0.6745 / busy_ns) if len(sd) else 0.0
