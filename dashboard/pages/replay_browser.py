"""The Replay's browser-side callbacks (Dash clientside callbacks): a step change from the page's
copy of the step drawn ahead, that copy painted in the timeline behind, the wait for the browser to
paint a step before the server draws the next one (and the heatmap is drawn), and play/pause. The
server-side callbacks are in replay.py, which imports this module (importing registers them).
"""
from __future__ import annotations

import json

import dash
from dash import Input, Output, State

# classNames of the boxes of (replay-timeline, replay-next) when replay-timeline is in front; swapped
# when it is behind (a box, as dcc.Graph keeps the className it was made with)
FRONT = ("timeline front", "timeline back")
FRONT_OUTPUTS = [("replay-timeline-box", "className"), ("replay-next-box", "className")]
FIGURE_OUTPUTS = [("replay-timeline", "figure"), ("replay-lateness", "figure"), ("replay-lateness-box", "style"),
                  ("replay-info", "children"), ("replay-error", "children"), ("replay-drawn", "data")]
# replay-want's 5th item when the page has drawn the step itself (the step callback below, replay.draw())
SHOWN = "shown"


# A step change, in the browser first: the step after the one on screen is drawn ahead (replay.draw_ahead,
# while this one is looked at) and kept in the page, painted in the timeline behind the one on
# screen (the second callback below); a move one step on (→, Play) brings that timeline to the front, with no round
# trip and no redraw. Any other move asks the server (replay.draw), whose figure goes to replay-timeline,
# which it brings to the front. Why both: the server's draw of a 1,024-rank step is ~110 ms and its
# response arrives ~150 ms after the key press, about a third of the ~420 ms until the browser had
# drawn it (session 25), so the copy came first; from the copy, Plotly still took ~80 ms to be
# handed the figure and software WebGL ~150 ms to paint it, 230-250 ms in all (session 28,
# benchmarks/dashboard.py, README "Big runs"); the copy painted behind is shown in one frame.
dash.clientside_callback(
    """
    function(step, mode, name, drawn, ahead, figA, figB, classA, want, served) {
        const no = dash_clientside.no_update, FRONT = __FRONT__;
        const key = [name, step, mode];
        const same = (a, b) => Array.isArray(a) && a.length >= 3 && [0, 1, 2].every(i => a[i] === b[i]);
        // A step asked of the server and not drawn yet would land after this move, over the step
        // moved to (the slider saying one step, the timeline showing another): a move that needs no
        // server asks again with SHOWN, and Dash drops the older request's answer (a newer request
        // of the same callback replaces one in flight); draw() answers SHOWN with nothing.
        const pending = Array.isArray(want) && want.length >= 4 && want[4] !== __SHOWN__ &&
            !(Array.isArray(served) && same(served, want) && served[3] === want[3]);
        const cancel = pending ? key.concat([Date.now(), __SHOWN__]) : no;
        if (same(drawn, key)) { return [no, no, no, no, no, no, cancel, no, no]; }   // on screen already
        if (!(ahead && same(ahead.key, key))) { return [no, no, no, no, no, no, key.concat([Date.now()]), no, no]; }
        const out = ahead.out.map((v, i) => ahead.skip.includes(i) ? no : v);
        const aInFront = classA === FRONT[0];
        const back = aInFront ? figB : figA;
        const meta = back && back.layout && back.layout.meta;
        if (!(meta && same(meta.key, key))) {      // not painted behind (yet): drawn from the copy, in front
            return out.concat([cancel, FRONT[0], FRONT[1]]);
        }
        // Behind, at the zoom of the one in front (uirevision keeps a zoom within one graph only):
        // a range set on the front (a zoom, or the run's fixed time axis) is copied where it differs,
        // an autorange (not zoomed) only where the one behind is zoomed. A relayout redraws the one
        // behind (~200 ms painted at 1,024 ranks), so only when they differ: comparing autoranged
        // ranges too redrew it on every other step (the steps' row counts differ).
        const gd = id => document.querySelector("#" + id + " .js-plotly-plot");
        const front = gd(aInFront ? "replay-timeline" : "replay-next"), behind = gd(aInFront ? "replay-next" : "replay-timeline");
        if (front && behind && front.layout && behind.layout) {
            const view = {};
            ["xaxis", "yaxis"].forEach(ax => {
                const f = front.layout[ax] || {}, b = behind.layout[ax] || {};
                if (f.autorange) {
                    if (!b.autorange) { view[ax + ".autorange"] = f.autorange; }
                } else if (b.autorange || JSON.stringify(f.range) !== JSON.stringify(b.range)) {
                    view[ax + ".range"] = f.range; view[ax + ".autorange"] = false;
                }
            });
            if (Object.keys(view).length) { Plotly.relayout(behind, view); }
        }
        out[0] = no;
        return out.concat([cancel], aInFront ? [FRONT[1], FRONT[0]] : [FRONT[0], FRONT[1]]);
    }
    """.replace("__FRONT__", json.dumps(FRONT)).replace("__SHOWN__", json.dumps(SHOWN)),
    *[Output(i, p, allow_duplicate=True) for i, p in FIGURE_OUTPUTS], Output("replay-want", "data"),
    *[Output(i, p, allow_duplicate=True) for i, p in FRONT_OUTPUTS],
    Input("replay-step", "value"), Input("replay-lanes", "value"),
    State("replay-run", "data"), State("replay-drawn", "data"), State("replay-ahead", "data"),
    State("replay-timeline", "figure"), State("replay-next", "figure"), State("replay-timeline-box", "className"),
    State("replay-want", "data"), State("replay-served", "data"),
    prevent_initial_call=True,
)

# The step drawn ahead, into the timeline behind the one on screen, where the browser paints it
# while the step on screen is looked at.
dash.clientside_callback(
    """
    function(ahead, classA) {
        const no = dash_clientside.no_update;
        if (!ahead || !ahead.out || ahead.skip.includes(0)) { return [no, no]; }
        return classA === __FRONT_A__ ? [no, ahead.out[0]] : [ahead.out[0], no];
    }
    """.replace("__FRONT_A__", json.dumps(FRONT[0])),
    Output("replay-timeline", "figure", allow_duplicate=True), Output("replay-next", "figure"),
    Input("replay-ahead", "data"), State("replay-timeline-box", "className"),
    prevent_initial_call=True,
)


HEATMAP_PATH = "_syncviz/replay-heatmap"    # the heatmap's route (replay.add_routes)


# replay-drawn once the browser has painted it: when it is idle after the animation frame that
# paints the timeline holding that step (style, layout and paint run in the frame); replay.draw_ahead
# and replay.heatmap_after_paint wait for it. Why: on two cores the server's draw of the
# next step (~70-100 ms of CPU) took the CPU the browser needed to paint this one in software WebGL;
# a jump (PgUp, drawn by the server) was painted a median 316-381 ms after the key press with the
# draw ahead starting when the answer landed, 229 ms with it started 0.3 s later by hand
# (benchmarks/dashboard.py on benchmarks/scale.py's 10^8-event ZeRO-3 run, session 33).
dash.clientside_callback(
    """
    function(drawn) {
        // Plotly is handed the figure after this store changes (dcc.Graph draws in a later task):
        // wait, a frame at a time, until the timeline in front holds the step (2 s at most: an
        // error card holds none), then for the frame that paints it.
        // A newer step on screen supersedes this wait (its own wait follows): nothing then, so that
        // the server draws ahead of the step shown, not of one already left.
        const no = dash_clientside.no_update, t0 = performance.now();
        const idle = window.requestIdleCallback || function (f) { return setTimeout(f, 0); };   // Safari has none
        const me = (window.__replayPaintedSeq = (window.__replayPaintedSeq || 0) + 1);
        const superseded = () => window.__replayPaintedSeq !== me;
        const holds = function (key) {
            const gd = document.querySelector(".timeline.front .js-plotly-plot");
            const k = gd && gd.layout && gd.layout.meta && gd.layout.meta.key;
            return Array.isArray(k) && Array.isArray(key) && [0, 1, 2].every(i => k[i] === key[i]);
        };
        return new Promise(function (resolve) {
            // Right after the frame that paints it (this callback runs after that frame, or a
            // frame's callbacks find the timeline holding it: that frame paints it), its heatmap
            // is asked for (replay.heatmap_after_paint): the browser rasterizes the timeline
            // meanwhile, on another thread, before the page can paint again. Asked once idle
            // (with draw_ahead, below) until session 50: a jump's heatmap painted ZeRO-3 269, 251
            // -> 230, 229 ms after the key press, DDP 190, 197 -> 180, 181 ms, the timeline as
            // before (benchmarks/dashboard.py --moves 24 on the 10^8-event runs, alternated).
            // Asking with the step itself (at the key press) made it no sooner: its answer then
            // lands while the page handles the timeline's, whose paint came later.
            // Asked of a plain route (replay.add_routes), its answer handed to the heatmap's graph
            // here. As a Dash callback (until session 58) it came back through a store and a second
            // browser-side callback: from the timeline painted to its heatmap painted 78-80 ms, now
            // 54-59 ms (10^8-event DDP run, three alternated pairs of benchmarks/dashboard.py runs).
            const framed = function () {
                setTimeout(function () {
                    if (superseded()) { return; }
                    const cfg = JSON.parse((document.getElementById("_dash-config") || {}).textContent || "{}");
                    fetch((cfg.requests_pathname_prefix || "/") + __HEATMAP_PATH__, {
                        method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(drawn),
                    }).then(r => r.ok ? r.json() : null).then(function (late) {
                        if (late && late.fig && holds(late.key)) {    // the step is still in front
                            dash_clientside.set_props("replay-lateness", {figure: late.fig});
                            dash_clientside.set_props("replay-lateness-box", {style: late.style});
                        }
                    }).catch(function () {});   // the server gone: the next step change tells
                }, 0);
            };
            const wait = function () {
                if (superseded()) {
                    resolve(no);
                } else if (holds(drawn) || performance.now() - t0 > 2000) {
                    framed();
                    requestAnimationFrame(function () { idle(function () {
                        resolve(superseded() ? no : drawn);
                    }, {timeout: 200}); });
                } else {
                    requestAnimationFrame(wait);
                }
            };
            wait();
        });
    }
    """.replace("__HEATMAP_PATH__", json.dumps(HEATMAP_PATH)),
    Output("replay-painted", "data"), Input("replay-drawn", "data"), prevent_initial_call=True,
)


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
