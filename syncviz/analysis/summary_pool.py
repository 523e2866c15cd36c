"""The partitioned summary's worker processes (a spawned pool whose workers keep freed memory) and
its scratch folder (removed only once the pool's tasks no longer write into it): analysis.partitioned."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor


@contextlib.contextmanager
def scratch_dir(root: str | None, pool):
    """The passes' scratch folder (under ``root``, default the system temp dir), removed at the end
    (once a summary on its own ``pool`` has finished, in a thread: remove_later).
    A summary stopped early (an error, `summary --json` before a full disk, Ctrl-C) leaves tasks of
    its own ``pool`` still writing pieces into the folder: they are waited for first, so that the
    folder goes whole and the error raised is the one that stopped the summary. Removed while they
    ran, it raised "Directory not empty" in place of that error and left 26 MB behind (the DDP
    10^8-event run's `summary --json`, once in seven). An executor of the caller's (Dask) is not
    waited for: the folder is removed as far as it can be, the stop raised all the same."""
    d = tempfile.mkdtemp(prefix="syncviz-summary-", dir=root)
    try:
        yield d
    except BaseException:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(d, ignore_errors=True)
        raise
    if pool is None:
        shutil.rmtree(d, ignore_errors=True)
    else:
        remove_later(d)


def remove_later(d: str) -> None:
    """Remove a finished summary's scratch folder in a thread, while the caller prints and keeps the
    tables: nothing writes into it any more (its pool's tasks are done). Not a daemon thread, so the
    process waits for it before it exits. Why: freeing the 10^8-event DDP summary's 443 scratch files
    (spills of every partition) took 1.5-1.7 s of the command's wall time at its very end (cProfile
    and timestamps, session 47), with the second core idle."""
    threading.Thread(target=shutil.rmtree, args=(d,), kwargs={"ignore_errors": True},
                     name="syncviz-scratch-removal").start()


def process_pool(jobs: int):
    # spawn, not fork: the parent has pyarrow's thread pools running, and a forked child can
    # inherit a held lock from them.
    if jobs <= 1:
        return None
    import multiprocessing as mp
    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=keep_freed_memory)


def keep_freed_memory() -> None:
    """In a worker process: glibc keeps freed memory instead of giving it back to the system after
    each large array (a partition allocates and frees some hundred arrays of ~6 MB). Measured on the
    10^7-event run, two workers, twice each: system time 3.7 -> 1.5 s and 3.6 -> 1.7 s, wall 8.5 -> 7.2 s
    and 8.8 -> 7.6 s. No effect (and no error) where the C library is not glibc.

    Setting a trim threshold also stops glibc raising its mmap threshold as it frees large blocks,
    so every array over 128 kB was still a fresh mapping: its pages faulted in and zeroed, and
    unmapped when freed (perf on the 10^8-event DDP summary: 10% of all CPU in the kernel's
    clear_page). Arrays up to 32 MB (glibc's ceiling; a partition's columns are ~6 MB, a rank's
    decompressed first pass ~9 MB) now come from the kept heap. Same run, alternated twice: minor
    faults 2.3-2.9 M -> 0.53-0.60 M, CPU 100.8 / 100.3 -> 96.7 / 94.6 s, wall 57.5 / 57.3 -> 55.3 /
    54.4 s, peak memory of all processes 3.72 / 3.68 -> 3.82 / 3.83 GB."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)       # M_TRIM_THRESHOLD: give memory back above 1 GB free only
        libc.mallopt(-2, 256 << 20)     # M_TOP_PAD: grow the heap 256 MB at a time
        libc.mallopt(-3, 32 << 20)      # M_MMAP_THRESHOLD: a fresh mapping only above 32 MB
    except (OSError, AttributeError):
        pass
