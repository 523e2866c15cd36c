"""Read syncviz run directories (the format is defined in schema.py).

Readers never pickle or eval; any damage becomes one ``TraceError`` line naming the file and the
problem, and every complete step before the damage is still returned.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from syncviz.trace import schema as S
from syncviz.trace import validate as V
from syncviz.trace.layouts import load_layouts
from syncviz.trace.streams import TraceError, _read_stream, _short  # noqa: F401  (TraceError: the package's error)

# --------------------------------------------------------------------------------------- reading

@dataclass
class Run:
    """One run, all ranks, as columnar tables (pandas DataFrames, one row per event)."""
    path: Path
    meta: dict
    events: pd.DataFrame          # EVENT_COLUMNS + "rank"
    layouts: pd.DataFrame         # LAYOUT_COLUMNS + "rank"
    problems: list[str] = field(default_factory=list)   # e.g. "rank 1 incomplete: ..."
    incomplete_ranks: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.meta.get("name") or self.path.name

    @property
    def world_size(self) -> int:
        w = self.meta.get("world_size")
        if isinstance(w, int) and not isinstance(w, bool) and 0 < w <= V.MAX_WORLD:
            return w
        return int(self.events["rank"].max() + 1) if len(self.events) else 0

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.events["rank"].unique()) if len(self.events) else []


_RANK_RE = re.compile(r"^rank-(\d+)\.arrow$")


def read_meta(run_dir: str | os.PathLike) -> dict:
    run_dir = Path(run_dir)
    path = run_dir / S.RUN_FILE
    if not run_dir.exists():
        raise TraceError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise TraceError(f"{run_dir}: not a directory (a run is a directory with run.json)")
    if not path.exists():
        raise TraceError(f"{path}: missing (is {run_dir} a syncviz run directory?)")
    try:
        meta = json.loads(path.read_text())
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e.__class__.__name__})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: corrupt JSON ({e.__class__.__name__}: {_short(e)})") from None
    except RecursionError:
        raise TraceError(f"{path}: corrupt JSON (nested too deeply)") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: expected a JSON object")
    try:
        major = S.parse_version(meta.get("schema", ""))
    except ValueError:
        raise TraceError(f"{path}: no syncviz schema version (got {meta.get('schema')!r})") from None
    if major != S.SCHEMA_MAJOR:
        raise TraceError(f"{path}: trace schema {meta['schema']} is not supported by this syncviz "
                         f"(reads {S.SCHEMA_VERSION}); upgrade syncviz")
    return meta


def rank_files(run_dir: Path) -> dict[int, Path]:
    out = {}
    for name in os.listdir(run_dir):      # names, not Paths: 4x faster at 2,000 files (a Replay step reads 4 ranks)
        m = _RANK_RE.match(name)
        if m and int(m.group(1)) < V.MAX_WORLD:    # beyond: not a rank (named by open_run)
            out[int(m.group(1))] = run_dir / name
    return dict(sorted(out.items()))


def files_of(run_dir: Path, ranks: Iterable[int]) -> dict[int, Path]:
    """rank_files of some ranks, found by their usual names (rank-<r>.arrow) where they have them: listing
    1,028 files took 3.3 ms of each step the Replay draws of the 1,024-rank DDP run (session 34)."""
    wanted = sorted({int(r) for r in ranks if 0 <= int(r) < V.MAX_WORLD})
    named = {r: run_dir / f"rank-{r}.arrow" for r in wanted}
    if all(p.is_file() for p in named.values()):
        return named
    return {r: p for r, p in rank_files(run_dir).items() if r in named}


def load_events(run_dir: Path, ranks: Iterable[int] | None = None, steps: tuple[int, int] | None = None,
                spans: dict | None = None) -> tuple[pa.Table, list[str], list[int]]:
    """Arrow table of all ranks' events (+ rank column), problems, incomplete ranks. A rank file
    that cannot be used is named in the problems and the other ranks are read; invalid and
    duplicate rows are dropped and counted (validate.py). Raises TraceError when no rank is usable.
    ``spans``: rank -> spans.index of its file, for a ``steps`` read of just those batches."""
    files = rank_files(run_dir) if ranks is None else files_of(run_dir, ranks)
    tables, problems, incomplete, errors = read_ranks(files, steps, spans)
    if errors and not tables:
        more = f" (and {len(errors) - 1} more rank files unreadable)" if len(errors) > 1 else ""
        raise TraceError(errors[0][1] + more)
    for rank, e in errors:
        problems.append(f"rank {rank} unreadable, left out: {e}")
        incomplete.append(rank)
    if not tables:
        return empty_events(), problems, incomplete
    return pa.concat_tables(tables), problems, incomplete


def empty_events() -> pa.Table:
    return S.EVENT_SCHEMA.append(pa.field("rank", pa.int32())).empty_table()


def read_ranks(files: dict[int, Path], steps: tuple[int, int] | None = None, spans: dict | None = None,
               index: dict | None = None) -> tuple[list[pa.Table], list[str], list[int], list[tuple[int, str]]]:
    """load_events' work on some rank files: their tables (+ rank column), problems, incomplete
    ranks and (rank, error) of the files that could not be used. ``steps``, ``spans`` (rank ->
    spans.index of its file; ranks not in it are read from the start): see _read_stream.
    ``index``: a dict that gets rank -> spans.index of each file read whole (None: not indexable)."""
    if steps is not None and index is None and len(files) > 1:
        at_once = _read_ranks_at_once(files, steps, spans)
        if at_once is not None:
            return at_once
    tables, problems, incomplete, errors = [], [], [], []
    found: dict[Path, object] | None = {} if index is not None else None
    for rank, path in files.items():
        try:
            batches, problem = _read_stream(path, S.EVENT_SCHEMA, steps, (spans or {}).get(rank), found)
            if index is not None:
                index[rank] = found.pop(path, None)
            if problem:
                problems.append(f"rank {rank} incomplete: {path.name}: {problem}")
                incomplete.append(rank)
            if not batches:
                continue
            t, bad = V.conform(pa.Table.from_batches(batches), S.EVENT_SCHEMA, S.EVENT_DEFAULTS)
        except V.StreamError as e:
            errors.append((rank, f"{path}: {e}"))
            continue
        except TraceError as e:
            errors.append((rank, str(e)))
            continue
        t, rank_problems = V.clean_rank_table(t, bad, rank)
        problems.extend(rank_problems)
        tables.append(t.append_column("rank", pa.array(np.full(t.num_rows, rank, dtype=np.int32))))
    return tables, problems, incomplete, errors


def _read_ranks_at_once(files: dict[int, Path], steps: tuple[int, int], spans: dict | None):
    """read_ranks of a step range, the ranks' rows validated as one table instead of rank by rank:
    per-rank validation costs ~1.4 ms a file whatever its size, 1.4 s for one step of 1,024 ranks
    (measured, benchmarks/scale.py's 10^8-event run). Used only where it gives exactly what rank by
    rank gives: one batch per rank, the same column types everywhere, and no value or row that
    validation would change, drop or name. Else None: the caller validates rank by rank."""
    raw, problems, incomplete, errors = [], [], [], []
    for rank, path in files.items():
        try:
            batches, problem = _read_stream(path, S.EVENT_SCHEMA, steps, (spans or {}).get(rank))
        except V.StreamError:
            return None
        except TraceError as e:
            errors.append((rank, str(e)))
            continue
        if problem:
            problems.append(f"rank {rank} incomplete: {path.name}: {problem}")
            incomplete.append(rank)
        if len(batches) > 1:      # a step written twice is for clean_rank_table to find and name
            return None
        if batches:
            raw.append((rank, batches[0]))
    if not raw:
        return [], problems, incomplete, errors
    schema = raw[0][1].schema.remove_metadata()
    if any(not b.schema.remove_metadata().equals(schema) for _, b in raw):
        return None
    table = pa.Table.from_batches([pa.RecordBatch.from_arrays(b.columns, schema=schema) for _, b in raw])
    try:
        t, bad = V.conform(table, S.EVENT_SCHEMA, S.EVENT_DEFAULTS)
    except V.StreamError:
        return None
    drop, why = V.invalid_rows(t, bad)
    if bad or why or drop.any():
        return None
    rank = np.repeat(np.array([r for r, _ in raw], dtype=np.int32), [b.num_rows for _, b in raw])
    is_step = V._kind_in(t.column("kind"), (S.STEP,))
    if is_step.any():             # a rank with two "step" rows for one step: clean_rank_table names it
        keys = pd.DataFrame({"rank": rank[is_step], "step": t.column("step").to_numpy()[is_step]})
        if keys.duplicated().any():
            return None
    return [t.append_column("rank", pa.array(rank))], problems, incomplete, errors


@dataclass
class RunFiles:
    """A run directory opened but not yet turned into pandas: the Arrow event table (with a
    ``rank`` column), layouts, and what was wrong. load_run and the dashboard both start here."""
    path: Path
    meta: dict
    table: pa.Table
    layouts: pd.DataFrame
    problems: list[str]
    incomplete_ranks: list[int]


def open_run(run_dir: str | os.PathLike, ranks: Iterable[int] | None = None,
             steps: tuple[int, int] | None = None, spans: dict | None = None) -> RunFiles:
    """Read run.json, every rank's complete steps and the layouts. Raises TraceError (one line)
    when nothing usable is there; damage that leaves steps readable goes to ``problems``.
    ``steps`` (A, B): only the events of steps A <= step < B (read without loading the rest;
    ``spans``: where each file's batches lie, spans.by_rank)."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    if not rank_files(run_dir):
        raise TraceError(f"{run_dir}: no rank-<r>.arrow files (the run recorded nothing)")
    on_disk = list(rank_files(run_dir))
    mproblems = V.check_meta(meta, on_disk)
    mproblems += [f"{p.name}: rank number out of range; ignored" for p in run_dir.glob("rank-*.arrow")
                  if _RANK_RE.match(p.name) and int(_RANK_RE.match(p.name).group(1)) >= V.MAX_WORLD][:3]
    table, problems, incomplete = load_events(run_dir, ranks, steps, spans)
    layouts, lproblems = load_layouts(run_dir)
    world = meta["world_size"]          # validated: 1..MAX_WORLD and >= the highest rank file
    if ranks is None and len(on_disk) < world:
        have = set(on_disk)
        missing = [r for r in range(world) if r not in have]   # bounded by check_meta
        shown = ", ".join(map(str, missing[:8])) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
        problems.append(f"ranks {shown} wrote no file")
        incomplete.extend(missing[:10_000])
    incomplete = sorted(set(incomplete))
    crashed = _unfinished(meta, table, incomplete)
    return RunFiles(run_dir, meta, table, layouts, ([crashed] if crashed else []) + mproblems + problems + lproblems,
                    incomplete)


def events_frame(table: pa.Table) -> pd.DataFrame:
    """The event table as pandas, repeated strings as categoricals (schema.CATEGORICAL_COLUMNS):
    every reader types a run the same way."""
    # Dictionary-encoded in Arrow first (one chunk: a run has one batch per rank-step, 32,000 at 1M
    # events): 0.33 s against 1.0 s for pandas' astype on 1.15M rows (measured). Categories sorted, as
    # astype("category") sorts them: groupbys on these columns list groups in that order.
    table = table.combine_chunks()
    for col in S.CATEGORICAL_COLUMNS:
        table = table.set_column(table.schema.get_field_index(col), col, pc.dictionary_encode(table.column(col)))
    events = table.to_pandas()
    for col in S.CATEGORICAL_COLUMNS:
        cats = events[col].cat.categories
        if not cats.is_monotonic_increasing:
            events[col] = events[col].cat.reorder_categories(cats.sort_values())
    return events


# Memory a whole-run read takes over its rank files' bytes: load_run of the 10^7-event DDP run
# (529 MB of rank files, benchmarks/scale.py --kind ddp) peaked at 4.86 GB, 9.2x (2026-11-29).
WHOLE_READ_FACTOR = 9.2
BY_PARTS = ("`syncviz summary` and `compare` (without --whole), `export tensorboard` and `export html` read it "
            "by partitions of ranks, `syncviz dash` a step at a time, `export perfetto --steps A:B` a range of steps")


class TooBigToRead(TraceError):
    """A run whose whole read would need more memory than this machine has available."""


def machine_memory(default: int) -> int:
    """This machine's physical memory in bytes (``default`` where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return default


def available_memory() -> int:
    """Bytes of memory available to a new allocation now (Linux's MemAvailable: free memory plus
    what the page cache can give back); the machine's whole memory where that is not known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return machine_memory(1 << 62)


def file_size(path: Path) -> int:
    """Bytes of ``path``; 0 where it cannot be read (a rank file removed since it was listed)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def check_fits_whole(run_dir: str | os.PathLike, factor: float = WHOLE_READ_FACTOR, what: str = "read whole",
                     instead: str = BY_PARTS) -> None:
    """Raise TooBigToRead (one line, saying what to run instead) when reading ``run_dir`` whole
    would need more than the available memory: ``factor`` times its rank files' bytes. A 10^8-event
    run (5.3 GB of rank files) would need ~48 GB on a 24 GB machine; under a 6 GB memory limit its
    Perfetto export died in a C++ bad_alloc, with no line saying why."""
    size = sum(file_size(f) for f in rank_files(Path(run_dir)).values())
    need, have = size * factor, available_memory()
    if need > have:
        raise TooBigToRead(f"{run_dir}: {size / 1e9:.1f} GB of rank files; {what}, it needs ~{need / 1e9:.0f} GB "
                           f"of memory and {have / 1e9:.1f} GB is available. Instead: {instead}")


def load_run(run_dir: str | os.PathLike, ranks: Iterable[int] | None = None,
             steps: tuple[int, int] | None = None, spans: dict | None = None) -> Run:
    """Read a whole run (``steps`` (A, B): its steps A <= step < B only). Raises TraceError (one
    line) when nothing usable is there, or when the whole run would not fit in the available
    memory (check_fits_whole)."""
    if ranks is None and steps is None and is_run_dir(run_dir):
        check_fits_whole(run_dir)
    f = open_run(run_dir, ranks, steps, spans)
    return Run(path=f.path, meta=f.meta, events=events_frame(f.table), layouts=f.layouts,
               problems=f.problems, incomplete_ranks=f.incomplete_ranks)


def warn_problems(run) -> None:
    """Every problem of a loaded run as one warning line on stderr: commands whose output has no
    place for them (JSON, exports, fits) still never give a number from damaged data silently."""
    import sys
    for p in run.problems:
        print(f"syncviz: warning: {run.name}: {p}", file=sys.stderr)


def _unfinished(meta: dict, table: pa.Table, incomplete: list[int]) -> str | None:
    """'run did not finish ...' with each incomplete rank's last complete step (where it stopped)."""
    if meta.get("finished", True) is not False:
        return None
    last = {}
    if table.num_rows:
        g = table.select(["rank", "step"]).group_by("rank").aggregate([("step", "max")])
        last = dict(zip(g.column("rank").to_pylist(), g.column("step_max").to_pylist()))
    where = "; ".join(f"rank {r} " + (f"after step {last[r]}" if r in last else "before its first step")
                      for r in (incomplete or sorted(last))[:8])
    return f"run did not finish (crashed, stopped, or still recording): {where}"


def is_run_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / S.RUN_FILE).is_file()


def find_runs(root: str | os.PathLike) -> list[Path]:
    """Run directories at or below ``root`` (root itself if it is one), sorted by name."""
    root = Path(root)
    if is_run_dir(root):
        return [root]
    if not root.is_dir():
        return []
    # os.walk, not rglob: a folder vanishing mid-walk (a run deleted, a cache writer's temp folder) is
    # skipped, not raised. Links are followed as rglob does, each real folder once (cycles end).
    found, seen = set(), set()
    for top, dirs, files in os.walk(root, followlinks=True):
        try:
            st = os.stat(top)
        except OSError:
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs[:] = [d for d in dirs if d != S.CACHE_DIR]
        if S.RUN_FILE in files:
            found.add(Path(top))
    return sorted(found)
