"""Strategies: runs side by side (all-reduce vs reduce-scatter, DDP vs ZeRO): headline numbers,
bytes per step by collective, the step split into compute / overlapped / exposed comm, memory."""
from __future__ import annotations

from urllib.parse import parse_qs

import dash
from dash import Input, Output, State, dcc, html

from syncviz.dashboard.figures import charts as CH
from syncviz.dashboard import components as C
from syncviz.dashboard.figures.timeline import empty_figure


DEFAULT_MAX = 6
ROWS = [("strategy", "strategy", None), ("engine", "engine", None), ("ranks", "world_size", None),
        ("step time", "step_ms", " ms"), ("compute", "compute_ms", " ms"), ("comm busy", "comm_busy_ms", " ms"),
        ("exposed comm", "exposed_ms", " ms"), ("overlap", "overlap_pct", " %"),
        ("compute / comm", "compute_comm_ratio", ""), ("bytes / step / rank", "bytes_per_step", "B"),
        ("busbw (median)", "busbw_gbps", "GB/s")]


def layout(**_query):
    names = C.store().names()
    return html.Div([
        html.H2("Strategies side by side"),
        dcc.Dropdown(id="strategies-runs", options=[{"label": n, "value": n} for n in names],
                     value=C.store().readable_names()[:DEFAULT_MAX], multi=True, placeholder="runs to compare"),
        html.Div(id="strategies-errors"),
        html.Div(id="strategies-table"),
        C.graph("strategies-split", figure=empty_figure("loading…")),
        html.Div([C.graph("strategies-bytes"), C.graph("strategies-memory")], className="two"),
    ])


dash.register_page(__name__, path="/strategies", name="Strategies", order=3, title="syncviz · strategies", layout=layout)


@dash.callback(Output("strategies-runs", "value"), Input("url", "search"), State("strategies-runs", "value"))
def runs_from_url(search, current):
    """``/strategies?run=a&run=b`` (the Runs page's "compare" link) selects those runs."""
    wanted = [n for n in parse_qs((search or "").lstrip("?")).get("run", []) if C.store().has(n)]
    return wanted or current or dash.no_update


def compare(names: list[str]):
    """(table, split figure, bytes figure, memory figure, error cards) for the readable runs."""
    summaries, splits, op_bytes, memory, errors = {}, {}, {}, {}, []
    for n in names:
        try:
            run = C.store().get(n)
            summaries[n], splits[n], op_bytes[n] = run.summary(), run.time_split(), run.op_bytes()
            memory[n] = CH.memory_of(run.meta)
        except Exception as e:
            errors.append(C.error_card(C.problem_text(e), title=f"{n}: left out"))
    if not summaries:
        return None, empty_figure("no readable run selected"), empty_figure(""), empty_figure(""), errors
    table = html.Table([html.Thead(html.Tr([html.Th("")] + [html.Th(n) for n in summaries])),
                        html.Tbody([html.Tr([html.Th(label)] + [html.Td(_cell(s.get(key), unit)) for s in summaries.values()])
                                    for label, key, unit in ROWS] +
                                   [html.Tr([html.Th("verdict")] + [html.Td(s["verdict"], className="verdict")
                                                                    for s in summaries.values()])])],
                       className="compare-table")
    return (table, CH.time_split_figure(splits), CH.op_bytes_figure(op_bytes), CH.memory_figure(memory), errors)


def _cell(value, unit):
    if unit == "B":
        return C.fmt_bytes(value)
    if unit == "GB/s":
        return C.fmt_sig(value, " GB/s")
    if unit is None:
        return str(value)
    return C.fmt(float(value) if isinstance(value, (int, float)) else value, 2, unit)


@dash.callback(Output("strategies-table", "children"), Output("strategies-split", "figure"),
               Output("strategies-bytes", "figure"), Output("strategies-memory", "figure"),
               Output("strategies-errors", "children"), Input("strategies-runs", "value"))
def draw(names):
    if not names:
        return None, empty_figure("pick runs to compare"), empty_figure(""), empty_figure(""), None
    return compare(list(names))
