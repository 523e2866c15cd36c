"""The Dash app and the ``syncviz dash ROOT`` command.

Pages live in syncviz.dashboard.pages and register themselves with dash.register_page; their
figures come from timeline.py / charts.py, their numbers from syncviz.analysis via store.py.
The header holds the navigation and one run picker shared by every page (it survives page
changes, and a ``?run=NAME`` in the address selects the run).
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import time
from pathlib import Path
from urllib.parse import parse_qs

import click
import dash
from dash import Input, Output, State, dcc, html

from syncviz.dashboard import components as C
from syncviz.dashboard import page_scripts
from syncviz.dashboard.data.stepview import FOREGROUND
from syncviz.dashboard.data.store import RunStore

PAGES = ("runs", "replay", "buckets", "strategies", "ratios", "distributed", "lesson")


def create_app(root: str | Path, max_run_bytes: int | None = None) -> dash.Dash:
    """Build the app for the runs under ``root`` (one app per process: pages are module-level)."""
    store = RunStore(root, max_run_bytes)
    C.set_store(store)
    app = page_scripts.Dash(__name__, use_pages=True, pages_folder="", title="syncviz",
                            assets_folder=str(Path(__file__).parent / "assets"),
                            suppress_callback_exceptions=True, update_title=None)
    import importlib
    for page in PAGES:   # importing a page registers it (dash.register_page) and its callbacks
        importlib.import_module(f"{__package__}.pages.{page}")
    app.layout = shell
    from syncviz.dashboard.pages import replay
    replay.add_routes(app)
    _server_timing(app.server)
    _prefetch_on_navigation(app.server)
    return app


def shell():
    """The frame around every page (a function: the run list is read at each page load)."""
    names = C.store().names()
    nav = [dcc.Link(p["name"], href=p["relative_path"], className="nav-link", id=f"nav-{p['module'].split('.')[-1]}")
           for p in sorted(dash.page_registry.values(), key=lambda p: p["order"])]
    return html.Div([
        dcc.Location(id="url"),
        html.Header([
            html.Span("syncviz", className="brand"),
            html.Nav(nav, className="nav"),
            html.Div([html.Span("run", className="picker-label"),
                      dcc.Dropdown(id="run-picker", options=[{"label": n, "value": n} for n in names],
                                   value=next(iter(C.store().readable_names()), None), clearable=False,
                                   placeholder="pick a run" if names else "no runs found", className="run-picker")],
                     className="picker"),
        ], className="header"),
        html.Div(f"Serving {len(names)} run(s) under {C.store().root}", className="root-note"),
        html.Div(id="url-error"),
        html.Main(dash.page_container, className="main"),
    ])


@dash.callback(Output("run-picker", "value"), Output("url-error", "children"), Input("url", "search"),
               State("run-picker", "value"))
def pick_from_url(search, current):
    """``?run=NAME`` in the address selects the run (only names found under the root exist); an
    unknown name gives an error card and no run, never silently another run."""
    wanted = parse_qs((search or "").lstrip("?")).get("run", [None])[0]
    if wanted and not C.store().has(wanted):
        return None, C.error_card(f"no run named {wanted[:80]!r} under {C.store().root}; pick one above",
                                  title="Unknown run")
    if wanted and wanted != current:
        return wanted, None
    return dash.no_update, None   # (re-sending the same run would make every page redraw)


RUN_PAGES = ("replay", "buckets", "ratios", "distributed")   # pages about one run (Strategies compares several)


@dash.callback([Output(f"nav-{p}", "href") for p in RUN_PAGES], Input("run-picker", "value"))
def keep_run_in_links(name):
    return [C.run_href(p, name) for p in RUN_PAGES]


def _server_timing(server) -> None:
    """Each response carries ``Server-Timing: app;dur=<ms>`` (request in → response built, so a
    callback's figure and its JSON encoding are included). The benchmark reads it in the browser."""
    from flask import g, request

    @server.before_request
    def _start():
        g.syncviz_t0 = time.perf_counter()
        if request.path.startswith("/_dash-update-component"):
            FOREGROUND.__enter__()   # background analysis pauses between blocks while requests run
            g.syncviz_fg = True

    @server.teardown_request
    def _done(_exc):
        if g.pop("syncviz_fg", False):
            FOREGROUND.__exit__(None, None, None)

    @server.after_request
    def _stamp(response):
        t0 = getattr(g, "syncviz_t0", None)
        if t0 is not None:
            response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1e3:.1f}"
            if request.path.startswith("/_dash-update-component"):
                response.headers["Timing-Allow-Origin"] = "*"
        return response


def _prefetch_on_navigation(server) -> None:
    """``GET /replay?run=NAME`` (the page itself, not a callback): start loading NAME and analysing
    its first step now. The browser needs ~1 s to boot the page before it asks for the run; for a
    run with a million events that second would otherwise be spent waiting."""
    from flask import request

    @server.before_request
    def _prefetch():
        if request.method != "GET" or request.path.startswith(("/_dash", "/assets", "/_favicon")):
            return
        name = request.args.get("run")
        if name:
            from syncviz.dashboard.pages.replay import prepare_first_step
            C.store().prefetch(name, then=prepare_first_step if request.path == "/replay" else None)


def _check_port(host: str, port: int) -> None:
    """Fail with one clear line before Dash starts when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the server will: SO_REUSEADDR lets a restart reuse a port whose old connections are in
        # TIME_WAIT, and still refuses a port another server is listening on.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise click.ClickException(f"port {port} on {host} is already in use; "
                                           f"pick another with --port") from None
            raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


@click.command("dash")
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@click.option("--port", default=8050, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the default serves this machine only.")
@click.option("--debug", is_flag=True, help="Dash debug mode (dev tools, reload on code change).")
@click.option("--max-run-gb", type=click.FloatRange(min=0.001), default=None,
              help="Largest run (GB of rank files) opened whole; bigger ones get an error card naming the "
                   "commands that handle them [a twentieth of this machine's memory: a run opened whole takes up to 20x "
                   "its files' size in the server].")
def dash_command(root: Path, port: int, host: str, debug: bool, max_run_gb: float | None):
    """Serve the Dash replay app for the runs under ROOT (a run directory or a folder of runs).

    Whole-run tables are kept in each run's .syncviz-cache/ folder (written by `syncviz trace` when
    a run ends, or here the first time they are computed) and used only for the exact files they
    came from; deleting the folder is always safe."""
    if not root.exists():
        raise click.ClickException(f"{root}: no such directory")
    # With --debug, Werkzeug's reloader runs this command again in a child process that serves on
    # the socket the parent already bound (WERKZEUG_RUN_MAIN is set there): check and print once.
    reloaded = os.environ.get("WERKZEUG_RUN_MAIN") == "true"
    if not reloaded:
        _check_port(host, port)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("syncviz.dashboard").addHandler(handler)
    if not debug:   # one line per request would bury the URL
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = create_app(root, None if max_run_gb is None else int(max_run_gb * 1e9))
    n = len(C.store().names())
    shown = f"[{host}]" if ":" in host else host
    if not reloaded:
        click.echo(f"syncviz dash: {n} run(s) under {C.store().root}")
        click.echo(f"Open http://{shown}:{port}/   (Ctrl+C to stop)")
    try:
        app.run(host=host, port=port, debug=debug, dev_tools_silence_routes_logging=True)
    except OSError as e:   # lost a race for the port between the check and the bind
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from None
    except SystemExit as e:
        if e.code not in (0, None):
            raise click.ClickException(f"cannot listen on {host}:{port} (port in use?)") from None
        raise
