"""The step timeline, shared by the dashboard's Replay page and the HTML report: a figure dict
(plain Plotly JSON) from analysis tables.

Per rank a compute row (forward, backward compute, optimizer; exposed communication hatched in
vermillion where no compute runs) and as many comm rows as the rank had collectives in flight at
once (each its sub-lane and wait as analysis.timeline.collective_parts defines them: _bar_columns), so no bar is painted over
another. A collective is drawn hollow from its start until its service began (waiting for late
peers or for collectives queued ahead of it) and solid while it was served. Hover gives start,
end and duration in ms since the step's first event.

Figures are dicts, not plotly.graph_objects: building a validated go.Figure of a 64-rank step costs
more than analysing the step, and the slider must redraw within 200 ms of server time. Up to
GL_ROWS rows the timeline is SVG: up to PATH_BARS bars as bar traces and, where Plotly would style
many bars one by one, as one path per op and kind (layout shapes) with hover points where a bar would
hover; above PATH_BARS every bar is in such a path (hover anywhere on a bar either way). Above GL_ROWS
rows, WebGL line segments with one hover point per bar.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.analysis.lanes import lanes
from syncviz.analysis.timeline import wait_of
from syncviz.trace import schema as S
from syncviz.views import palette as P
from syncviz.views.timeline_marks import (BAND, COMM_HOVER, COMPUTE_HOVER, EXPOSED_HOVER, HOVER_EDGE, end_and_along,
                                          ends, hover_at, legend_only, path_bars, ready_ticks, rect_path, spread)

LABELS_UNMEASURED = {"ticklabeloverflow": "allow"}
"""Tick labels not measured for overflow. On a linear axis or a colour bar Plotly's default ("hide past
div") measures every tick label once for each label it draws, to hide those past the page's edge; none
reaches it here (the margins hold them). The step timeline's axes ask for "allow" since session 39 (~13 ms
of a 25-row redraw); the lateness heatmaps' axes and colour bar since session 53: a DDP step's heatmap
(256 ranks × 121 buckets), Plotly's draw in the page 43, 42 → 36, 36 ms (benchmarks/dashboard.py
--root BIG --run ddp256x150 --moves 24, HEAD and the change alternated, headless Chromium)."""


GL_ROWS = 160
# Above this many bars every bar is a path, not only the hollow spans and narrow service parts: a
# ZeRO-3 step of the four ranks the Replay draws of a 1,024-rank run (benchmarks/scale.py's 10^8 run)
# is ~3,200 bars (as bar traces each redraw took 500-580 ms in headless Chromium, session 10). Until
# session 41 those were WebGL segments, which this machine's browser paints in software (no GPU): a
# jump key press to painted 230-339 ms (median 262, 12 runs); every bar a path, alternated with them:
# 214-338 ms (median 238, 13 runs; benchmarks/dashboard.py --moves 24, each run's median; the page's
# redraw ~85-100 ms, ~60-70 of it Plotly reading the paths), and the first open ~0.35 s sooner. A DDP
# step of 64 buckets on 4 ranks is ~600 bars and keeps its bar traces.
PATH_BARS = 1500
HOLLOW = "rgba(255,255,255,0.9)"
# The outline of a hollow (waiting) span and of exposed communication, px. At 1.5 px the browser
# stroked each of a path's thousands of rectangles in full for each tile it rasterized; at 1 px it
# draws them as hairlines: the timeline of a ZeRO-3 step of benchmarks/scale.py's 10^8-event run
# rasterized in 24 -> 10 ms in headless Chromium (session 50, its own trace, 9 redraws each).
OUTLINE = 1.0
# A bucket's service bar is labelled ("b12") only where it spans this share of the time axis, ~15 px
# of a 1,000 px plot: Plotly shrinks a label to fit its bar, so on narrower bars it is unreadable,
# and laying out the labels is most of a redraw. The 1,024-rank DDP run's step (4 ranks, 484 service
# bars, none that wide): Plotly.react + the next frame 138-147 ms with every label, 84-100 ms with
# these (none), in headless Chromium (session 34, /tmp script redrawing the page's own figures).
LABEL_MIN_SPAN = 0.015
MAX_HEIGHT = 1100     # px: the figure scrolls inside itself beyond this, the page does not grow


def _ms(ns, t0) -> np.ndarray:
    return (np.asarray(ns, dtype=np.float64) - t0) / 1e6


def step_origin(*tables: pd.DataFrame) -> int:
    """Time zero of a step's timeline: its earliest compute or comm interval on any rank."""
    starts = [t["start_ns"].min() for t in tables if len(t)]
    return int(min(starts)) if starts else 0


def _key(f: pd.DataFrame) -> np.ndarray:
    return (f["rank"].to_numpy(np.int64) << 42) | (f["step"].to_numpy(np.int64) << 20) | (f["bucket"].to_numpy(np.int64) & 0xFFFFF)


def comm_bars(comm: pd.DataFrame) -> pd.DataFrame:
    """Rows to draw as comm bars: every bucket, plus collectives that are not the inner call of a
    bucket already drawn (those would cover their bucket's bar)."""
    if not len(comm):
        return comm
    is_bucket = (comm["kind"] == S.BUCKET).to_numpy()
    return comm if is_bucket.all() else comm.iloc[comm_bar_rows(comm, is_bucket)].reset_index(drop=True)


def comm_bar_rows(comm: pd.DataFrame, is_bucket: np.ndarray | None = None) -> np.ndarray:
    """comm_bars' rows as positions in ``comm``, in its order: the buckets, then the other collectives
    (``is_bucket``: which rows are buckets, where the caller has it)."""
    is_bucket = (comm["kind"] == S.BUCKET).to_numpy() if is_bucket is None else is_bucket
    if is_bucket.all():
        return np.arange(len(comm))
    coll = np.flatnonzero(~is_bucket)
    inner = (comm["bucket"].to_numpy()[coll] >= 0) & np.isin(_key(comm.iloc[coll]), _key(comm[is_bucket]))
    return np.r_[np.flatnonzero(is_bucket), coll[~inner]]


def bucket_param_labels(bmap: pd.DataFrame) -> dict:
    """(layout, bucket) -> "N params: a, b, c, … (+k)" for hover text, from analysis.bucket_map;
    layout -1 (not recorded on the event) means the latest layout."""
    out = {}
    for (lay, b), f in bmap.groupby(["layout", "bucket"]) if len(bmap) else []:
        names = f["param"].tolist()
        more = f", … (+{len(names) - 3})" if len(names) > 3 else ""
        out[(int(lay), int(b))] = f"{len(names)} params: " + ", ".join(names[:3]) + more
    if len(bmap):
        last = int(bmap["layout"].max())
        out.update({(-1, b): t for (lay, b), t in list(out.items()) if lay == last})
    return out


def _ms_text(x) -> list:
    """ "1.234 ms" per value, None where not finite (np.isfinite once for all: per value, on numpy
    scalars, it was half of this, ~1 ms a thousand values)."""
    x = np.asarray(x, dtype=float)
    return [f"{v:.3f} ms" if ok else None for v, ok in zip(x.tolist(), np.isfinite(x).tolist())]


class _Rows:
    """Row numbers (y) and names: per rank, compute then comm, comm 2, ..."""

    def __init__(self, ranks: list[int], labels: dict[int, str], comm_lanes: dict[int, int]):
        self.names: list[str] = []
        self.compute_y: dict[int, int] = {}
        self.comm_y0: dict[int, int] = {}
        self.rank_ticks: list[int] = []
        for r in ranks:
            label = labels.get(r, f"rank {r}")
            self.compute_y[r] = len(self.names)
            self.rank_ticks.append(len(self.names))
            self.names.append(f"{label} · compute")
            self.comm_y0[r] = len(self.names)
            for j in range(comm_lanes.get(r, 0)):
                self.names.append(f"{label} · comm" + (f" {j + 1}" if j else ""))


def _rows_of(ranks: pd.Series | np.ndarray, row_of: dict[int, int]) -> np.ndarray:
    """``pd.Series(ranks).map(row_of).to_numpy()``: each rank's row, by a dict lookup per value (pandas'
    map builds an index of the dict every call: ~2 ms each, five calls a drawn step, session 52)."""
    found = [row_of.get(r) for r in ranks.tolist()]
    return np.array(found, dtype=np.int64) if None not in found else pd.Series(ranks).map(row_of).to_numpy()


def _bars(name, y, start, end, color, *, role, customdata=None, hover=None, legend=True, text=None, **marker):
    t = {"type": "bar", "orientation": "h", "name": name, "y": np.asarray(y, dtype=float), "base": start,
         "x": np.asarray(end) - np.asarray(start), "width": BAND, "showlegend": legend, "legendgroup": name,
         "marker": {"color": color, **marker}, "meta": {"role": role}}
    if customdata is not None:
        t.update(customdata=customdata, hovertemplate=hover)
    else:
        t["hoverinfo"] = "skip"
    if text is not None:
        t.update(text=text, textposition="inside", insidetextanchor="middle", textfont={"size": 9},
                 constraintext="inside")
    return t


def _segments(name, y, start, end, color, width, *, role, legend=True, dash=None):
    n = len(start)
    xs, ys = np.empty(3 * n), np.empty(3 * n)
    xs[0::3], xs[1::3], xs[2::3] = start, end, np.nan
    ys[0::3], ys[1::3], ys[2::3] = y, y, np.nan
    return {"type": "scattergl", "mode": "lines", "name": name, "x": xs, "y": ys, "hoverinfo": "skip",
            "line": {"color": color, "width": width, **({"dash": dash} if dash else {})}, "showlegend": legend,
            "legendgroup": name, "connectgaps": False, "meta": {"role": role}}


def _hover_points(name, x, y, customdata, hover):
    return {"type": "scattergl", "mode": "markers", "name": name, "x": x, "y": y, "customdata": customdata,
            "hovertemplate": hover, "showlegend": False, "marker": {"size": 5, "color": "rgba(0,0,0,0.25)"},
            "meta": {"role": "hover"}}


def timeline_figure(compute: pd.DataFrame, comm: pd.DataFrame, exposed: pd.DataFrame, *, ranks: list[int],
                    labels: dict[int, str] | None = None, t0: int, title: str = "", params: dict | None = None,
                    x_range: float | None = None, max_height: int = MAX_HEIGHT) -> dict:
    """Timeline of the given ranks. ``compute`` = analysis.compute_intervals, ``comm`` =
    analysis.comm_metrics (bucket and collective rows of every rank: waiting is measured against
    all peers), ``exposed`` = analysis.exposed_intervals; ``labels`` names ranks ("rank 7 ·
    slowest"); ``params`` maps (layout, bucket) to the parameters a bucket holds."""
    labels, params = labels or {}, params or {}
    shown = set(ranks)
    bars = _bar_columns(comm, shown)
    n_bars = len(bars["rank"])
    comm_lanes = {int(r): int(bars["lane"][bars["rank"] == r].max()) + 1 for r in np.unique(bars["rank"]).tolist()}
    rows = _Rows(ranks, labels, comm_lanes)
    n_rows = len(rows.names)
    comp = compute[compute["rank"].isin(shown)]
    ex = exposed[exposed["rank"].isin(shown)]
    gl = n_rows > GL_ROWS
    paths = not gl and len(comp) + len(ex) + 2 * n_bars > PATH_BARS    # a comm bar is two: hollow and solid
    every = LABEL_MIN_SPAN * (x_range or _span_ms(comp, bars))            # hover points at most this far apart
    px_row = 26 if not gl else max(2.0, min(14.0, 900.0 / max(1, n_rows)))
    width_px = max(1.0, px_row * BAND)
    data: list[dict] = []
    shapes: list[dict] = []

    # the compute intervals' columns as arrays, each kind's rows picked from them: a frame filtered by
    # its Arrow string column once a kind was ~15% of a drawn DDP step's figure (py-spy, session 52)
    c_kind, c_rank, c_start, c_end = (comp[k].to_numpy() for k in ("kind", "rank", "start_ns", "end_ns"))
    for kind in (S.FORWARD, S.BACKWARD, S.OPTIMIZER):
        pick = np.flatnonzero(c_kind == kind)
        if not len(pick):
            continue
        y = _rows_of(c_rank[pick], rows.compute_y)
        s, e = _ms(c_start[pick], t0), _ms(c_end[pick], t0)
        label = "backward compute" if kind == S.BACKWARD else kind
        where = [rows.names[int(v)] for v in y]
        custom = list(zip([label] * len(pick), s, e, e - s, where))
        if gl:
            data.append(_segments(label, y, s, e, P.PHASE[kind], width_px, role="bar"))
            data.append(_hover_points(label, (s + e) / 2, y, custom, COMPUTE_HOVER))
        elif paths:
            data += path_bars(label, y, s, e, P.PHASE[kind], P.PHASE[kind], 0, custom, COMPUTE_HOVER, every, shapes,
                               role="bar")
        else:
            data.append(_bars(label, y, s, e, P.PHASE[kind], role="bar", customdata=custom, hover=COMPUTE_HOVER))

    if len(ex):
        y = _rows_of(ex["rank"], rows.compute_y)
        s, e = _ms(ex["start_ns"], t0), _ms(ex["end_ns"], t0)
        custom = list(zip(s, e, e - s, [rows.names[int(v)] for v in y]))
        name = "exposed comm (no compute)"
        if gl:
            data.append(_segments(name, y, s, e, P.EXPOSED, width_px, role="exposed"))
        elif paths:      # a layout shape has no fill pattern: the hatch is a tint
            data += path_bars(name, y, s, e, P.EXPOSED_TINT, P.EXPOSED, OUTLINE, custom, EXPOSED_HOVER, every, shapes,
                               role="exposed")
        else:
            data.append(_bars(name, y, s, e, "rgba(0,0,0,0)", role="exposed", customdata=custom, hover=EXPOSED_HOVER,
                              pattern={"shape": "/", "fgcolor": P.EXPOSED, "bgcolor": "rgba(0,0,0,0)",
                                       "fillmode": "overlay", "size": 6, "solidity": 0.5},
                              line={"width": OUTLINE, "color": P.EXPOSED}))

    if n_bars:
        data += _comm_traces(bars, rows, t0, params, gl, width_px, every, shapes, paths)

    height = int(min(max_height, 130 + n_rows * px_row))
    dense = gl or (height - 130) / max(1, n_rows) < 11      # row labels would print over each other
    tickvals = list(range(n_rows)) if not dense else rows.rank_ticks
    ticktext = rows.names if not dense else [rows.names[i].replace(" · compute", "") for i in rows.rank_ticks]
    if dense and len(tickvals) > 40:
        every = int(np.ceil(len(tickvals) / 32))
        tickvals, ticktext = tickvals[::every], ticktext[::every]
    layout = {
        "title": {"text": title, "x": 0.01, "y": 0.99, "yanchor": "top", "font": {"size": 14}},
        "barmode": "overlay", "height": height, "margin": {"l": 150, "r": 20, "t": 80, "b": 40},
        "xaxis": {"title": {"text": "ms since the step's first event"}, "zeroline": False, "showgrid": True,
                  **LABELS_UNMEASURED},
        "yaxis": {"tickvals": tickvals, "ticktext": ticktext, "autorange": "reversed", "zeroline": False,
                  "showgrid": False, "tickfont": {"size": 10}, "range": None, **LABELS_UNMEASURED},
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "font": {"size": 11}},
        "hovermode": "closest", "plot_bgcolor": "#fbfbfd", "uirevision": "timeline",
        "meta": {"rows": rows.names},
    }
    if shapes:
        layout["shapes"] = shapes
    del layout["yaxis"]["range"]
    if x_range:   # one time axis for every step of the run, so playing shows change, not rescaling
        layout["xaxis"]["range"] = [-0.01 * x_range, 1.01 * x_range]
    return {"data": data, "layout": layout}


def _span_ms(comp: pd.DataFrame, bars: dict) -> float:
    """The time the drawn bars cover, in ms (the x-axis's extent when no range is given)."""
    starts = np.concatenate([comp["start_ns"].to_numpy(), bars["start_ns"]])
    ends = np.concatenate([comp["end_ns"].to_numpy(), bars["end_ns"]])
    return float(ends.max() - starts.min()) / 1e6 if len(starts) else 0.0


# comm_metrics' columns a comm bar is drawn from (_bar_columns), as they are and as floats
BAR_COLUMNS = ("rank", "start_ns", "end_ns", "bucket", "layout", "ready_ns", "bytes", "exposed_ns")
BAR_FLOATS = ("service_ns", "launch_delay_ns", "busbw_gbps")


def _bar_columns(comm: pd.DataFrame, shown: set) -> dict:
    """comm_bars' rows (in its order) of the ``shown`` ranks, with collective_parts' ``wait_ns`` and
    ``lane`` (measured over every rank's bars, as before), as arrays by column: BAR_COLUMNS, BAR_FLOATS,
    ``op`` (str), ``is_bucket``. Why arrays: the bars' frame, concatenated with its parts and filtered by
    rank, copied comm_metrics' ~34 columns twice (~20% of a drawn 1,024-rank DDP step's figure, py-spy,
    session 52); the same values in the same order."""
    if not len(comm):
        return {k: np.zeros(0) for k in (*BAR_COLUMNS, *BAR_FLOATS, "wait_ns", "lane", "op", "is_bucket")}
    is_bucket = (comm["kind"] == S.BUCKET).to_numpy()
    at = comm_bar_rows(comm, is_bucket)
    col = {k: comm[k].to_numpy()[at] for k in BAR_COLUMNS}
    col.update({k: comm[k].to_numpy(dtype=float)[at] for k in BAR_FLOATS})
    col["wait_ns"] = wait_of(col["start_ns"], col["end_ns"], col["service_ns"])
    col["lane"] = lanes(col["start_ns"], col["end_ns"], groups=col["rank"])
    col["op"] = comm["op"].astype(str).to_numpy()[at]
    col["is_bucket"] = is_bucket[at]
    mine = np.flatnonzero(np.isin(col["rank"], list(shown)))
    return {k: v[mine] for k, v in col.items()}


def _comm_traces(bars: dict, rows: _Rows, t0: int, params: dict, gl: bool, width_px: float,
                 min_label_ms: float, shapes: list[dict], paths: bool = False) -> list[dict]:
    """Per op: the hollow whole span (role "bar": these never overlap within a row), the solid
    service part inside it, and in SVG the gradient-ready marks. A service part at least
    ``min_label_ms`` long (LABEL_MIN_SPAN of the axis) is a bar, labelled with its bucket's number,
    unless ``paths`` (every bar a path: timeline_figure); in SVG the hollow spans, the other service
    parts and the marks are appended to ``shapes`` (layout shapes, see rect_path), each with hover
    points where a bar trace would hover."""
    out = []
    y_all = _rows_of(bars["rank"], rows.comm_y0) + bars["lane"]
    # the columns drawn are arrays (_bar_columns): a frame sliced per op (iloc) took its ~34 columns
    # along, ~3 ms an op on the 1,024-rank ZeRO-3 step (its string columns Arrow-backed)
    for op in sorted(set(bars["op"].tolist())):
        idx = np.flatnonzero(bars["op"] == op)
        f = {k: v[idx] for k, v in bars.items()}
        y = y_all[idx]
        s, e = _ms(f["start_ns"], t0), _ms(f["end_ns"], t0)
        svc = f["service_ns"]
        svc_start = np.where(np.isnan(svc), s, e - svc / 1e6)
        color = P.op_color(op)
        bucket = f["bucket"]
        is_bucket = f["is_bucket"]
        what = np.where(bucket >= 0, "bucket " + bucket.astype(str).astype(object) + " " + op, op or "collective")
        held = [params.get((int(lay), int(b)), "") for lay, b in zip(f["layout"].tolist(), bucket.tolist())]
        ready = np.where(f["ready_ns"] >= 0, _ms(f["ready_ns"], t0), np.nan)
        custom = list(zip(
            what, [P.fmt_mb(b) for b in f["bytes"].tolist()], s, e, e - s,
            [t or "n/a" for t in _ms_text(f["wait_ns"] / 1e6)], [t or "n/a (clock error)" for t in _ms_text(svc / 1e6)],
            [("at " + t) if t else "n/a" for t in _ms_text(ready)],
            [t or "n/a" for t in _ms_text(f["launch_delay_ns"] / 1e6)],
            [f"{v:.2f} GB/s" if ok else "n/a" for v, ok in zip(f["busbw_gbps"].tolist(), np.isfinite(f["busbw_gbps"]).tolist())],
            f["exposed_ns"] / 1e6,
            [f"{rows.names[int(v)]}" + (f"<br>{h}" if h else "") for v, h in zip(y.tolist(), held)]))
        name = op or "collective"
        if gl:
            out.append(_segments(f"{name} (waiting)", y, s, svc_start, color, max(1.0, width_px * 0.35),
                                 role="bar", legend=True, dash="dot"))
            out.append(_segments(name, y, svc_start, e, color, width_px, role="service"))
            out.append(_hover_points(name, (s + e) / 2, y, custom, COMM_HOVER))
            continue
        wide = (e - svc_start >= min_label_ms) & (not paths)
        hollow = f"{name} waiting (hollow)"
        shapes.append(rect_path(hollow, y, s, e, HOLLOW, color, OUTLINE))
        out.append(legend_only(hollow, HOLLOW, color, OUTLINE))
        first, last = ends(s, e, min_label_ms * HOVER_EDGE)
        out.append(hover_at(hollow, first, y, custom, color, role="bar", hollow=True))
        x_more, more = spread(s, svc_start, min_label_ms)        # along waiting parts too wide for one
        if len(more):
            out.append(hover_at(hollow, x_more, y[more], [custom[i] for i in more], color, role="hover", hollow=True))
        # the service parts: wide ones a bar trace (hover anywhere, a label), narrow ones one path
        w, n = np.flatnonzero(wide), np.flatnonzero(~wide)
        if len(w):
            label = np.where(is_bucket[w], "b" + bucket[w].astype(str).astype(object), "").tolist()
            out.append(_bars(name, y[w], svc_start[w], e[w], color, role="service", customdata=[custom[i] for i in w],
                             hover=COMM_HOVER, text=label, line={"width": 0.5, "color": color}))
            # inside a bar Plotly's hover distance is ~19 px: a neighbour's point nearer than that would
            # win, so a wide service part has its own points along it and at its end too
            out.append(hover_at(name, *end_and_along(svc_start[w], e[w], last[w], y[w], [custom[i] for i in w],
                                                     min_label_ms), color, role="hover"))
        else:
            out.append(legend_only(name, color, color, 0.5))
        if len(n):
            shapes.append(rect_path(name, y[n], svc_start[n], e[n], color, color, 0.5))
            out.append(hover_at(name, *end_and_along(svc_start[n], e[n], last[n], y[n], [custom[i] for i in n],
                                                     min_label_ms), color, role="service"))
        has_ready = np.isfinite(ready)
        if has_ready.any():
            shapes.append(ready_ticks(ready[has_ready], y[has_ready] - BAND / 2))
    return out
