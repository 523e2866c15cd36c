"""Interval arithmetic over (rank, step) groups and the compute/comm intervals every metric in
syncviz.analysis is built from (the definitions are documented there). Pure numpy/pandas,
vectorized: no Python loop per event."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis import keys as K
from syncviz.trace import schema as S
from syncviz.analysis.columns import as_str

# Suffix of a collective row's name when the calling thread blocked until it finished (written by
# syncviz.record.collectives, which defines the same literal; analysis imports no torch).
BLOCKING = S.BLOCKING


# ------------------------------------------------------------------------ interval arithmetic

def merge_intervals(g: np.ndarray, s: np.ndarray, e: np.ndarray):
    """Union of intervals per group: returns (group, start, end) of disjoint merged intervals,
    sorted by group then start."""
    if len(g) == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z.copy(), z.copy()
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    cm = K.group_cummax(g, e)
    new_group = np.r_[True, g[1:] != g[:-1]]
    prev_end = np.r_[np.iinfo(np.int64).min, cm[:-1]]
    starts_block = new_group | (s > prev_end)
    idx = np.flatnonzero(starts_block)
    last = np.r_[idx[1:] - 1, len(s) - 1]
    return g[idx], s[idx], cm[last]


class Coverage:
    """Covered length of a union of intervals in (-inf, t], per group; answers many queries at once."""

    def __init__(self, g, s, e, n_groups: int, base: np.ndarray, span: int):
        self.mg, self.ms, self.me = merge_intervals(g, s, e)
        self.base, self.span = base, span
        self.key_s = self._key(self.mg, self.ms)
        lengths = (self.me - self.ms).astype(np.int64)
        self.cum = np.cumsum(lengths) - lengths      # covered length before each merged interval
        self.total = np.bincount(self.mg, weights=lengths, minlength=n_groups)

    def _key(self, g, t):
        return g.astype(np.int64) * self.span + (t - self.base[g])

    def at(self, g: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Covered length in group g up to time t (relative to the group's first interval)."""
        if len(self.ms) == 0:
            return np.zeros(len(g))
        k = np.searchsorted(self.key_s, self._key(g, t), side="right") - 1
        kk = np.maximum(k, 0)
        valid = (k >= 0) & (self.mg[kk] == g)
        inside = np.minimum(t, self.me[kk]) - self.ms[kk]
        # covered length from earlier intervals of the same group: cum[kk] - cum[first of group]
        first = np.searchsorted(self.mg, g, side="left")
        firstc = self.cum[np.minimum(first, len(self.cum) - 1)]
        return np.where(valid, self.cum[kk] - firstc + inside, 0.0)

    def overlap(self, g, s, e) -> np.ndarray:
        """|[s, e] ∩ union| for each query interval."""
        return self.at(g, e) - self.at(g, s)


def _valid_intervals(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["start_ns"] >= 0) & (df["end_ns"] >= df["start_ns"])]


# ------------------------------------------------------------------------ the building blocks

def compute_intervals(events: pd.DataFrame) -> pd.DataFrame:
    """Compute intervals (rank, step, micro, kind, start_ns, end_ns): forward, backward compute
    ([backward start, last gradient ready]), optimizer, and eval forwards (a forward whose backward
    never ran: not training compute, but it keeps the rank busy, so comm under it is overlapped)."""
    # Filter a frame of the columns used here: filtering the whole event table takes its string
    # columns along (name, dtype), which made these four filters most of this function's time.
    ev = events[[c for c in ("rank", "step", "micro", "kind", "start_ns", "end_ns", "layout") if c in events]]
    fwd = ev[ev["kind"].isin((S.FORWARD, S.EVAL_FORWARD))][["rank", "step", "micro", "kind", "start_ns", "end_ns"]]
    opt = innermost_optimizer_rows(ev[ev["kind"] == S.OPTIMIZER])
    opt = opt[["rank", "step", "micro", "kind", "start_ns", "end_ns"]]
    bwd = ev[ev["kind"] == S.BACKWARD][["rank", "step", "micro", "kind", "start_ns", "end_ns"]].copy()
    ready = ev[ev["kind"] == S.GRAD_READY]
    if len(bwd) and len(ready):
        last = ready.groupby(["rank", "step", "micro"], observed=True)["end_ns"].max().rename("last_ready")
        bwd = bwd.join(last, on=["rank", "step", "micro"])
        has = bwd["last_ready"].notna() & (bwd["last_ready"] >= bwd["start_ns"])
        bwd.loc[has, "end_ns"] = bwd.loc[has, "last_ready"].astype(np.int64)
        bwd = bwd.drop(columns="last_ready")
    out = pd.concat([fwd, bwd, opt], ignore_index=True)
    out["kind"] = as_str(out["kind"])
    out = _valid_intervals(out)
    blocked = blocking_rows(events)
    if len(blocked) and len(out):
        out = subtract_intervals(out, blocked)
    return out


def innermost_optimizer_rows(opt: pd.DataFrame) -> pd.DataFrame:
    """Optimizer rows of the deepest nesting per (rank, step): the optimizer that does the math.
    The recorder writes one row per optimizer step at every depth (``layout`` = depth, -1 or 0
    for a plain optimizer)."""
    if not len(opt) or "layout" not in opt or not (opt["layout"] > 0).any():
        return opt
    deepest = opt.groupby(["rank", "step"], observed=True)["layout"].transform("max")
    return opt[opt["layout"] == deepest]


def blocking_rows(events: pd.DataFrame) -> pd.DataFrame:
    """Collective rows during which the calling thread was blocked (synchronous host collectives)."""
    is_coll = (events["kind"] == S.COLLECTIVE).to_numpy()
    if not is_coll.any():
        return events.iloc[:0]
    name = events["name"]
    # each category tested once, not each row: 30 -> 5 ms on 781,440 events of the 10^8 run
    # (a partition; compute_intervals 84 -> 51 ms), called twice a partition by the summary
    if isinstance(name.dtype, pd.CategoricalDtype):
        cats = name.cat.categories
        blocking = np.r_[np.asarray(pd.Index(cats.astype(str)).str.endswith(BLOCKING), dtype=bool), False]
        is_coll = is_coll & blocking[name.cat.codes.to_numpy()]    # code -1 (missing): the last, False
        return _valid_intervals(events[is_coll])
    coll = events[is_coll]
    return _valid_intervals(coll[as_str(coll["name"]).str.endswith(BLOCKING)])


def subtract_intervals(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``a`` with the union of ``b``'s intervals of the same (rank, step) cut out: a row
    may become several pieces (same other columns) or vanish."""
    idx, (ga, gb), base, span = _groups(a, b)
    mg, ms, me = merge_intervals(gb, b["start_ns"].to_numpy(), b["end_ns"].to_numpy())
    s, e = a["start_ns"].to_numpy(), a["end_ns"].to_numpy()
    key = lambda g, t: g.astype(np.int64) * span + (t - base[g])  # noqa: E731  (sorted like mg, ms)
    lo = np.searchsorted(key(mg, me), key(ga, s), side="right")   # first cut ending after s
    hi = np.searchsorted(key(mg, ms), key(ga, e), side="left")    # cuts starting before e
    cuts = np.maximum(hi - lo, 0)
    pieces = cuts + 1
    row = np.repeat(np.arange(len(a)), pieces)
    j = np.arange(len(row)) - np.repeat(np.cumsum(pieces) - pieces, pieces)   # piece number in row
    k = lo[row] + j
    last = max(len(ms) - 1, 0)
    start = np.where(j == 0, s[row], me[np.clip(k - 1, 0, last)])
    end = np.where(j == cuts[row], e[row], ms[np.clip(k, 0, last)])
    start, end = np.maximum(start, s[row]), np.minimum(end, e[row])
    keep = end > start
    out = a.iloc[row[keep]].copy()
    out["start_ns"], out["end_ns"] = start[keep], end[keep]
    return out.reset_index(drop=True)


def wire_mask(comm: pd.DataFrame) -> np.ndarray:
    """Comm rows that put bytes on the wire once: every bucket, plus collectives not issued from
    inside a bucket's comm hook (those are the bucket's own transfer)."""
    return ((comm["kind"] == S.BUCKET) | (comm["bucket"] < 0)).to_numpy()


def comm_rows(events: pd.DataFrame) -> pd.DataFrame:
    """Bucket and collective rows, each one a comm interval [launch, done]: ``start_ns`` and
    ``launch_ns`` hold the launch (the collective call; the row's start where no launch was
    stamped), ``hook_ns`` the row's own start (comm-hook entry for a DDP bucket)."""
    rows = events[events["kind"].isin(S.COMM_KINDS)]
    s, launch, e = rows["start_ns"].to_numpy(), rows["launch_ns"].to_numpy(), rows["end_ns"].to_numpy()
    launch = np.where((launch >= s) & (launch <= e), launch, s)
    rows = rows.assign(hook_ns=s, start_ns=launch, launch_ns=launch)
    return _valid_intervals(rows)


def _groups(*frames: pd.DataFrame) -> tuple[pd.MultiIndex, list[np.ndarray], np.ndarray, int]:
    """Shared (rank, step) group codes for several frames, plus per-group time base and span."""
    idx, codes = _group_codes(frames)
    n = len(idx)
    base = np.full(n, np.iinfo(np.int64).max)
    top = np.full(n, np.iinfo(np.int64).min)
    for f, c in zip(frames, codes):
        if len(f):
            np.minimum.at(base, c, f["start_ns"].to_numpy())
            np.maximum.at(top, c, f["end_ns"].to_numpy())
    base = np.where(base == np.iinfo(np.int64).max, 0, base)
    span = int(max(1, (top - base).max() + 2)) if n else 1
    if n * span >= 2 ** 62:
        raise OverflowError("run too long for vectorized interval analysis")
    return idx, codes, base, span


def _group_codes(frames) -> tuple[pd.MultiIndex, list[np.ndarray]]:
    """The sorted distinct (rank, step) pairs of all frames and each frame's row codes into them.
    Integer keys in numpy (a dense table where the key range is small): the pandas MultiIndex
    version (unique, sort, get_indexer) took ~10 ms of the 128-rank sample's Perfetto export per call."""
    ranks = [f["rank"].to_numpy() for f in frames]
    steps = [f["step"].to_numpy() for f in frames]
    r, s = np.concatenate(ranks).astype(np.int64), np.concatenate(steps).astype(np.int64)
    lens = np.cumsum([0] + [len(x) for x in ranks])
    if len(r):
        r0, s0 = int(r.min()), int(s.min())
        width, height = int(s.max()) - s0 + 1, int(r.max()) - r0 + 1
    if not len(r) or width * height >= 2 ** 62:      # nothing, or keys that do not fit: pandas
        allkeys = pd.concat([f[["rank", "step"]] for f in frames], ignore_index=True)
        idx = pd.MultiIndex.from_frame(allkeys).unique().sort_values()
        return idx, [idx.get_indexer(pd.MultiIndex.from_frame(f[["rank", "step"]])) if len(f) else
                     np.zeros(0, dtype=np.int64) for f in frames]
    key = (r - r0) * width + (s - s0)
    if width * height <= 4 * len(key) + (1 << 20):
        present = np.zeros(width * height, dtype=bool)
        present[key] = True
        uniq = np.flatnonzero(present)
        code_of = np.cumsum(present) - 1
        inv = code_of[key]
    else:
        uniq, inv = np.unique(key, return_inverse=True)
    dtypes = [np.result_type(*[x.dtype for x in ranks]), np.result_type(*[x.dtype for x in steps])]
    idx = pd.MultiIndex.from_arrays([(uniq // width + r0).astype(dtypes[0]), (uniq % width + s0).astype(dtypes[1])],
                                    names=["rank", "step"])
    inv = inv.astype(np.int64)
    return idx, [inv[lens[i]:lens[i + 1]] for i in range(len(frames))]
