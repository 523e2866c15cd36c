"""The timeline's marks drawn in SVG paths (layout shapes) and the hover points that hold them:
views.timeline decides what is drawn and how (bar traces, paths, WebGL); these draw bars, ticks and
legend entries as paths and put hover points where a bar trace would hover."""
from __future__ import annotations

import numpy as np

from syncviz.views import palette as P

BAND = 0.7            # bar thickness, in rows
# How far inside each end of a span its first and last hover points lie (ends), as a share of
# views.timeline.LABEL_MIN_SPAN: ~0.3 px of a 1,175 px plot, so no cursor inside the span is nearer a neighbour's point.
HOVER_EDGE = 1 / 64

COMM_HOVER = ("<b>%{customdata[0]}</b> · %{customdata[1]}<br>"
              "start %{customdata[2]:.3f} ms · end %{customdata[3]:.3f} ms · duration %{customdata[4]:.3f} ms<br>"
              "waiting %{customdata[5]} · service %{customdata[6]}<br>"
              "gradients ready %{customdata[7]} · launch delay %{customdata[8]}<br>"
              "busbw %{customdata[9]} · exposed %{customdata[10]:.3f} ms<br>%{customdata[11]}<extra></extra>")
COMPUTE_HOVER = ("<b>%{customdata[0]}</b> · %{customdata[4]}<br>"
                 "start %{customdata[1]:.3f} ms · end %{customdata[2]:.3f} ms · duration %{customdata[3]:.3f} ms<extra></extra>")
EXPOSED_HOVER = ("<b>exposed communication</b> · %{customdata[3]}<br>nobody on this rank computes while a collective runs<br>"
                 "start %{customdata[0]:.3f} ms · end %{customdata[1]:.3f} ms · duration %{customdata[2]:.3f} ms<extra></extra>")


# In SVG, each collective's hollow whole span, its service part where that is narrow (under
# LABEL_MIN_SPAN of the axis) and the gradient-ready marks are layout shapes, one SVG path per op
# and kind, not bar or marker traces: Plotly styles a trace's bars and markers one by one (two colour
# parses each), which was most of a redraw. The 1,024-rank DDP run's step (4 ranks, 484 collectives)
# in headless Chromium, Plotly.react + the next frame (/tmp/exp/variants.py, the page's own figures):
# 108.6 ms as bar and marker traces, 73.5 ms with the spans and marks as paths, 60.7 ms with tick labels
# not measured for overflow (ticklabeloverflow "allow", in views.timeline), 44.5 ms with the narrow service parts
# as paths too (session 39); above PATH_BARS every bar (session 41). Hover stays anywhere on a bar: a
# wide service part is a bar trace; every part drawn in a path has a point just inside its start and
# its end (ends) and one every LABEL_MIN_SPAN of the axis between (spread), which Plotly's hover
# distance (20 px) reaches from anywhere on the bar.
def nums(values) -> map:
    """Numbers as path text, each the shortest that reads back exactly (repr): a path's bars keep the
    times the tests compare."""
    return map(repr, np.asarray(values, dtype=float).tolist())


def rect_path(name, y, start, end, fill, line, width) -> dict:
    """Bars from ``start`` to ``end`` on rows ``y`` as one SVG path (a layout shape, drawn between
    the grid and the traces, as a bar trace is); its legend entry is legend_only's."""
    # a row's two edges as text once (a step's bars lie on a few rows): 3.9 -> 2.7 ms for the ~3,250
    # bars of a 1,024-rank ZeRO-3 step's four ranks (timeit); the same text, number for number
    rows = np.asarray(y, dtype=float).tolist()
    top = {v: f",{v - BAND / 2!r}H" for v in set(rows)}
    bottom = {v: f"V{v + BAND / 2!r}H" for v in top}
    path = "".join([f"M{a}{top[v]}{b}{bottom[v]}{a}Z" for a, v, b in zip(nums(start), rows, nums(end))])
    return {"type": "path", "path": path, "layer": "between", "fillcolor": fill,
            "line": {"width": width, "color": line}, "name": name, "legendgroup": name}


def legend_only(name, fill, line, width) -> dict:
    """A bar trace with no bar: the legend entry (a bar's swatch) of a shape's bars; clicking it
    hides its legendgroup, shapes included."""
    return {"type": "bar", "orientation": "h", "name": name, "x": [None], "y": [None], "legendgroup": name,
            "hoverinfo": "skip", "marker": {"color": fill, "line": {"width": width, "color": line}},
            "meta": {"role": "legend"}}


def ready_ticks(x, y_top) -> dict:
    """The gradient-ready marks: a short tick above the bar at each time (one path; zoom keeps a
    vertical tick a tick, where a triangle in data units would stretch). The bar's hover gives the time."""
    y_top = np.asarray(y_top, dtype=float)
    path = "".join(f"M{a},{y0}V{y1}" for a, y0, y1 in zip(nums(x), nums(y_top - 0.25), nums(y_top)))
    return {"type": "path", "path": path, "layer": "above", "line": {"width": 1.5, "color": P.READY},
            "name": "gradients ready"}


def spread(start: np.ndarray, end: np.ndarray, every: float) -> tuple[np.ndarray, np.ndarray]:
    """Hover points along the parts [start, end) longer than ``every``: (x, index of the part), at
    most ``every`` apart, so that one is within hover distance of any point of the part."""
    width = np.asarray(end, dtype=float) - np.asarray(start, dtype=float)
    k = np.where(width > every, np.ceil(width / every) if every > 0 else 1, 0).astype(np.int64)
    idx = np.repeat(np.arange(len(k)), k)
    j = np.arange(len(idx)) - np.repeat(np.cumsum(k) - k, k)          # 0..k-1 within each part
    return np.asarray(start, dtype=float)[idx] + (j + 0.5) * width[idx] / k[idx], idx


def ends(start: np.ndarray, end: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Where a collective's span [start, end] gets its first and last hover points: ``eps`` inside
    each end (at its middle when it is shorter than 2 ``eps``). Plotly hovers the point nearest the
    cursor, and a neighbour's point is outside the span: with a point this near each end, a cursor
    anywhere inside is nearer one of the span's own points, which spread keeps at most 1.5
    LABEL_MIN_SPAN apart (~13 px from any x on a 1,175 px plot: within Plotly's 20 px). Without
    them, on the 10^8-event DDP run's step, 32 of 81 cursors 2 px into a waiting part showed the
    collective before, whose narrow service part's point was a few px away and the span's own first
    point ~12 px (session 40)."""
    start, end = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    mid = (start + end) / 2
    return np.minimum(start + eps, mid), np.maximum(end - eps, mid)


def end_and_along(start, end, last, y, customdata: list, every: float) -> tuple:
    """Hover points just inside each part's end (``last``: ends' second) and along it (spread, at most
    ``every`` apart): their x, y and customdata, the parts' own first and then those along them."""
    x_more, more = spread(start, end, every)
    return np.concatenate([last, x_more]), np.concatenate([y, y[more]]), customdata + [customdata[i] for i in more]


def hover_at(name, x, y, customdata, color, *, role, hollow: bool = False, template: str = COMM_HOVER) -> dict:
    """Hover points (drawn as nothing: mode "none") at ``x`` for bars a shape draws, with their
    customdata (a collective's start and end at [2] and [3], a compute bar's at [1] and [2]). Role
    "bar" (compute, or a collective's whole span) and "exposed": a point each, just inside its start
    (ends); these bars never share a row; "hover": more, at a wide service part's or compute bar's
    end (ends) and along long parts (spread); "service": the service parts that are paths, at
    their end and along them. ``hollow``: points on the hollow spans (their label is white)."""
    return {"type": "scatter", "mode": "none", "name": name, "x": x, "y": np.asarray(y, dtype=float),
            "customdata": customdata, "hovertemplate": template, "showlegend": False, "legendgroup": name,
            # the label a bar of that fill would get: a hollow span's white, a service part's colour
            "hoverlabel": {"bgcolor": "white", "bordercolor": color, "font": {"color": "black"}}
            if hollow else {"bgcolor": color}, "meta": {"role": role}}


def path_bars(name, y, start, end, fill, line, width, custom, template, every, shapes, *, role) -> list[dict]:
    """Bars as one path (appended to ``shapes``), their legend entry, and their hover points: one
    a bar just inside its start (``role``), then just inside its end and along it (role "hover"),
    ``every`` ms of the axis apart at most (LABEL_MIN_SPAN; see ends)."""
    shapes.append(rect_path(name, y, start, end, fill, line, width))
    first, last = ends(start, end, every * HOVER_EDGE)
    return [legend_only(name, fill, line, width),
            hover_at(name, first, y, custom, line, role=role, template=template),
            hover_at(name, *end_and_along(start, end, last, y, custom, every), line, role="hover", template=template)]
