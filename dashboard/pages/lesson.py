"""Lesson: the story ``syncviz lesson`` tells, with the runs it recorded. One section per step:
what it showed (the narration and numbers from lesson.json), a figure made from the recorded
data (gradient values, compute/comm split, ring transfers, memory table) and links to the pages
that show the run in detail."""
from __future__ import annotations

import json
from pathlib import Path

import dash
from dash import Input, Output, dcc, html

from syncviz.analysis import grads as G
from syncviz.trace.grads import load_grads
from syncviz.analysis import ring as R

from syncviz.dashboard.figures import charts as CH
from syncviz.dashboard import components as C
from syncviz.dashboard.figures import lesson as LC
from syncviz.dashboard.figures.timeline import empty_figure

MAX_DEPTH = 3      # lesson.json files searched this deep under the dashboard's root


def lessons() -> dict[str, Path]:
    """Lesson directories under the root, by name relative to it (e.g. "lesson")."""
    root = C.store().root
    found = {}
    for depth in range(MAX_DEPTH + 1):
        for p in sorted(root.glob("/".join(["*"] * depth + ["lesson.json"]))):
            if p.is_file() and p.resolve().is_relative_to(root):
                found[p.parent.relative_to(root).as_posix() or "."] = p.parent
    return found


def layout(**_query):
    found = lessons()
    return html.Div([
        html.H2("Lesson: data parallelism, one idea at a time"),
        html.P(["Recorded by ", html.Code("syncviz lesson"), " on real CPU ranks; each section is one step of it. "
                "Run it again to refresh (", html.Code("syncviz lesson --fast"), " takes about two minutes)."],
               className="hint"),
        dcc.Dropdown(id="lesson-pick", options=[{"label": n, "value": n} for n in found],
                     value=next(iter(found), None), clearable=False, placeholder="no lesson.json under this root"),
        html.Div(id="lesson-body"),
    ])


dash.register_page(__name__, path="/lesson", name="Lesson", order=5, title="syncviz · lesson", layout=layout)


def _run_name(lesson_dir: Path, rel: str) -> str | None:
    """The store's name of a run lesson.json lists (paths there are relative to its parent)."""
    path = (lesson_dir.parent / rel).resolve()
    try:
        name = path.relative_to(C.store().root).as_posix()
    except ValueError:
        return None
    return name if C.store().has(name) else None


def _links(names: list[str]) -> html.Div:
    items = []
    for n in names:
        items += [dcc.Link(f"Replay {n}", href=C.run_href("replay", n)), " · ",
                  dcc.Link("Buckets", href=C.run_href("buckets", n)), "   "]
    return html.Div(items, className="hint")


def _section(step: dict, figures: list, names: list[str]) -> html.Div:
    return html.Div([
        html.H3(f"{step.get('number', '')}. {step['title']}"),
        html.Pre("\n".join(step["text"]), className="lesson-text",
                 style={"whiteSpace": "pre-wrap", "fontSize": "13px", "background": "#f7f7f9", "padding": "8px"}),
        *figures,
        html.Div(f"Shown in detail on: {step['page']}", className="hint"),
        _links(names) if names else None,
    ], className="lesson-step")


def _figures(kind: str, step: dict, lesson_dir: Path, names: list[str], earlier: list[str] = ()) -> list:
    if kind == "averaging" and names:
        check = G.averaging_check(load_grads(C.store().path_of(names[0])))
        return [C.graph("lesson-averaging", figure=LC.averaging_figure(check))]
    if kind in ("manual", "buckets", "straggler") and names:
        # the buckets step is drawn next to the hand-written runs: same model, same ranks
        shown = [*earlier, *names] if kind == "buckets" else names
        splits = {n: C.store().get(n).time_split() for n in shown}
        return [C.graph(f"lesson-split-{kind}", figure=CH.time_split_figure(splits))]
    if kind == "ring":
        results = [json.loads(p.read_text()) for p in sorted((lesson_dir / "ring").glob("ring-N*.json"))]
        if not results:
            return [html.Div("no ring-N*.json next to lesson.json", className="hint")]
        results.sort(key=lambda r: r["world_size"])
        options = [{"label": f"N = {r['world_size']}", "value": i} for i, r in enumerate(results)]
        pick = min(range(len(results)), key=lambda i: abs(results[i]["world_size"] - 4))
        return [html.Div([html.Span("ranks: ", className="picker-label"),
                          dcc.RadioItems(id="lesson-ring-n", options=options, value=pick, inline=True)]),
                dcc.Store(id="lesson-ring-lesson", data=lesson_dir.relative_to(C.store().root).as_posix() or "."),
                C.graph("lesson-ring-anim", figure=empty_figure("loading…")),
                C.graph("lesson-ring-timeline", figure=empty_figure("loading…")),
                C.graph("lesson-ring-bytes", figure=LC.ring_bytes_figure(results))]
    if kind == "memory":
        return [C.graph("lesson-memory", figure=LC.memory_figure(step.get("numbers", {})))]
    if kind == "stale":
        return [C.graph("lesson-stale", figure=LC.stale_figure(step.get("numbers", {})))]
    if kind == "dataparallel":
        return [C.graph("lesson-dataparallel", figure=LC.dataparallel_figure(step.get("numbers", {})))]
    return []


KINDS = ("stale", "dataparallel", "averaging", "manual", "buckets", "straggler", "ring", "memory")


def _kind(step: dict) -> str:
    t = step["title"].lower()
    words = ("stale gradients", "dataparallel vs ddp", "averaging", "by hand", "buckets", "straggler", "ring", "memory")
    for k, word in zip(KINDS, words):
        if word in t:
            return k
    return ""


@dash.callback(Output("lesson-body", "children"), Input("lesson-pick", "value"))
def draw(name):
    if not name:
        return html.Div(["No lesson here yet: run ", html.Code("syncviz lesson --out <this root>/lesson"),
                         " and reload."], className="hint")
    try:
        lesson_dir = lessons()[name]
        doc = json.loads((lesson_dir / "lesson.json").read_text())
        out, manual = [], []
        for step in doc.get("steps", []):
            names = [n for n in (_run_name(lesson_dir, r) for r in step.get("runs", [])) if n]
            if _kind(step) == "manual":
                manual = names
            try:
                figs = _figures(_kind(step), step, lesson_dir, names, manual)
            except Exception as e:
                figs = [C.error_card(C.problem_text(e), title="cannot draw this step")]
            out.append(_section(step, figs, names))
        return out or html.Div("lesson.json has no steps", className="hint")
    except Exception as e:
        return C.error_card(C.problem_text(e), title="Cannot show this lesson")


@dash.callback(Output("lesson-ring-anim", "figure"), Output("lesson-ring-timeline", "figure"),
               Input("lesson-ring-n", "value"), Input("lesson-ring-lesson", "data"))
def draw_ring(index, name):
    found = lessons()          # only lessons under the root: the name comes from the browser
    if name not in found or index is None:
        return empty_figure(""), empty_figure("")
    paths = sorted(Path(found[name], "ring").glob("ring-N*.json"))
    results = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r["world_size"])
    res = results[int(index)]
    n = res["world_size"]
    return (LC.ring_animation(R.ring_states(res["transfers"], n), n, res["bytes"] / n / 1e6),
            LC.ring_timeline(res["transfers"], n))
