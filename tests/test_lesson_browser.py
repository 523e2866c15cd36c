"""The Lesson page in a real headless Chromium (the real `syncviz dash` server): every section
draws, the ring animation steps through its frames, no JavaScript errors. Screenshots go to
$SYNCVIZ_SHOTS (default /tmp/syncviz-dashboard-shots)."""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from test_dashboard import free_port
from test_dashboard_browser import SHOTS, WAIT_S, browser, js_errors, wait_for  # noqa: F401  (fixture)
from test_lesson import build_lesson

pytestmark = pytest.mark.browser

DRAWN = "var g=document.querySelector('#'+arguments[0]+' .js-plotly-plot'); return g && g.data ? g.data.length : 0;"
TITLE = "var g=document.querySelector('#lesson-ring-anim .js-plotly-plot'); return g._fullLayout.title.text;"
Z = "var g=document.querySelector('#lesson-ring-anim .js-plotly-plot'); return g.data[0].z;"


@pytest.fixture(scope="module")
def lesson_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lessonb") / "runs"
    build_lesson(root)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "syncviz", "dash", str(root), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + WAIT_S
    while True:
        try:
            urllib.request.urlopen(base + "/_dash-layout", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"server did not start: {proc.stdout.read()}")
            time.sleep(0.2)
    yield base
    proc.terminate()
    proc.wait(10)


def test_lesson_page_and_ring_animation(lesson_server, browser):  # noqa: F811
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
