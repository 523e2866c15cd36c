"""Figure builders of the Replay page: plain functions of analysis tables -> Plotly figure dicts.

One lane per rank (or per min / median / max over ranks): the upper band shows compute (forward,
backward compute, optimizer), the lower band one bar per bucket collective coloured by bucket,
with its ready (▼) → launch (|) → done (|) marks and the exposed part of comm hatched in red.

Figures are dicts, not plotly.graph_objects: building a validated go.Figure of a 64-rank step
costs more than analysing the step, and the slider must redraw within 200 ms of server time.
Up to GL_LANES lanes are drawn as SVG bars (hover anywhere on a bar); more lanes are drawn with
WebGL (Scattergl) as thick line segments with one hover point per bar.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.trace import schema as S

GL_LANES = 16
# Viridis (purple → green → yellow) for buckets: no red in it, red is reserved for exposed comm.
BUCKET_SCALE = "Viridis"
COMPUTE_COLORS = {S.FORWARD: "#9fb3cf", S.BACKWARD: "#5f7fae", S.OPTIMIZER: "#d8b877"}
OP_COLORS = {"all_gather": "#8c564b", "reduce_scatter": "#e377c2", "broadcast": "#7f7f7f",
             "all_reduce": "#17becf"}
EXPOSED_COLOR = "#d62728"
COMP_DY, COMM_DY, BAND = -0.2, 0.2, 0.34   # lane offsets and band thickness (lane units)

BUCKET_HOVER = ("<b>bucket %{customdata[0]}</b> · %{customdata[1]} · %{customdata[12]}<br>"
                "%{customdata[2]:.2f} MB · %{customdata[3]}<br>"
                "ready %{customdata[4]:.2f} → launch %{customdata[5]:.2f} → done %{customdata[6]:.2f} ms<br>"
                "duration %{customdata[7]:.2f} ms · launch delay %{customdata[8]:.2f} ms<br>"
                "algbw %{customdata[9]:.2f} GB/s · busbw %{customdata[10]:.2f} GB/s<br>"
                "exposed %{customdata[11]:.2f} ms<extra></extra>")


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
    if is_bucket.all():
        return comm
    coll = comm[~is_bucket]
    inner = (coll["bucket"].to_numpy() >= 0) & np.isin(_key(coll), _key(comm[is_bucket]))
    return pd.concat([comm[is_bucket], coll[~inner]], ignore_index=True)


def _hover_data(bars: pd.DataFrame, t0: int, params: dict, lane_names: list[str]) -> list:
    ready = np.where(bars["ready_ns"] >= 0, _ms(bars["ready_ns"], t0), np.nan)
    cols = [bars["bucket"].to_numpy(), bars["op"].astype(str).to_numpy(),
            bars["bytes"].to_numpy() / 1e6,
            [params.get((int(l), int(b)), "") for l, b in zip(bars["layout"], bars["bucket"])],
            ready, _ms(bars["launch_ns"], t0), _ms(bars["end_ns"], t0),
            bars["duration_ns"].to_numpy() / 1e6, bars["launch_delay_ns"].to_numpy() / 1e6,
            bars["algbw_gbps"].to_numpy(), bars["busbw_gbps"].to_numpy(),
            bars["exposed_ns"].to_numpy() / 1e6, [lane_names[int(r)] for r in bars["_lane"]]]
    out = np.empty((len(bars), len(cols)), dtype=object)
    for j, c in enumerate(cols):
        out[:, j] = c
    out[pd.isna(out)] = None   # JSON null, not NaN
    return out.tolist()


def _svg_bars(name, y, start, end, color, hover=None, customdata=None, legend=True, **marker):
    trace = {"type": "bar", "orientation": "h", "name": name, "y": y, "base": start,
             "x": np.asarray(end) - np.asarray(start), "width": BAND, "showlegend": legend,
             "marker": {"color": color, **marker}}
    if customdata is not None:
        trace.update(customdata=customdata, hovertemplate=hover)
    else:
        trace.update(hovertemplate=hover or f"{name} %{{base:.2f}} ms + %{{x:.2f}} ms<extra>%{{y}}</extra>")
    return trace


def _gl_segments(name, y, start, end, color, width, legend=True):
    n = len(start)
    xs = np.empty(3 * n)
    ys = np.empty(3 * n)
    xs[0::3], xs[1::3], xs[2::3] = start, end, np.nan
    ys[0::3], ys[1::3], ys[2::3] = y, y, np.nan
    return {"type": "scattergl", "mode": "lines", "name": name, "x": xs, "y": ys, "hoverinfo": "skip",
            "line": {"color": color, "width": width}, "showlegend": legend, "connectgaps": False}


def _bucket_colorbar(n_buckets: int) -> dict:
    bar = {"title": {"text": "bucket"}, "thickness": 12}
    if n_buckets <= 12:
        bar["dtick"] = 1   # integer bucket indices, not 0.5 steps
    return bar


def _bucket_colors(buckets: np.ndarray, n_buckets: int) -> list[str]:
    from plotly.colors import sample_colorscale
    pos = np.clip(buckets, 0, None) / max(1, n_buckets - 1)
    return sample_colorscale(BUCKET_SCALE, list(pos))


def timeline_figure(compute: pd.DataFrame, comm: pd.DataFrame, exposed: pd.DataFrame, *,
                    lane_names: list[str], t0: int, title: str = "", params: dict | None = None,
                    x_range: float | None = None, n_buckets: int | None = None,
                    lane_of: dict | None = None) -> dict:
    """Timeline of one step. ``compute`` = analysis.compute_intervals, ``comm`` = analysis.comm_metrics
    (bucket and collective rows), ``exposed`` = analysis.exposed_intervals, all for one step; lane i
    holds rank (or statistic) ``lane_of`` -> i (default: rank value is the lane)."""
    params = params or {}
    lane_of = lane_of or {i: i for i in range(len(lane_names))}
    n_lanes = len(lane_names)
    gl = n_lanes > GL_LANES
    lane = lambda f: f["rank"].map(lane_of).to_numpy(dtype=float)  # noqa: E731
    bars = comm_bars(comm).copy()
    bars["_lane"] = lane(bars) if len(bars) else []
    if n_buckets is None:
        n_buckets = int(bars["bucket"].max()) + 1 if len(bars) else 1
    px_lane = 46 if not gl else max(3.0, min(24.0, 900.0 / n_lanes))
    height = int(min(1200, 110 + n_lanes * px_lane))
    width_px = max(1.0, px_lane * BAND)
    data = []
    for kind in (S.FORWARD, S.BACKWARD, S.OPTIMIZER):
        f = compute[compute["kind"] == kind]
        if not len(f):
            continue
        y, s, e = lane(f) + COMP_DY, _ms(f["start_ns"], t0), _ms(f["end_ns"], t0)
        label = "backward compute" if kind == S.BACKWARD else kind
        data.append(_gl_segments(label, y, s, e, COMPUTE_COLORS[kind], width_px) if gl
                    else _svg_bars(label, y, s, e, COMPUTE_COLORS[kind]))
    is_bucket = (bars["kind"] == S.BUCKET).to_numpy() if len(bars) else np.zeros(0, bool)
    bb = bars[is_bucket | (bars["bucket"] >= 0).to_numpy()] if len(bars) else bars
    if len(bb):
        y, s, e = bb["_lane"].to_numpy() + COMM_DY, _ms(bb["start_ns"], t0), _ms(bb["end_ns"], t0)
        custom = _hover_data(bb, t0, params, lane_names)
        if gl:
            colors = _bucket_colors(np.arange(n_buckets), n_buckets)
            for b in sorted(bb["bucket"].unique()):
                m = (bb["bucket"] == b).to_numpy()
                data.append(_gl_segments(f"bucket {b}", y[m], s[m], e[m], colors[int(b) % len(colors)],
                                         width_px, legend=False))
            data.append({"type": "scattergl", "mode": "markers", "name": "bucket collectives",
                         "x": (s + e) / 2, "y": y, "customdata": custom, "hovertemplate": BUCKET_HOVER,
                         "marker": {"size": 4, "color": bb["bucket"].to_numpy(), "colorscale": BUCKET_SCALE,
                                    "cmin": 0, "cmax": max(1, n_buckets - 1),
                                    "colorbar": _bucket_colorbar(n_buckets)}})
        else:
            data.append(_svg_bars("bucket collectives", y, s, e, bb["bucket"].to_numpy(), BUCKET_HOVER, custom,
                                  colorscale=BUCKET_SCALE, cmin=0, cmax=max(1, n_buckets - 1),
                                  colorbar=_bucket_colorbar(n_buckets),
                                  line={"width": 0.5, "color": "rgba(0,0,0,0.45)"}))
        if not gl:   # with many lanes the marks would cover the bars (hover still gives the times)
            data.extend(_marks(bb, y, t0, gl))
    other = bars[~is_bucket & (bars["bucket"] < 0).to_numpy()] if len(bars) else bars
    for op, f in other.groupby(other["op"].astype(str)) if len(other) else []:
        y, s, e = f["_lane"].to_numpy() + COMM_DY, _ms(f["start_ns"], t0), _ms(f["end_ns"], t0)
        color = OP_COLORS.get(op, "#7f7f7f")
        custom = _hover_data(f, t0, params, lane_names)
        data.append(_gl_segments(op or "collective", y, s, e, color, width_px) if gl else
                    _svg_bars(op or "collective", y, s, e, color, BUCKET_HOVER.replace("bucket %{customdata[0]}", "collective"),
                              custom))
    if len(exposed):
        # WebGL lines cannot be hatched: a thin red line just under the comm band instead
        y = lane(exposed) + (COMM_DY + BAND / 2 + 0.06 if gl else COMM_DY)
        s, e = _ms(exposed["start_ns"], t0), _ms(exposed["end_ns"], t0)
        name = "exposed comm (not hidden by compute)"
        data.append(_gl_segments(name, y, s, e, EXPOSED_COLOR, max(1.0, width_px * 0.4)) if gl else
                    _svg_bars(name, y, s, e, "rgba(0,0,0,0)",
                              "exposed %{base:.2f} ms + %{x:.2f} ms<extra></extra>",
                              pattern={"shape": "/", "fgcolor": EXPOSED_COLOR, "bgcolor": "rgba(0,0,0,0)",
                                       "fillmode": "overlay", "size": 7, "solidity": 0.4},
                              line={"width": 1.5, "color": EXPOSED_COLOR}))
    ticks = list(range(n_lanes))
    if gl and n_lanes > 64:
        ticks = ticks[::int(np.ceil(n_lanes / 32))]
    layout = {
        "title": {"text": title, "x": 0.01, "y": 0.99, "yanchor": "top", "font": {"size": 14}},
        "barmode": "overlay", "height": height + 40, "margin": {"l": 70, "r": 20, "t": 80, "b": 40},
        "xaxis": {"title": {"text": "ms since the step's first event"}, "zeroline": False, "showgrid": True},
        "yaxis": {"tickvals": ticks, "ticktext": [lane_names[i] for i in ticks], "autorange": "reversed",
                  "zeroline": False, "showgrid": False},
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "font": {"size": 11}},
        "hovermode": "closest", "plot_bgcolor": "#fbfbfd", "uirevision": "timeline",
    }
    if x_range:   # one time axis for every step of the run, so playing shows change, not rescaling
        layout["xaxis"]["range"] = [-0.01 * x_range, 1.01 * x_range]
    return {"data": data, "layout": layout}


def _marks(bb: pd.DataFrame, y: np.ndarray, t0: int, gl: bool) -> list[dict]:
    """ready ▼ above the bar, a dotted line ready → launch (the launch delay), and | at launch and done."""
    has_ready = (bb["ready_ns"] >= 0).to_numpy()
    r = _ms(bb["ready_ns"], t0)[has_ready]
    launch = _ms(bb["launch_ns"], t0)
    yr = y[has_ready]
    kind = "scattergl" if gl else "scatter"
    out = []
    if has_ready.any():
        xs = np.empty(3 * len(r))
        ys = np.empty(3 * len(r))
        xs[0::3], xs[1::3], xs[2::3] = r, launch[has_ready], np.nan
        ys[0::3], ys[1::3], ys[2::3] = yr, yr, np.nan
        out.append({"type": kind, "mode": "lines", "name": "launch delay (ready → launch)", "x": xs, "y": ys,
                    "hoverinfo": "skip", "line": {"color": "#444", "width": 1, "dash": "dot"}})
        out.append({"type": kind, "mode": "markers", "name": "gradients ready", "x": r, "y": yr - BAND / 2 - 0.04,
                    "hovertemplate": "ready %{x:.2f} ms<extra></extra>",
                    "marker": {"symbol": "triangle-down", "size": 7 if not gl else 4, "color": "#222"}})
    ends = np.r_[launch, _ms(bb["end_ns"], t0)]
    out.append({"type": kind, "mode": "markers", "name": "launch / done", "x": ends, "y": np.r_[y, y],
                "hoverinfo": "skip", "showlegend": True,
                "marker": {"symbol": "line-ns-open", "size": 13 if not gl else 5,
                           "line": {"width": 1.5, "color": "#222"}, "color": "#222"}})
    return out


def lateness_figure(lateness: pd.DataFrame, title: str = "") -> dict:
    """Rank × bucket heatmap of launch lateness (analysis.launch_lateness) for one step, in ms:
    the straggler is the hot row."""
    if not len(lateness):
        return empty_figure("no bucket collectives in this step")
    # rank × bucket grid (max over micro-steps), filled with numpy: pivot_table costs ~20 ms here.
    ranks, r_idx = np.unique(lateness["rank"].to_numpy(), return_inverse=True)
    buckets, b_idx = np.unique(lateness["bucket"].to_numpy(), return_inverse=True)
    z = np.full((len(ranks), len(buckets)), -np.inf)
    np.maximum.at(z, (r_idx, b_idx), lateness["late_ns"].to_numpy(dtype=float) / 1e6)
    z = np.where(np.isinf(z), None, z)
    return {"data": [{"type": "heatmap", "z": z.tolist(), "x": buckets.tolist(),
                      "y": ranks.tolist(), "colorscale": "Reds", "zmin": 0,
                      "colorbar": {"title": {"text": "ms late"}, "thickness": 12},
                      "hovertemplate": "rank %{y} · bucket %{x}<br>launched %{z:.2f} ms after the first rank<extra></extra>"}],
            "layout": {"title": {"text": title, "x": 0.01, "font": {"size": 14}},
                       "height": int(min(700, 140 + 6 * len(ranks))),
                       "margin": {"l": 70, "r": 20, "t": 40, "b": 40},
                       "xaxis": {"title": {"text": "bucket"}}, "yaxis": {"title": {"text": "rank"}, "autorange": "reversed"}}}


def empty_figure(message: str) -> dict:
    return {"data": [], "layout": {"height": 220, "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                   "annotations": [{"text": message, "showarrow": False, "font": {"size": 14},
                                                    "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]}}
