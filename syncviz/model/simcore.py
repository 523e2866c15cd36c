"""The simulator's core (``syncviz simulate``): what a run would look like at another world
size, link, bucket cap or strategy. Replays per-gradient ready times (measured in a run, or
derived from a model description) through DDP's launch-in-order bucket pipeline under the cost
model (syncviz.model.costmodel); syncviz.model.simtrace writes the result as an ordinary syncviz trace.

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
trace writer (syncviz.model.simtrace) only broadcasts per-rank factors into columns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from syncviz.model import costmodel as CM
from syncviz.trace import schema as S
from syncviz.model.simprofile import Profile

STRATEGIES = S.SIM_STRATEGIES
COMPRESSION = ("none", "fp16", "bf16", "powersgd")


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

    @classmethod
    def measured(cls, profile: Profile, comm_cv: float = 0.0, seed: int = 0) -> "Jitter":
        """The noise a recorded run showed (predictions): its rank-to-rank compute spread and the
        collective-to-collective spread around the fitted cost model (costmodel.Fit.noise)."""
        return cls(compute_cv=profile.compute_cv, rank_cv=0.0, start_frac=0.0, comm_cv=comm_cv, seed=seed)


@dataclass
class SimConfig:
    """What to simulate (everything but the model)."""
    world_size: int = 8              # ranks (GPUs)
    steps: int = 20                  # optimizer steps
    strategy: str = "ddp"            # ddp | zero1 | zero2 | zero3
    bucket_cap_mb: float = 25.0      # DDP bucket cap, MiB (DDP's MB)
    first_bucket_cap_mb: float = 1.0  # cap of the first bucket (DDP's default is 1 MiB)
    link: CM.Link = field(default_factory=lambda: CM.LINKS["nvlink"])
    algo: str = "auto"               # ring | tree | auto (the faster per message)
    compression: str = "none"        # DDP comm hook: none | fp16 | bf16 | powersgd
    jitter: Jitter = field(default_factory=Jitter)
    gpus_per_node: int = 8           # for run.json's nodes/hosts only
    contention: float = 0.0          # κ (costmodel.Fit): collectives (1+κ)× slower while backward runs

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
        if self.jitter.straggler >= self.world_size:
            raise ValueError(f"straggler rank {self.jitter.straggler} is not below the world size {self.world_size}")
        if not self.jitter.straggler_slowdown >= 0:
            raise ValueError(f"straggler slowdown must be >= 0 (got {self.jitter.straggler_slowdown})")
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
        p, cfg = self.p, self.cfg
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
        # launch = last gradient ready + hook overhead + copying that gradient into the bucket,
        # and never before the previous bucket (DDP launches in order)
        ends = np.r_[starts[1:], len(p.numel)] - 1
        self.h = p.hook_ns + p.copy_ns_per_byte * grad_bytes[ends]
        self.h_const = bool(np.all(self.h == self.h[0]))      # then ready order is launch order
        ready_max = max_affine(self.a, self.c, p.forward_ns + p.pre_backward_ns + self.x)
        launch_max = np.maximum.accumulate(ready_max + self.h[None, :], axis=1)
        durations = t[None, :] * self._noise((s, k))
        if cfg.contention > 0:   # slower until the slowest rank's backward ends (its last gradient)
            self.e = contended_stream(launch_max, durations, ready_max[:, -1], cfg.contention)
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
        s = cfg.steps
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

