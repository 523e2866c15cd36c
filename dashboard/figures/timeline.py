"""Figure builders of the Replay page: plain functions of analysis tables -> Plotly figure dicts.

The step timeline itself is syncviz/views/timeline.py (the HTML report draws the same one); here
the Replay page's other figures. Colours come from syncviz/views/palette.py.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.views import palette as P
from syncviz.views.timeline import GL_ROWS, comm_bars, step_origin, timeline_figure  # noqa: F401

GL_LANES = 16        # above this many ranks, "auto" draws the fastest, median and slowest rank
BUCKET_SCALE = P.BUCKET_SCALE
COMPUTE_COLORS = P.PHASE
EXPOSED_COLOR = P.EXPOSED


def lateness_figure(lateness: pd.DataFrame, title: str = "") -> dict:
    """Rank × bucket heatmap of launch lateness (analysis.sync_lateness) for one step, in ms: the
    straggler is the hot row. A step without buckets (ZeRO-3, FSDP) has a column per collective."""
    if not len(lateness):
        return empty_figure("no collectives in this step")
    labelled = "label" in lateness and (lateness["label"] != "").any()
    what = "collective" if labelled else "bucket"
    title = title.replace("{what}", what)
    # rank × bucket grid (max over micro-steps), filled with numpy: pivot_table costs ~20 ms here.
    ranks, r_idx = np.unique(lateness["rank"].to_numpy(), return_inverse=True)
    buckets, b_idx = np.unique(lateness["bucket"].to_numpy(), return_inverse=True)
    z = np.full((len(ranks), len(buckets)), -np.inf)
    np.maximum.at(z, (r_idx, b_idx), lateness["late_ns"].to_numpy(dtype=float) / 1e6)
    z = np.where(np.isinf(z), None, z)
    yaxis = {"title": {"text": "rank"}, "autorange": "reversed"}
    if len(ranks) <= 32:   # integer ticks at the rows, not -0.5 / 0.5 / 1.5
        yaxis.update(tickmode="array", tickvals=ranks.tolist(), ticktext=[str(r) for r in ranks])
    xaxis = {"title": {"text": what if not labelled else "collective, in order of first launch"}}
    x = buckets.tolist()
    if labelled:   # "all_gather #3": the collective's op and its place in the step's launch order, as categories
        first = lateness.drop_duplicates("bucket").set_index("bucket")["label"]
        x = [str(first.get(b, b)) for b in buckets]
        xaxis.update(type="category")
        if len(x) > 40:   # names under 243 columns were cut to "all_gat" and overlapped: every k-th number
            k = next(k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9) if len(x) / k <= 15)
            xaxis.update(tickmode="array", tickvals=x[::k], ticktext=[str(b) for b in buckets[::k]])
    elif len(buckets) <= 40:
        xaxis.update(tickmode="array", tickvals=x, ticktext=[str(b) for b in x])
    height = int(min(700, max(260, 140 + 8 * len(ranks))))
    # The hover names the column by its x: a name per cell (customdata) was half of the 7.2 MB this
    # figure took for one step of the 1,024-rank run (benchmarks/scale.py's 10^8-event run).
    return {"data": [{"type": "heatmap", "z": z.tolist(), "x": x,
                      "y": ranks.tolist(), "colorscale": P.HEAT_SCALE, "zmin": 0,
                      "colorbar": {"title": {"text": "ms late", "side": "right"}, "thickness": 12, "len": 0.9},
                      "hovertemplate": (f"rank %{{y}} · {what} %{{x}}<br>launched %{{z:.2f}} ms after the first rank"
                                        "<extra></extra>")}],
            "layout": {"title": {"text": title, "x": 0.01, "font": {"size": 14}},
                       "height": height, "margin": {"l": 70, "r": 20, "t": 50, "b": 50},
                       "xaxis": xaxis, "yaxis": yaxis}}


def empty_figure(message: str) -> dict:
    return {"data": [], "layout": {"height": 220, "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                   "annotations": [{"text": message, "showarrow": False, "font": {"size": 14},
                                                    "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]}}
