"""Ratios: compute/comm ratio, overlap % and exposed comm over steps, and a rank × step heatmap of
launch skew that makes stragglers obvious. A run still being recorded is redrawn as steps arrive."""
from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html

from syncviz import analysis as A
from syncviz.trace import TraceError

from syncviz.dashboard.figures import charts as CH
from syncviz.dashboard import components as C
from syncviz.dashboard.figures.timeline import empty_figure


LIVE_MS = 2000


def layout(**_query):
    return html.Div([
        html.H2("Ratios over steps"),
        html.P("compute / comm = (forward + backward + optimizer compute) / comm busy time; overlap % = comm "
               "hidden under compute / comm busy; exposed = comm busy − overlapped.", className="hint"),
        html.Div(id="ratios-error"),
        C.graph("ratios-steps", figure=empty_figure("loading…")),
        C.graph("ratios-skew"),
        dcc.Store(id="ratios-sig"),
        dcc.Interval(id="ratios-live", interval=LIVE_MS, disabled=True),   # enabled for runs being recorded
    ])


dash.register_page(__name__, path="/ratios", name="Ratios", order=4, title="syncviz · ratios", layout=layout)


def ratio_figures(name: str) -> tuple[dict, dict, bool]:
    run = C.store().get(name)
    # 4 of the step table's 15 columns: read alone from a big run's kept table, 0.03-0.05 s against
    # 0.15-0.48 s for the whole (10^8-event DDP run, 800,000 rank-steps; session 44)
    shown = ["compute_comm_ratio", "overlap_pct", "exposed_ns"]
    steps = run.step_columns(["step"] + shown)
    spread = {c: A.quantiles(steps, "step", c, qs=(0.0, 0.5, 1.0)) for c in shown}
    try:
        skew = CH.skew_heatmap_figure(run.rank_skew())
    except TraceError:
        if not run.partial:
            raise
        skew = empty_figure("The rank × step lateness map needs every event of this run, more than this dashboard "
                            "reads whole; the Replay page draws each step's lateness")
    return CH.over_steps_figure(spread, live=run.recording), skew, run.recording


@dash.callback(Output("ratios-steps", "figure"), Output("ratios-skew", "figure"), Output("ratios-error", "children"),
               Output("ratios-sig", "data"), Output("ratios-live", "disabled"),
               Input("run-picker", "value"), Input("ratios-live", "n_intervals"), State("ratios-sig", "data"))
def draw(name, _tick, shown):
    if not name:
        return empty_figure("no run selected"), empty_figure(""), C.run_picker_note(name), None, True
    try:
        sig = repr((name, C.store().signature(name)))
        if sig == shown:   # live tick, nothing new flushed
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update, dash.no_update
        steps_fig, skew_fig, recording = ratio_figures(name)
        return steps_fig, skew_fig, None, sig, not recording
    except Exception as e:
        return empty_figure("nothing to draw"), empty_figure(""), C.error_card(C.problem_text(e)), None, True
