"""The dashboard's pages with and without Dash's @babel/polyfill, side by side in one run
(dashboard/page_scripts.py says why the app no longer serves it).

    python benchmarks/page_scripts.py                  # a simulated llama70b-1024 ZeRO-3 run, 4 steps
    python benchmarks/page_scripts.py --root /tmp/syncviz-scale --run llama70b-1024x240-b1 --rounds 6

Each round opens the Replay of the real `syncviz dash` server in two fresh headless Chromiums, one
as the app serves it and one with the polyfill run first (injected before any page script, where
Dash put it), in alternating order: V8 keeps a regular expression's slow path for the life of the tab
(and of its renderer process), so each variant gets a browser of its own. In each, Plotly.react
redraws the Replay's timeline of a few steps of the run (the figures the server draws for them,
computed here) on the page's own graph, --reacts times; a react is timed to its promise (Plotly done)
and to two animation frames later (painted). Prints each variant's median and the ratio of the two,
per round and over all rounds. No timing is asserted: the machine's noise is what the rounds show.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard as B  # noqa: E402  (benchmarks/dashboard.py: server, browser, waits)

PY = sys.executable

REACT_JS = """const cb = arguments[arguments.length - 1]; const i = arguments[0];
const gd = document.querySelector('#replay-timeline .js-plotly-plot');
const f = JSON.parse(JSON.stringify(window.__figs[i]));      // new objects, as a Dash answer brings
const t = performance.now();
Plotly.react(gd, f.data, f.layout).then(() => {
  const done = performance.now();
  requestAnimationFrame(() => requestAnimationFrame(() => cb([done - t, performance.now() - t])));
});"""


def simulated_run(where: Path, steps: int) -> tuple[Path, str]:
    out = where / "z3"
    env = dict(os.environ, SYNCVIZ_RANK_PASS="never")
    subprocess.run([PY, "-m", "syncviz", "simulate", "--preset", "llama70b-1024", "--steps", str(steps),
                    "--out", str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
    return where, out.name


def figures(root: Path, name: str, count: int) -> list[dict]:
    """The Replay's timeline of ``count`` steps after the first, as the server draws them."""
    from plotly.io.json import to_json_plotly
    from syncviz.dashboard.app import create_app
    create_app(root)
    from syncviz.dashboard import components as C
    from syncviz.dashboard.pages import replay as R
    steps = C.store().get(name).step_list
    picked = [int(s) for s in steps[1:1 + count]] or [int(steps[0])]
    return [json.loads(to_json_plotly(R.draw_step(name, s, "auto", heatmap=False)[0])) for s in picked]


def one_browser(base: str, name: str, figs: list[dict], polyfill: str | None, reacts: int) -> list[list[float]]:
    driver = B.browser()
    try:
        if polyfill is not None:
            driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": polyfill})
        driver.get(f"{base}/replay?run={name}")
        B.wait_drawn(driver, None)
        time.sleep(1.0)          # the page's own follow-up requests (heatmap, the step ahead) settle
        loaded = driver.execute_script("return window._babelPolyfill === true")
        if loaded != (polyfill is not None):
            raise SystemExit(f"the polyfill was {'' if loaded else 'not '}loaded where it should "
                             f"{'not ' if loaded else ''}be")
        driver.execute_script("window.__figs = arguments[0];", figs)
        driver.set_script_timeout(60)
        for i in range(len(figs)):                       # warm: each figure once
            driver.execute_async_script(REACT_JS, i)
        return [driver.execute_async_script(REACT_JS, k % len(figs)) for k in range(reacts)]
    finally:
        driver.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, help="a directory of runs (with --run) [simulate one]")
    ap.add_argument("--run", help="the run under --root to draw")
    ap.add_argument("--steps", type=int, default=4, help="steps of the simulated run [4]")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, each variant once a round [4]")
    ap.add_argument("--reacts", type=int, default=12, help="timed redraws per browser [12]")
    args = ap.parse_args()
    if (args.root is None) != (args.run is None):
        ap.error("--root and --run go together")
    with tempfile.TemporaryDirectory(prefix="syncviz-page-scripts-") as tmp:
        root, name = (args.root, args.run) if args.root else simulated_run(Path(tmp), args.steps)
        print(f"run {root / name}: drawing its Replay timelines", flush=True)
        figs = figures(root, name, 3)
        shapes = sum(s.get("path", "").count("Z") for s in figs[0]["layout"].get("shapes", []))
        print(f"{len(figs)} steps; the first has {shapes:,} bars in path shapes", flush=True)
        source = B.polyfill_source()
        port = B.free_port()
        server = B.start_server(root, port)
        base = f"http://127.0.0.1:{port}"
        got: dict[str, list] = {"served": [], "polyfill": []}
        try:
            for rnd in range(args.rounds):
                order = ("served", "polyfill") if rnd % 2 == 0 else ("polyfill", "served")
                line = []
                for v in order:
                    r = one_browser(base, name, figs, source if v == "polyfill" else None, args.reacts)
                    got[v].append(r)
                    line.append(f"{v} {statistics.median(x[0] for x in r):.1f} ms")
                ratio = statistics.median(x[0] for x in got["polyfill"][-1]) / \
                    statistics.median(x[0] for x in got["served"][-1])
                print(f"round {rnd + 1}: Plotly.react median: {', '.join(line)}; with polyfill / served {ratio:.2f}",
                      flush=True)
        finally:
            server.terminate()
    print("\nover all rounds (median of every timed redraw):")
    print(f"{'page':34} {'Plotly.react':>13} {'painted':>9}")
    med = {}
    for v, label in (("served", "as served (no polyfill)"), ("polyfill", "with Dash's @babel/polyfill")):
        flat = [x for r in got[v] for x in r]
        med[v] = (statistics.median(x[0] for x in flat), statistics.median(x[1] for x in flat))
        print(f"{label:34} {med[v][0]:10.1f} ms {med[v][1]:6.1f} ms")
    per_round = [statistics.median(x[0] for x in p) / statistics.median(x[0] for x in s)
                 for s, p in zip(got["served"], got["polyfill"])]
    print(f"with polyfill / served: react {med['polyfill'][0] / med['served'][0]:.2f} "
          f"(rounds {min(per_round):.2f}-{max(per_round):.2f}), painted {med['polyfill'][1] / med['served'][1]:.2f}")


if __name__ == "__main__":
    main()
