"""What the dashboard's per-request run lookup costs on a wide run: ``RunStore.get`` as it is (a name
from the last scan checked alone, a finished run's signature kept while its folder and run.json are
unchanged: store.FULL_SIG_S) beside the same call with every check in full (a new scan of the root
and a stat of every rank file, as before session 26), alternated in one process, each after the
server has idled ``--idle`` seconds (as between a user's moves on the Replay). "As it is" still takes
a full signature once every FULL_SIG_S (10 s); alternated with full checks here, it never comes due.

    python benchmarks/run_lookup.py                         # a synthetic finished run of 1,024 ranks
    python benchmarks/run_lookup.py --root /tmp/syncviz-scale --run llama70b-1024x240-b1 --rounds 12

Prints the median and range of each and their ratio. Measured (session 26, 2026-11-29, 2.1 s idle):
the synthetic run 7.1 against 24.1 ms (0.30); the 10^8-event run 12.3 against 28.0 ms (0.44), and an
hour earlier, against the code before itself (a verbatim copy of its lookup), 37.6 against 71.1 ms.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from syncviz.dashboard.data import store as ST


def full_checks(store: ST.RunStore, name: str):
    """get() with nothing kept: the root scanned again and every file of the run statted."""
    saved = ST.FULL_SIG_S
    ST.FULL_SIG_S = 0.0
    try:
        store._runs(refresh=True)
        return store.get(name)
    finally:
        ST.FULL_SIG_S = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, help="a root the dashboard serves (default: a synthetic run in a temp folder)")
    ap.add_argument("--run", help="the run's name under --root")
    ap.add_argument("--ranks", type=int, default=1024, help="ranks of the synthetic run (default 1,024)")
    ap.add_argument("--idle", type=float, default=2.1, help="seconds idle before each lookup")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    tmp = None
    if a.root is None:
        from syncviz.dashboard.data.synth import write_synth_run
        tmp = tempfile.TemporaryDirectory(prefix="syncviz-lookup-")
        a.root, a.run = Path(tmp.name), "wide"
        print(f"writing a finished synthetic run of {a.ranks} ranks x 2 steps ...", flush=True)
        write_synth_run(a.root / a.run, world=a.ranks, steps=2, n_buckets=2)
    elif not a.run:
        ap.error("--root needs --run")
    store = ST.RunStore(a.root)
    store.get(a.run)
    times = {"as it is": [], "every check in full": []}
    for i in range(a.rounds):
        for mode in (("as it is", "every check in full") if i % 2 else ("every check in full", "as it is")):
            time.sleep(a.idle)
            t = time.perf_counter()
            store.get(a.run) if mode == "as it is" else full_checks(store, a.run)
            times[mode].append((time.perf_counter() - t) * 1e3)
    for mode, v in times.items():
        print(f"{mode:>20}: median {statistics.median(v):6.1f} ms, range {min(v):.1f}-{max(v):.1f} "
              f"({len(v)} lookups, {a.idle} s idle before each)")
    ratio = statistics.median(times["as it is"]) / statistics.median(times["every check in full"])
    print(f"as it is / every check in full: {ratio:.2f}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
