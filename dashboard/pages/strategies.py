"""Strategies: runs side by side (all-reduce vs reduce-scatter, DDP vs ZeRO): headline numbers,
bytes per step by collective, the step split into compute / overlapped / exposed comm, memory, and
the backend caveats `syncviz compare` prints (views/compare.py). Opens on runs of one model."""
from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import parse_qs

import dash
from dash import Input, Output, State, dcc, html

from syncviz.dashboard.figures import charts as CH
from syncviz.views import compare as CMP
from syncviz.dashboard import components as C
from syncviz.dashboard.figures.timeline import empty_figure


DEFAULT_MAX = 6
ROWS = [("strategy", "strategy", None), ("engine", "engine", None), ("ranks", "world_size", None),
        ("step time", "step_ms", " ms"), ("compute", "compute_ms", " ms"), ("comm busy", "comm_busy_ms", " ms"),
        ("exposed comm", "exposed_ms", " ms"), ("overlap", "overlap_pct", " %"),
        ("offloading (in compute)", "offload_ms", " ms"),
        ("compute / comm", "compute_comm_ratio", ""), ("bytes / step / rank", "bytes_per_step", "B"),
        ("bus traffic / step / rank", "bus_bytes_per_step", "B"), ("busbw on service time (median)", "busbw_gbps", "GB/s")]


def _model(name: str) -> tuple:
    """(model name, parameter count) from run.json, as `syncviz compare` tells models apart."""
    return CMP.model_key(SimpleNamespace(meta=C.store().meta(name)))[:2]


def _model_text(key: tuple) -> str:
    name, params = key
    return f"{name or 'unknown model'}" + (f" ({params:,} parameters)" if params else "")


def default_runs() -> tuple[list[str], str]:
    """Readable runs of one model (the model most runs train; the first found on ties), at most
    DEFAULT_MAX, and a line saying which model and what was left out."""
    groups: dict[tuple, list[str]] = {}
    for n in C.store().readable_names():
        try:
            groups.setdefault(_model(n), []).append(n)
        except Exception:
            continue
    if not groups:
        return [], ""
    key = max(groups, key=lambda k: len(groups[k]))
    runs = groups[key][:DEFAULT_MAX]
    others = sum(len(v) for k, v in groups.items() if k != key)
    text = f"Showing runs of {_model_text(key)}."
    if others:
        text += f" {others} other run{'s' if others > 1 else ''} train other models; comparing strategies needs one model."
    if len(groups[key]) > DEFAULT_MAX:
        text += f" First {DEFAULT_MAX} of {len(groups[key])}."
    return runs, text


def layout(**_query):
    names = C.store().names()
    runs, note = default_runs()
    return html.Div([
        html.H2("Strategies side by side"),
        html.P(note, id="strategies-default", className="hint"),
        dcc.Dropdown(id="strategies-runs", options=[{"label": n, "value": n} for n in names],
                     value=runs, multi=True, placeholder="runs to compare"),
        html.Div(id="strategies-errors"),
        html.Div(id="strategies-table"),
        html.Div(id="strategies-notes", className="notes"),
        C.graph("strategies-split", figure=empty_figure("loading…")),
        html.Div([C.graph("strategies-bytes"), C.graph("strategies-memory")], className="two"),
    ])


dash.register_page(__name__, path="/strategies", name="Strategies", order=3, title="syncviz · strategies", layout=layout)


@dash.callback(Output("strategies-runs", "value"), Input("url", "search"), State("strategies-runs", "value"))
def runs_from_url(search, current):
    """``/strategies?run=a&run=b`` (the Runs page's "compare" link) selects those runs."""
    wanted = [n for n in parse_qs((search or "").lstrip("?")).get("run", []) if C.store().has(n)]
    return wanted or current or dash.no_update


def compare(names: list[str]):
    """(table, split figure, bytes figure, memory figure, error cards, notes) for the readable runs."""
    summaries, splits, op_bytes, memory, errors, comparisons = {}, {}, {}, {}, [], {}
    for n in names:
        try:
            run = C.store().get(n)
            summaries[n], splits[n], op_bytes[n] = dict(run.summary()), run.time_split(), run.op_bytes()
            comparisons[n] = run.comparison()
            # bus traffic per step and rank (bytes × nccl-tests' bus factor), as `syncviz compare` counts it
            summaries[n]["bus_bytes_per_step"] = comparisons[n]["bus_bytes_per_step"]
            memory[n] = CH.memory_of(run.meta)
        except Exception as e:
            errors.append(C.error_card(C.problem_text(e), title=f"{n}: left out"))
    if not summaries:
        return None, empty_figure("no readable run selected"), empty_figure(""), empty_figure(""), errors, None
    models = {}
    for n in summaries:
        models.setdefault(_model(n), []).append(n)
    if len(models) > 1:
        errors.append(C.error_card("; ".join(f"{', '.join(v)}: {_model_text(k)}" for k, v in models.items())
                                   + ". Their numbers are not comparable.", title="These runs train different models"))
    table = html.Table([html.Thead(html.Tr([html.Th("")] + [html.Th(n) for n in summaries])),
                        html.Tbody([html.Tr([html.Th(label)] + [html.Td(_cell(s.get(key), unit)) for s in summaries.values()])
                                    for label, key, unit in ROWS] +
                                   [html.Tr([html.Th("verdict")] + [html.Td(s["verdict"], className="verdict")
                                                                    for s in summaries.values()])])],
                       className="compare-table")
    return (table, CH.time_split_figure(splits), CH.op_bytes_figure(op_bytes), CH.memory_figure(memory), errors,
            notes_block(comparisons))


def notes_block(comparisons: dict[str, dict]):
    """The caveats `syncviz compare` prints: the backend's (gloo runs reduce-scatter as an
    all-reduce...) and each run's (FSDP2 synchronous on CPU, ZeroRedundancyOptimizer's broadcasts...)."""
    items = [html.Li(n) for n in CMP.backend_notes(list(comparisons.values()))]
    for name, c in comparisons.items():
        items += [html.Li([html.B(f"{name}: "), n]) for n in c.get("notes", [])]
    if not items:
        return None
    return html.Div([html.H3("What these numbers mean on this backend"), html.Ul(items)])


def _cell(value, unit):
    if unit == "B":
        return C.fmt_bytes(value)
    if unit == "GB/s":
        return C.fmt_sig(value, " GB/s")
    if unit is None:
        return str(value)
    return C.fmt(float(value) if isinstance(value, (int, float)) else value, 2, unit)


@dash.callback(Output("strategies-table", "children"), Output("strategies-split", "figure"),
               Output("strategies-bytes", "figure"), Output("strategies-memory", "figure"),
               Output("strategies-errors", "children"), Output("strategies-notes", "children"),
               Output("strategies-default", "children"), Input("strategies-runs", "value"))
def draw(names):
    if not names:
        return None, empty_figure("pick runs to compare"), empty_figure(""), empty_figure(""), None, None, \
            default_runs()[1]
    return *compare(list(names)), selection_text(list(names))


def selection_text(names: list[str]) -> str:
    """What the page shows: the model of the selected runs (the default line describes the default
    selection, not one picked by hand or by the address)."""
    runs, note = default_runs()     # reads every run's run.json: once
    if list(names) == runs:
        return note
    models = set()
    for n in names:
        try:
            models.add(_model(n))
        except Exception:
            continue
    if len(models) == 1:
        return f"Showing {len(names)} run{'s' if len(names) > 1 else ''} of {_model_text(models.pop())}."
    return f"Showing {len(names)} runs of {len(models)} different models: their numbers are not comparable."
