"""The Lesson page in a real headless Chromium (the real `syncviz dash` server): every section
draws, the ring animation steps through its frames, no JavaScript errors. Screenshots go to
$SYNCVIZ_SHOTS (default /tmp/syncviz-dashboard-shots)."""
from __future__ import annotations

import time

import pytest
from browser_helpers import SHOTS, dash_server, js_errors, wait_for
from test_lesson import build_lesson

pytestmark = pytest.mark.browser

DRAWN = "var g=document.querySelector('#'+arguments[0]+' .js-plotly-plot'); return g && g.data ? g.data.length : 0;"
TITLE = "var g=document.querySelector('#lesson-ring-anim .js-plotly-plot'); return g._fullLayout.title.text;"
Z = "var g=document.querySelector('#lesson-ring-anim .js-plotly-plot'); return g.data[0].z;"


@pytest.fixture(scope="module")
def lesson_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lessonb") / "runs"
    build_lesson(root)
    with dash_server(root) as base:
        yield base


def test_lesson_page_and_ring_animation(lesson_server, browser):
    d = browser
    d.get(lesson_server + "/lesson")
    for gid in ("lesson-averaging", "lesson-split-manual", "lesson-ring-anim", "lesson-ring-timeline",
                "lesson-ring-bytes", "lesson-memory", "lesson-stale", "lesson-dataparallel"):
        wait_for(lambda gid=gid: d.execute_script(DRAWN, gid), f"{gid} drawn")
    assert "start: every rank holds only its own gradients" in d.execute_script(TITLE)
    d.execute_script("var g=document.querySelector('#lesson-ring-anim .js-plotly-plot');"
                     "Plotly.animate(g, ['6'], {mode:'immediate', frame:{duration:0, redraw:true}});")
    wait_for(lambda: d.execute_script(Z) == [[4] * 4] * 4, "the last frame: every chunk summed on every rank")
    assert "all-gather step 3/3" in d.execute_script(TITLE)
    d.set_window_size(1400, 3400)
    time.sleep(0.5)
    d.save_screenshot(str(SHOTS / "lesson.png"))
    assert js_errors(d) == []
