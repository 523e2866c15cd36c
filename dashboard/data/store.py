"""Where the dashboard gets its data: the runs under one root, loaded once and cached.

- Only runs discovered under the root are served: a run is asked for by its name (its path relative
  to the root) and anything not in that list — ``../../etc``, an absolute path, a symlink leading
  out of the root — is refused with a TraceError.
- A loaded run is cached under a signature of its files (name, size, mtime), so a run that is
  still being recorded is re-read when a rank flushes a step (Live), and a finished one never.
- Whole-run tables (step_metrics, run_summary, ...) are computed lazily, once per signature. The
  replay page only needs one step at a time: a step's events are sliced from the Arrow table
  (sorted by step once) and analysed alone — every metric of a step depends only on that step's
  rows — so opening a run with a million bucket events does not wait for whole-run analysis.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable


from syncviz import trace as T
from syncviz.trace import TraceError
from syncviz.trace import schema as S

from syncviz.views import runcache as RC

from syncviz.dashboard.data.loaded import LoadedRun

log = logging.getLogger("syncviz.dashboard")

LIST_TTL_S = 2.0          # how long a directory scan of the root is reused
MAX_LOADED = 4            # runs kept in memory at once
# A finished run's full signature is taken again at least this often even when its folder and
# run.json are unchanged (only a file rewritten in place by hand escapes that check); in between,
# two stats stand for its 2,049 (a 1,024-rank run: 20-45 ms a request after the server idled 2 s,
# a large part of a step change's server time beside the step's own ~40 ms: README "Big runs").
FULL_SIG_S = 10.0


def inside_root(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def signature(run_dir: Path, root: Path) -> tuple:
    """(file name, size, mtime_ns) of every file the run is read from; refuses links out of root.
    One scandir, and a resolve() only for symlinks: this runs on every callback (Live)."""
    def check(entry):
        if entry.is_symlink() and not inside_root(Path(entry.path), root):
            raise TraceError(f"{run_dir.name}/{entry.name}: links outside the served directory; not read")
    return RC.signature(run_dir, check)


def folder_stamp(run_dir: Path) -> tuple | None:
    """What changes when a run's files are added, removed or renamed (its folder's mtime) or its
    run.json is rewritten (a new trace into the same folder writes it first): two stats."""
    try:
        d, m = os.stat(run_dir), os.stat(run_dir / S.RUN_FILE)
    except OSError:
        return None
    return d.st_ino, d.st_mtime_ns, m.st_ino, m.st_size, m.st_mtime_ns


# The dashboard server's peak memory over the rank files' bytes of a run it opens whole: the
# 10^7-event DDP run (552 MB of rank files, benchmarks/dashboard.py --pages-only, a fresh server a
# page) peaked at 2.55 GB (Runs), 9.22 (Buckets), 10.59 (Strategies) and 11.15 GB (Distributed), 20x
# (2026-11-29). The budget was an eighth of the machine's memory until then: a run just under it
# would have needed 2.5x the machine.
WHOLE_RUN_FACTOR = 20


def default_max_run_bytes() -> int:
    """Largest run (bytes of its rank files) the dashboard opens whole: this machine's memory over
    WHOLE_RUN_FACTOR (at least 256 MB). A bigger run is opened from what `syncviz summary` kept
    beside it, a step at a time; read whole, a 10^8-event run would take the server down with it."""
    return max(2 ** 28, T.machine_memory(16 * 2 ** 30) // WHOLE_RUN_FACTOR)


class TooBig(TraceError):
    """A run too big to read whole, with nothing kept beside it to open it from."""


class RunStore:
    """The runs under ``root``: discovery, safe lookup by name, and a cache of loaded runs."""

    def __init__(self, root: str | Path, max_run_bytes: int | None = None):
        self.root = Path(root).resolve()
        self.max_run_bytes = default_max_run_bytes() if max_run_bytes is None else int(max_run_bytes)
        self._lock = threading.Lock()
        self._listed: tuple[float, dict[str, Path]] = (0.0, {})
        self._loaded: OrderedDict[str, LoadedRun | TraceError] = OrderedDict()
        self._summaries: dict[str, tuple[tuple, tuple]] = {}
        self._sigs: dict[str, tuple] = {}
        self._finished: dict[str, tuple[tuple, tuple, float]] = {}   # name → (folder_stamp, sig, when)
        self._load_locks: dict[str, threading.Lock] = {}

    def names(self) -> list[str]:
        return list(self._runs())

    def has(self, name) -> bool:
        """Is ``name`` a run under the root (rescanning once for a run created since the last scan)?"""
        try:
            self.path_of(name)
            return True
        except TraceError:
            return False

    def _runs(self, refresh: bool = False) -> dict[str, Path]:
        with self._lock:
            when, runs = self._listed
            if not refresh and time.monotonic() - when < LIST_TTL_S:
                return runs
        runs = {}
        for p in T.find_runs(self.root):
            if not inside_root(p, self.root):
                log.warning("skipping %s: it leads outside %s", p, self.root)
                continue
            rel = p.resolve().relative_to(self.root).as_posix()
            runs[p.name if rel == "." else rel] = p
        with self._lock:
            self._listed = (time.monotonic(), runs)
        return runs

    def readable_names(self) -> list[str]:
        """Runs whose run.json reads (a cheap check for defaults; loading may still fail)."""
        out = []
        for name, path in self._runs().items():
            try:
                T.read_meta(path)
                out.append(name)
            except TraceError:
                pass
        return out

    def path_of(self, name: str) -> Path:
        """The directory of run ``name``; only names found under the root are accepted. A name
        from the last scan is served without a new one while it is still a run inside the root:
        a scan walks every run's folder (25 ms for one 1,024-rank run after the server idled 2 s,
        the Replay's request for a step every time it is looked at longer than LIST_TTL_S)."""
        with self._lock:
            when, runs = self._listed
        path = runs.get(name) if isinstance(name, str) else None
        if path is not None and (time.monotonic() - when < LIST_TTL_S
                                 or (T.is_run_dir(path) and inside_root(path, self.root))):
            return path
        runs = self._runs(refresh=True)       # a run created, moved or removed since the last scan
        if not isinstance(name, str) or name not in runs:
            raise TraceError(f"no run named {str(name)[:80]!r} under {self.root}")
        return runs[name]

    def signature(self, name: str) -> tuple:
        path = self.path_of(name)
        return self._signature(name, path, folder_stamp(path))

    def _signature(self, name: str, path: Path, stamp: tuple | None) -> tuple:
        """The run's signature. For a finished run (run.json says so and every rank stream was
        closed) whose folder and run.json have not changed since its last full signature, taken
        less than FULL_SIG_S ago, that signature: nothing is appended to such a run, and a trace
        into its folder again rewrites run.json (tests/test_dashboard.py, a run traced again).
        ``stamp``: folder_stamp taken before (a change during the full signature shows next time)."""
        kept = self._finished.get(name)
        if kept is not None and stamp is not None and kept[0] == stamp and time.monotonic() - kept[2] < FULL_SIG_S:
            return kept[1]
        self._finished.pop(name, None)
        sig = signature(path, self.root)
        if kept is not None and sig == kept[1] and stamp is not None:   # the folder changed, not a file read
            self._finished[name] = (stamp, sig, time.monotonic())     # (its .syncviz-cache made, say): still finished
        return sig

    def _note_finished(self, name: str, run, stamp) -> None:
        """Keep a finished run's signature for _signature (``stamp``: folder_stamp before it was taken)."""
        if isinstance(run, LoadedRun) and stamp is not None and run.meta.get("finished", False) \
                and not run.incomplete_ranks:
            self._finished.setdefault(name, (stamp, run.sig, time.monotonic()))

    def get(self, name: str) -> LoadedRun:
        """The loaded run (re-read when its files changed). Raises TraceError with one line."""
        path = self.path_of(name)
        with self._lock:
            lock = self._load_locks.setdefault(name, threading.Lock())
        with lock:   # one loader per run; concurrent callbacks wait for it instead of re-reading
            stamp = folder_stamp(path)
            sig = self._signature(name, path, stamp)
            cached = self._loaded.get(name)
            # a refusal (TooBig) is tried again: `syncviz summary` may have kept what it needs since
            if cached is None or self._sigs.get(name) != sig or isinstance(cached, TooBig):
                if isinstance(cached, LoadedRun):
                    cached.cancel()
                try:
                    cached = LoadedRun(name, path, sig, partial=self._check_size(name, path, sig))
                except TraceError as e:
                    cached = e
                except Exception as e:   # a damaged file the reader did not foresee: one line, logged
                    log.exception("cannot read run %s", name)
                    cached = TraceError(f"{name}: cannot read ({e.__class__.__name__}: {str(e)[:160]})")
                self._loaded[name], self._sigs[name] = cached, sig
            self._note_finished(name, cached, stamp)
            self._keep_recent(name)
        if isinstance(cached, TraceError):
            raise cached
        return cached

    def _check_size(self, name: str, path: Path, sig: tuple) -> str | None:
        """None for a run this dashboard reads whole. A run too big to hold in memory (see
        default_max_run_bytes) is opened from what `syncviz summary` (or `syncviz trace`) kept beside
        it — its step index, summary and step table — and read one step at a time: the returned
        line says why a page that needs every event cannot have it. Without those, it is refused in
        one line naming the command that writes them."""
        size = sum(n for f, n, _ in sig if f.startswith("rank-"))
        if size <= self.max_run_bytes:
            return None
        what = (f"{name}: {size / 1e9:.1f} GB of events, more than this dashboard reads whole "
                f"({self.max_run_bytes / 1e9:.1f} GB: --max-run-gb)")
        cache = RC.RunCache(path, sig)
        if cache.get("facts") is None:
            # a cache folder with a stamp: a summary was kept, for other files or by another syncviz
            again = (" again: what it kept is for other files or another syncviz" if (cache.folder / RC.STAMP).exists()
                     else " once")
            raise TooBig(f"{what}; run `syncviz summary {path}`{again} (it summarizes the run in partitions and keeps "
                         f"what the Runs, Replay, Ratios, Buckets, Strategies and Distributed pages need), or "
                         f"`syncviz export perfetto {path} --steps A:B`")
        return (f"{what}: this page needs every event (`syncviz summary {path}` keeps what the Runs, Replay, Ratios, "
                f"Buckets, Strategies and Distributed pages need: run it again if this syncviz is newer than the one "
                f"that ran it); `syncviz summary`, `syncviz compare` and `syncviz export html` read it whole in bounded memory")

    def _keep_recent(self, name: str) -> None:
        """Keep the MAX_LOADED most recently used runs in memory (a 1M-event run holds ~1 GB once
        analysed); the others are read again when asked for. Summaries survive (summary())."""
        with self._lock:
            self._loaded.move_to_end(name)
            while len(self._loaded) > MAX_LOADED:
                old, run = self._loaded.popitem(last=False)
                self._sigs.pop(old, None)
                if isinstance(run, LoadedRun):
                    run.cancel()

    def summary(self, name: str) -> tuple[dict, bool, list[str]]:
        """(analysis.run_summary, still recording, problems) of a run, kept per file signature even
        after the run itself was dropped from memory (the Runs page lists every run)."""
        sig = self.signature(name)
        hit = self._summaries.get(name)
        if hit and hit[0] == sig:
            return hit[1]
        run = self.get(name)
        out = (run.summary(), run.recording, list(run.problems))
        self._summaries[name] = (run.sig, out)
        return out

    def prefetch(self, name: str, then: Callable[[LoadedRun], None] | None = None) -> None:
        """Load run ``name`` in a thread (then call ``then`` with it): a page address naming a run
        arrives ~1 s before the page's scripts ask for it. Unknown names are ignored."""
        if not self.has(name):
            return

        def work():
            try:
                run = self.get(name)
                if then is not None:
                    then(run)
            except Exception as e:   # the page's own request reports it
                log.debug("prefetch of %s: %s", name, e)
        threading.Thread(target=work, name="syncviz-prefetch", daemon=True).start()

    def meta(self, name: str) -> dict:
        """run.json of a run without loading its events (for listings)."""
        return T.read_meta(self.path_of(name))
