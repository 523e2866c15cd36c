"""The simulator's core (``syncviz simulate``): what a run would look like at another world
size, link, bucket cap or strategy. Replays per-gradient ready times (measured in a run, or
derived from a model description) through DDP's launch-in-order bucket pipeline under the cost
model (syncviz.costmodel); syncviz.simtrace writes the result as an ordinary syncviz trace.

Model of one step (times relative to the step's global reference G_s, the moment the previous
step's last collective finished):
- rank r starts at a[r,s] = its previous optimizer (DDP) + gap + jitter, runs forward F·c[r,s],
  then backward; gradient i is ready at F·c + x_i·c (c = per rank-step speed factor).
- bucket k is launched when its last gradient is ready (+ hook overhead h), in index order;
  the collective runs once every rank launched it and the one before it finished:
  end_k = max(max_r launch[r,k], end_{k−1}) + T_k, T_k from the cost model.
- DDP's optimizer starts when all buckets are done; ZeRO-1/2 run the optimizer on a 1/N shard and
  then all-gather the parameters; ZeRO-3 (simulated per layer, FSDP-style) all-gathers each
  layer's parameters before its forward and backward (prefetching one ahead) and reduce-scatters
  its gradients, all on one communication stream.
Because every rank's times are affine in G_s, all steps are computed at once (numpy), and the
trace writer (syncviz.simtrace) only broadcasts per-rank factors into columns.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from . import costmodel as CM

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
COMPRESSION = ("none", "fp16", "bf16", "powersgd")


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
    master_bytes: float = 4.0     # fp32 master weights (mixed precision)
    hbm_gbps: float = 2000.0      # memory bandwidth the optimizer step streams at

    def validate(self) -> "ModelSpec":
        checks = [(self.params > 0, f"parameter count must be > 0 (got {self.params})"),
                  (self.layers >= 1, f"layers must be >= 1 (got {self.layers})"),
                  (self.tokens_per_gpu > 0, f"tokens per GPU must be > 0 (got {self.tokens_per_gpu})"),
                  (self.tflops > 0, f"compute throughput must be > 0 TFLOP/s (got {self.tflops})"),
                  (0 <= self.embedding_params < self.params,
                   f"embedding parameters must be >= 0 and < the total (got {self.embedding_params})"),
                  (self.hbm_gbps > 0, f"memory bandwidth must be > 0 GB/s (got {self.hbm_gbps})"),
                  (self.param_dtype in _ITEMSIZE and self.grad_dtype in _ITEMSIZE,
                   f"dtypes must be one of {', '.join(_ITEMSIZE)}")]
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
    "llama70b-1024": Scenario("llama-70b", 1024, "ib-400", "zero3", steps=10,
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
        return _ITEMSIZE.get(self.grad_dtype, 4)

    @property
    def param_itemsize(self) -> int:
        return _ITEMSIZE.get(self.param_dtype, 4)


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
    pbytes, gbytes = _ITEMSIZE[spec.param_dtype], _ITEMSIZE[spec.grad_dtype]
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
    from . import analysis as A
    from . import schema as S
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
    step_rows = ev[kind == S.STEP].sort_values(["rank", "step"])
    gaps = step_rows.groupby("rank")["start_ns"].shift(-1) - step_rows["end_ns"]
    dtype = str(lay["dtype"].iloc[0]).replace("torch.", "")
    layer = lay["param"].astype(str).map(lambda n: int(m.group(1)) if (m := re.search(r"\.(\d+)\.", n)) else -1)
    return Profile(run.name, lay["param"].astype(str).tolist(), lay["numel"].to_numpy(dtype=np.int64),
                   np.maximum(lay["ready"].to_numpy(dtype=float), 0.0), layer.to_numpy(),
                   lay["param_index"].to_numpy(), forward_ns=_median(fwd), optimizer_ns=_median(opt),
                   pre_backward_ns=max(_median(pre), 0.0),
                   gap_ns=max(_median(gaps), 0.0), post_comm_ns=_median(post),
                   hook_ns=max(_median(buckets["launch_delay_ns"]), 0.0) if len(buckets) else 20_000.0,
                   grad_dtype=dtype, param_dtype=dtype, device=run.meta.get("device") or "cpu",
                   backend=run.meta.get("backend") or "gloo",
                   source={"run": str(run.path), "run_id": run.meta.get("run_id"),
                           "world_size": run.world_size, "steps": [int(s) for s in steps]})


# ---------------------------------------------------------------------------------- buckets

def assign_buckets(nbytes: np.ndarray, cap_bytes: float, first_cap_bytes: float | None = None) -> np.ndarray:
    """Bucket index per tensor (tensors in ready order), as DDP's compute_bucket_assignment_by_size:
    add tensors until the bucket holds at least the cap, then start the next bucket; the first
    bucket uses its own (smaller) cap."""
    if cap_bytes <= 0 or (first_cap_bytes is not None and first_cap_bytes <= 0):
        raise ValueError("bucket caps must be > 0 MB")
    out = np.empty(len(nbytes), dtype=np.int64)
    b, size = 0, 0.0
    limit = first_cap_bytes if first_cap_bytes is not None else cap_bytes
    for i, n in enumerate(nbytes):
        out[i] = b
        size += n
        if size >= limit and i + 1 < len(nbytes):
            b, size, limit = b + 1, 0.0, cap_bytes
    return out


def powersgd_bytes(numel: np.ndarray, itemsize: int, rank: int = 4) -> np.ndarray:
    """Bytes PowerSGD sends per tensor: matrices (taken as square) send P and Q, rank·(m+n)
    values; vectors (< 64k elements here) are all-reduced uncompressed, as the hook does."""
    side = np.sqrt(numel.astype(float))
    return np.where(numel >= 65536, np.minimum(2 * rank * side, numel), numel) * itemsize


@dataclass
class Jitter:
    """Per-rank noise so skew and straggler views show something. 0 everywhere = deterministic."""
    compute_cv: float = 0.01      # σ of the log of each rank-step's compute speed
    rank_cv: float = 0.003        # σ of each rank's persistent speed (device variation)
    start_frac: float = 0.002     # mean start delay per rank-step, as a fraction of fwd+bwd
    comm_cv: float = 0.05         # σ of the log of each collective's time
    straggler: int = -1           # a rank that is persistently slow
    straggler_slowdown: float = 0.0
    seed: int = 0

    @classmethod
    def none(cls) -> "Jitter":
        return cls(0.0, 0.0, 0.0, 0.0)


@dataclass
class SimConfig:
    world_size: int = 8
    steps: int = 20
    strategy: str = "ddp"
    bucket_cap_mb: float = 25.0
    first_bucket_cap_mb: float = 1.0
    link: CM.Link = field(default_factory=lambda: CM.LINKS["nvlink"])
    algo: str = "auto"
    compression: str = "none"
    jitter: Jitter = field(default_factory=Jitter)
    gpus_per_node: int = 8
    contention: float = 0.0       # κ (costmodel.Fit): collectives (1+κ)× slower while backward runs

    def validate(self) -> "SimConfig":
        if self.world_size < 1:
            raise ValueError(f"world size must be >= 1 (got {self.world_size})")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1 (got {self.steps})")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose from {', '.join(STRATEGIES)}")
        if self.compression not in COMPRESSION:
            raise ValueError(f"unknown compression {self.compression!r}; choose from {', '.join(COMPRESSION)}")
        if self.compression != "none" and self.strategy != "ddp":
            raise ValueError("compression hooks apply to DDP only (--strategy ddp)")
        if not (self.bucket_cap_mb > 0 and self.first_bucket_cap_mb > 0):
            raise ValueError("bucket caps must be > 0 MB")
        if self.algo not in CM.ALGOS:
            raise ValueError(f"unknown algorithm {self.algo!r}; choose from {', '.join(CM.ALGOS)}")
        if self.gpus_per_node < 1:
            raise ValueError("GPUs per node must be >= 1")
        if not self.contention >= 0:
            raise ValueError(f"contention must be >= 0 (got {self.contention})")
        self.link.validate()
        return self


# --------------------------------------------------------------------------------- timeline

def max_affine(a: np.ndarray, c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """M[s, k] = max over ranks r of a[r, s] + c[r, s]·y[k] (y ascending), exactly.
    Two lines cross at most once, so a line that is below another at both ends of y's range is
    never the maximum; the survivors (a 2-D Pareto front, a handful of ranks) are evaluated."""
    n, steps = a.shape
    if n * len(y) <= 4096:
        return (a[:, :, None] + c[:, :, None] * y[None, None, :]).max(axis=0)
    lo, hi = a + c * y[0], a + c * y[-1]                       # (n, s)
    order = np.argsort(-lo, axis=0, kind="stable")
    hi_sorted = np.take_along_axis(hi, order, axis=0)
    best_before = np.maximum.accumulate(np.vstack([np.full((1, steps), -np.inf), hi_sorted[:-1]]), axis=0)
    keep = hi_sorted > best_before
    m = int(keep.sum(axis=0).max())
    first = np.argsort(~keep, axis=0, kind="stable")[:m]       # kept ones first
    cand = np.take_along_axis(order, first, axis=0)           # (m, s) rank ids
    valid = np.take_along_axis(keep, first, axis=0)
    ca, cc = np.take_along_axis(a, cand, axis=0), np.take_along_axis(c, cand, axis=0)
    vals = ca[:, :, None] + cc[:, :, None] * y[None, None, :]
    vals[~valid] = -np.inf
    return vals.max(axis=0)


def serial_stream(ready: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """End times of collectives run in order on one stream: end_k = max(ready_k, end_{k−1}) + dur_k
    (rows = steps, vectorized)."""
    csum = np.cumsum(dur, axis=1)
    return csum + np.maximum.accumulate(ready - (csum - dur), axis=1)


def contended_stream(ready: np.ndarray, dur: np.ndarray, busy_until: np.ndarray, kappa: float) -> np.ndarray:
    """serial_stream where a collective runs (1+κ)× slower before ``busy_until`` (per step): the
    part of its work left at that moment finishes at full speed."""
    end = np.full(ready.shape[0], -np.inf)
    out = np.empty_like(ready)
    slow = 1.0 + kappa
    for k in range(ready.shape[1]):
        start = np.maximum(ready[:, k], end)
        d = dur[:, k]
        left = busy_until - start                                 # busy time ahead of it
        end = np.where(left <= 0, start + d,
                       np.where(d * slow <= left, start + d * slow, busy_until + d - left / slow))
        out[:, k] = end
    return out


class Timeline:
    """Every rank's step timeline for a profile under a config (see the module docstring).
    Global arrays are per step (relative to G_s); per-rank factors a[r, s] (start offset) and
    c[r, s] (compute speed) turn them into each rank's events (rank_times)."""

    def __init__(self, profile: Profile, cfg: SimConfig):
        self.p, self.cfg = profile, cfg.validate()
        if len(profile.numel) == 0 or profile.params <= 0:
            raise ValueError("the model has no parameters with gradients")
        n, s = cfg.world_size, cfg.steps
        j = cfg.jitter
        rng = np.random.default_rng(j.seed)
        speed = np.exp(rng.normal(0.0, j.rank_cv, n)) if j.rank_cv else np.ones(n)
        if 0 <= j.straggler < n:
            speed[j.straggler] *= 1.0 + j.straggler_slowdown
        self.c = speed[:, None] * (np.exp(rng.normal(0.0, j.compute_cv, (n, s))) if j.compute_cv else np.ones((n, s)))
        busy = profile.forward_ns + profile.backward_ns
        self.d = rng.exponential(j.start_frac * busy, (n, s)) if j.start_frac else np.zeros((n, s))
        self._rng = rng
        self.opt_ns = profile.optimizer_ns / (n if cfg.strategy != "ddp" else 1)
        if cfg.strategy == "zero3":
            self._zero3()
        else:
            self._bucketed()
        self.G = np.r_[0.0, np.cumsum(self.step_len)[:-1]]

    # ------------------------------------------------------------------ collective times
    def _coll_ns(self, op: str, nbytes: np.ndarray) -> np.ndarray:
        return 1e9 * CM.collective_time(op, nbytes, self.cfg.world_size, self.cfg.link, self.cfg.algo)

    def _noise(self, shape) -> np.ndarray:
        cv = self.cfg.jitter.comm_cv
        return np.exp(self._rng.normal(0.0, cv, shape)) if cv else np.ones(shape)

    # ----------------------------------------------------------------- DDP, ZeRO-1/2
    def _bucketed(self):
        p, cfg, n = self.p, self.cfg, self.cfg.world_size
        grad_bytes = p.numel * p.grad_itemsize
        self.bucket_of = assign_buckets(grad_bytes, cfg.bucket_cap_mb * CM.MIB, cfg.first_bucket_cap_mb * CM.MIB)
        k = int(self.bucket_of.max()) + 1
        starts = np.flatnonzero(np.r_[True, np.diff(self.bucket_of) != 0])
        self.logical_bytes = np.add.reduceat(grad_bytes, starts)
        self.x = np.maximum.reduceat(p.ready_ns, starts)                 # bucket ready offsets
        self.op = "reduce_scatter" if cfg.strategy == "zero2" else "all_reduce"
        self.wire_dtype, self.hook = p.grad_dtype, {"zero2": "reduce_scatter"}.get(cfg.strategy, "allreduce")
        if cfg.compression in ("fp16", "bf16"):
            self.wire_dtype = "float16" if cfg.compression == "fp16" else "bfloat16"
            self.wire_bytes = np.add.reduceat(p.numel * 2, starts)
            self.hook = f"{cfg.compression}_compress_hook"
            t = self._coll_ns(self.op, self.wire_bytes)
        elif cfg.compression == "powersgd":
            self.wire_bytes = np.add.reduceat(powersgd_bytes(p.numel, p.grad_itemsize), starts).astype(np.int64)
            self.hook = "powerSGD_hook"
            t = 2 * self._coll_ns(self.op, self.wire_bytes / 2)            # P and Q: two all-reduces
        else:
            self.wire_bytes = self.logical_bytes
            t = self._coll_ns(self.op, self.wire_bytes)
        self.comm_ns = t
        s = cfg.steps
        post, gap = p.post_comm_ns, p.gap_ns
        prev = np.zeros_like(self.c)
        if cfg.strategy == "ddp":           # a rank starts its next step after its own optimizer
            prev[:, 1:] = self.c[:, :-1] * (post + self.opt_ns)
        self.a = prev + self.d + np.where(np.arange(s) > 0, gap, 0.0)[None, :]
        launch_max = max_affine(self.a, self.c, p.forward_ns + p.pre_backward_ns + self.x) + p.hook_ns
        durations = t[None, :] * self._noise((s, k))
        if cfg.contention > 0:   # slower until the slowest rank's backward ends (its last gradient)
            self.e = contended_stream(launch_max, durations, launch_max[:, -1] - p.hook_ns, cfg.contention)
        else:
            self.e = serial_stream(launch_max, durations)
        self.E = self.e[:, -1]
        if cfg.strategy == "ddp":
            self.ag_end = None
            self.step_len = self.E
        else:
            self.ag_bytes = np.add.reduceat(p.numel * p.param_itemsize, starts)
            opt_last = self.E + post + self.c.max(axis=0) * self.opt_ns
            t_ag = self._coll_ns("all_gather", self.ag_bytes)[None, :] * self._noise((s, k))
            self.ag_end = opt_last[:, None] + np.cumsum(t_ag, axis=1)
            self.step_len = self.ag_end[:, -1]

    # ------------------------------------------------------------------------ ZeRO-3
    def _zero3(self):
        """FSDP-like: unit = transformer block (tensors outside blocks form one root unit, first)."""
        p, cfg = self.p, self.cfg
        layers = np.asarray(p.layer)
        unit_ids = sorted(set(layers.tolist()))          # -1 (root) first, then blocks in forward order
        unit_of = np.searchsorted(unit_ids, layers)
        u = len(unit_ids)
        numel = np.bincount(unit_of, weights=p.numel, minlength=u)
        share = numel / numel.sum()
        self.unit_param_bytes = (numel * p.param_itemsize).astype(np.int64)
        self.unit_grad_bytes = (numel * p.grad_itemsize).astype(np.int64)
        s, n = cfg.steps, cfg.world_size
        t_ag = self._coll_ns("all_gather", self.unit_param_bytes)
        t_rs = self._coll_ns("reduce_scatter", self.unit_grad_bytes)
        noise = self._noise((s, 3 * u))
        self.comm_ns = np.r_[t_ag, t_rs]
        post, gap = p.post_comm_ns, p.gap_ns
        prev = np.zeros_like(self.c)
        prev[:, 1:] = self.c[:, :-1] * (post + self.opt_ns)
        self.a = prev + self.d + np.where(np.arange(s) > 0, gap, 0.0)[None, :]
        C, A = self.c.T, self.a.T                              # (s, n)
        stream = np.full(s, -np.inf)
        ops = iter(range(3 * u))

        def run(issue, dur):                                    # one collective on the stream
            nonlocal stream
            stream = np.maximum(issue.max(axis=1), stream) + dur * noise[:, next(ops)]
            return stream.copy()

        z = {"ag_f_issue": [], "ag_f_end": [], "fwd": [], "ag_b_issue": [], "ag_b_end": [],
                      "bwd": [], "rs_end": []}
        comp_end, issue = A, A
        for i in range(u):
            end = run(issue, t_ag[i])
            z["ag_f_issue"].append(issue)
            z["ag_f_end"].append(end)
            cs = np.maximum(end[:, None], comp_end)
            comp_end = cs + C * (p.forward_ns * share[i])
            z["fwd"].append((cs, comp_end))
            issue = cs                                          # prefetch the next unit
        bwd_total = p.backward_ns
        comp_end = comp_end + C * p.pre_backward_ns
        ag_b = {u - 1: (comp_end, run(comp_end, t_ag[u - 1]))}
        prev_end = comp_end
        for i in reversed(range(u)):
            bcs = np.maximum(ag_b[i][1][:, None], prev_end)
            if i > 0:
                ag_b[i - 1] = (bcs, run(bcs, t_ag[i - 1]))
            bce = bcs + C * (bwd_total * share[i])
            z["bwd"].append((bcs, bce))
            z["rs_end"].append(run(bce, t_rs[i]))
            prev_end = bce
        z["bwd"].reverse()
        z["rs_end"].reverse()
        # (steps, units, ranks) for per-rank times, (steps, units) for a collective's end
        self.z = {"ag_f_issue": np.stack(z["ag_f_issue"], 1), "ag_f_end": np.stack(z["ag_f_end"], 1),
                  "fwd_start": np.stack([x[0] for x in z["fwd"]], 1),
                  "fwd_end": np.stack([x[1] for x in z["fwd"]], 1),
                  "ag_b_issue": np.stack([ag_b[i][0] for i in range(u)], 1),
                  "ag_b_end": np.stack([ag_b[i][1] for i in range(u)], 1),
                  "bwd_start": np.stack([x[0] for x in z["bwd"]], 1),
                  "bwd_end": np.stack([x[1] for x in z["bwd"]], 1), "rs_end": np.stack(z["rs_end"], 1)}
        self.units = u
        self.unit_names = [f"layers.{x}" if x >= 0 else "root" for x in unit_ids]
        self.E = stream
        self.step_len = stream

