"""Figure builders of the Replay page: plain functions of analysis tables -> Plotly figure dicts.

The step timeline itself is syncviz/views/timeline.py (the HTML report draws the same one); here
the Replay page's other figures. Colours come from syncviz/views/palette.py.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.views import palette as P
from syncviz.views.timeline import GL_ROWS, LABELS_UNMEASURED, comm_bars, step_origin, timeline_figure  # noqa: F401

GL_LANES = 16        # above this many ranks, "auto" draws the fastest, median and slowest rank
BUCKET_SCALE = P.BUCKET_SCALE
COMPUTE_COLORS = P.PHASE
EXPOSED_COLOR = P.EXPOSED


MAX_HEAT_ROWS = 300
"""Rows of the lateness heatmap at most. It is at most 700 px tall, so above ~300 ranks a rank had
under 2 px and the browser could not show them apart anyway; more ranks are binned, a row per k
ranks holding the latest of them (the straggler stays the hot row). At 1,024 ranks (k = 4) this
took the heatmap's JSON from 1.68 MB to 0.43 MB a step change, and its redraw in headless Chromium
from 66 to 38 ms (medians of 15 step changes each way, alternated; benchmarks/scale.py's run of
10^8 events, session 17). The whole change drawn moved within its noise (367 → 359 ms): most of it
is the response (~130 ms) and the browser painting the WebGL timeline (~125 ms, software GL)."""


def heat_colorbar() -> dict:
    """The lateness heatmaps' colour bar (a fresh dict: a figure is a tree its callers may change)."""
    return {"title": {"text": "ms late", "side": "right"}, "thickness": 12, "len": 0.9, **LABELS_UNMEASURED}


HEAT_MARGIN_R = 120
"""The heatmap's right margin, px, wide enough for its colour bar: with 20, Plotly widened it to fit the
bar (96-110 px, as its tick labels' widths changed from step to step), so the plot moved sideways on a
step change and each such widening drew the whole figure a second time."""


def lateness_figure(lateness: pd.DataFrame, title: str = "") -> dict:
    """Rank × bucket heatmap of launch lateness (analysis.sync_lateness) for one step, in ms: the
    straggler is the hot row. A step without buckets (ZeRO-3, FSDP) has a column per collective.
    Above MAX_HEAT_ROWS ranks a row holds k ranks ("512–515"), the latest of them."""
    if not len(lateness):
        return empty_figure("no collectives in this step")
    # rank × bucket grid (max over micro-steps), filled with numpy: pivot_table costs ~20 ms here,
    # and np.unique's sorts and np.maximum.at ~25 ms at 1,024 ranks × 243 collectives (session 10).
    ranks, r_idx = _codes(lateness["rank"].to_numpy())
    k, rows = rank_rows(ranks)
    r_idx = r_idx // k
    buckets, b_idx = _codes(lateness["bucket"].to_numpy())
    first = lateness.drop_duplicates("bucket").set_index("bucket")["label"] if "label" in lateness else None
    # labelled: any row has a label. A step's columns each carry one label (all buckets: "", or all
    # collectives: "op #n"), so a column's first row answers it (243 strings, not 250,000); every row
    # is compared only when those say no, as the rule was stated before: in numpy, not pandas (a DDP
    # step of 1,024 ranks, where every row is compared: 124,000 labels in 1.5 ms against 7.1 ms, session 52).
    labelled = first is not None and ((first != "").any() or (lateness["label"].to_numpy() != "").any())
    what = "collective" if labelled else "bucket"
    title = title.replace("{what}", what)
    z = _max_grid(r_idx, b_idx, lateness["late_ns"].to_numpy(dtype=float) / 1e6, (len(rows), len(buckets)))
    z[np.isinf(z)] = np.nan      # a gap in the heatmap (null in its JSON)
    # to the µs, as the timeline's hovers: this hover prints 0.01 ms and no colour step is finer. In
    # full float64 precision z was 370 of the 702 kB a jump on the 1,024-rank DDP run sends; 278 kB so
    # (session 34)
    z = np.round(z, 3)
    yaxis = {"title": {"text": "rank"}, "autorange": "reversed", **LABELS_UNMEASURED}
    who, when = "rank", "launched"
    if k > 1:
        yaxis.update(binned_rows_axis(k, rows))
        who, when = "ranks", "the latest launched"
        title += f" · a row per {k} ranks: the latest of them"
    elif len(ranks) <= 32:   # integer ticks at the rows, not -0.5 / 0.5 / 1.5
        yaxis.update(tickmode="array", tickvals=ranks.tolist(), ticktext=[str(r) for r in ranks])
    xaxis = {"title": {"text": what if not labelled else "collective, in order of first launch"}, **LABELS_UNMEASURED}
    x = buckets.tolist()
    if labelled:   # "all_gather #3": the collective's op and its place in the step's launch order, as categories
        x = [str(first.get(b, b)) for b in buckets]
        xaxis.update(type="category")
        if len(x) > 40:   # names under 243 columns were cut to "all_gat" and overlapped: every k-th number
            every = label_stride(len(x), 15)     # not k: that is ranks per row, which sets the left margin
            xaxis.update(tickmode="array", tickvals=x[::every], ticktext=[str(b) for b in buckets[::every]])
    elif len(buckets) <= 40:
        xaxis.update(tickmode="array", tickvals=x, ticktext=[str(b) for b in x])
    height = int(min(700, max(260, 140 + 8 * len(rows))))
    # The colour scale runs from 0 ms (the first rank), zmin and zmax both set: Plotly ignores a zmin
    # set alone and took the cells' own minimum, after a pass over every cell for each bound.
    zmax = float(np.nanmax(z)) if np.isfinite(z).any() else 0.0
    # The hover names the column by its x: a name per cell (customdata) was half of the 7.2 MB this
    # figure took for one step of the 1,024-rank run (benchmarks/scale.py's 10^8-event run).
    # z and y stay numpy arrays: Dash's JSON (plotly's, with orjson) falls back to walking every
    # element when a response holds components (the Replay's cards), and a 1,024 × 243 z as lists
    # cost ~150 ms of that walk per step change; arrays are passed to orjson whole (session 10).
    return {"data": [{"type": "heatmap", "z": z, "x": x,
                      "y": rows, "colorscale": P.HEAT_SCALE, "zmin": 0, "zmax": max(zmax, 1e-3),
                      "colorbar": heat_colorbar(),
                      "hovertemplate": (f"{who} %{{y}} · {what} %{{x}}<br>{when} %{{z:.2f}} ms after the first rank"
                                        "<extra></extra>")}],
            "layout": {"title": {"text": title, "x": 0.01, "font": {"size": 14}},
                       "height": height, "margin": {"l": 70 if k == 1 else 100, "r": HEAT_MARGIN_R, "t": 50, "b": 50},
                       "xaxis": xaxis, "yaxis": yaxis}}


def rank_rows(ranks: np.ndarray) -> tuple[int, np.ndarray | list]:
    """(k, rows) of a heatmap with a row per rank (``ranks`` sorted): k ranks a row, so that there are
    at most MAX_HEAT_ROWS rows, each named by its ranks ("512–515") where k > 1; the i-th rank is in
    row i // k, whose cell the caller fills with the latest of them (the straggler stays the hot row)."""
    k = max(1, -(-len(ranks) // MAX_HEAT_ROWS))
    if k == 1:
        return 1, ranks
    last = ranks[np.minimum(np.arange(k - 1, len(ranks) + k - 1, k), len(ranks) - 1)]
    return k, [f"{a}–{b}" for a, b in zip(ranks[::k].tolist(), last.tolist())]


MAX_ROW_TICKS = 16
"""Labelled rows of a binned heatmap at most. On a category axis Plotly labels as many rows as fit,
43 of the 1,024-rank run's 256 ("0–3", "24–27", ...), each label laid out and measured on every
redraw. With every 20th row labelled (13) a DDP step's heatmap redrew and reached its next frame in
27.0-31.1 ms against 37.3-41.4 ms in headless Chromium (session 51: the page's own heatmaps of
benchmarks/scale.py's 10^8-event DDP run, Plotly.react then the next frame, medians of 27 redraws
each way, alternated, three runs)."""


def binned_rows_axis(k: int, rows: list[str]) -> dict:
    """The y axis of a heatmap with k > 1 ranks a row (rank_rows): a category per row, every j-th
    row labelled (label_stride: at most MAX_ROW_TICKS are); the hover still names every row."""
    j = label_stride(len(rows), MAX_ROW_TICKS)
    return {"title": {"text": f"ranks, {k} a row"}, "type": "category", "tickmode": "array",
            "tickvals": rows[::j], "ticktext": rows[::j]}


def label_stride(n: int, most: int) -> int:
    """Label every j-th of ``n`` ticks, j the first of 1, 2, 5, 10, 20, 50, ... that leaves at most
    ``most`` labels."""
    return next(j for j in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9) if -(-n // j) <= most)


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) of integers, by counting when their range is small
    (ranks, bucket and collective numbers) rather than sorting."""
    if not len(values) or values.dtype.kind not in "iu":
        return np.unique(values, return_inverse=True)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 4 * len(values) + 1024:
        return np.unique(values, return_inverse=True)
    present = np.bincount(values - lo, minlength=hi - lo + 1) > 0
    code = np.cumsum(present) - 1
    return (np.flatnonzero(present) + lo).astype(values.dtype), code[values - lo]


def _max_grid(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The largest value per (row, col) cell, -inf where none."""
    z = np.full(shape, -np.inf)
    flat = rows * shape[1] + cols
    if len(flat) and np.bincount(flat, minlength=z.size).max() == 1:   # one value a cell: no reduction needed
        z.ravel()[flat] = values
    else:
        np.maximum.at(z.ravel(), flat, values)
    return z


def empty_figure(message: str) -> dict:
    return {"data": [], "layout": {"height": 220, "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                   "annotations": [{"text": message, "showarrow": False, "font": {"size": 14},
                                                    "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]}}
