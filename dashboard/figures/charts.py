"""Figure builders of the Buckets, Strategies and Ratios pages: plain functions of analysis tables
-> Plotly figure dicts (no browser, no Dash needed to call or test them)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from syncviz.dashboard.figures.timeline import (BUCKET_SCALE, LABELS_UNMEASURED, binned_rows_axis, empty_figure,
                                               heat_colorbar, rank_rows)
from syncviz.views import palette as P

GL_POINTS = 2000    # above this many points per line, draw it with WebGL
MARGIN = {"l": 70, "r": 20, "t": 44, "b": 44}
SPLIT_COLORS = P.SPLIT
EXPOSED_COLOR = P.EXPOSED


def _title(text):
    return {"text": text, "x": 0.01, "font": {"size": 14}}


def _none(a):
    """A list for JSON with NaN and ±inf as null (plotly leaves a gap)."""
    a = np.asarray(a, dtype=float)
    out = a.astype(object)
    out[~np.isfinite(a)] = None
    return out.tolist()


# ------------------------------------------------------------------------------------ buckets

def bucket_map_figure(bmap: pd.DataFrame, unit: str = "bucket") -> dict:
    """Which parameters went into which bucket, per layout version (analysis.bucket_map): one bar
    per bucket, stacked by parameter byte ranges; parameters DDP's rebuild moved are orange.
    ``unit``: what a group is when it is not a DDP bucket (a ZeRO-3 run's layout groups parameters
    by the unit gathered and reduce-scattered together): named so, without DDP's wording."""
    if not len(bmap):
        return empty_figure("no bucket layout recorded for this run")
    ddp = unit == "bucket"
    versions = sorted(bmap["layout"].unique())
    data = []
    names = {0: "layout 0 (initial)", 1: "layout 1 (after DDP's rebuild)"} if ddp else {}
    if ddp and 1 in versions and bmap.loc[bmap["layout"] == 0, "bucket"].nunique() == 1:
        # DDP's own choice, not a recording gap: without find_unused_parameters (or with static_graph)
        # torch puts every parameter in one bucket until the rebuild after the first backward
        names[0] = "layout 0 (initial: DDP holds every parameter in one bucket until its rebuild)"
    hover = (f"{unit} %{{x}}: <b>%{{customdata[0]}}</b><br>%{{customdata[1]:,}} × %{{customdata[2]}}"
             f" = %{{customdata[5]:.2f}} MB, at %{{customdata[6]:.2f}} MB of the {unit}"
             + ("<br>param index %{customdata[3]} · moved by rebuild: %{customdata[4]}" if ddp else "") + "<extra></extra>")
    for i, v in enumerate(versions):
        f = bmap[bmap["layout"] == v]
        moved = f["moved"].to_numpy()
        color = np.where(moved, P.ORANGE, np.where(f["param_index"].to_numpy() % 2 == 0, P.BLUE, P.SKY))
        data.append({"type": "bar", "name": names.get(int(v), f"layout {v}"), "xaxis": f"x{i + 1}" if i else "x",
                     "yaxis": "y", "x": f["bucket"].to_numpy(), "base": f["start_byte"].to_numpy() / 1e6,
                     "y": f["bytes"].to_numpy() / 1e6, "width": 0.8, "showlegend": False,
                     "marker": {"color": color.tolist(), "line": {"width": 0.5, "color": "white"}},
                     # sizes from customdata: a bar with a base hovers %{y} as its top (base + size),
                     # which showed a 0.59 MB parameter at 4.53 MB as "5.12 MB"
                     "customdata": np.c_[f["param"].to_numpy(), f["numel"].to_numpy(), f["dtype"].to_numpy(),
                                         f["param_index"].to_numpy(), moved, f["bytes"].to_numpy() / P.MB,
                                         f["start_byte"].to_numpy() / P.MB].tolist(),
                     "hovertemplate": hover})
    n = len(versions)
    title = ("Bucket map: parameters per bucket (MB = 10⁶ bytes), orange = moved by DDP's rebuild" if ddp else
             f"Parameters per {unit}: gathered and reduce-scattered together (MB = 10⁶ bytes)")
    layout = {"title": _title(title),
              "barmode": "overlay", "height": 420, "margin": MARGIN, "yaxis": {"title": {"text": "MB"}},
              "annotations": []}
    gap = 0.06
    w = (1 - gap * (n - 1)) / n
    for i, v in enumerate(versions):
        key = "xaxis" if i == 0 else f"xaxis{i + 1}"
        layout[key] = {"domain": [i * (w + gap), i * (w + gap) + w], "title": {"text": unit}}
        if bmap["bucket"].max() < 40:
            layout[key]["dtick"] = 1
        if i:
            layout[key]["anchor"] = "y"
        layout["annotations"].append({"text": names.get(int(v), f"layout {v}"), "showarrow": False, "xref": "paper",
                                      "yref": "paper", "x": i * (w + gap) + w / 2, "y": 1.0, "yanchor": "bottom"})
    return {"data": data, "layout": layout}


def distribution_figure(q: pd.DataFrame, title: str, unit: str, scale: float = 1.0) -> dict:
    """Box per bucket from precomputed quantiles (analysis.quantiles): q0/q25/q50/q75/q100 and mean.
    Sending a million raw values to the browser would cost megabytes; the quantiles are enough."""
    if not len(q):
        return empty_figure(f"no data for {title.lower()}")
    x = q.index.to_numpy()
    s = lambda c: (q[c].to_numpy(dtype=float) * scale)  # noqa: E731
    colors = np.clip(x, 0, None) / max(1, x.max())
    from plotly.colors import sample_colorscale
    return {"data": [{"type": "box", "x": x, "q1": s("q25"), "median": s("q50"), "q3": s("q75"),
                      "lowerfence": s("q0"), "upperfence": s("q100"), "mean": s("mean"), "name": title,
                      "marker": {"color": "#4c78a8"}, "fillcolor": "rgba(76,120,168,0.35)",
                      "line": {"color": "#2a4a75"}, "boxpoints": False,
                      "hoverinfo": "x+y"}] +
                    [{"type": "scatter", "mode": "markers", "x": x, "y": s("q50"), "name": "median",
                      "marker": {"color": sample_colorscale(BUCKET_SCALE, list(colors)), "size": 7},
                      "customdata": q["count"].to_numpy(),
                      "hovertemplate": "bucket %{x}: median %{y:.3g} " + unit + " (%{customdata} events)<extra></extra>"}],
            "layout": {"title": _title(title), "height": 330, "margin": MARGIN, "showlegend": False,
                       "xaxis": {"title": {"text": "bucket"}}, "yaxis": {"title": {"text": unit}}}}


# --------------------------------------------------------------------------------- strategies

def _calls(rows: pd.DataFrame) -> str:
    """Calls of one op per rank and step as an integer (a range when ranks or steps differ)."""
    if not len(rows):
        return "0"
    lo, hi = int(rows["count_min"].min()), int(rows["count_max"].max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def op_bytes_figure(by_run: dict[str, pd.DataFrame]) -> dict:
    """Bytes per step and rank by collective op (analysis.op_bytes_per_step), runs side by side."""
    ops = sorted({op for t in by_run.values() for op in t["op"]})
    if not ops:
        return empty_figure("no collectives recorded in these runs")
    runs = list(by_run)
    data = []
    for op in ops:
        y = [float(t.loc[t["op"] == op, "bytes_per_step"].sum()) / 1e6 for t in by_run.values()]
        c = [_calls(t[t["op"] == op]) for t in by_run.values()]
        data.append({"type": "bar", "name": op or "(unnamed)", "x": runs, "y": y, "customdata": c,
                     "marker": {"color": P.op_color(op)},
                     "hovertemplate": "%{x}<br>" + (op or "?") + ": %{y:.2f} MB per step (%{customdata} calls)<extra></extra>"})
    return {"data": data, "layout": {"title": _title("Bytes per step and rank by collective (MB)"),
                                     "barmode": "stack", "height": 360, "margin": MARGIN,
                                     "yaxis": {"title": {"text": "MB per step"}, "rangemode": "tozero"}}}


def time_split_figure(by_run: dict[str, dict]) -> dict:
    """Mean step split into compute only / overlapped comm / exposed comm / other (analysis.time_split)."""
    runs = list(by_run)
    parts = [("compute only", "compute_only_ms"), ("overlapped comm", "overlapped_ms"),
             ("exposed comm", "exposed_ms"), ("other (idle, data, host)", "other_ms")]
    data = [{"type": "bar", "orientation": "h", "name": label, "y": runs,
             "x": _none([by_run[r][key] for r in runs]), "marker": {"color": SPLIT_COLORS[label]},
             "hovertemplate": "%{y}<br>" + label + ": %{x:.2f} ms<extra></extra>"} for label, key in parts]
    return {"data": data, "layout": {"title": _title("Mean step time split (ms): compute, overlapped comm, exposed comm"),
                                     "barmode": "stack", "height": 120 + 50 * len(runs), "margin": {**MARGIN, "l": 160},
                                     "xaxis": {"title": {"text": "ms per step"}}, "yaxis": {"autorange": "reversed"},
                                     "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1.0,
                                                "xanchor": "right", "traceorder": "normal"}}}


MEMORY_KEYS = [("params_bytes", "parameters"), ("grads_bytes", "gradients"),
               ("optimizer_bytes", "optimizer state"), ("params_after_forward_bytes", "parameters held after forward"),
               ("peak_allocated_bytes", "peak allocated"),
               # DeepSpeed runs: where it is held (ZeRO-Offload: host; ZeRO-Infinity: NVMe swap files)
               ("device_bytes", "on device"), ("host_bytes", "on host"), ("nvme_bytes", "on NVMe")]
MEMORY_COLORS = {**P.MEMORY, "peak allocated": P.GREY, "on device": P.ORANGE, "on host": P.GREEN,
                 "on NVMe": P.BLACK}


def memory_figure(by_run: dict[str, dict | None]) -> dict:
    """Per-rank memory as run.json's optional "memory" records it (the largest rank), in MB.
    "parameters held after forward" is what FSDP keeps gathered from forward to backward: it is
    what tells ZeRO-2 (kept) from ZeRO-3 (resharded after forward)."""
    have = {r: m for r, m in by_run.items() if m}
    if not have:
        return empty_figure("memory was not recorded for these runs (run.json has no \"memory\")")
    runs = list(have)
    data = [{"type": "bar", "name": label, "x": runs, "y": _none([(have[r].get(key) or np.nan) / P.MB for r in runs]),
             "marker": {"color": MEMORY_COLORS[label]},
             "hovertemplate": "%{x}<br>" + label + ": %{y:.2f} MB<extra></extra>"} for key, label in MEMORY_KEYS]
    return {"data": data, "layout": {"title": _title("Memory per rank (MB = 10⁶ bytes, largest rank)"), "barmode": "group",
                                     "height": 360, "margin": MARGIN, "yaxis": {"title": {"text": "MB"}, "rangemode": "tozero"}}}


def memory_of(meta: dict) -> dict | None:
    """run.json "memory": a dict of byte counts, or per rank (list: the largest value of each
    key over ranks; dict keyed by rank: rank 0's)."""
    mem = meta.get("memory")
    if isinstance(mem, list) and mem:
        ranks = [m for m in mem if isinstance(m, dict)]
        mem = {k: max(m[k] for m in ranks if isinstance(m.get(k), (int, float)))
               for k, _ in MEMORY_KEYS if any(isinstance(m.get(k), (int, float)) for m in ranks)}
    if isinstance(mem, dict) and mem and all(isinstance(v, dict) for v in mem.values()):
        mem = mem.get("0") or mem.get(0) or next(iter(mem.values()))
    if not isinstance(mem, dict):
        return None
    return {k: float(mem[k]) for k, _ in MEMORY_KEYS if isinstance(mem.get(k), (int, float))} or None


# ------------------------------------------------------------------------------------- ratios

def over_steps_figure(spread: dict[str, pd.DataFrame], live: bool = False) -> dict:
    """Compute/comm ratio, overlap % and exposed comm per step: median over ranks with the
    min–max band (analysis.quantiles of step_metrics by step). Steps are drawn with WebGL."""
    rows = [("compute_comm_ratio", "compute / comm", 1.0, "y"), ("overlap_pct", "overlap %", 1.0, "y2"),
            ("exposed_ns", "exposed comm (ms)", 1e-6, "y3")]
    data = []
    for col, label, scale, axis in rows:
        q = spread.get(col)
        if q is None or not len(q):
            continue
        x = q.index.to_numpy()
        lo, mid, hi = (q[c].to_numpy(dtype=float) * scale for c in ("q0", "q50", "q100"))
        # The band is SVG (WebGL fills are unreliable); the median line is WebGL once steps are many.
        data.append({"type": "scatter", "mode": "lines", "x": x, "y": _none(hi), "yaxis": axis, "line": {"width": 0},
                     "showlegend": False, "hoverinfo": "skip", "name": f"{label} max"})
        data.append({"type": "scatter", "mode": "lines", "x": x, "y": _none(lo), "yaxis": axis, "line": {"width": 0},
                     "fill": "tonexty", "fillcolor": "rgba(76,120,168,0.2)", "showlegend": False,
                     "hoverinfo": "skip", "name": f"{label} min"})
        data.append({"type": "scattergl" if len(x) > GL_POINTS else "scatter",
                     "mode": "lines+markers" if len(x) < 80 else "lines", "x": x, "y": _none(mid),
                     "yaxis": axis, "name": label, "line": {"color": EXPOSED_COLOR if "exposed" in label else "#2a4a75"},
                     "marker": {"size": 4}, "customdata": np.c_[lo, hi].tolist(),
                     "hovertemplate": "step %{x}: " + label
                     + " median %{y:.3g} (ranks %{customdata[0]:.3g}–%{customdata[1]:.3g})<extra></extra>"})
    if not data:
        return empty_figure("no complete step yet")
    layout = {"title": _title("Per step: median over ranks, band = min–max over ranks" + (" · live" if live else "")),
              "height": 560, "margin": MARGIN, "showlegend": False, "hovermode": "x",
              "xaxis": {"title": {"text": "step"}, "anchor": "y3", "zeroline": False},
              "yaxis": {"domain": [0.70, 1.0], "title": {"text": "compute / comm"}, "rangemode": "tozero"},
              "yaxis2": {"domain": [0.36, 0.64], "title": {"text": "overlap %"}, "range": [0, 105]},
              "yaxis3": {"domain": [0.0, 0.30], "title": {"text": "exposed ms"}, "rangemode": "tozero"}}
    n_steps = max((len(d["x"]) for d in data), default=0)
    if n_steps <= 20:   # steps are whole numbers: no "step 0.5" tick on a short run
        layout["xaxis"].update(dtick=1, tick0=0)
    return {"data": data, "layout": layout}


def skew_heatmap_figure(table: pd.DataFrame, max_cols: int = 2000) -> dict:
    """Rank × step heatmap of launch lateness (ms late vs the first rank; analysis.lateness_matrix
    of analysis.sync_lateness: buckets, or every collective in steps without buckets): a straggler
    is a hot row. Runs with more steps than max_cols show every k-th step (labelled) to stay light.
    Above MAX_HEAT_ROWS ranks a row holds k ranks ("512–515"), the latest of them, as the Replay's
    heatmap (figures.timeline.rank_rows). Why: the 10^8-event DDP run's map (1,024 ranks × 781
    steps, in full float precision, as lists) was a 14.9 MB response; the page was drawn 2.45-2.79 s
    after it was opened (benchmarks/dashboard.py's first_open_pages, session 44)."""
    if table is None or not len(table):
        return empty_figure("no collectives seen on two or more ranks")
    cols = table.columns.to_numpy()
    if len(cols) > max_cols:
        table = table.iloc[:, ::int(np.ceil(len(cols) / max_cols))]
    z = table.to_numpy(dtype=float) / 1e6
    ranks, steps = table.index.to_numpy(), table.columns.tolist()
    k, rows = rank_rows(ranks)
    if k > 1:          # the latest of each row's ranks; NaN only where none of them has a value
        with np.errstate(invalid="ignore"):
            z = np.fmax.reduceat(z, np.arange(0, len(ranks), k), axis=0)
    # to the µs, as the Replay's heatmap; a NaN is a gap (null in the figure's JSON), and z stays an
    # array, which Dash's JSON writes whole (as lists, a Python object per cell)
    z = np.round(z, 3)
    yaxis = {"title": {"text": "rank"}, "autorange": "reversed", **LABELS_UNMEASURED}
    if k > 1:
        yaxis.update(binned_rows_axis(k, rows))
    elif len(ranks) <= 32:   # integer ticks on the rows (not -0.5 / 0.5 / 1.5 with 2 ranks)
        yaxis.update(tickmode="array", tickvals=ranks.tolist(), ticktext=[str(r) for r in ranks.tolist()])
    xaxis = {"title": {"text": "step"}, **LABELS_UNMEASURED}
    if len(steps) <= 40:
        xaxis.update(tickmode="array", tickvals=steps, ticktext=[str(c) for c in steps])
    who, when = ("rank", "launched") if k == 1 else ("ranks", "the latest of them launched")
    title = "Launch skew, rank × step: stragglers are hot rows" + (f" · a row per {k} ranks: the latest of them"
                                                                   if k > 1 else "")
    return {"data": [{"type": "heatmap", "z": z, "x": steps, "y": ranks.tolist() if k == 1 else rows,
                      "colorscale": P.HEAT_SCALE, "zmin": 0,
                      "colorbar": heat_colorbar(),
                      "hovertemplate": f"{who} %{{y}} · step %{{x}}<br>{when} %{{z:.2f}} ms after the first rank "
                                       "(mean over its buckets, or collectives in a step without buckets)<extra></extra>"}],
            "layout": {"title": _title(title),
                       "height": int(min(800, max(300, 160 + 10 * len(rows)))), "margin": MARGIN,
                       "xaxis": xaxis, "yaxis": yaxis}}
