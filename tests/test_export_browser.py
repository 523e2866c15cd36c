"""The HTML report opens from disk in headless Chromium (no server, no network) and draws every
chart. A screenshot is left next to the report (its path is printed) for a person to look at."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from syncviz.views.export.report import write_html
from syncviz.trace import load_run
from tracebuild import make_ddp_run
from browser_helpers import start_chromium

pytestmark = pytest.mark.browser

CHARTS = ("timeline", "steps", "buckets", "skew")


@pytest.fixture
def chromium():
    driver = start_chromium(1300, 2300)
    try:
        yield driver
    finally:
        driver.quit()


def drawn(driver) -> dict:
    """Per chart div: how many plot traces plotly rendered into SVG."""
    return driver.execute_script("""
        const out = {};
        for (const div of document.querySelectorAll('.js-plotly-plot')) {
            out[div.id] = div.querySelectorAll('.main-svg .trace, .main-svg .hm, .main-svg image').length;
        }
        return out;""")


def test_report_draws_its_charts(chromium, tmp_path):
    run = load_run(make_ddp_run(tmp_path / "straggly", straggler=1, straggle_ms=3))
    report = write_html(run, tmp_path / "report.html")
    chromium.get(report.resolve().as_uri())
    deadline = time.monotonic() + 60
    while True:
        counts = drawn(chromium)
        if len(counts) == len(CHARTS) and all(counts.values()):
            break
        assert time.monotonic() < deadline, f"charts not drawn: {counts}"
        time.sleep(0.2)
    assert set(counts) == {f"chart-{c}" for c in CHARTS}
    # timeline (the dashboard's): forward, backward, optimizer and bucket bars of both ranks, none
    # overlapping another on its row, exposed comm marked
    bars = chromium.execute_script("""
        var gd = document.getElementById('chart-timeline'), out = [];
        gd._fullData.forEach(function (t) { if (!(t.meta && t.meta.role === 'bar')) return;
            for (var i = 0; i < t.y.length; i++)      // a collective's whole span: its hover points' customdata
                out.push(t.type === 'bar' ? [t.y[i], t.base[i], t.base[i] + t.x[i]] : [t.y[i], t.customdata[i][2], t.customdata[i][3]]); });
        return out;""")
    assert len(bars) == 2 * 2 * (3 + 2)      # ranks × shown steps (1, 2) × (3 compute + 2 buckets)
    for y in {b[0] for b in bars}:
        row = sorted(b[1:] for b in bars if b[0] == y)
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(row, row[1:])), row
    exposed = chromium.execute_script(
        "return document.getElementById('chart-timeline').data.filter(t => t.meta && t.meta.role === 'exposed').length")
    assert exposed == 1
    assert "mostly bucket 1" in chromium.find_element("css selector", ".verdict").text
    errors = [e for e in chromium.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    shot = Path(tmp_path / "report.png")
    chromium.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
    print(f"\nscreenshot: {shot}")
