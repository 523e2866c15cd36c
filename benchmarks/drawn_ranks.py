"""The Replay's analysis of the drawn ranks of a step (the four ranks a step of a big run draws), two
ways side by side in one process: the reference functions on a pandas frame of their events
(trace.events_frame, compute_intervals, comm_metrics, exposed_intervals: how the dashboard did it
until session 52) and analysis.drawn_ranks on the Arrow table read (what it does now). The same
tables (tests/test_drawn_ranks.py); this prints what each costs.

    python benchmarks/drawn_ranks.py                       # simulates a DDP and a ZeRO-3 run (64 ranks)
    python benchmarks/drawn_ranks.py --root /tmp/syncviz-scale --run ddp70b-1024x781-b1   # a summarized run

For each of ``--steps`` steps: the drawn ranks' events of the step are read once (not timed), then
each way is timed ``--repeat`` times, alternating which goes first; prints the median of each over the
steps and the median of the paired ratios (reference / arrays). Then the same for what the server does
for a jump (the Replay's ``render`` of a step without its heatmap, and Dash's JSON of the answer), on
two stores of the run, one of them analysing the drawn ranks the reference way; other steps than the
first table's, each drawn once a way (nothing cached). A run of yours must have been
summarized (`syncviz summary`, which keeps the Replay's tables) and be over --max-run-gb, as
`syncviz dash` reads it one step at a time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from syncviz import analysis as A
from syncviz import trace as T
from syncviz.analysis import drawn_ranks as DR
from dash._no_update import NoUpdate
from dash._utils import to_json

from syncviz.dashboard import components as C
from syncviz.dashboard.app import create_app
from syncviz.dashboard.data.keptstep import read_step_table
from syncviz.dashboard.data.store import RunStore
from syncviz.trace import schema as S

SIMULATED = {"ddp": ["--model", "llama-70b", "--strategy", "ddp", "--bucket-cap-mb", "700", "--grad-ready", "none"],
             "zero3": ["--preset", "llama70b-1024"]}


def reference(table, joined):
    ev = T.events_frame(table)
    intervals = (A.compute_intervals(ev), A.comm_rows(ev))
    return (intervals[0], A.comm_metrics(ev, kinds=S.COMM_KINDS, joined=joined, intervals=intervals),
            A.exposed_intervals(ev, intervals=intervals))


def simulate(root: Path, kind: str, ranks: int, steps: int) -> str:
    name = f"{kind}-{ranks}x{steps}"
    if not (root / name / "run.json").exists():
        print(f"simulating {name} ...", flush=True)
        subprocess.run([sys.executable, "-m", "syncviz", "simulate", *SIMULATED[kind], "--world-size", str(ranks),
                        "--steps", str(steps), "--steps-per-batch", "1", "--out", str(root / name)],
                       check=True, stdout=subprocess.DEVNULL)
    # what the summary keeps is for this code: any change of syncviz's .py files makes it summarize again
    subprocess.run([sys.executable, "-m", "syncviz", "summary", str(root / name)], check=True, stdout=subprocess.DEVNULL)
    return name


def opened(root: Path, name: str, limit: int):
    """(store, run, its KeptReplay) with no read-ahead or background work."""
    store = RunStore(root, max_run_bytes=limit)
    run = store.get(name)
    run.prefetch_neighbours = run.analyse_in_background = lambda *args, **kwargs: None
    kept_step = run._kept_step(run.start_step)
    if not run.partial or kept_step is None:
        raise SystemExit(f"{name}: not a run read one step at a time with the kept Replay tables "
                         "(run `syncviz summary` on it; lower --max-run-gb for a small run)")
    return store, run, kept_step.replay


def answer_json(outputs: tuple) -> str:
    """Dash's JSON of a callback's answer as its server sends it: outputs left as they are
    (``dash.no_update``) are not in the answer. Serialized with them, as this benchmark did until
    session 53, orjson refuses the NoUpdate object and plotly's encoder falls back to walking every
    element of the figure (a ZeRO-3 step's ~5,000 hover points: ~40 ms a jump on the machines here)
    that the server never pays."""
    return to_json([v for v in outputs if not isinstance(v, NoUpdate)])


def jumps(root: Path, name: str, n_steps: int, limit: int) -> None:
    """The server's draw of a jump (replay.render without the heatmap, and Dash's JSON), this code
    beside the reference analysis of the drawn ranks (one store each)."""
    from syncviz.dashboard.pages.replay import render
    (sa, run, _), (sb, _, ref_replay) = opened(root, name, limit), opened(root, name, limit)
    ref_replay.analyse = lambda table: reference(table, ref_replay.joined)

    def draw(store, step):
        C.set_store(store)
        t = time.perf_counter()
        answer_json(render(name, step, "auto", heatmap=False))
        return 1e3 * (time.perf_counter() - t)
    steps = [int(s) for s in run.step_list]
    draw(sa, steps[0]), draw(sb, steps[0])           # files opened, footers read: out of the timing
    picks = steps[2::max(1, (len(steps) - 2) // n_steps)][:n_steps]
    new, old = [], []
    for i, step in enumerate(picks):
        for which in ((0, 1) if i % 2 else (1, 0)):
            (old if which == 0 else new).append(draw(sb if which == 0 else sa, step))
    ratios = [a / b for a, b in zip(old, new)]
    print(f"  a jump's server draw (render + JSON), {len(picks)} steps: reference analysis median "
          f"{statistics.median(old):.1f} ms, arrays {statistics.median(new):.1f} ms; paired ratio "
          f"{statistics.median(ratios):.2f} [{min(ratios):.2f}..{max(ratios):.2f}]")


def side_by_side(root: Path, name: str, n_steps: int, repeat: int, limit: int) -> None:
    _, run, replay = opened(root, name, limit)
    joined = DR.Joined(replay.joined)
    steps = [int(s) for s in run.step_list]
    picks = steps[1::max(1, (len(steps) - 1) // n_steps)][:n_steps]
    ref_ms, new_ms, ratios, rows = [], [], [], []
    for i, step in enumerate(picks):
        view = run.step_view(step)
        ranks = [int(r) for r, _ in A.representative_ranks(view.get("steps"), None, latest=replay.latest(step)[1])]
        table = read_step_table(run.path, step, run._spans(), ranks)
        rows.append(table.num_rows)
        a, b = [], []
        for j in range(repeat):
            for which in ((0, 1) if (i + j) % 2 else (1, 0)):
                t = time.perf_counter()
                reference(table, replay.joined) if which == 0 else DR.analyse(table, joined)
                (a if which == 0 else b).append(1e3 * (time.perf_counter() - t))
        ref_ms.append(statistics.median(a))
        new_ms.append(statistics.median(b))
        ratios.append(ref_ms[-1] / new_ms[-1])
    print(f"{name}: {len(run.ranks)} ranks, {len(picks)} steps, drawn ranks' events {min(rows)}-{max(rows)} rows a step")
    print(f"  reference (pandas frame):  median {statistics.median(ref_ms):6.1f} ms [{min(ref_ms):.1f}..{max(ref_ms):.1f}]")
    print(f"  drawn_ranks (arrays):      median {statistics.median(new_ms):6.1f} ms [{min(new_ms):.1f}..{max(new_ms):.1f}]")
    print(f"  reference / arrays: median of paired ratios {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}..{max(ratios):.2f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", help="directory holding a summarized run (default: simulate into --dir)")
    ap.add_argument("--run", action="append", help="the run under --root (repeatable)")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "syncviz-drawn"), help="where simulated runs are kept")
    ap.add_argument("--ranks", type=int, default=64, help="ranks of the simulated runs [64]")
    ap.add_argument("--sim-steps", type=int, default=40, help="steps of the simulated runs [40]")
    ap.add_argument("--steps", type=int, default=12, help="steps timed [12]")
    ap.add_argument("--repeat", type=int, default=5, help="timings of each way a step [5]")
    ap.add_argument("--max-run-gb", type=float, default=0.001, help="as `syncviz dash`: runs over it are read a step at a time [0.001]")
    a = ap.parse_args()
    limit = int(a.max_run_gb * 1e9)
    if a.root:
        if not a.run:
            ap.error("--root needs --run")
        root, names = Path(a.root), a.run
    else:
        root = Path(a.dir)
        root.mkdir(parents=True, exist_ok=True)
        names = [simulate(root, kind, a.ranks, a.sim_steps) for kind in SIMULATED]
    create_app(str(root), max_run_bytes=limit)     # registers the pages, so replay.render can be imported
    for name in names:
        side_by_side(root, name, a.steps, a.repeat, limit)
        jumps(root, name, a.steps, limit)


if __name__ == "__main__":
    main()
