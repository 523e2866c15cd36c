"""A Replay step change on a run read one step at a time, two ways side by side in one process:
from what `syncviz summary` kept plus the four drawn ranks' events (dashboard/data/keptstep.py), and
from every rank's events of the step (how it was done before, and what a cache without the kept
tables still does). Steps alternate between the two, in alternating order, none read ahead.

    python benchmarks/scale.py --sizes 1e8        # writes and summarizes the 10^8-event run, or:
    python benchmarks/replay_step.py /tmp/syncviz-scale llama70b-1024x240-b1

Prints the median and range of each and the paired ratios, twice: the data layer (the tables the
page draws) and the whole draw of the Replay page's callback (replay.draw_step: tables, timeline,
heatmap and cards, then Dash's JSON of them), which is what the server does for a step change; the
browser's own drawing is not in it."""
from __future__ import annotations

import argparse
import statistics
import time

from dash._utils import to_json

from syncviz.dashboard import components as C
from syncviz.dashboard.app import create_app
from syncviz.dashboard.data.stepview import STEP_TABLES
from syncviz.dashboard.data.store import RunStore

KEPT = STEP_TABLES["spread"]
EVERY_RANK = ("steps", "step_spread", "lateness", "compute", "comm", "exposed")


def once(run, step: int, keys) -> float:
    t = time.perf_counter()
    view = run.step_view(step)
    for k in keys:
        view.get(k)
    return 1e3 * (time.perf_counter() - t)


def drawn(store: RunStore, name: str, step: int) -> float:
    """replay.draw_step of ``step`` (lanes "auto") and Dash's JSON of what it returns, in ms."""
    from syncviz.dashboard.pages.replay import draw_step
    C.set_store(store)
    t = time.perf_counter()
    to_json(draw_step(name, step, "auto"))
    return 1e3 * (time.perf_counter() - t)


def side_by_side(label: str, picks: list[int], steps: list[int], kept, every) -> None:
    """Time kept(step) and every(another step) for each pick, alternating which goes first."""
    x, y = [], []
    for i, s in enumerate(picks):
        other = steps[min(steps.index(s) + 1, len(steps) - 1)]   # a different step: nothing cached
        if i % 2:
            x.append(kept(s))
            y.append(every(other))
        else:
            y.append(every(other))
            x.append(kept(s))
    print(f"{label}, {len(x)} step changes of each kind:")
    print(f"  kept tables + drawn ranks: median {statistics.median(x):.0f} ms [{min(x):.0f}..{max(x):.0f}]")
    print(f"  every rank's events:       median {statistics.median(y):.0f} ms [{min(y):.0f}..{max(y):.0f}]")
    print(f"  every rank / kept: {statistics.median(y) / statistics.median(x):.1f}x (medians); paired "
          + " ".join(f"{b / a_:.1f}" for a_, b in zip(x, y)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="directory holding the run")
    ap.add_argument("name", help="the run (summarized with `syncviz summary`, over --max-run-gb)")
    ap.add_argument("--steps", type=int, default=14, help="step changes of each kind [14]")
    ap.add_argument("--max-run-gb", type=float, default=None, help="as `syncviz dash` [RAM/8]")
    a = ap.parse_args()
    limit = None if a.max_run_gb is None else int(a.max_run_gb * 1e9)
    create_app(a.root, max_run_bytes=limit)      # registers the pages, so draw_step can be imported
    stores = [RunStore(a.root, max_run_bytes=limit) for _ in range(2)]
    kept, every = (st.get(a.name) for st in stores)
    if not kept.partial or kept._kept_step(kept.start_step) is None:
        raise SystemExit(f"{a.name}: not a run read one step at a time with the kept Replay tables "
                         "(run `syncviz summary` on it; lower --max-run-gb for a small run)")
    every._kept_step = lambda step: None          # the path before: every rank's events of the step
    for run in (kept, every):                     # no read-ahead or background work: one step at a time
        run.prefetch_neighbours = run.analyse_in_background = lambda *args, **kwargs: None
    steps = [int(s) for s in kept.step_list]
    once(kept, steps[0], KEPT)                     # first opens (files, footers) out of the timing
    once(every, steps[0], EVERY_RANK)
    stride = max(2, (len(steps) - 1) // (2 * a.steps + 1))
    picks = steps[1::stride][:2 * a.steps]
    print(f"{a.name}: {len(kept.ranks)} ranks")
    side_by_side("data layer", picks[0::2], steps, lambda s: once(kept, s, KEPT), lambda s: once(every, s, EVERY_RANK))
    side_by_side("whole draw (draw_step + Dash JSON)", picks[1::2], steps,
                 lambda s: drawn(stores[0], a.name, s), lambda s: drawn(stores[1], a.name, s))


if __name__ == "__main__":
    main()
