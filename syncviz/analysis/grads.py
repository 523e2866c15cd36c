"""The data-parallel averaging argument, checked on recorded gradient values (trace.grads.load_grads):
after synchronization every rank holds the mean of the ranks' local gradients,
∇L(B) = (1/N) Σ_r ∇L(B_r).

DDP computes the mean as Σ_r (g_r × fl(1/N)) in the gradient dtype: it multiplies by the reciprocal
of the world size, then all-reduces a sum (torch's reducer; syncviz.record.ddp reproduces it bit
for bit). For N = 2 that equals (g_0 + g_1)/2 bit for bit (×0.5 is exact, a sum of two has one
order). For N ≥ 3 the backend's summation order (which rank a ring chunk starts from) changes the
last bits, so "exact" means: equal bit for bit to the sum in some order of the ranks (all N! orders
are tried up to 6 ranks), and the largest difference from the rank-order sum is reported in ulps.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from syncviz.trace import schema as S

_NP = {"float32": np.float32, "float64": np.float64, "float16": np.float16}
ORDERS_UP_TO = 6          # try every summation order up to this many ranks (6! = 720 orders)


def ddp_mean(before: np.ndarray, dtype: str, order=None) -> np.ndarray:
    """DDP's average of the rows of ``before`` (ranks × elements): Σ_r g_r × fl(1/N) in the gradient
    dtype, summed left to right in ``order`` (rank order by default). bf16 is computed in fp32."""
    t = _NP.get(dtype, np.float32)
    n = before.shape[0]
    order = range(n) if order is None else order
    scale = t(1.0) / t(n)
    terms = [before[r].astype(t) * scale for r in order]
    acc = terms[0]
    for x in terms[1:]:
        acc = (acc + x).astype(t)
    return acc


def matches_some_order(before: np.ndarray, after: np.ndarray, dtype: str) -> bool:
    """after == Σ g_r·fl(1/N) for some order of the ranks, element by element (each element may
    come from a different ring chunk, each summed from a different starting rank)."""
    n = before.shape[0]
    orders = itertools.permutations(range(n)) if n <= ORDERS_UP_TO else [tuple(range(n))]
    left = np.ones(after.shape, dtype=bool)
    for order in orders:
        left &= ddp_mean(before, dtype, order).astype(np.float64) != after
        if not left.any():
            return True
    return False


def _ulps(before: np.ndarray, after: np.ndarray, mean: np.ndarray, dtype: str) -> float:
    """Largest |after − mean| in units of the last place of the largest term |g_r/N| (the scale
    of a sum's rounding error; the result itself may be tiny after cancellation)."""
    t = _NP.get(dtype, np.float32)
    scale = np.abs(before).max(axis=0) / before.shape[0]
    spacing = np.spacing(scale.astype(t)).astype(np.float64)
    d = np.abs(after - mean)
    return float(np.max(np.where(spacing > 0, d / spacing, 0.0))) if d.size else 0.0


def averaging_check(grads: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, micro, param): N, the first element before on each rank, DDP's mean, the
    after value, whether every rank's after is identical, whether after == DDP's mean bit for bit
    over all recorded elements (in some summation order of the ranks), the largest difference from
    the rank-order mean in ulps of the largest term, and the norms (mean of the ranks'
    before-norms vs the after-norm: averaging cancels noise, so the after-norm is smaller)."""
    out = []
    for (step, micro, param), g in grads.groupby(["step", "micro", "param"], sort=True):
        before = g[g["when"] == S.GRAD_BEFORE].sort_values("rank")
        after = g[g["when"] == S.GRAD_AFTER].sort_values("rank")
        if before.empty or after.empty or len(before) != len(after):
            continue
        dtype = str(before["dtype"].iloc[0])
        b = np.array([np.asarray(v, dtype=np.float64) for v in before["values"]])
        a = np.array([np.asarray(v, dtype=np.float64) for v in after["values"]])
        mean = ddp_mean(b, dtype).astype(np.float64)
        exact = bool((a[0] == mean).all()) or matches_some_order(b, a[0], dtype)
        out.append({
            "step": int(step), "micro": int(micro), "param": param, "ranks": len(b),
            "bucket": int(before["bucket"].iloc[0]), "param_index": int(before["param_index"].iloc[0]),
            "before": [float(x) for x in b[:, 0]], "mean": float(mean[0]), "after": float(a[0, 0]),
            "after_equal_on_ranks": bool((a == a[0]).all()),
            "exact": exact, "max_ulps": _ulps(b, a[0], mean, dtype),
            "before_norms": [float(x) for x in before["norm"]], "after_norm": float(after["norm"].iloc[0]),
            "elements": int(b.shape[1]), "dtype": dtype})
    return pd.DataFrame(out)


def averaging_summary(check: pd.DataFrame) -> dict:
    """Counts over the whole run: parameter-steps checked, bitwise equal, worst ulps."""
    if check.empty:
        return {"checked": 0, "exact": 0, "after_equal_on_ranks": 0, "max_ulps": 0.0, "elements": 0}
    return {"checked": int(len(check)), "exact": int(check["exact"].sum()),
            "after_equal_on_ranks": int(check["after_equal_on_ranks"].sum()),
            "max_ulps": float(check["max_ulps"].max()), "elements": int(check["elements"].sum())}
