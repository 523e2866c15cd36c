"""Figure builders of the Lesson page: plain functions of tables and dicts -> Plotly figure dicts
(no Dash needed to call or test them)."""
from __future__ import annotations

import pandas as pd

from syncviz.dashboard.figures.timeline import empty_figure
from syncviz.views import palette as P

MARGIN = {"l": 70, "r": 20, "t": 48, "b": 44}
RANK_COLORS = (P.BLUE, P.ORANGE, P.GREEN, P.PURPLE, P.SKY, P.VERMILLION, P.YELLOW, P.BLACK)
PHASE_COLORS = {"reduce-scatter": P.OP["reduce_scatter"], "all-gather": P.OP["all_gather"]}


def _title(text):
    return {"text": text, "x": 0.01, "font": {"size": 14}}


def averaging_figure(check: pd.DataFrame, step: int | None = None, max_params: int = 14) -> dict:
    """First gradient element of each parameter: every rank's before (dots) and the value every
    rank holds after the all-reduce (a bar), which sits exactly at the dots' mean."""
    if not len(check):
        return empty_figure("no gradient values recorded")
    step = int(check["step"].max()) if step is None else step
    c = check[check["step"] == step].sort_values("param_index").head(max_params)
    # scale each parameter to its own largest |value| so small and large gradients share a plot
    scale = [max(max(abs(v) for v in b), abs(a), 1e-30) for b, a in zip(c["before"], c["after"])]
    x = list(c["param"])
    data = [{"type": "bar", "x": x, "y": [a / s for a, s in zip(c["after"], scale)], "name": "after all-reduce (every rank)",
             "marker": {"color": "rgba(0,158,115,0.35)", "line": {"color": P.GREEN, "width": 1.5}},
             "customdata": list(c["after"]), "hovertemplate": "%{x}<br>after: %{customdata:.7g}<extra></extra>"}]
    for r in range(int(c["ranks"].max())):
        vals = [b[r] for b in c["before"]]
        data.append({"type": "scatter", "mode": "markers", "x": x, "y": [v / s for v, s in zip(vals, scale)],
                     "name": f"rank {r} before", "customdata": vals,
                     "marker": {"size": 11, "color": RANK_COLORS[r % len(RANK_COLORS)], "symbol": "circle"},
                     "hovertemplate": f"%{{x}}<br>rank {r} before: %{{customdata:.7g}}<extra></extra>"})
    exact = int(check["exact"].sum())
    return {"data": data, "layout": {
        "title": _title(f"Step {step}: each parameter's first gradient element (scaled per parameter); "
                        f"after = mean(before) bit for bit in {exact}/{len(check)} parameter-steps"),
        "barmode": "overlay", "margin": {**MARGIN, "b": 120}, "height": 420,
        "yaxis": {"title": "value / max |value| of that parameter", "zeroline": True},
        "xaxis": {"tickangle": -40}, "legend": {"orientation": "h", "y": 1.12}}}


def ring_animation(states: list[dict], n: int, chunk_mb: float) -> dict:
    """Ranks (rows) × chunks (columns): how many ranks' contributions each rank holds, step by
    step (play button and slider); each frame's title says which chunk each rank sent right."""
    if not states:
        return empty_figure("no ring transfers recorded")
    chunks = [f"chunk {c}" for c in range(n)]
    ranks = [f"rank {r}" for r in range(n)]

    def heat(st):
        z = st["counts"]
        return {"type": "heatmap", "z": z, "x": chunks, "y": ranks, "zmin": 1, "zmax": n,
                "colorscale": [[0, "#f0f4fa"], [1, P.BLUE]], "showscale": False,
                "text": [[("sum" if v == n else f"{v}/{n}") for v in row] for row in z],
                "texttemplate": "%{text}", "hovertemplate": "%{y}, %{x}: %{z} of " + str(n) + " ranks<extra></extra>"}

    def label(st):
        if st["phase"] == "start":
            return f"start: every rank holds only its own gradients, cut into {n} chunks of {chunk_mb:.3g} MB"
        sends = ", ".join(f"{s}→{d}: chunk {c}" for s, d, c in sorted(st["moves"]))
        verb = "adds it" if st["phase"] == "reduce-scatter" else "keeps it"
        return f"{st['phase']} step {st['step'] + 1}/{n - 1}: each rank sends one chunk right ({sends}); receiver {verb}"

    names = [f"{i}" for i in range(len(states))]
    frames = [{"name": nm, "data": [heat(st)], "layout": {"title": _title(label(st))}} for nm, st in zip(names, states)]
    steps = [{"label": ("start" if st["phase"] == "start" else f"{'RS' if st['phase'] == 'reduce-scatter' else 'AG'}"
                        f"{st['step'] + 1}"), "method": "animate",
              "args": [[nm], {"mode": "immediate", "frame": {"duration": 0, "redraw": True}}]}
             for nm, st in zip(names, states)]
    return {"data": [heat(states[0])], "frames": frames, "layout": {
        "title": _title(label(states[0])), "height": 120 + 60 * n, "margin": {**MARGIN, "t": 60, "b": 90},
        "yaxis": {"autorange": "reversed"},
        "updatemenus": [{"type": "buttons", "showactive": False, "x": 0, "y": -0.25, "xanchor": "left",
                         "buttons": [{"label": "▶ play", "method": "animate",
                                      "args": [None, {"frame": {"duration": 1100, "redraw": True},
                                                      "fromcurrent": True, "transition": {"duration": 0}}]}]}],
        "sliders": [{"active": 0, "x": 0.12, "y": -0.12, "len": 0.88, "steps": steps,
                     "currentvalue": {"prefix": "step: "}}]}}


def ring_timeline(transfers: list[dict], n: int) -> dict:
    """Every recorded chunk transfer as a bar on its sender's lane (host monotonic clock)."""
    if not transfers:
        return empty_figure("no ring transfers recorded")
    data = []
    for phase, color in PHASE_COLORS.items():
        t = [x for x in transfers if x["phase"] == phase]
        data.append({"type": "bar", "orientation": "h", "name": phase,
                     "y": [f"rank {x['src']}" for x in t], "base": [x["start_ns"] / 1e6 for x in t],
                     "x": [max((x["end_ns"] - x["start_ns"]) / 1e6, 1e-3) for x in t], "marker": {"color": color},
                     "text": [f"c{x['chunk']}" for x in t], "textposition": "inside",
                     "customdata": [[x["step"] + 1, x["chunk"], x["dst"], x["bytes"] / 1e6] for x in t],
                     "hovertemplate": "step %{customdata[0]}: chunk %{customdata[1]} → rank %{customdata[2]}, "
                                      "%{customdata[3]:.3f} MB<extra>" + phase + "</extra>"})
    title = _title(f"Every chunk transfer, N = {n}: 2(N−1) = {2 * (n - 1)} steps per rank")
    return {"data": data, "layout": {"title": title,
                                     "barmode": "overlay", "height": 120 + 40 * n, "margin": MARGIN,
                                     "xaxis": {"title": "ms"},
                                     "yaxis": {"autorange": "reversed", "categoryorder": "array",
                                               "categoryarray": [f"rank {r}" for r in range(n)]}}}


def ring_bytes_figure(results: list[dict]) -> dict:
    """Bytes each rank sent vs N: formulas (lines) and kernel-measured values (markers)."""
    if not results:
        return empty_figure("no ring measurements")
    results = sorted(results, key=lambda r: r["world_size"])
    ns = [r["world_size"] for r in results]
    d = results[0]["bytes"] / 1e6

    def measured(key):
        return [max(x[key]["kernel_bytes"] for x in r["ranks"]) / 1e6 for r in results]
    data = [
        {"type": "scatter", "mode": "lines", "x": ns, "y": [2 * (n - 1) / n * d for n in ns], "name": "ring 2(N−1)/N·D",
         "line": {"color": P.BLUE, "dash": "dash"}},
        {"type": "scatter", "mode": "lines", "x": ns, "y": [(n - 1) * d for n in ns], "name": "naive (N−1)·D",
         "line": {"color": P.VERMILLION, "dash": "dash"}},
        {"type": "scatter", "mode": "markers", "x": ns, "y": measured("ring"), "name": "ring, measured",
         "marker": {"color": P.BLUE, "size": 11}},
        {"type": "scatter", "mode": "markers", "x": ns, "y": measured("all_to_all"), "name": "all-to-all, measured",
         "marker": {"color": P.VERMILLION, "size": 11, "symbol": "square"}},
        {"type": "scatter", "mode": "markers", "x": ns, "y": measured("parameter_server"),
         "name": "parameter server (server), measured", "marker": {"color": P.ORANGE, "size": 11, "symbol": "diamond"}},
        {"type": "scatter", "mode": "markers", "x": ns, "y": measured("torch_all_reduce"), "name": "gloo all_reduce, measured",
         "marker": {"color": P.GREEN, "size": 9, "symbol": "x"}}]
    return {"data": data, "layout": {"title": _title(f"MB each rank sends to all-reduce D = {d:.3g} MB "
                                                     "(measured: /proc/self/io)"),
                                     "height": 360, "margin": MARGIN, "xaxis": {"title": "ranks N", "tickvals": ns},
                                     "yaxis": {"title": "MB sent per rank"}}}


def memory_figure(numbers: dict, gpu_gb: float = 80.0) -> dict:
    """The 70B / 8-GPU table as bars, with the GPU's memory as a line."""
    keys = [k for k in ("ddp", "zero1", "zero2", "zero3") if k in numbers]
    if not keys:
        return empty_figure("no memory step in this lesson")
    labels = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
    return {"data": [{"type": "bar", "x": [labels[k] for k in keys], "y": [numbers[k] for k in keys],
                      "text": [f"{numbers[k]:g} GB" for k in keys], "textposition": "outside",
                      "marker": {"color": [P.VERMILLION if numbers[k] > gpu_gb else P.BLUE for k in keys]}}],
            "layout": {"title": _title("70B parameters on 8 GPUs, K = 8: model states per GPU"), "height": 340,
                       "margin": MARGIN, "yaxis": {"title": "GB per GPU"},
                       "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": gpu_gb, "y1": gpu_gb,
                                   "line": {"dash": "dot", "color": "#555"}}],
                       "annotations": [{"xref": "paper", "x": 1, "y": gpu_gb, "yref": "y", "yanchor": "bottom",
                                        "text": f"{gpu_gb:g} GB GPU",
                                        "showarrow": False, "xanchor": "right"}]}}


def stale_figure(numbers: dict) -> dict:
    """Step 7: the loss of the stale run and of synchronous DDP on the same batches, and how far
    the replicas are apart (right axis)."""
    steps = numbers.get("steps") or []
    if not steps:
        return empty_figure("no asynchronous step in this lesson")
    s = numbers.get("stale", "?")
    return {"data": [{"type": "scatter", "mode": "lines+markers", "x": steps, "y": numbers["loss_sync"],
                      "name": "loss, synchronous (DDP)", "line": {"color": P.BLUE}},
                     {"type": "scatter", "mode": "lines+markers", "x": steps, "y": numbers["loss_stale"],
                      "name": f"loss, stale S = {s}", "line": {"color": P.VERMILLION}},
                     {"type": "bar", "x": steps, "y": numbers["drift_max"], "yaxis": "y2", "opacity": 0.35,
                      "name": "replicas apart: max |θ_r − θ̄|", "marker": {"color": P.GREY}}],
            "layout": {"title": _title(f"Gradients {s} steps stale: replicas drift apart, the loss falls slower"),
                       "height": 360, "margin": {**MARGIN, "r": 70}, "xaxis": {"title": {"text": "step"}},
                       "yaxis": {"title": {"text": "loss (mean over ranks)"}},
                       "yaxis2": {"title": {"text": "max |θ_r − θ̄|"}, "overlaying": "y", "side": "right", "showgrid": False},
                       "legend": {"orientation": "h", "y": -0.25}}}


def dataparallel_figure(numbers: dict) -> dict:
    """Step 8: step time of DataParallel and DDP (the model) for 2/4/8 GPUs, and GPU 0's bytes."""
    gpus = numbers.get("gpus") or []
    if not gpus:
        return empty_figure("no DataParallel step in this lesson")
    x = [f"{n} GPUs" for n in gpus]
    text = lambda ys: [f"{y:,.0f} ms" for y in ys]   # noqa: E731
    return {"data": [{"type": "bar", "x": x, "y": numbers["ddp_ms"], "name": "DDP", "marker": {"color": P.BLUE},
                      "text": text(numbers["ddp_ms"]), "textposition": "outside"},
                     {"type": "bar", "x": x, "y": numbers["dp_ms"], "name": "DataParallel",
                      "marker": {"color": P.VERMILLION}, "text": text(numbers["dp_ms"]), "textposition": "outside",
                      "customdata": [f"{b:,.0f}" for b in numbers["dp_gpu0_mb"]],
                      "hovertemplate": "%{y:.1f} ms; %{customdata} MB through GPU 0<extra>DataParallel</extra>"}],
            "layout": {"title": _title(f"{numbers.get('model', '')} on {numbers.get('link', '')}: time per step "
                                       "(model, not measured)"),
                       "height": 340, "margin": MARGIN, "barmode": "group", "yaxis": {"title": {"text": "ms per step"}}}}
