"""What ``syncviz compare`` measures in one run, from the whole run (``measure``) or from partitions of
whole ranks (partition_facts.compare_partial in each, ``combine`` at the end; analysis.partitioned):
the steady steps, their step_metrics rows, bytes per op, the buckets' logical/wire bytes, whether
collectives blocked the host, and (for compression hooks) the collectives' own busy time.

Why the partitioned numbers equal the whole-run ones: every input is per (rank, step) — step_metrics
rows (concatenated in rank order, as the whole run's), per-(rank, step, op) call counts and byte sums
(integers: exact in any order), bucket byte sums, a count of blocking rows. The theory and the notes
beside these numbers are in views/compare.py.
"""
from __future__ import annotations

import pandas as pd

from syncviz.analysis import keys as K
from syncviz.analysis.headline import headline
from syncviz.analysis.intervals import blocking_rows
from syncviz.analysis.metrics import STEP_COLUMNS, step_metrics
from syncviz.analysis.tables import op_bytes_per_step
from syncviz.trace import schema as S

OP_COLUMNS = ["op", "bytes_per_step", "count_per_step", "count_min", "count_max"]


def steady_steps(meta: dict, steps) -> list[int]:
    """Steps whose traffic is the strategy's steady state, of a run's steps (every step >= 0 it
    recorded): headline steps (not step 0), and for PowerSGD only those after its plain all-reduce
    warm-up."""
    steps = sorted(int(s) for s in steps if s >= 0)
    head = steps[1:] if len(steps) > 1 else steps
    if meta.get("strategy") in ("ds-zero3", "ds-infinity") and len(steps) > 2:
        head = steps[2:]      # DeepSpeed's ZeRO-3 records and checks its module trace in steps 0-1
    start = ((meta.get("strategy_config") or {}).get("powersgd") or {}).get("start_powerSGD_iter")
    if start is not None:
        later = [s for s in head if s >= start]
        return later or head
    return head


def measure(events: pd.DataFrame, meta: dict, steps: pd.DataFrame | None = None) -> dict:
    """compare's measured numbers from a whole run's events. ``steps``: step_metrics of the whole run
    when the caller has it (a step's metrics depend only on its rows)."""
    steady = steady_steps(meta, events["step"].unique())
    ev = events[events["step"].isin(steady)]
    steps = step_metrics(ev) if steps is None else steps[steps["step"].isin(steady)]
    buckets = ev[ev["kind"] == S.BUCKET]
    m = {"steady": steady, "steps": steps, "op_bytes": op_bytes_per_step(ev, steps=steady),
         "n_buckets": len(buckets), "logical_bytes": int(buckets["logical_bytes"].sum()),
         "bucket_bytes": int(buckets["bytes"].sum()), "blocking": bool(blocking_rows(ev).shape[0])}
    m["coll_steps"] = _coll_steps(ev) if _needs_coll(m) else None
    return m


def _needs_coll(m: dict) -> bool:
    r = compressed(m)
    return r is not None and r > 1.01


def _coll_steps(ev: pd.DataFrame) -> pd.DataFrame:
    """step_metrics of the collectives alone (a compression hook computes inside its bucket interval)."""
    return step_metrics(ev[ev["kind"] != S.BUCKET])


def compressed(m: dict) -> float | None:
    """Logical over wire bytes of the buckets (None without buckets); above 1: a compression hook."""
    return m["logical_bytes"] / m["bucket_bytes"] if m["n_buckets"] and m["bucket_bytes"] else None


def numbers(m: dict) -> dict:
    """The headline compare prints for measured numbers ``m`` (measure's or combine's)."""
    out = {"head": headline(m["steps"]), "ratio": compressed(m), "collectives_busy_ms": None}
    if _needs_coll(m):
        out["collectives_busy_ms"] = headline(m["coll_steps"])["comm_busy_ms"]
    return out


# ------------------------------------------------------------------------- by partitions of ranks

def combine(parts: list[dict], steps: pd.DataFrame, steady: list[int]) -> dict:
    """measure's dict from every partition's inputs (partition_facts.compare_partial, in rank order)
    and the run's step_metrics (``steps``: the partitions' concatenated, as the whole run's)."""
    keep = set(steady)
    colls = [p["coll_steps"] for p in parts if len(p["coll_steps"])]
    coll = pd.concat(colls, ignore_index=True) if colls else pd.DataFrame(columns=STEP_COLUMNS)
    sums = [p["buckets"] for p in parts]
    b = pd.concat(sums) if sums else pd.DataFrame(columns=["n", "logical_bytes", "bytes"])
    b = b[b.index.isin(steady)]
    return {"steady": steady, "steps": _in(steps, steady), "op_bytes": _op_bytes([p["pairs"] for p in parts], steady),
            "n_buckets": int(b["n"].sum()), "logical_bytes": int(b["logical_bytes"].sum()),
            "bucket_bytes": int(b["bytes"].sum()), "blocking": any(p["blocking"] & keep for p in parts),
            "coll_steps": _in(coll, steady)}


def _in(steps: pd.DataFrame, steady: list[int]) -> pd.DataFrame:
    return steps[steps["step"].isin(steady)] if len(steps) else steps


def _op_bytes(pairs: list, steady: list[int]) -> pd.DataFrame:
    """tables.op_bytes_per_step(ev, steps=steady) from per-(rank, step, op) call counts and byte sums."""
    pairs = [p for p in pairs if p is not None]
    t = pd.concat(pairs) if pairs else None
    if t is not None:
        t = t[t.index.get_level_values("step").isin(steady)]
    if t is None or not len(t):
        return pd.DataFrame(columns=OP_COLUMNS)
    # (rank, step) pairs with any wire row: counted on integer codes (MultiIndex.nunique made a
    # tuple a row: 1.2 s of the 10^8-event summary's main process for ~800,000 pairs)
    n = K.distinct_pairs(*(t.index.get_level_values(k).to_numpy() for k in ("rank", "step")))
    per_pair = t["calls"].unstack("op").fillna(0)
    g = t.groupby(level="op")
    return pd.DataFrame({"bytes_per_step": g["bytes"].sum() / n, "count_per_step": g["calls"].sum() / n,
                         "count_min": per_pair.min().astype(int),
                         "count_max": per_pair.max().astype(int)}).rename_axis("op").reset_index()


def headline_op_bytes(parts: list[dict]) -> pd.DataFrame:
    """tables.op_bytes_per_step(ev) of the whole run (every step with wire rows but the first: the
    dashboard's op_bytes, its Strategies page) from every partition's compare inputs."""
    pairs = [p["pairs"] for p in parts if p is not None and p["pairs"] is not None]
    steps = sorted({int(s) for t in pairs for s in t.index.get_level_values("step").unique()})
    return _op_bytes(pairs, steps[1:] if len(steps) > 1 else steps)


__all__ = ["steady_steps", "measure", "numbers", "combine", "compressed", "headline_op_bytes"]
