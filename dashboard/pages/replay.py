"""Replay: one step at a time, every rank's compute and bucket collectives on one time axis.

Thin callbacks: slider set-up (and Live: new steps appear as ranks flush them), drawing a step and
the step after it; what runs in the browser (a move to a step drawn ahead, the wait for the paint,
play/pause) is in replay_browser.py.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import dash
from dash import Input, Output, State, dcc, html

from syncviz.dashboard import components as C
from syncviz.dashboard.data.readahead import prepare
from syncviz.dashboard.data.stepview import STEP_TABLES
from syncviz.dashboard.figures import timeline as TL
from syncviz.dashboard.pages.replay_heatmap import HeatmapsAhead
# the page's browser-side callbacks (registered on import) and the outputs they share with these
from syncviz.dashboard.pages.replay_browser import FIGURE_OUTPUTS, FRONT, FRONT_OUTPUTS, HEATMAP_PATH, SHOWN


LANE_MODES = [{"label": "auto", "value": "auto"}, {"label": "each rank", "value": "ranks"},
              {"label": "fastest / median / slowest rank", "value": "spread"}]
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
        # Two timelines stacked in one place (double buffering): the one in front is on screen; the
        # one behind holds the step drawn ahead, painted while this one is looked at, so → brings it
        # to the front with no redraw (see the step callback below for why).
        html.Div([html.Div(C.graph("replay-timeline", figure=TL.empty_figure("loading…")), id="replay-timeline-box",
                           className=FRONT[0]),
                  html.Div(C.graph("replay-next", figure=TL.empty_figure("")), id="replay-next-box", className=FRONT[1])],
                 className="timeline-stage"),
        html.Div(C.graph("replay-lateness", figure=TL.empty_figure("")), id="replay-lateness-box"),
        dcc.Store(id="replay-run"),     # the run whose steps the slider holds (set with them)
        dcc.Store(id="replay-drawn"),   # [run, step, lane mode] of the figure on screen
        dcc.Store(id="replay-ahead"),   # the step after it, drawn while this one is looked at (draw_ahead)
        dcc.Store(id="replay-painted"),  # replay-drawn, once the browser has painted it (draw_ahead starts then)
        dcc.Store(id="replay-want"),    # [run, step, lane mode, nonce]: a step the browser has no copy of
        dcc.Store(id="replay-served"),  # the replay-want draw() answered last (an ask not answered is in flight)
        dcc.Interval(id="replay-tick", interval=PLAY_MS, disabled=True),
        dcc.Interval(id="replay-live", interval=LIVE_MS, disabled=True),   # pick_run enables it for live runs
    ])


dash.register_page(__name__, path="/replay", name="Replay", order=1, title="syncviz · replay", layout=layout)


def slider_marks(first: int, last: int) -> dict:
    n = last - first
    every = max(1, round(n / 10)) if n > 0 else 1
    return {str(s): str(s) for s in range(first, last + 1, every)} | {str(last): str(last)}



@dash.callback(Output("replay-step", "min"), Output("replay-step", "max"), Output("replay-step", "marks"),
               Output("replay-step", "value"), Output("replay-run", "data"), Output("replay-status", "children"),
               Output("replay-live", "disabled"),
               *[Output(i, p, allow_duplicate=True) for i, p in FIGURE_OUTPUTS + FRONT_OUTPUTS],
               Input("run-picker", "value"), State("replay-lanes", "value"), State("replay-follow", "value"),
               prevent_initial_call="initial_duplicate")
def pick_run(name, mode="auto", follow=()):
    """A run was picked: its steps on the slider and its first step after warm-up drawn, in one
    response (a second round trip for the figure costs ~0.5-1 s of browser time on a first open);
    its heatmap follows once the timeline is painted, as after draw()."""
    try:
        run = C.store().get(name) if name else None
    except Exception as e:   # drawn below as an error card
        C.problem_text(e)
        run = None
    if run is None:
        return (0, 0, None, 0, name, "", True, *render(name, 0, mode), *FRONT)
    first, last = run.first_step, run.last_step
    start = last if run.recording and follow and "follow" in follow else run.start_step
    return (first, last, slider_marks(first, last), start, name, C.status_badge(run.recording, run.problems),
            not run.recording, *heatmap_later(render(name, start, mode, heatmap=False), run), *FRONT)


@dash.callback(Output("replay-step", "max", allow_duplicate=True), Output("replay-step", "marks", allow_duplicate=True),
               Output("replay-step", "value", allow_duplicate=True), Output("replay-status", "children", allow_duplicate=True),
               Output("replay-live", "disabled", allow_duplicate=True),
               Input("replay-live", "n_intervals"), State("replay-run", "data"), State("replay-step", "value"),
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
    # "follow new steps" ticked: show the newest step, wherever the slider was (untick to stay put)
    return (last, slider_marks(run.first_step, last), last if follow and "follow" in follow else dash.no_update,
            C.status_badge(run.recording, run.problems), not run.recording)


def prepare_first_step(run, mode: str | None = "auto") -> None:
    """Analyse the step the replay opens at in the background (see LoadedRun.prepare)."""
    prepare(run, run.start_step, STEP_TABLES[choose_lanes(mode or "auto", len(run.ranks))])


def choose_lanes(mode: str, n_ranks: int) -> str:
    if mode == "auto":
        return "ranks" if n_ranks <= TL.GL_LANES else "spread"
    return mode


def draw_step(name: str, step: int, mode: str = "auto", heatmap: bool = True):
    """Figures and numbers of one step: (timeline, lateness heatmap, show heatmap, info cards);
    ``heatmap`` False: the heatmap is left out (no_update) even where it is shown (draw())."""
    run = C.store().get(name)
    step = run.nearest_step(step)
    view = run.step_view(step)
    lanes = choose_lanes(mode or "auto", len(run.ranks))
    title = f"{name} · step {step} · {len(run.ranks)} ranks"
    if lanes == "spread":       # the drawn ranks' tables alone (a run read one step at a time reads no other rank)
        drawn = view.get("drawn")
        compute, comm, exposed, t0 = drawn.compute, drawn.comm, drawn.exposed, drawn.t0
        ranks = [r for r, _ in drawn.picks]
        labels = {r: f"rank {r} · {', '.join(roles)}" for r, roles in drawn.picks}
        title += " · real ranks: fastest, median and slowest step, and the rank that launches last"
    else:
        compute, comm, exposed = view.compute, view.comm, view.exposed
        t0 = TL.step_origin(compute, comm)
        ranks, labels = list(run.ranks), {}
    fig = TL.timeline_figure(compute, comm, exposed, ranks=ranks, labels=labels, t0=t0,
                             params=run.bucket_params(), x_range=run.step_range_ms(step), title=title)
    fig["layout"]["meta"].update({"step": int(step), "lanes": lanes, "source": view.source})
    late = lateness_heatmap(view, step) if lanes == "spread" and heatmap else dash.no_update
    info = step_cards(view)
    run.analyse_in_background()
    run.prefetch_neighbours(step, STEP_TABLES[lanes])     # a run read one step at a time
    return fig, late, lanes == "spread", info


def lateness_heatmap(view, step: int) -> dict:
    """The rank × collective launch lateness heatmap of a step (StepView ``view``)."""
    late = TL.lateness_figure(view.lateness, "Launch lateness per rank and {what} (ms after the first rank)")
    late["layout"]["meta"] = {"step": int(step)}      # which step it shows (the page and its tests match it by this)
    return late


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


# The draws in progress, by (run, step, lane mode): a request for a step already being drawn waits
# for that draw and shares its result instead of drawing it again. Why: → held down asks the server
# for the step draw_ahead is still drawing (its copy has not reached the page yet), and each of those
# drew it twice, two ~110 ms draws of a 1,024-rank step competing for the same cores.
_DRAWING: dict[tuple, Future] = {}
_DRAWING_LOCK = threading.Lock()


def render(name, step, mode, heatmap: bool = True) -> tuple:
    """Values of FIGURE_OUTPUTS for (run, step, lane mode); errors become an error card. One draw
    of each (run, step, lane mode, ``heatmap``: see draw_step) at a time (_DRAWING), and one
    without the heatmap (draw()) takes a draw with it in progress (draw_ahead's: → held down);
    nothing is kept once it is drawn."""
    try:
        key = (name, step, mode, heatmap)
        hash(key)
    except TypeError:             # not a key of ours: drawn on its own (and reported as an error card)
        return _render(name, step, mode, heatmap)
    with _DRAWING_LOCK:
        running = _DRAWING.get(key) or (None if heatmap else _DRAWING.get((name, step, mode, True)))
        if running is None:
            mine = _DRAWING[key] = Future()
    if running is not None:
        return running.result()
    try:
        out = _render(name, step, mode, heatmap)
        mine.set_result(out)
        return out
    except BaseException as e:       # _render turns errors into cards; this is an interrupt or a bug
        mine.set_exception(e)
        raise
    finally:
        with _DRAWING_LOCK:
            _DRAWING.pop(key, None)


def _render(name, step, mode, heatmap: bool = True) -> tuple:
    drawn = [name, step, mode]
    if not name:
        return (TL.empty_figure("no run selected"), TL.empty_figure(""), {"display": "none"}, [],
                C.run_picker_note(name), drawn)
    try:
        fig, late, show_late, info = draw_step(name, step, mode, heatmap)
    except Exception as e:
        return (TL.empty_figure("nothing to draw"), TL.empty_figure(""), {"display": "none"}, [],
                C.error_card(C.problem_text(e)), drawn)
    fig["layout"]["meta"]["key"] = drawn      # what was asked for: the page matches its copies by it
    return fig, late, {} if show_late else {"display": "none"}, C.as_json(info), None, drawn



# Shown on the heatmap box while it still holds the step before (draw() leaves the new one out).
PENDING_STYLE = {"opacity": 0.35}


@dash.callback(*[Output(i, p) for i, p in FIGURE_OUTPUTS], *[Output(i, p, allow_duplicate=True) for i, p in FRONT_OUTPUTS],
               Output("replay-served", "data"), Input("replay-want", "data"), prevent_initial_call=True)
def draw(want):
    """The slider moved (or play, or Live, or the lane mode changed) to a step the page has no copy
    of: draw it, in replay-timeline, brought to the front. ``want``: [run, step, lane mode, nonce]
    (the nonce makes a repeated ask a change); a 5th item SHOWN: the page moved to a step it drew
    itself while an ask was in flight, and asks again only so that Dash drops that one's answer.

    The lateness heatmap is not in this answer: the heatmap of the step before is dimmed, and the
    page asks for the new one right after the frame that paints the timeline (heatmap_after_paint). Why:
    - Plotly took ~35 ms for the 300 × 243 heatmap of the 1,024-rank run before the timeline's
      paint could start: a jump was painted a median 284 ms after the key press with it, 260 ms
      without (session 33, when it was first held back until the paint);
    - it was still in this answer until session 42, 299 of its 1,153 kB: sent, parsed and
      computed (~7 ms of server time) before the timeline could be drawn.
    (benchmarks/dashboard.py on benchmarks/scale.py's 10^8-event ZeRO-3 run.) The server makes it
    meanwhile, once this answer is out, and answers it before draw_ahead's step (replay_heatmap)."""
    if not isinstance(want, list) or len(want) < 3 or (len(want) > 4 and want[4] == SHOWN):
        return (dash.no_update,) * (len(FIGURE_OUTPUTS) + len(FRONT_OUTPUTS) + 1)
    name, step, mode = want[:3]
    return (*heatmap_later(render(name, step, mode, heatmap=False)), *FRONT, want)


def heatmap_later(out: tuple, run=None) -> list:
    """render()'s outputs without the heatmap (heatmap=False): where the step shows one, the
    heatmap on screen dims until heatmap_after_paint's arrives, and the server makes it meanwhile
    (replay_heatmap: once this response is out)."""
    out = list(out)
    if out[4] is None and out[2] != {"display": "none"}:
        out[1], out[2] = dash.no_update, PENDING_STYLE
        key = out[5][:3]
        _HEATMAPS.start(key, lambda: heatmap_of(*key, run=run))
    return out


def add_routes(app: dash.Dash) -> None:
    """The page's route besides Dash's callbacks, on ``app``'s Flask server: POST [run, step, lane mode]
    to HEATMAP_PATH (after the app's path prefix) for heatmap_after_paint's answer as JSON (null where
    there is none). The page asks right after the frame that paints a step draw() or pick_run() drew
    and hands the answer to the heatmap's graph itself (replay_browser.py). A plain route, not a Dash
    callback, since session 58: as a callback it went from a store to the server and back into a
    second store, then through a browser-side callback into the graph: on the 10^8-event DDP run,
    from the ask to Plotly 29-44 ms for 4-8 ms of server time; now 14-20 ms for 3 ms, and a jump's
    heatmap painted 212-220 -> 188-200 ms after the key press (`benchmarks/dashboard.py --moves 24`,
    three runs of each alternated, session 58)."""
    import flask
    from plotly.io.json import to_json_plotly

    @app.server.route(app.config.routes_pathname_prefix + HEATMAP_PATH, methods=["POST"])
    def replay_heatmap():
        # encoded as Dash encodes a callback's answer (plotly's JSON: numpy arrays whole, by orjson)
        answer = heatmap_after_paint(flask.request.get_json(silent=True))
        return flask.Response(to_json_plotly(answer), mimetype="application/json")


def heatmap_after_paint(painted) -> dict | None:
    """The lateness heatmap of a step draw() or pick_run() drew, asked for right after the frame that
    paints its timeline (HEATMAP_PATH; ``painted``: its [run, step, lane mode]), as {"key", "fig",
    "style"}: the page hands it to Plotly if the timeline in front still holds that step. None where
    the step shows no heatmap, or ``painted`` is not such a key: a step shown from the page's copy (a
    4th item, its files_version: draw_ahead) came with its heatmap."""
    if not isinstance(painted, list) or len(painted) != 3 or not painted[0] or not isinstance(painted[1], int):
        return None
    try:
        fig = _HEATMAPS.take(painted, lambda: heatmap_of(*painted))
    except Exception:          # draw() has shown why as an error card, or the next draw will
        fig = None
    finally:
        _HEATMAPS.answered(painted)       # draw_ahead waits for this (replay_heatmap)
    return None if fig is None else {"key": painted, "fig": fig, "style": {}}


def heatmap_of(name, step, mode, run=None) -> dict | None:
    """The lateness heatmap of ``step`` as the page shows it, or None where the lanes show none."""
    run = run if run is not None else C.store().get(name)
    if choose_lanes(mode or "auto", len(run.ranks)) != "spread":
        return None
    step = run.nearest_step(step)
    return lateness_heatmap(run.step_view(step), step)


_HEATMAPS = HeatmapsAhead()


def files_version(sig: tuple) -> str:
    """A short mark of the files a run is read from (store signature: name, size, mtime of each):
    their count, total size and newest mtime. A run traced again into the same folder changes it."""
    return f"{len(sig)}:{sum(size for _, size, _ in sig)}:{max((mtime for *_, mtime in sig), default=0)}"



@dash.callback(Output("replay-ahead", "data"), Output("replay-want", "data", allow_duplicate=True),
               Input("replay-painted", "data"), State("replay-step", "max"), prevent_initial_call=True)
def draw_ahead(drawn, last):
    """The step after the one just drawn, for the page to keep ({"key": [run, step, lane mode],
    "out": the values of FIGURE_OUTPUTS, "skip": which of them to leave as they are}). Not for the
    last step, nor when it cannot be drawn (the server then says why when it is asked).

    A copy carries the files_version of the run it was drawn from (a 4th item in its "replay-drawn"):
    when the page shows it and the run's files have changed since (traced again into the same
    folder while the page was open), the step is asked of the server again (replay-want), so the
    page shows the old run for one round trip at most instead of for good."""
    no = dash.no_update
    if not isinstance(drawn, list) or len(drawn) not in (3, 4) or not drawn[0] or not isinstance(drawn[1], int):
        return no, no
    name, step, mode = drawn[:3]
    try:
        run = C.store().get(name)
    except Exception:                       # the server's draw says why, if it is asked
        return no, no
    version = files_version(run.sig)
    if len(drawn) == 4 and drawn[3] != version:     # shown from a copy of files since replaced
        return no, [name, step, mode, time.monotonic_ns()]
    if run.recording or not isinstance(last, int) or step >= last:
        return no, no          # recording: a step some ranks have not flushed yet would be kept partial
    # its heatmap is answered first: it is on screen, this step is not yet (no wait where none was
    # started here: lanes without a heatmap, a step shown from the page's copy, which brought its own)
    _HEATMAPS.wait(drawn)
    out = list(render(name, step + 1, mode))
    if out[4] is not None:        # an error card
        return no, no
    out[5] = out[5] + [version]
    skip = [i for i, v in enumerate(out) if v is dash.no_update]
    return {"key": [name, step + 1, mode], "out": [None if i in skip else v for i, v in enumerate(out)], "skip": skip}, no
