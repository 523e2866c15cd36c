"""Runs: every run under the root with its headline numbers (analysis.run_summary); pick one to
replay or several to compare. Each row fills itself in its own request, so a large run being
analysed does not hold up the others, and a corrupt run shows its error in its own row."""
from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import MATCH, Input, Output, dcc, html

from syncviz.dashboard import components as C


COLUMNS = ["run", "status", "strategy", "ranks", "steps", "step time", "overlap", "exposed comm",
           "compute / comm", "busbw", "verdict"]


def layout(**_query):
    names = C.store().names()
    if not names:
        return html.Div([html.H2("Runs"), C.error_card(
            f"No runs under {C.store().root}: a run is a directory holding run.json and rank-<r>.arrow files "
            f"(record one with `syncviz demo` or `syncviz trace`).", title="Nothing to show")])
    rows = [html.Tr(meta_cells(n) + [html.Td("analysing…", colSpan=6, className="muted")],
                    id={"type": "run-row", "run": n}) for n in names]
    return html.Div([
        html.H2("Runs"),
        html.P("Headline numbers are means over ranks and the steps after the first (step 0 includes warm-up and "
               "DDP's bucket rebuild); overlap = 100 × (1 − exposed / comm busy). Click a run to "
               "replay it; tick several and compare them.", className="hint"),
        html.Table([html.Thead(html.Tr([html.Th(c) for c in COLUMNS])), html.Tbody(rows)], className="runs-table"),
        html.Div([dcc.Checklist(id="runs-compare", options=[{"label": n, "value": n} for n in names], value=[],
                                inline=True, className="radio"),
                  dcc.Link("Compare selected →", id="runs-compare-link", href="/strategies", className="btn")],
                 className="compare"),
        html.Div([dcc.Store(id={"type": "run-key", "run": n}, data=n) for n in names]),
    ])


dash.register_page(__name__, path="/", name="Runs", order=0, title="syncviz · runs", layout=layout)


def meta_cells(name: str) -> list:
    link = html.Td(dcc.Link(name, href=C.run_href("replay", name), className="run-link"))
    try:
        meta = C.store().meta(name)
    except Exception as e:
        return [link, html.Td(C.error_card(C.problem_text(e), title="unreadable run"), colSpan=4)]
    steps = meta.get("steps_recorded", "–")
    return [link, html.Td("…"),
            html.Td(f"{meta.get('strategy', '?')} ({meta.get('engine', 'torch')})"),
            html.Td(str(meta.get("world_size", "?"))), html.Td(str(steps))]


def summary_cells(name: str) -> list:
    """Row cells of one run from analysis.run_summary (or an error card spanning the row)."""
    try:
        s, recording, problems = C.store().summary(name)
    except Exception as e:
        return [html.Td(dcc.Link(name, href=C.run_href("replay", name), className="run-link")),
                html.Td(C.error_card(C.problem_text(e), title="cannot read this run"), colSpan=len(COLUMNS) - 1)]
    cells = [html.Td(dcc.Link(name, href=C.run_href("replay", name), className="run-link")),
             html.Td(C.status_badge(recording, problems)),
             html.Td(f"{s['strategy']} ({s['engine']})"), html.Td(str(s["world_size"])), html.Td(str(s["steps"])),
             html.Td(C.fmt(s["step_ms"], 1, " ms")), html.Td(C.fmt(s["overlap_pct"], 0, " %")),
             html.Td(C.fmt(s["exposed_ms"], 2, " ms")), html.Td(C.fmt(s["compute_comm_ratio"], 2)),
             html.Td(C.fmt_sig(s["busbw_gbps"], " GB/s")), html.Td(s["verdict"], className="verdict")]
    return cells


@dash.callback(Output({"type": "run-row", "run": MATCH}, "children"), Input({"type": "run-key", "run": MATCH}, "data"))
def fill_row(name):
    return summary_cells(name)


@dash.callback(Output("runs-compare-link", "href"), Input("runs-compare", "value"))
def compare_link(selected):
    return "/strategies?" + urlencode([("run", n) for n in selected or []]) if selected else "/strategies"
