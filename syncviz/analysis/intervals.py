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
    order = K.lexsort((s, g))
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
        # covered length before each group's first merged interval (looked up per query: one
        # search per group here instead of one per query, 8 ms a call on 500,000 queries)
        first = np.searchsorted(self.mg, np.arange(max(n_groups, int(self.mg.max()) + 1 if len(self.mg) else 0)),
                                side="left")
        self.group_cum = self.cum[np.minimum(first, len(self.cum) - 1)] if len(self.cum) else first

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
        return np.where(valid, self.cum[kk] - self.group_cum[g] + inside, 0.0)

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
    kind = events["kind"]
    blocked = blocking_rows(events)
    src, pos, start, end = compute_rows(
        *(events[c].to_numpy() for c in ("rank", "step", "micro", "start_ns", "end_ns")),
        events["layout"].to_numpy() if "layout" in events else None,
        kind.isin((S.FORWARD, S.EVAL_FORWARD)).to_numpy(), (kind == S.BACKWARD).to_numpy(),
        (kind == S.OPTIMIZER).to_numpy(), (kind == S.GRAD_READY).to_numpy(),
        _spans(blocked) if len(blocked) else None)
    out = events.iloc[src][["rank", "step", "micro", "kind", "start_ns", "end_ns"]]
    out = out.assign(kind=as_str(out["kind"]), start_ns=start, end_ns=end)
    out.index = pd.RangeIndex(len(out)) if pos is None else pd.Index(pos)
    return out


def compute_rows(rank, step, micro, start, end, layout, is_fwd, is_bwd, is_opt, is_ready, blocked=None):
    """compute_intervals on arrays: for each compute interval, the row it comes from (forward and
    eval-forward rows, then backward rows, then the innermost optimizer rows, in row order within
    each), its place in that list before invalid intervals were dropped (None once ``blocked`` —
    (rank, step, start, end) of blocking collectives — cut some rows in pieces), start and end."""
    fwd, bwd, opt = np.flatnonzero(is_fwd), np.flatnonzero(is_bwd), np.flatnonzero(is_opt)
    if len(opt) and layout is not None and (layout[opt] > 0).any():      # innermost_optimizer_rows
        deepest, _ = K.max_by_key([rank[opt], step[opt]], layout[opt], [rank[opt], step[opt]])
        opt = opt[layout[opt] == deepest]
    bend = end[bwd]
    ready = np.flatnonzero(is_ready)
    if len(bwd) and len(ready):
        last, found = K.max_by_key([rank[ready], step[ready], micro[ready]], end[ready],
                                   [rank[bwd], step[bwd], micro[bwd]])
        bend = np.where(found & (last >= start[bwd]), last, bend)
    src = np.concatenate([fwd, bwd, opt])
    s, e = start[src], np.concatenate([end[fwd], bend, end[opt]])
    valid = (s >= 0) & (e >= s)
    pos = np.flatnonzero(valid)
    src, s, e = src[pos], s[pos], e[pos]
    if blocked is not None and len(src):
        row, s, e = subtract_arrays((rank[src], step[src], s, e), blocked)
        return src[row], None, s, e
    return src, pos, s, e


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
    row, start, end = subtract_arrays(*(_spans(f) for f in (a, b)))
    out = a.iloc[row].copy()
    out["start_ns"], out["end_ns"] = start, end
    return out.reset_index(drop=True)


def subtract_arrays(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """subtract_intervals on arrays: ``a`` and ``b`` are (rank, step, start, end); returns, per
    piece left, the row of ``a`` it comes from and its (start, end), in row order."""
    (ga, gb), base, span = group_spans(a, b)[1:]
    mg, ms, me = merge_intervals(gb, b[2], b[3])
    s, e = a[2], a[3]
    key = lambda g, t: g.astype(np.int64) * span + (t - base[g])  # noqa: E731  (sorted like mg, ms)
    lo = np.searchsorted(key(mg, me), key(ga, s), side="right")   # first cut ending after s
    hi = np.searchsorted(key(mg, ms), key(ga, e), side="left")    # cuts starting before e
    cuts = np.maximum(hi - lo, 0)
    pieces = cuts + 1
    row = np.repeat(np.arange(len(s)), pieces)
    j = np.arange(len(row)) - np.repeat(np.cumsum(pieces) - pieces, pieces)   # piece number in row
    k = lo[row] + j
    last = max(len(ms) - 1, 0)
    start = np.where(j == 0, s[row], me[np.clip(k - 1, 0, last)])
    end = np.where(j == cuts[row], e[row], ms[np.clip(k, 0, last)])
    start, end = np.maximum(start, s[row]), np.minimum(end, e[row])
    keep = end > start
    return row[keep], start[keep], end[keep]


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


def _spans(f: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return tuple(f[c].to_numpy() for c in ("rank", "step", "start_ns", "end_ns"))


def _groups(*frames: pd.DataFrame) -> tuple[pd.MultiIndex, list[np.ndarray], np.ndarray, int]:
    """Shared (rank, step) group codes for several frames, plus per-group time base and span."""
    (ranks, steps), codes, base, span = group_spans(*(_spans(f) for f in frames))
    return pd.MultiIndex.from_arrays([ranks, steps], names=["rank", "step"]), codes, base, span


def group_spans(*parts: tuple) -> tuple[tuple[np.ndarray, np.ndarray], list[np.ndarray], np.ndarray, int]:
    """_groups on arrays: ``parts`` are (rank, step, start, end) arrays; returns the sorted distinct
    (rank, step) pairs (as two arrays), each part's row codes into them, per-group time base and span."""
    keys, codes = group_keys([p[0] for p in parts], [p[1] for p in parts])
    n = len(keys[0])
    base = np.full(n, np.iinfo(np.int64).max)
    top = np.full(n, np.iinfo(np.int64).min)
    for p, c in zip(parts, codes):
        if len(c):
            np.minimum.at(base, c, p[2])
            np.maximum.at(top, c, p[3])
    base = np.where(base == np.iinfo(np.int64).max, 0, base)
    span = int(max(1, (top - base).max() + 2)) if n else 1
    if n * span >= 2 ** 62:
        raise OverflowError("run too long for vectorized interval analysis")
    return keys, codes, base, span


def _group_codes(frames) -> tuple[pd.MultiIndex, list[np.ndarray]]:
    (ranks, steps), codes = group_keys([f["rank"].to_numpy() for f in frames], [f["step"].to_numpy() for f in frames])
    return pd.MultiIndex.from_arrays([ranks, steps], names=["rank", "step"]), codes


def group_keys(ranks: list[np.ndarray], steps: list[np.ndarray]) -> tuple[tuple[np.ndarray, np.ndarray], list[np.ndarray]]:
    """The sorted distinct (rank, step) pairs of several parts' rows (two arrays) and each part's row
    codes into them. Integer keys in numpy (a dense table where the key range is small): the pandas
    MultiIndex version (unique, sort, get_indexer) took ~10 ms of the 128-rank sample's Perfetto export per call."""
    r, s = np.concatenate(ranks, dtype=np.int64), np.concatenate(steps, dtype=np.int64)
    lens = np.cumsum([0] + [len(x) for x in ranks])
    dtypes = [np.result_type(*[x.dtype for x in ranks]), np.result_type(*[x.dtype for x in steps])]
    if len(r):
        r0, s0 = int(r.min()), int(s.min())
        width, height = int(s.max()) - s0 + 1, int(r.max()) - r0 + 1
    if not len(r) or width * height >= 2 ** 62:      # nothing, or keys that do not fit: sort both columns
        order = K.lexsort((s, r))
        new = np.r_[True, (r[order][1:] != r[order][:-1]) | (s[order][1:] != s[order][:-1])] if len(r) else \
            np.zeros(0, dtype=bool)
        inv = np.empty(len(r), dtype=np.int64)
        inv[order] = np.cumsum(new) - 1
        first = order[new]
        keys = (r[first].astype(dtypes[0]), s[first].astype(dtypes[1]))
        return keys, [inv[lens[i]:lens[i + 1]] for i in range(len(ranks))]
    key = (r - r0) * width + (s - s0)
    if width * height <= 4 * len(key) + (1 << 20):
        present = np.zeros(width * height, dtype=bool)
        present[key] = True
        uniq = np.flatnonzero(present)
        code_of = np.cumsum(present) - 1
        inv = code_of[key]
    else:
        uniq, inv = np.unique(key, return_inverse=True)
    keys = ((uniq // width + r0).astype(dtypes[0]), (uniq % width + s0).astype(dtypes[1]))
    inv = inv.astype(np.int64, copy=False)
    return keys, [inv[lens[i]:lens[i + 1]] for i in range(len(ranks))]
