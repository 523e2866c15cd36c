"""The scripts every page loads: Dash's, less @babel/polyfill.

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
"""
from __future__ import annotations

import re

import dash

# a <script> tag whose src is the polyfill, served locally (".../dash/deps/polyfill@7.v4_4_1m....min.js")
# or from a CDN (".../@babel/polyfill@7.12.1/dist/polyfill.min.js")
POLYFILL_TAG = re.compile(r'<script\b[^>]*\bsrc="[^"]*/(?:@babel/)?polyfill@[^"]*"[^>]*>\s*</script>\s*')


def without_polyfill(scripts: str) -> str:
    """Dash's script tags less the polyfill's."""
    return POLYFILL_TAG.sub("", scripts)


class Dash(dash.Dash):
    """dash.Dash whose pages load no @babel/polyfill (see above)."""

    def interpolate_index(self, **kwargs):
        kwargs["scripts"] = without_polyfill(kwargs.get("scripts", ""))
        return super().interpolate_index(**kwargs)
