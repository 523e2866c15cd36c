"""Small shared pieces of the pages: the store the app serves, error cards, number cards, formats."""
from __future__ import annotations

import logging
import math
from urllib.parse import quote

from dash import dcc, html

from syncviz.trace import TraceError

from syncviz.dashboard.data.store import RunStore

log = logging.getLogger("syncviz.dashboard")
_STORE: RunStore | None = None


def set_store(store: RunStore) -> None:
    global _STORE
    _STORE = store


def store() -> RunStore:
    """The RunStore of the app in this process (one app per process, set by create_app)."""
    if _STORE is None:
        raise RuntimeError("syncviz.dashboard: create_app() was not called")
    return _STORE


def as_json(components):
    """Dash components as the plain JSON Dash would send for them (type, namespace, props). Why: a
    component in a callback's answer makes plotly's JSON encoder (orjson) fall back to walking every
    value of the answer, figures included: 12.5 ms for a Replay step of the 1,024-rank run against
    3.6 ms with its cards as plain JSON (benchmarks/scale.py's 10^8-event ZeRO-3 run, session 33)."""
    import orjson
    from plotly.io.json import to_json_plotly
    return orjson.loads(to_json_plotly(components))


def error_card(message: str, title: str = "Cannot show this run") -> html.Div:
    return html.Div([html.B(title), html.Div(message, className="error-msg")], className="error-card")


def note_card(message: str, title: str) -> html.Div:
    """Not an error: what a page has nothing to show for, and where to look instead."""
    return html.Div([html.B(title), html.Div(message)], className="note-card")


def problem_text(exc: Exception) -> str:
    """One line for an error card; unexpected errors are logged with their traceback."""
    if isinstance(exc, TraceError):
        return str(exc)
    log.exception("dashboard callback failed")
    return f"{exc.__class__.__name__}: {str(exc)[:200]}"


def fmt(value, digits: int = 2, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def fmt_sig(value, unit: str = "", digits: int = 3) -> str:
    """``digits`` significant digits: bandwidths span 0.01 GB/s (gloo on CPU) to 400 GB/s."""
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return "–"
    return f"{value:.{digits}g}{unit}"


def fmt_count(lo, hi) -> str:
    """A count as an integer, or the integer range when it differs between ranks or steps
    ("6–7", never a mean such as "6.5" or "7.0")."""
    lo, hi = int(lo), int(hi)
    return str(lo) if lo == hi else f"{lo}–{hi}"


def fmt_bytes(n) -> str:
    if n is None or n != n:
        return "–"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= k:
            return f"{n / k:.2f} {unit}"
    return f"{int(n)} B"


def number_card(label: str, value: str, hint: str = "") -> html.Div:
    return html.Div([html.Div(value, className="num"), html.Div(label, className="label")],
                    className="card", title=hint)


def run_href(page: str, name: str | None) -> str:
    return f"/{page}?run={quote(name)}" if name else f"/{page}"


def run_picker_note(name: str | None) -> html.Div | None:
    if not name:
        return html.Div("Pick a run in the box at the top right (or on the Runs page).", className="hint")
    return None


def status_badge(recording: bool, problems: list[str]) -> html.Span:
    if recording:
        return html.Span("● recording", className="badge live", title="run.json is not marked finished; "
                         "new steps appear as ranks flush them")
    if problems:
        return html.Span("incomplete", className="badge warn", title="; ".join(problems))
    return html.Span("finished", className="badge ok")


def graph(id_, **kw) -> dcc.Graph:
    return dcc.Graph(id=id_, config={"displaylogo": False, "scrollZoom": False}, **kw)
