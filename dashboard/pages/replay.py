"""Replay: one step at a time, every rank's compute and bucket collectives on one time axis.

Thin callbacks: slider set-up (and Live: new steps appear as ranks flush them), drawing a step,
and a client-side play/pause that advances the slider without a server round trip.
"""
from __future__ import annotations

import time

import dash
from dash import Input, Output, State, dcc, html

from .. import components as C
from .. import timeline as TL


LANE_MODES = [{"label": "auto", "value": "auto"}, {"label": "each rank", "value": "ranks"},
              {"label": "min / median / max over ranks", "value": "spread"}]
PLAY_MS = 700
LIVE_MS = 1500


def layout(**_query):
    return html.Div([
        html.Div([
            html.Button("▶ Play", id="replay-play", n_clicks=0, className="btn play"),
            html.Div(dcc.Slider(id="replay-step", min=0, max=0, step=1, value=0, marks=None,
                                tooltip={"placement": "bottom", "always_visible": True}, updatemode="mouseup"),
                     className="slider"),
            dcc.RadioItems(id="replay-lanes", options=LANE_MODES, value="auto", inline=True, className="radio"),
            dcc.Checklist(id="replay-follow", options=[{"label": "follow new steps", "value": "follow"}],
                          value=["follow"], inline=True, className="radio"),
            html.Span(id="replay-status"),
        ], className="controls"),
        html.Div(id="replay-error"),
        html.Div(id="replay-info", className="cards"),
        C.graph("replay-timeline", figure=TL.empty_figure("loading…")),
        html.Div(C.graph("replay-lateness", figure=TL.empty_figure("")), id="replay-lateness-box"),
        dcc.Interval(id="replay-tick", interval=PLAY_MS, disabled=True),
        dcc.Interval(id="replay-live", interval=LIVE_MS, disabled=True),   # setup_slider enables it for live runs
    ])


dash.register_page(__name__, path="/replay", name="Replay", order=1, title="syncviz · replay", layout=layout)


def slider_marks(first: int, last: int) -> dict:
    n = last - first
    every = max(1, round(n / 10)) if n > 0 else 1
    return {str(s): str(s) for s in range(first, last + 1, every)} | {str(last): str(last)}


@dash.callback(Output("replay-step", "min"), Output("replay-step", "max"), Output("replay-step", "marks"),
               Output("replay-step", "value"), Output("replay-status", "children"),
               Output("replay-live", "disabled"),
               Input("run-picker", "value"), State("replay-step", "value"))
def setup_slider(name, value):
    """The run's steps on the slider, which starts at the first step after warm-up."""
    try:
        run = C.store().get(name) if name else None
    except Exception as e:   # the draw callback shows the error card
        C.problem_text(e)
        run = None
    if run is None:
        return 0, 0, None, dash.no_update if value == 0 else 0, "", True
    first, last, start = run.first_step, run.last_step, run.start_step
    # Setting the value it already has would make the draw callback run twice.
    return (first, last, slider_marks(first, last), dash.no_update if value == start else start,
            C.status_badge(run.recording, run.problems), not run.recording)


@dash.callback(Output("replay-step", "max", allow_duplicate=True), Output("replay-step", "marks", allow_duplicate=True),
               Output("replay-step", "value", allow_duplicate=True), Output("replay-status", "children", allow_duplicate=True),
               Output("replay-live", "disabled", allow_duplicate=True),
               Input("replay-live", "n_intervals"), State("run-picker", "value"), State("replay-step", "value"),
               State("replay-step", "max"), State("replay-follow", "value"), prevent_initial_call=True)
def follow_live(_tick, name, value, old_max, follow):
    """Live: a run still being recorded grows as ranks flush steps (the store re-reads files whose
    size or mtime changed); new steps extend the slider, and are shown when following."""
    try:
        run = C.store().get(name)
    except Exception:
        return (dash.no_update,) * 5
    last = run.last_step
    if last == old_max or old_max is None:
        return dash.no_update, dash.no_update, dash.no_update, C.status_badge(run.recording, run.problems), not run.recording
    at_end = value is None or old_max is None or value >= old_max
    return (last, slider_marks(run.first_step, last), last if follow and at_end else dash.no_update,
            C.status_badge(run.recording, run.problems), not run.recording)


def choose_lanes(mode: str, n_ranks: int) -> str:
    if mode == "auto":
        return "ranks" if n_ranks <= TL.GL_LANES else "spread"
    return mode


def draw_step(name: str, step: int, mode: str = "auto"):
    """Figures and numbers of one step: (timeline, lateness heatmap, show heatmap, info cards)."""
    t = time.perf_counter()
    run = C.store().get(name)
    step = run.nearest_step(step)
    view = run.step_view(step)
    lanes = choose_lanes(mode or "auto", len(run.ranks))
    shown = view.lanes() if lanes == "spread" else {"compute": view.compute, "comm": view.comm, "exposed": view.exposed}
    t0 = TL.step_origin(shown["compute"], shown["comm"])   # the min lane starts where the earliest rank does
    n_buckets = run.n_buckets
    title = f"{name} · step {step} · {len(run.ranks)} ranks"
    if lanes == "spread":
        names, lane_of, title = ["min", "median", "max"], None, title + " · each time is the min / median / max over ranks"
    else:
        names, lane_of = [f"rank {r}" for r in run.ranks], {r: i for i, r in enumerate(run.ranks)}
    fig = TL.timeline_figure(shown["compute"], shown["comm"], shown["exposed"], lane_names=names, lane_of=lane_of,
                             t0=t0, params=run.bucket_params(), x_range=run.step_range_ms(), n_buckets=n_buckets,
                             title=title)
    fig["layout"]["meta"] = {"step": int(step), "lanes": lanes, "source": view.source}
    late = (TL.lateness_figure(view.lateness, "Launch lateness per rank and bucket (ms after the first rank)")
            if lanes == "spread" else dash.no_update)
    info = step_cards(view)
    ms = (time.perf_counter() - t) * 1e3
    info.append(C.number_card("server time", f"{ms:.0f} ms", f"analysis + figure of this step ({view.source}); "
                              "JSON encoding not included"))
    run.analyse_in_background()
    return fig, late, lanes == "spread", info


def step_cards(view) -> list:
    """Number cards of one step: median over ranks (hover: min and max), from analysis.rank_spread."""
    spread = view.step_spread
    row = spread.iloc[0] if len(spread) else None

    def get(col, stat):
        return None if row is None else float(row[f"{col}_{stat}"])

    cards = []
    for label, col, unit, scale in (("step time", "step_ns", " ms", 1e-6), ("comm busy", "comm_busy_ns", " ms", 1e-6),
                                    ("exposed comm", "exposed_ns", " ms", 1e-6), ("overlap", "overlap_pct", " %", 1.0),
                                    ("compute / comm", "compute_comm_ratio", "", 1.0)):
        m, lo, hi = (None if get(col, s) is None else get(col, s) * scale for s in ("median", "min", "max"))
        cards.append(C.number_card(label, C.fmt(m, 1 if unit else 2, unit),
                                   f"median over ranks; min {C.fmt(lo)} · max {C.fmt(hi)}"))
    cards.append(C.number_card("bytes / rank", C.fmt_bytes(get("bytes", "max")),
                               "bytes on the wire in this step (largest rank)"))
    return cards


@dash.callback(Output("replay-timeline", "figure"), Output("replay-lateness", "figure"),
               Output("replay-lateness-box", "style"), Output("replay-info", "children"),
               Output("replay-error", "children"),
               Input("run-picker", "value"), Input("replay-step", "value"), Input("replay-lanes", "value"))
def draw(name, step, mode):
    if not name:
        return TL.empty_figure("no run selected"), TL.empty_figure(""), {"display": "none"}, [], C.run_picker_note(name)
    try:
        fig, late, show_late, info = draw_step(name, step, mode)
    except Exception as e:
        msg = C.problem_text(e)
        return (TL.empty_figure("nothing to draw"), TL.empty_figure(""), {"display": "none"}, [],
                C.error_card(msg))
    return fig, late, {} if show_late else {"display": "none"}, info, None


# Play / pause in the browser: each tick moves the slider one step (the draw callback follows);
# at the last step playing stops (a live run keeps extending the slider; press play again).
dash.clientside_callback(
    """
    function(clicks, ticks, value, min, max, paused) {
        const trig = (dash_clientside.callback_context.triggered[0] || {}).prop_id || "";
        const no = dash_clientside.no_update;
        if (trig.startsWith("replay-play")) {
            if (paused) {   // start playing; from the end, start over
                return [value >= max ? min : no, false, "⏸ Pause"];
            }
            return [no, true, "▶ Play"];
        }
        if (paused) { return [no, no, no]; }
        if (value >= max) { return [no, true, "▶ Play"]; }
        return [value + 1, false, "⏸ Pause"];
    }
    """,
    Output("replay-step", "value", allow_duplicate=True), Output("replay-tick", "disabled"),
    Output("replay-play", "children"),
    Input("replay-play", "n_clicks"), Input("replay-tick", "n_intervals"),
    State("replay-step", "value"), State("replay-step", "min"), State("replay-step", "max"),
    State("replay-tick", "disabled"),
    prevent_initial_call=True,
)
