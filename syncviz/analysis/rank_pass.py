"""Each rank's own first pass, written when its recording closes, so that the summary of a big run
combines those instead of reading and analysing every event again.

Why: the summary's first pass (partition_passes.pass1: read, validate, decode, and everything one
rank's events decide) was ~70% of the 10^8-event summary's wall time (session 21: 31-36 of ~48 s on
two cores), yet it needs one rank's events only (partitioned.py's docstring). Each rank of a real run
has its own CPUs when it closes, so computing it there costs the run ~0.1 s a rank (97,680 events of
the simulated llama70b-1024 run: 0.10 s of CPU) and takes it off the one machine that summarizes.

What a rank keeps (``.syncviz-cache/ranks/rank-<r>.pass1``: one JSON header and its arrays in two
LZ4 frames, no pickle: what pass 1 reads, then what only pass 2 reads): its comm rows with their
first-pass results (partition_local.local_pass's ``comm`` without the identity numbers), what pass 2
needs of its other rows, its step_metrics rows,
its step facts, where its batches lie, each step's first start, what ``syncviz compare`` measures of
it (partition_facts.compare_partial), and, in the header, the rank file's size and mtime and the
digest of the code that decides it (``CODE``). ``partition_pass1`` turns the files of a
partition's ranks into exactly what pass1 returns for that partition, and ``partition_local`` into
what pass 2 needs (dictionaries merged, identities numbered over the partition), or None when any
rank lacks a file this code wrote for exactly that rank file: then the partition is read as before.
Only a rank file read without any problem keeps one (a damaged or unfinished one is read each time,
so its problems are reported the same way).

Measured (benchmarks/scale.py, 2026-11-28, 10^8 events, two cores): the summary 58.6 s reading
every event, 34.0 s from the ranks' passes, the same bytes; writing all 1,024 passes took 79 s of
CPU (0.08 s a rank) and 1.22 GB (26% of the run's 4.69 GB). Session 46 (LZ4, close integers as
differences: rank_pass_file.py): 1.74 GB for that run, 1.56 GB for the 10^8-event DDP run (3.54 GB in
zstd); writing the DDP run's took 111.8 s of CPU.
tests/test_rank_pass.py compares every number, table and report byte with and without these files.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz.analysis import keys as K
from syncviz.analysis import partition_local as PL
from syncviz.analysis import partition_facts as PF
from syncviz.analysis import rank_pass_file as RF
from syncviz.analysis.rank_pass_file import _MAGIC  # noqa: F401  (tests write damaged files)
from syncviz.codedigest import code_digest
from syncviz.trace import schema as S
from syncviz.trace import spans as SP

log = logging.getLogger("syncviz.rank_pass")

FORMAT = 4                      # 4: close integers as differences; 3: LZ4 frames (rank_pass_file.CODEC); 2: zstd
DIR = "ranks"                   # under the run's cache folder; views.runcache keeps it when it empties the rest
SUFFIX = ".pass1"
# A run is worth it from about 750,000 events (at partitioned.BYTES_PER_EVENT on disk; the size of a
# partition until 2026-12-03, half of one now): below that the summary is a few seconds anyway.
WORTH_BYTES = 750_000 * 52
# ...and a rank keeps none when its own file is bigger than 1.5 M events (a partition): analysing it at
# close would hold more memory in the training process than a summary worker holds (up to ~1.5 GB on a
# partition of 1.5 M events: partitioned.PARTITION_EVENTS).
MAX_BYTES = 2 * WORTH_BYTES
# The code a kept pass depends on: reading the rank file (trace) and analysing it (analysis), which
# import nothing else of syncviz's (a change to the recorder, the views or the dashboard keeps them).
CODE = ("analysis", "trace")
ENV = "SYNCVIZ_RANK_PASS"       # "always" / "never" override worth_it (tests, benchmarks)


def path_of(rank_file: Path) -> Path:
    """Where the rank whose events are in ``rank_file`` keeps its first pass."""
    rank_file = Path(rank_file)
    return rank_file.parent / S.CACHE_DIR / DIR / (rank_file.stem + SUFFIX)


def worth_it(rank_bytes: int, world_size: int) -> bool:
    """Whether a rank of ``world_size`` whose file holds ``rank_bytes`` writes its first pass at close."""
    mode = os.environ.get(ENV, "").strip().lower()
    if mode in ("always", "never"):
        return mode == "always"
    return rank_bytes * max(1, world_size) >= WORTH_BYTES and rank_bytes <= MAX_BYTES


def _identity(rank_file: Path) -> tuple[int, int]:
    st = os.stat(rank_file)
    return st.st_size, st.st_mtime_ns


def write(rank: int, rank_file: Path) -> Path | None:
    """Compute and keep the first pass of one rank file. None (nothing written) when the file has no
    rows, needs any of validation's repairs, or changed while it was read. Raises OSError where the
    cache folder cannot be written."""
    rank_file = Path(rank_file)
    before = _identity(rank_file)
    index: dict = {}
    ev, problems, incomplete, errors = PF.read_events({rank: rank_file}, index)
    if ev is None or not len(ev) or problems or incomplete or errors:
        return None
    local = PL.local_pass(ev)
    if not len(local.steps):      # no step rows: an empty step_metrics frame has no column types to keep
        return None
    out = PF.empty_pass1([], [], [], PF.span_table(index))
    PF.event_facts(out, ev)
    c = local.comm
    arrays = {f"c_{k}": v for k, v in c.items() if k not in PL.DICTIONARIES and k != "ident"}
    arrays.update({f"d_{k}": np.asarray(c[k].tolist(), dtype=str) for k in PL.DICTIONARIES})
    arrays.update({f"x_{k}": v for k, v in PF.pass2_extras(ev, local).items()})
    arrays.update({f"s_{k}": local.steps[k].to_numpy() for k in local.steps.columns})
    compared = PF.compare_partial(ev, local.comm)
    arrays.update(_compare_arrays(compared))
    f = out["facts"]
    arrays.update({"f_ranks": f["ranks"], "f_steps": f["steps"], "f_first_step": f["first"].index.to_numpy(),
                   "f_first": f["first"].to_numpy(), "f_last_step": f["last"].index.to_numpy(),
                   "f_last": f["last"].to_numpy(), "p_spans": out["spans"].to_numpy(),
                   "t_step": out["step_first"].index.to_numpy(), "t_start": out["step_first"].to_numpy()})
    if _identity(rank_file) != before:
        return None
    # integer columns kept in the smallest type that holds them (less to decompress: merge widens them
    # back as it concatenates; "wide" names each one's own type)
    wide = {k: v.dtype.str for k, v in arrays.items() if k[:2] in ("c_", "x_") and v.dtype.kind == "i"}
    arrays.update({k: PL.small_ints(arrays[k]) for k in wide})
    head = {"format": FORMAT, "code": code_digest(*CODE), "rank": rank, "size": before[0], "mtime_ns": before[1], "wide": wide,
            "rows": out["rows"], "last_step": [[r, s] for r, s in out["last_step"].items()],
            "max_rank": out["max_rank"], "steps": list(local.steps.columns),
            "top_bucket": f["top_bucket"], "compare": {"pairs": compared["pairs"] is not None,
                                                       "steps": list(compared["coll_steps"].columns)}}
    target = path_of(rank_file)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            RF.write_file(fh, head, arrays, pass2_only)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def pass2_only(key: str) -> bool:
    """Whether a kept array is one pass 1 does not read (_merged's comm and extra columns for pass 1)."""
    kind, name = key[:2], key[2:]
    return (kind in ("c_", "d_") and name not in PASS1_COMM) or (kind == "x_" and name not in PASS1_EXTRA)


def load(rank: int, rank_file: Path) -> tuple[dict, dict] | None:
    """(header, arrays) of the rank's kept first pass, or None where there is none for exactly this
    rank file and this code (a damaged file is None too: the partition is then read)."""
    try:
        head, packed = RF.read_file(path_of(rank_file))
        if not (head.get("format") == FORMAT and head.get("code") == code_digest(*CODE) and head.get("rank") == rank
                and [head.get("size"), head.get("mtime_ns")] == list(_identity(rank_file))):
            return None
        z = RF.Packed(head, packed)
        z.frame(0)              # what every reader reads: a damaged file is None here, not later
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return head, z


def _load_all(files: dict[int, Path]) -> list[tuple[dict, dict]] | None:
    """Every rank's (header, arrays), or None when a rank has no usable pass (or the ranks are not in
    increasing order, as pass1 reads them)."""
    ranks = list(files)
    if any(b <= a for a, b in zip(ranks, ranks[1:])):
        return None
    loaded = []
    for rank, f in files.items():
        got = load(rank, f)
        if got is None:
            return None
        loaded.append(got)
    return loaded


# What pass 1 uses of the comm rows (partition_facts.comm_facts: the identities, each collective's
# launches and op, every bucket's first launch) and of the extras (the launch order the identities'
# first rows follow). Merging only these in pass 1: 9 of ~30 columns.
PASS1_COMM = PL.IDENTITY + ("launch", "op", "names", "ops")
PASS1_EXTRA = ("order",)


def _merged(loaded: list[tuple[dict, dict]], comm: tuple | None = None, extra: tuple | None = None) -> tuple[dict, dict, dict]:
    """merge of the loaded passes, of the ``comm`` and ``extra`` columns only when given."""
    cat = [z for _, z in loaded]
    return merge([_comm(z, comm) for z in cat],
                 [{k[2:]: z[k] for k in z if k.startswith("x_") and (extra is None or k[2:] in extra)}
                  for z in cat], loaded[0][0]["wide"])


def partition_local(files: dict[int, Path]) -> tuple[dict, dict, dict] | None:
    """What pass 2 needs of a partition (partition_local.load's comm, idents and extra) from its
    ranks' kept first passes, or None when a rank has none."""
    return _from_passes(files, _merged)


# A pass that loads but does not merge (a header or an array missing: only a file this code did not
# write for this rank can be so, whatever its stamp says) is never trusted: the partition is read.
_UNUSABLE = (KeyError, ValueError, TypeError, IndexError, OSError, pa.ArrowException)   # OSError: a damaged second frame


def _from_passes(files: dict[int, Path], build):
    """``build(loaded)`` of the partition's kept passes; None when a rank has none or they do not merge."""
    loaded = _load_all(files)
    if loaded is None:
        return None
    try:
        return build(loaded)
    except _UNUSABLE as e:
        log.warning("ranks %s: kept first passes unusable (%s: %s); reading their events", list(files)[:4],
                    type(e).__name__, e)
        return None


def partition_pass1(files: dict[int, Path], compare: bool = False) -> dict | None:
    """pass1's result for a partition from its ranks' kept first passes, or None when a rank has
    none. Nothing is kept for pass 2, which merges the same files again (partition_local): writing
    the merged comm rows cost more than merging them twice (py-spy of the 10^8-event summary, two
    workers: 7.5 s of the workers' 19 s in pass 1 went to writing those 2.7 GB; merging a
    partition's 8 ranks takes ~70 ms). ``compare``: with what ``syncviz compare`` measures, from
    each rank's own (partition_facts.compare_partial of its events, kept since 2026-11-29)."""
    return _from_passes(files, lambda loaded: _pass1_of(loaded, compare))


def _pass1_of(loaded: list[tuple[dict, dict]], compare: bool = False) -> dict | None:
    heads = [h for h, _ in loaded]
    columns = heads[0]["steps"]
    if any(h["steps"] != columns for h in heads):
        return None
    if compare and any("compare" not in h for h in heads):
        return None             # kept by a syncviz that kept no compare inputs: the partition is read
    cat = [z for _, z in loaded]
    c, idents, _ = _merged(loaded, PASS1_COMM, PASS1_EXTRA)
    spans = _cat(cat, "p_spans").reshape(-1, len(SP.COLUMNS))
    out = PF.empty_pass1([], [], [], pd.DataFrame(spans, columns=SP.COLUMNS))
    out["rows"] = int(sum(h["rows"] for h in heads))
    out["kept_ranks"] = len(heads)
    out["last_step"] = {int(r): int(s) for h in heads for r, s in h["last_step"]}
    out["max_rank"] = max(h["max_rank"] for h in heads)
    out["facts"] = _facts(heads, cat)
    out["step_first"] = PF.min_by_step(_cat(cat, "t_step"), _cat(cat, "t_start"), "start_ns")
    steps = pd.DataFrame({k: _cat(cat, f"s_{k}") for k in columns})
    PF.comm_facts(out, steps, c, idents)
    if compare:
        out["compare"] = _compare_of(heads, cat)
    return out


def _compare_arrays(compared: dict) -> dict:
    """One rank's compare_partial as the pass file's arrays (no pickle): "k_" the wire calls and bytes
    per (rank, step, op), "b_" the bucket sums per step, "k_blocking" the steps with a blocking
    collective, "m_" the step_metrics rows of every row but the buckets."""
    out = {}
    pairs = compared["pairs"]
    if pairs is not None:
        out.update({"k_rank": pairs.index.get_level_values("rank").to_numpy(),
                    "k_step": pairs.index.get_level_values("step").to_numpy(),
                    "k_op": np.asarray(pairs.index.get_level_values("op").tolist(), dtype=str),
                    "k_calls": pairs["calls"].to_numpy(), "k_bytes": pairs["bytes"].to_numpy()})
    b = compared["buckets"]
    out.update({"b_step": b.index.to_numpy(), "b_n": b["n"].to_numpy(), "b_logical_bytes": b["logical_bytes"].to_numpy(),
                "b_bytes": b["bytes"].to_numpy(), "k_blocking": np.array(sorted(compared["blocking"]), dtype=np.int64)})
    out.update({f"m_{k}": compared["coll_steps"][k].to_numpy() for k in compared["coll_steps"].columns})
    return out


def _compare_of(heads: list[dict], arrays: list[dict]) -> dict:
    """compare_partial of the partition from its ranks' own: what it gives when the ranks are read
    together (their pairs and step_metrics rows in rank order, the bucket sums added per step)."""
    have = [z for h, z in zip(heads, arrays) if h["compare"]["pairs"]]
    pairs = None
    if have:
        idx = pd.MultiIndex.from_arrays([_cat(have, "k_rank"), _cat(have, "k_step"), _cat(have, "k_op").astype(object)],
                                        names=["rank", "step", "op"])
        pairs = pd.DataFrame({"calls": _cat(have, "k_calls"), "bytes": _cat(have, "k_bytes")}, index=idx)
    buckets = PF.sums_by_step(_cat(arrays, "b_step"), {k: _cat(arrays, f"b_{k}") for k in ("n", "logical_bytes", "bytes")})
    columns = heads[0]["compare"]["steps"]
    frames = [pd.DataFrame({k: z[f"m_{k}"] for k in h["compare"]["steps"]}) for h, z in zip(heads, arrays)]
    rows = [f for f in frames if len(f)]
    coll = pd.concat(rows, ignore_index=True) if rows else frames[0][columns]
    return {"pairs": pairs, "buckets": buckets, "blocking": set(_cat(arrays, "k_blocking").tolist()), "coll_steps": coll}


def _comm(z: dict, only: tuple | None = None) -> dict:
    c = {k[2:]: z[k] for k in z if k.startswith("c_") and (only is None or k[2:] in only)}
    c.update({k[2:]: z[k].astype(object) for k in z if k.startswith("d_") and (only is None or k[2:] in only)})
    return c


def _cat(arrays: list[dict], key: str) -> np.ndarray:
    return np.concatenate([z[key] for z in arrays])


def _facts(heads: list[dict], arrays: list[dict]) -> dict:
    """partition_facts.step_facts of the partition from its ranks' own."""
    first, = PF.by_step(_cat(arrays, "f_first_step"), [_cat(arrays, "f_first")], ["start"], [np.minimum])
    last, = PF.by_step(_cat(arrays, "f_last_step"), [_cat(arrays, "f_last")], ["end"], [np.maximum])
    return {"ranks": K.unique_ints(_cat(arrays, "f_ranks")), "top_bucket": max(h["top_bucket"] for h in heads),
            "steps": K.unique_ints(_cat(arrays, "f_steps")), "first": first, "last": last}


# comm columns holding codes into a dictionary, and the dictionary (the bucket rows' dtype too)
_CODED = {"name": "names", "op": "ops", "phase": "phases", "dtype": "dtypes"}


def merge(comms: list[dict], extras: list[dict], wide: dict) -> tuple[dict, dict, dict]:
    """(comm, idents, extra) of one partition from its ranks' own comm rows and pass-2 extras, in
    rank order: what partition_local.local_pass and partition_facts.pass2_extras give when the ranks are
    read together. Per-row results depend on their own rank only; the dictionaries are merged
    (sorted, as the partition's reader sorts them, so codes keep their order), bucket rows' places
    shifted, and the identities numbered over the partition. Given some of the columns (_merged's
    ``comm``, ``extra``), merges those."""
    c: dict = {}
    for d in (d for d in PL.DICTIONARIES if d in comms[0]):
        c[d] = np.unique(np.concatenate([x[d] for x in comms])) if any(len(x[d]) for x in comms) else comms[0][d]
    sizes = [len(x["step"]) for x in comms]
    offsets = np.cumsum([0] + sizes[:-1])
    for key in comms[0]:
        if key in PL.DICTIONARIES:
            continue
        if key in _CODED:
            d = _CODED[key]
            pieces = [_recoded(x[key], np.searchsorted(c[d], x[d]), wide.get(f"c_{key}")) if len(x[d]) else x[key]
                      for x in comms]
        elif key == "bucket_rows":
            pieces = [x[key] + o for x, o in zip(comms, offsets)]
        else:
            pieces = [x[key] for x in comms]
        c[key] = _concat(pieces, wide.get(f"c_{key}"))
    order = _concat([x["order"] + o for x, o in zip(extras, offsets)], wide.get("x_order"))
    idents = PL.identities(c, order, sizes)
    extra = {"rows": np.array([sum(int(x["rows"][0]) for x in extras)])} if "rows" in extras[0] else {}
    extra["order"] = order
    if "origin" in extras[0]:
        origin = PF.min_by_step(_concat([x["origin_step"] for x in extras], wide.get("x_origin_step")),
                                _concat([x["origin"] for x in extras], wide.get("x_origin")), "start_ns")
        extra.update(origin_step=origin.index.to_numpy(), origin=origin.to_numpy())
    for key in extras[0]:
        if key not in extra:
            extra[key] = _concat([x[key] for x in extras], wide.get(f"x_{key}"))
    return c, idents, extra


def write_run(run_dir, jobs: int | None = None, missing_only: bool = False) -> int:
    """Write the first pass of every rank file of a recorded run, as its ranks would have when they
    closed (``jobs`` processes; benchmarks/scale.py times this separately from the summary, and a
    run recorded by an older syncviz gets them this way: ``syncviz summary --keep-passes``, which
    writes only the ranks with no usable pass, ``missing_only``). Returns how many were written."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    from syncviz.trace import read as R
    files = [(r, f) for r, f in R.rank_files(Path(run_dir)).items() if not missing_only or load(r, f) is None]
    if not files:
        return 0
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(files)))
    if jobs == 1:
        return sum(_write_one(f) for f in files)
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        return sum(pool.map(_write_one, files, chunksize=16))


def _write_one(item: tuple[int, Path]) -> bool:
    return write(*item) is not None


def _recoded(codes: np.ndarray, place: np.ndarray, dtype: str | None) -> np.ndarray:
    """A rank's codes into its own dictionary as codes into the merged one (``place``: where each of
    its entries is there). Where every entry keeps its place (ranks that used the same names: most
    often all of them) and the merged column's type is known (``dtype``: _concat casts to it), the
    codes themselves, not looked up row by row (~10 ms a partition of the 10^8-event DDP run, in
    each pass: session 47)."""
    return codes if dtype is not None and np.array_equal(place, np.arange(len(place))) else place[codes]


def _concat(pieces: list, dtype: str | None) -> np.ndarray:
    """The pieces as one new array, in ``dtype`` when given (the column's own type before it was
    kept small)."""
    return np.concatenate(pieces) if dtype is None else np.concatenate(pieces, dtype=np.dtype(dtype))
