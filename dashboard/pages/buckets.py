"""Buckets: what went into each bucket (both layouts: DDP's initial one and the rebuilt one) and
how each bucket's collective behaved: duration, bus bandwidth and launch delay distributions."""
from __future__ import annotations

import dash
from dash import Input, Output, html


from syncviz.dashboard.figures import charts as CH
from syncviz.dashboard import components as C
from syncviz.dashboard.figures.timeline import empty_figure


GRAPHS = ("buckets-map", "buckets-duration", "buckets-busbw", "buckets-delay")


def layout(**_query):
    return html.Div([
        html.H2("Buckets"),
        html.P("Distributions are over every step and rank (boxes: min, quartiles, max; marker: median). "
               "busbw follows nccl-tests' convention; GB/s = 1e9 bytes/s. Launch delay = launch − "
               "the moment the bucket's last gradient was ready.", className="hint"),
        html.Div(id="buckets-error"),
        C.graph("buckets-map", figure=empty_figure("loading…")),
        html.Div([C.graph("buckets-duration"), C.graph("buckets-busbw")], className="two"),
        C.graph("buckets-delay"),
    ])


dash.register_page(__name__, path="/buckets", name="Buckets", order=2, title="syncviz · buckets", layout=layout)


def bucket_figures(name: str) -> list[dict]:
    run = C.store().get(name)
    duration, busbw, delay, _ = run.bucket_stats()
    return [CH.bucket_map_figure(run.bucket_map()),
            CH.distribution_figure(duration, "Duration per bucket", "ms", 1e-6),
            CH.distribution_figure(busbw, "Bus bandwidth per bucket", "GB/s"),
            CH.distribution_figure(delay, "Launch delay per bucket", "ms", 1e-6)]


@dash.callback([Output(g, "figure") for g in GRAPHS] + [Output("buckets-error", "children")],
               Input("run-picker", "value"))
def draw(name):
    if not name:
        return [empty_figure("no run selected")] * len(GRAPHS) + [C.run_picker_note(name)]
    try:
        run = C.store().get(name)
        strategy = run.meta.get("strategy") or "this strategy"
        units = strategy == "zero3" and len(run.bucket_map())   # the simulator's ZeRO-3 layout: parameters per unit
        if not run.bucket_stats()[3] and (units or not len(run.bucket_map())):
            counts = ("`syncviz summary` counts and times them (this run is too big for the Distributed page)"
                      if run.partial else "the Distributed page counts and times them")
            note = C.note_card(f"Gradient buckets are DDP's (and ZeRO-1/2's under DDP). In this run ({strategy}) "
                               f"gradients are synchronized by other collectives: {counts}, and the Replay page "
                               "draws each one.", title="No gradient buckets in this run")
            first = CH.bucket_map_figure(run.bucket_map(), unit="ZeRO-3 unit") if units else \
                empty_figure("no gradient buckets in this run")
            return [first] + [empty_figure("no gradient buckets in this run")] * (len(GRAPHS) - 1) + [note]
        return bucket_figures(name) + [None]
    except Exception as e:
        return [empty_figure("nothing to draw")] * len(GRAPHS) + [C.error_card(C.problem_text(e))]
