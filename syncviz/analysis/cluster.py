"""The partitioned summary on a Dask cluster (``syncviz summary RUN --dask ADDRESS|local``).

analysis.partitioned maps its two passes over partitions of ranks with any concurrent.futures
Executor; ``distributed.Client.get_executor()`` is one, so the same functions (partials.pass1 /
pass2) run on Dask workers instead of local processes, and the numbers are the same ones.

What the workers need: the run directory and the scratch directory at the same path as this
process sees them (a shared filesystem: NFS, Lustre, a mounted bucket), and syncviz importable.
Workers read their partition's rank files themselves; only small per-partition tables and scratch
files (spilled medians, a few MB per partition) travel back.

dask[distributed] is optional (the ``cluster`` extra); without it ``--dask`` says how to get it.
"""
from __future__ import annotations

import contextlib
import os

CONNECT_TIMEOUT_S = 10     # a wrong address should fail in seconds, not distributed's default 30 s


class ClusterError(Exception):
    """No cluster to run on: distributed missing, or the scheduler unreachable (one line)."""


@contextlib.contextmanager
def dask_executor(address: str, jobs: int | None = None, timeout: float = CONNECT_TIMEOUT_S):
    """A concurrent.futures Executor on a Dask cluster: ``address`` a scheduler (tcp://host:8786)
    or "local" for a LocalCluster of ``jobs`` worker processes (default: CPU count), one thread
    each (pass 2 keeps one table per worker process: partials._EVENTS). Yields (executor, text)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        raise ClusterError(f"--dask needs dask[distributed] ({e}); pip install 'syncviz[cluster]'") from None
    cluster = None
    try:
        if address == "local":
            n = jobs or os.cpu_count() or 1
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(cluster, timeout=timeout)
        else:
            client = Client(address, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as e:
        if cluster is not None:
            cluster.close()
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ClusterError(f"cannot reach the Dask scheduler at {address!r}: {why[:200]}") from None
    try:
        workers = len(client.scheduler_info().get("workers", {}))
        yield client.get_executor(), f"Dask cluster {client.scheduler.address} ({workers} workers)"
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
