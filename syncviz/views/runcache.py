"""Whole-run tables kept beside a run, so that opening it again costs a read, not an analysis.

The dashboard's whole-run tables (the run summary, step and bucket rows, lateness, Distributed's
breakdown, Strategies' comparison) take ~4-5 s of CPU per million events to compute
(benchmarks/dashboard.py) and are the same every time the same files are read. They are written to
``<run>/.syncviz-cache/`` once — by ``syncviz trace`` when the run ends, or by the dashboard the
first time a page needs them — and read back in a fraction of that.

Trust, because a profiler's cached number is as much a claim as a computed one:
- An entry is valid only for the exact files it was computed from: the stamp holds the run's
  signature (every rank file's and run.json's name, size and modification time), its absolute
  path, and a digest of syncviz's own source. Any change to the run or to syncviz makes the whole
  cache stale, and it is recomputed (and rewritten) on next use.
- Values are stored as JSON and Parquet, never pickle (a run directory can come from anyone; a
  pickle would run their code in the dashboard). An entry is written only if it reads back equal
  to what was computed (dtypes, index and NaNs included); anything that does not round-trip
  exactly is simply not cached.
- Nothing is cached for a run that is still recording, and a directory that cannot be written
  (read-only share) just means no cache: the tables are computed as before.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from syncviz import __version__
from syncviz.analysis.rank_pass import DIR as RANK_PASSES   # each rank's first pass: checked on use, kept
from syncviz.analysis.tables import time_split
from syncviz.codedigest import code_digest
from syncviz.views.cacherows import RowGroups, labelled
from syncviz.trace import schema as S
from syncviz.trace import spans as SP

log = logging.getLogger("syncviz.runcache")

CACHE_DIR = S.CACHE_DIR
FORMAT = 1
STAMP = "stamp.json"
STALE_S = 300.0    # an unfinished run untouched this long has stopped: it is incomplete, not recording
# A kept frame's Parquet row groups: 8 steps of a 1,024-rank step table, so the Replay reads one
# step's rows (get_rows) where it read the whole table on a first open: 0.15 s warm, 0.39 s out of
# the page cache, for the 10^8-event DDP run's 800,000 rank-steps (53 MB; session 43; cacherows.py).
# The whole table reads as fast from these groups as from one (0.19 against 0.23 s).
ROW_GROUP_ROWS = 8192


def signature(run_dir: Path, check=None) -> tuple:
    """(file name, size, mtime_ns) of every file a run is read from (run.json and rank files).
    ``check(entry)``: called for each such entry (the dashboard refuses links out of its root)."""
    sig = []
    with os.scandir(run_dir) as it:
        for entry in it:
            if entry.name == S.RUN_FILE or entry.name.endswith(".arrow"):
                if check is not None:
                    check(entry)
                st = entry.stat()
                sig.append((entry.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(sig))


def is_recording(meta: dict, incomplete_ranks: list, sig: tuple) -> bool:
    """Still being written: run.json not marked finished, a rank stream not closed yet, and a file
    changed in the last STALE_S seconds (else the run stopped: it is just incomplete). Nothing is
    cached for such a run."""
    if meta.get("finished", False) or not incomplete_ranks:
        return False
    newest = max((mtime for _, _, mtime in sig), default=0)
    return time.time() - newest / 1e9 < STALE_S


def put_summary(run_dir: str | os.PathLike, tables, sig: tuple) -> bool:
    """Keep what the partitioned summary (analysis.partitioned.SummaryTables) found in the run's
    cache, under the dashboard's keys (dashboard/data/loaded.py, PERSISTED): ``facts`` (the step
    index), ``summary`` and ``steps`` (the step table in step order). These are the values the
    dashboard computes from the whole run (tests/test_runcache.py compares them), and with them it opens
    a run too big to read whole: the Runs list, the Replay of one step at a time and every other page.
    Also ``spans``: where each rank file's batches lie (trace.spans), so a step is read alone, and
    ``rank_skew``: the rank × step lateness map (metrics.lateness_matrix of tables.sync_lateness),
    ``time_split``: the Strategies page's split of the mean step (tables.time_split of that step table),
    ``bucket_stats``: the Buckets page's distributions per bucket (partials.combine_bucket_stats),
    ``comparison`` and ``op_bytes``: the Strategies page's (summarize(compare=True)), ``distributed``:
    the Distributed page's (distributed.rank_breakdown and collective_kinds, from the partitions).
    ``sig``: the run's signature taken before summarizing; nothing is written when the files changed
    since, or while the run is recording. False when nothing was written."""
    run_dir = Path(run_dir)
    try:
        if signature(run_dir) != sig or is_recording(tables.meta, tables.incomplete_ranks, sig) or not tables.facts:
            return False
    except OSError:
        return False
    cache = RunCache(run_dir, sig)
    steps = tables.steps.sort_values("step", kind="stable").reset_index(drop=True) if len(tables.steps) else tables.steps
    kept = [cache.put("summary", tables.summary), cache.put("steps", steps)]
    cache.put("time_split", time_split(steps))    # else read from the whole step table: 0.5 GB, ~1 s at 10^8
    if tables.spans is not None:     # not needed to open the run: each step is then read from the start
        cache.put("spans", tables.spans)
    if tables.rank_skew is not None:     # Ratios' rank × step lateness map (a note without it)
        cache.put("rank_skew", tables.rank_skew)
    if tables.bucket_stats is not None:  # the Buckets page's distributions per bucket
        cache.put("bucket_stats", tables.bucket_stats)
    if tables.comparison is not None:    # the Strategies page: what `syncviz compare` shows, and bytes per op
        from syncviz.views.compare import run_comparison
        cache.put("comparison", run_comparison(tables))
    if tables.op_bytes is not None:
        cache.put("op_bytes", tables.op_bytes)
    if tables.distributed is not None:   # the Distributed page: per rank where the step goes, per op the calls
        cache.put("distributed", tables.distributed)
    if tables.replay is not None:        # the Replay draws a step from the drawn ranks' events alone
        put_replay(cache, tables.replay)
    # the rest of what `syncviz summary` prints: it prints from the cache next time (kept_report)
    for name in REPORT_TABLES:
        cache.put(f"{REPORT_KEY}-{name}", getattr(tables, name))
    # facts last: the dashboard takes a run's facts as the sign that the rest is there to read
    return all(kept) and cache.put("facts", tables.facts)


def summarize_to_keep(run_dir: str | os.PathLike, replay_dir: str, **opts):
    """analysis.partitioned.summarize with what put_summary keeps for the views besides the report:
    the Replay's tables (written under ``replay_dir``, which must outlive put_summary) and what
    ``syncviz compare`` shows (the Strategies page; from the ranks' kept passes it costs ~nothing,
    README "Big runs"). `syncviz summary` and `syncviz trace` (a run too big to read whole) both
    summarize through here, so what a kept summary holds is decided in one place."""
    from syncviz.analysis.partitioned import summarize
    return summarize(run_dir, compare=True, replay_dir=replay_dir, **opts)


REPLAY_KEYS = ("joined", "step_origin", "step_lateness")
REPORT_KEY = "report"
REPORT_TABLES = ("step_table", "bucket_table", "collective_table", "offload")


def kept_report(run_dir: str | os.PathLike, sig: tuple):
    """The partitioned summary's tables (analysis.partitioned.SummaryTables) as put_summary kept
    them for exactly these files and this syncviz: what ``syncviz summary`` prints, read back instead
    of computed again (the 10^8-event run: 1.42 s against 58.1 s). ``steps`` holds the step_metrics rows
    in step order (as the dashboard keeps them), ``bucket_json`` nothing (``--json`` summarizes
    again). None when anything is missing."""
    from syncviz.analysis.partitioned import SummaryTables
    from syncviz.trace import read as R
    from syncviz.trace import validate as V
    run_dir = Path(run_dir)
    cache = RunCache(run_dir, sig)
    summary, steps, facts = (cache.get(k) for k in ("summary", "steps", "facts"))
    report = [cache.get(f"{REPORT_KEY}-{name}") for name in REPORT_TABLES]
    if any(x is None for x in [summary, steps, facts, *report]):
        return None
    step_table, bucket_table, collective_table, offload = report
    meta = R.read_meta(run_dir)
    V.check_meta(meta, list(R.rank_files(run_dir)))   # drops what summarize dropped (its problems are kept)
    layouts, _ = R.load_layouts(run_dir)
    return SummaryTables(path=run_dir, meta=meta, layouts=layouts, problems=list(summary["problems"]),
                         summary=summary, steps=steps, step_table=step_table, bucket_table=bucket_table,
                         collective_table=collective_table, offload=offload,
                         incomplete_ranks=list(facts.get("incomplete_ranks", [])), facts=facts)


def put_replay(cache: "RunCache", replay: dict) -> bool:
    """Keep summarize(replay_dir=)'s tables: ``joined`` (every collective's last launch over all
    ranks: queueing.EVENT_KEY + last), ``step_origin`` (each step's timeline origin) and
    ``step_lateness`` (the lateness pieces, moved into the cache folder: analysis.steplateness).
    The dashboard's Replay uses them only when all three are there."""
    origin = replay["origin"].rename("start_ns").rename_axis("step").reset_index()
    return (cache.put("joined", replay["joined"]) and cache.put("step_origin", origin)
            and cache.put_files("step_lateness", Path(replay["dir"]), replay["lateness"]))


def kept_spans(run_dir: str | os.PathLike) -> dict | None:
    """Where each rank file's batches lie (trace.spans.by_rank), when `syncviz summary` kept that
    for exactly these files; else None (a step range is then read from the start of each file)."""
    try:
        return SP.by_rank(RunCache(run_dir, signature(Path(run_dir))).get("spans"))
    except OSError:
        return None


def _stamp(run_dir: Path, sig: tuple) -> dict:
    return {"format": FORMAT, "syncviz": __version__, "code": code_digest(),
            "path": str(Path(run_dir).resolve()), "signature": [list(s) for s in sig]}


# ------------------------------------------------------------------------- encoding

def _same(a: Any, b: Any) -> bool:
    """Equality that counts NaN equal to NaN and tells 1 from 1.0 from True (JSON round trips)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _same_frame(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=True, check_column_type=True, check_index_type=True)
        return True
    except AssertionError:
        return False


def _write_frame(df: pd.DataFrame, path: Path) -> dict:
    """Parquet with string column names (what Parquet allows); the real column labels, and the
    column index's name and dtype, go in the spec."""
    plain = df.set_axis([f"c{i}" for i in range(df.shape[1])], axis=1)
    plain.to_parquet(path, row_group_size=ROW_GROUP_ROWS)   # a RangeIndex is kept as metadata, any other index as columns
    cols = df.columns
    return {"file": path.name, "columns": cols.tolist(), "columns_name": cols.name, "columns_dtype": str(cols.dtype),
            # a frame without columns (pd.DataFrame()) has a RangeIndex of them: an empty list gives Index([])
            "columns_range": [cols.start, cols.stop, cols.step] if isinstance(cols, pd.RangeIndex) else None}


def _read_frame(spec: dict, folder: Path) -> pd.DataFrame:
    return labelled(pd.read_parquet(folder / spec["file"]), spec)


class RunCache:
    """The cache of one run (``sig``: its signature now). ``get`` gives None for anything not
    cached for exactly these files; ``put`` writes an entry when it round-trips exactly."""

    def __init__(self, run_dir: str | os.PathLike, sig: tuple):
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / CACHE_DIR
        self.sig = sig
        self._valid: bool | None = None
        self.writable = True
        self._write_lock = threading.Lock()     # one writer at a time (the dashboard writes in threads)
        self._groups: dict[tuple, RowGroups] = {}      # get_rows's open files

    def valid(self) -> bool:
        if self._valid is None:
            try:
                self._valid = json.loads((self.folder / STAMP).read_text()) == _stamp(self.run_dir, self.sig)
            except (OSError, ValueError):
                self._valid = False
        return self._valid

    def _kept(self, key: str, read: Callable[[], Any], then: str = "") -> Any | None:
        """``read()`` of the entry ``key``: None where the cache is stale or holds no such entry; an
        entry ``read`` cannot read (damaged, or not what the caller asked of it) is logged and None,
        never trusted (``then``: what the log line adds)."""
        if not self.valid():
            return None
        try:
            return read()
        except FileNotFoundError:
            return None
        except Exception as e:
            log.warning("%s: cached %s unreadable (%s)%s", self.run_dir.name, key, e, then)
            return None

    def _spec(self, key: str) -> dict:
        return json.loads((self.folder / f"{key}.json").read_text())

    def get(self, key: str) -> Any | None:
        def read():
            spec = self._spec(key)
            if spec["type"] == "json":
                return spec["value"]
            if spec["type"] == "frame":
                return _read_frame(spec, self.folder)
            if spec["type"] == "frames":
                return tuple(_read_frame(s, self.folder) for s in spec["frames"])
            if spec["type"] == "files":
                return {"folder": self.folder, "items": spec["items"]}
            return None
        return self._kept(key, read, "; recomputing")      # a damaged entry is recomputed

    def get_columns(self, key: str, columns: list[str]) -> pd.DataFrame | None:
        """``get(key)[columns]`` of a kept frame, reading those columns alone; None where ``get``
        gives None or the frame has no such column."""
        def read():
            spec = self._spec(key)
            at = [spec["columns"].index(c) for c in columns]
            part = pd.read_parquet(self.folder / spec["file"], columns=[f"c{i}" for i in at])
            return labelled(part, {**spec, "columns": columns, "columns_range": None})
        return self._kept(key, read)

    def get_rows(self, key: str, column: str, value) -> pd.DataFrame | None:
        """The rows of the kept frame ``key`` whose ``column`` equals ``value``, in the frame's order
        and with a fresh RangeIndex, read from the row groups whose statistics may hold ``value``.
        None where ``get`` gives None, and where those groups hold more than 4 * ROW_GROUP_ROWS rows
        (a frame kept in one group by an older syncviz): read it whole once instead."""
        def read():
            with self._write_lock:      # one RowGroups a key and column (its file opened once); reads in turn
                if (key, column) not in self._groups:
                    spec = self._spec(key)
                    self._groups[(key, column)] = RowGroups(self.folder / spec["file"], spec, column)
                return self._groups[(key, column)].rows(value, 4 * ROW_GROUP_ROWS)
        return self._kept(key, read)

    def put(self, key: str, value: Any) -> bool:
        """Store ``value`` (a JSON-able dict or list, a DataFrame or a tuple of DataFrames) if it
        reads back equal. False when it was not stored (not exact, or the folder is read-only)."""
        return self._write(key, lambda: self._put(key, value))

    def put_files(self, key: str, source: Path, items: list[dict]) -> bool:
        """Move files another writer checked (``items``: dicts naming each in "file"; analysis.steplateness
        writes and reads back its pieces) from ``source`` into the cache under ``key``: ``get`` then
        returns {"folder", "items"}. Names are prefixed with the key."""
        return self._write(key, lambda: self._put_files(key, source, items))

    def _write(self, key: str, work) -> bool:
        """``work()`` (a put) under the write lock, in a folder claimed for this signature; a folder
        that cannot be written means no cache from then on."""
        with self._write_lock:
            if not self.writable:
                return False
            try:
                self._claim()
                return work()
            except (OSError, TypeError, ValueError) as e:
                if isinstance(e, OSError):
                    self.writable = False
                log.info("%s: %s not cached (%s)", self.run_dir.name, key, e)
                return False

    def _put(self, key: str, value: Any) -> bool:
        for k in [k for k in self._groups if k[0] == key]:     # get_rows opens the new file
            del self._groups[k]
        with tempfile.TemporaryDirectory(dir=self.folder, prefix=".tmp-") as tmp:
            tmp = Path(tmp)
            if isinstance(value, pd.DataFrame):
                spec = {"type": "frame", **_write_frame(value, tmp / f"{key}.parquet")}
            elif isinstance(value, tuple) and value and all(isinstance(v, pd.DataFrame) for v in value):
                spec = {"type": "frames", "frames": [_write_frame(v, tmp / f"{key}.{i}.parquet")
                                                     for i, v in enumerate(value)]}
            else:
                spec = {"type": "json", "value": value}
            text = json.dumps(spec, default=_plain)
            back = json.loads(text)
            if spec["type"] == "json":
                same = _same(_plain_tree(value), back["value"])   # numpy scalars come back as Python numbers
            elif spec["type"] == "frame":
                same = _same_frame(value, _read_frame(back, tmp))
            else:
                same = all(_same_frame(v, _read_frame(s, tmp)) for v, s in zip(value, back["frames"]))
            if not same:
                log.info("%s: %s does not round-trip exactly; not cached", self.run_dir.name, key)
                return False
            for f in tmp.iterdir():       # data files first, the spec last: a reader never
                if f.suffix != ".json":   # finds a spec whose data is missing
                    os.replace(f, self.folder / f.name)
            (tmp / f"{key}.json").write_text(text)
            os.replace(tmp / f"{key}.json", self.folder / f"{key}.json")
        return True

    def _put_files(self, key: str, source: Path, items: list[dict]) -> bool:
        kept = []
        for item in items:
            name = f"{key}.{item['file']}"
            shutil.move(str(source / item["file"]), str(self.folder / name))
            kept.append({**item, "file": name})
        tmp = self.folder / f".tmp-{key}.json"
        tmp.write_text(json.dumps({"type": "files", "items": kept}))
        os.replace(tmp, self.folder / f"{key}.json")      # the spec last, as _put
        return True

    def _claim(self) -> None:
        """Make the folder this signature's: a stale cache is emptied and restamped."""
        if self.valid():
            return
        if self.folder.exists():      # each rank's kept first pass names its own rank file: kept
            for entry in self.folder.iterdir():
                if entry.name == RANK_PASSES:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        self.folder.mkdir(exist_ok=True)
        (self.folder / STAMP).write_text(json.dumps(_stamp(self.run_dir, self.sig)))
        self._valid = True


def _plain(o):
    """numpy scalars as Python numbers for json.dumps (anything else is refused: not cached)."""
    if hasattr(o, "item") and getattr(o, "ndim", None) == 0:
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON")


def _plain_tree(v):
    if isinstance(v, dict):
        return {k: _plain_tree(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain_tree(x) for x in v]
    return _plain(v) if hasattr(v, "item") and getattr(v, "ndim", None) == 0 else v
