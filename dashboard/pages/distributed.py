"""Distributed: what torch-tb-profiler's distributed view gives, from syncviz's own trace, so it
draws offline and for every recorded step: per rank, computation / overlapped / communication /
waiting for peers / other; per collective kind, calls, bytes, bus traffic and time."""
from __future__ import annotations

import dash
import numpy as np
from dash import Input, Output, html

from syncviz.dashboard import components as C
from syncviz.dashboard.figures.timeline import empty_figure
from syncviz.views import palette as P

PARTS = [("computation_ns", "computation", P.BLUE), ("overlapped_ns", "overlapped comm", P.GREEN),
         ("communication_ns", "communication only", P.EXPOSED), ("waiting_ns", "waiting for peers", P.ORANGE),
         ("other_ns", "other (data, host, idle)", P.LIGHT_GREY)]


def layout(**_query):
    return html.Div([
        html.H2("Distributed: where each rank's step goes"),
        html.P("Per rank, mean over the steps after the first: computation (no collective in flight), "
               "communication overlapped with computation, communication alone, waiting for peers (a collective "
               "waiting for a late rank to launch it, or for the collectives queued ahead of it), and other time. "
               "torch-tb-profiler's distributed view shows the same split from a profiler trace, but its page "
               "draws with charts loaded from the internet; this one works offline.", className="hint"),
        html.Div(id="distributed-error"),
        C.graph("distributed-ranks", figure=empty_figure("loading…")),
        html.H3("Collectives per rank and step"),
        html.P("Calls: how many one rank issues in one step (a range when ranks or steps differ); sizes and "
               "times: mean per rank and step.", className="hint"),
        html.Div(id="distributed-kinds"),
    ])


dash.register_page(__name__, path="/distributed", name="Distributed", order=5, title="syncviz · distributed",
                   layout=layout)


def ranks_figure(b) -> dict:
    if not len(b):
        return empty_figure("no complete step in this run")
    y = [f"rank {r}" for r in b["rank"]]
    data = [{"type": "bar", "orientation": "h", "name": label, "y": y, "x": b[col].to_numpy() / 1e6,
             "marker": {"color": color}, "hovertemplate": "%{y}: " + label + " %{x:.2f} ms per step<extra></extra>"}
            for col, label, color in PARTS]
    height = int(min(1100, 160 + 18 * len(b)))
    return {"data": data, "layout": {"barmode": "stack", "height": height,
                                     "title": {"text": "Step time per rank (ms, mean per step)", "x": 0.01},
                                     "margin": {"l": 80, "r": 20, "t": 70, "b": 40},
                                     "xaxis": {"title": {"text": "ms per step"}, "rangemode": "tozero"},
                                     "yaxis": {"autorange": "reversed", "tickfont": {"size": 10}},
                                     # legend in the bars' order (plotly reverses it for stacked bars)
                                     "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "traceorder": "normal"}}}


def kinds_table(k) -> html.Table:
    head = ["collective", "calls", f"size ({P.SIZE_UNIT})", f"bus traffic ({P.SIZE_UNIT})", "time (ms)", "mean per call (ms)"]
    rows = [[r.op, C.fmt_count(r.calls_min, r.calls_max), f"{r.bytes / P.MB:.2f}", f"{r.bus_bytes / P.MB:.2f}",
             f"{r.time_ns / 1e6:.2f}",
             f"{r.mean_ns / 1e6:.3f}" if np.isfinite(r.mean_ns) else "–"] for r in k.itertuples()]
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in head])),
                       html.Tbody([html.Tr([html.Td(c) for c in row]) for row in rows])], className="compare-table")


@dash.callback(Output("distributed-ranks", "figure"), Output("distributed-kinds", "children"),
               Output("distributed-error", "children"), Input("run-picker", "value"))
def draw(name):
    if not name:
        return empty_figure("no run selected"), None, C.run_picker_note(name)
    try:
        breakdown, kinds = C.store().get(name).distributed()
        return ranks_figure(breakdown), kinds_table(kinds), None
    except Exception as e:
        return empty_figure("nothing to draw"), None, C.error_card(C.problem_text(e))
