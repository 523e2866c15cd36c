"""The scripts every page loads: Dash's, less @babel/polyfill, and a plotly.js of the trace types the
pages draw.

Dash serves @babel/polyfill 7.12.1 (core-js 2) before React, for browsers that lack ES2015+. In one
that has them it replaces nothing the pages use, but one of its feature tests (RegExp @@split)
assigns ``constructor`` on a RegExp, and V8 then runs every regular expression of the tab, for as
long as it lives, on its slow path. Plotly reads each path shape's text with regular expressions
(the Replay draws a big step's bars as path shapes: views/timeline_marks.py), so with the polyfill
loaded, Plotly.react of a 1,024-rank ZeRO-3 step's timeline (3,244 bars in path shapes) took 85.9 ms
in headless Chromium, against 36.3 ms without it (benchmarks/page_scripts.py, the two side by side;
session 45), and a jump of the Replay on benchmarks/scale.py's 10^8-event ZeRO-3 run was painted
163-170 ms after the key press, against 117-126 ms without it (benchmarks/dashboard.py --babel-polyfill).

The one thing Dash's own bundles take from the polyfill, the global ``regeneratorRuntime``, is
served from assets/regenerator_runtime.js (regenerator-runtime 0.13.11, the version the polyfill
bundles), which Dash loads before its renderer.

plotly.js: Dash's dcc.Graph loads the full plotly.min.js (4.8 MB, every trace type: maps, 3-D,
geo...) when the first graph of a page mounts, from the URL dash-renderer gives it. Headless Chromium
took 1.38 s to evaluate it on the first open of the Replay (AMD EPYC family 25 model 1, in Chromium's
own trace of the page, tracing on; session 48), on the page's one thread, while the first step's draw
waited. The app serves plotly_bundle/plotly-syncviz.min.js at that URL instead: the same plotly.js
version built with only the trace types below (1.6 MB; plotly_bundle/build.js). The Replay's cold
first open of benchmarks/scale.py's 10^8-event runs, alternated with the full bundle (three pairs
each, benchmarks/dashboard.py): DDP 3.57-4.58 s -> 2.37-2.45 s, ZeRO-3 3.22-4.07 s -> 1.94-2.21 s.
Where the plotly Python package ships another plotly.js version, the full bundle is served as
before: figures are built for the version it ships.
"""
from __future__ import annotations

import re
from pathlib import Path

import dash
import flask

# a <script> tag whose src is the polyfill, served locally (".../dash/deps/polyfill@7.v4_4_1m....min.js")
# or from a CDN (".../@babel/polyfill@7.12.1/dist/polyfill.min.js")
POLYFILL_TAG = re.compile(r'<script\b[^>]*\bsrc="[^"]*/(?:@babel/)?polyfill@[^"]*"[^>]*>\s*</script>\s*')


# Every trace type the pages draw: the bundle holds these and no other (tests/test_dashboard.py;
# tests/test_dashboard_browser.py check every graph drawn on every page against the bundle's list)
TRACES = ("bar", "box", "heatmap", "scatter", "scattergl")
BUNDLE = Path(__file__).parent / "plotly_bundle" / "plotly-syncviz.min.js"
# where dash-renderer tells dcc.Graph to load plotly.js from when Dash serves its scripts itself
PLOTLY_JS = "_dash-component-suites/plotly/package_data/plotly.min.js"
BANNER = re.compile(rb"/\* plotly\.js v(\S+) ")


def bundle_version() -> str | None:
    """The plotly.js version the partial bundle was built from (its banner), None if there is none."""
    try:
        with open(BUNDLE, "rb") as f:
            m = BANNER.match(f.read(200))
    except OSError:
        return None
    return m.group(1).decode() if m else None


def serves_bundle() -> bool:
    """Whether pages get the partial bundle: it is there and is the plotly.js the plotly package ships."""
    from plotly.offline import get_plotlyjs_version
    return bundle_version() == get_plotlyjs_version()


def without_polyfill(scripts: str) -> str:
    """Dash's script tags less the polyfill's."""
    return POLYFILL_TAG.sub("", scripts)


class Dash(dash.Dash):
    """dash.Dash whose pages load no @babel/polyfill and the partial plotly.js (see above)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.config.serve_locally and serves_bundle():
            url = self.config.routes_pathname_prefix + PLOTLY_JS      # the path as Flask sees it
            bundle = BUNDLE

            @self.server.before_request
            def _partial_plotly():
                if flask.request.path == url:
                    # max_age 0 with an ETag, as Dash serves that unfingerprinted URL: revalidated, not re-sent
                    return flask.send_file(bundle, mimetype="text/javascript", conditional=True, etag=True,
                                           max_age=0)
                return None

    def interpolate_index(self, **kwargs):
        kwargs["scripts"] = without_polyfill(kwargs.get("scripts", ""))
        return super().interpolate_index(**kwargs)
