"""A self-contained HTML report of one run: summary, timeline and key charts in one file.

plotly.js is inlined once, so the file opens from disk, offline, with no server: attach it to a
bug report or a slide. Figure builders are plain functions of analysis tables.
"""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from syncviz import analysis as A
from syncviz.analysis.partitioned import SummaryTables
from syncviz.trace import Run, load_run
from syncviz.trace import schema as S
from syncviz.trace import spans as SP
from syncviz.views import palette as P
from syncviz.views import timeline as TLV

COLORS = {"compute": P.BLUE, "exposed": P.EXPOSED, "bucket": P.GREEN, "overlap": P.ORANGE}
CONFIG = {"displaylogo": False, "responsive": True}
AGGREGATE_ABOVE = 16     # ranks: above this, the timeline shows real representative ranks, as the dashboard does


def timeline_figure(run: Run, steps: list[int], ranks: list[int] | None = None) -> dict:
    """The dashboard's timeline (syncviz/views/timeline.py) over the chosen steps: every rank up
    to AGGREGATE_ABOVE ranks, else the fastest, median and slowest rank and the one that launches last.
    ``run``: a loaded run, or one holding those steps only (``ranks``: then every rank of the run)."""
    ev = run.events
    ev = ev[ev["step"].isin(steps)]
    comp, comm, exposed = A.compute_intervals(ev), A.comm_metrics(ev, kinds=S.COMM_KINDS), A.exposed_intervals(ev)
    every = list(run.ranks) if ranks is None else list(ranks)
    ranks, labels = every, {}
    what = f"{len(ranks)} ranks"
    if len(ranks) > AGGREGATE_ABOVE:
        picks = A.representative_ranks(A.step_metrics(ev), A.sync_lateness(ev))
        ranks = [r for r, _ in picks]
        labels = {r: f"rank {r} · {', '.join(roles)}" for r, roles in picks}
        what = f"{len(every)} ranks, shown: fastest, median and slowest step and the rank that launches last"
    fig = TLV.timeline_figure(comp, comm, exposed, ranks=ranks, labels=labels, t0=TLV.step_origin(comp, comm),
                              title=f"Timeline, step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))} ({what})",
                              params=TLV.bucket_param_labels(A.bucket_map(run.layouts)),
                              max_height=900)
    fig["layout"]["xaxis"]["title"]["text"] = "ms since the first shown step began"
    fig["layout"]["uirevision"] = None
    return fig


def steps_figure(steps: pd.DataFrame) -> go.Figure:
    """Per step (mean over ranks): compute and exposed comm stacked, step time, and overlap %."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = steps["step"]
    fig.add_trace(go.Bar(x=x, y=steps["compute_ns"] / 1e6, name="compute (ms)", marker_color=COLORS["compute"]))
    fig.add_trace(go.Bar(x=x, y=steps["exposed_ns"] / 1e6, name="exposed comm (ms)", marker_color=COLORS["exposed"]))
    fig.add_trace(go.Scatter(x=x, y=steps["step_ns"] / 1e6, name="step time (ms)", mode="lines+markers",
                             line_color="#333"))
    fig.add_trace(go.Scatter(x=x, y=steps["overlap_pct"], name="overlap %", mode="lines+markers",
                             line=dict(color=COLORS["overlap"], dash="dot")), secondary_y=True)
    fig.update_layout(barmode="stack", title="Per step (mean over ranks)", legend_orientation="h",
                      height=360, margin=dict(l=10, r=10, t=50, b=40))
    fig.update_xaxes(title_text="step", dtick=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="overlap %", range=[0, 105], dtick=25, showgrid=False, secondary_y=True)
    return fig


def buckets_figure(buckets: pd.DataFrame) -> go.Figure:
    """Per bucket (median over ranks and headline steps): queue and service time, exposed part,
    busbw on service time."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [f"{b} ({mb:.1f} MB)" for b, mb in zip(buckets["bucket"], buckets["bytes"] / 1e6)]
    fig.add_trace(go.Bar(x=x, y=buckets["queue_ns"] / 1e6, name="queue (ms)", marker_color="#bbbbbb"))
    fig.add_trace(go.Bar(x=x, y=buckets["duration_ns"] / 1e6, name="service (ms)", marker_color=COLORS["bucket"]))
    fig.add_trace(go.Bar(x=x, y=buckets["exposed_ns"] / 1e6, name="exposed (ms)", marker_color=COLORS["exposed"]))
    fig.add_trace(go.Scatter(x=x, y=buckets["busbw_gbps"], name="busbw (GB/s)", mode="lines+markers",
                             line_color="#333"), secondary_y=True)
    fig.update_layout(barmode="group", title="Per bucket (median)", legend_orientation="h",
                      height=360, margin=dict(l=10, r=10, t=50, b=40))
    fig.update_xaxes(title_text="bucket")
    fig.update_yaxes(title_text="ms", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="busbw (GB/s)", rangemode="tozero", showgrid=False, secondary_y=True)
    return fig


def skew_figure(late: pd.DataFrame) -> go.Figure:
    """Rank × step heat map of how late each rank launched its buckets (analysis.rank_step_skew)."""
    fig = go.Figure(go.Heatmap(z=late.to_numpy() / 1e6, x=[str(c) for c in late.columns],
                               y=[f"rank {r}" for r in late.index], colorscale=P.HEAT_SCALE,
                               colorbar=dict(title=dict(text="ms late", side="right"), len=0.9, thickness=12),
                               hovertemplate="%{y}, step %{x}: %{z:.3f} ms late<extra></extra>"))
    fig.update_layout(title="Launch lateness per rank and step (stragglers are hot rows)",
                      height=min(700, max(260, 14 * len(late) + 140)), margin=dict(l=10, r=10, t=50, b=40),
                      xaxis_title="step")
    return fig


def _fmt(v, digits=3) -> str:
    if isinstance(v, float):
        return "–" if v != v else f"{v:.{digits}f}"
    return html.escape(str(v))


def summary_html(run: Run | SummaryTables, s: dict) -> str:
    m = run.meta
    ddp = m.get("ddp") or {}
    facts = [("strategy", s["strategy"]), ("engine", s["engine"]), ("world size", s["world_size"]),
             ("backend / device", f"{m.get('backend', '?')} / {m.get('device', '?')}"),
             ("bucket cap (MB)", ddp.get("bucket_cap_mb", "–")), ("steps", s["steps"]),
             ("headline steps", ", ".join(map(str, s["headline_steps"])) or "–"),
             ("created", m.get("created", "–")), ("torch", m.get("torch_version", "–"))]
    nums = A.headline_rows(s)
    table = lambda rows: "<table>" + "".join(  # noqa: E731
        f"<tr><th>{html.escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in rows) + "</table>"
    problems = "".join(f"<li>{html.escape(p)}</li>" for p in s["problems"])
    return (f"<p class='verdict'>{html.escape(s['verdict'])}</p>"
            f"<div class='cards'>{table(facts)}{table(nums)}</div>"
            + (f"<ul class='problems'>{problems}</ul>" if problems else ""))


STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px}.sub{color:#666;margin-bottom:12px}
.verdict{font-size:16px;font-weight:600;background:#fff4e5;padding:8px 12px;border-left:4px solid #E69F00}
.cards{display:flex;gap:24px;flex-wrap:wrap}table{border-collapse:collapse;font-size:13px}
th{text-align:left;font-weight:500;color:#555;padding:2px 12px 2px 0}td{text-align:right;padding:2px 0}
.problems{color:#b00}.chart{margin-top:18px}"""


def html_report(run: Run | SummaryTables, timeline_steps: int = 3) -> str:
    """The report as one HTML string with plotly.js inlined: of a loaded run, or of
    summarize(..., export_dir=)'s tables (a run of any size: the timeline's steps are read alone)."""
    partitioned = isinstance(run, SummaryTables)
    summary = run.summary if partitioned else A.run_summary(run)
    steps = run.step_table if partitioned else A.step_table(run)
    shown = (summary["headline_steps"] or sorted(int(s) for s in steps["step"]))[:timeline_steps]
    if partitioned:     # only the shown steps are read (no step: step 0's read, filtered to nothing)
        span = (min(shown), max(shown) + 1) if shown else (0, 1)
        few = load_run(run.path, steps=span, spans=SP.by_rank(run.spans))
        timeline = timeline_figure(few, shown, ranks=run.facts["ranks"])
    else:
        timeline = timeline_figure(run, shown)
    figures = [("timeline", timeline)]
    if len(steps):
        figures.append(("steps", steps_figure(steps)))
    buckets = run.export["bucket_table"] if partitioned else A.bucket_table(run)
    if len(buckets):
        figures.append(("buckets", buckets_figure(buckets)))
    late = run.export["bucket_skew"] if partitioned else A.rank_step_skew(run)
    if len(late) > 1:
        figures.append(("skew", skew_figure(late)))
    charts = "".join(
        f"<div class='chart'>{pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f'chart-{name}', config=CONFIG)}</div>"
        for name, fig in figures)
    name = html.escape(run.name)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>syncviz: {name}</title>"
            f"<style>{STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body><h1>syncviz report: {name}</h1>"
            f"<div class='sub'>{html.escape(str(run.path))}</div>{summary_html(run, summary)}"
            f"{charts}</body></html>")


def write_html(run: Run | SummaryTables, path: str | Path, timeline_steps: int = 3) -> Path:
    path = Path(path)
    path.write_text(html_report(run, timeline_steps), encoding="utf-8")
    return path
