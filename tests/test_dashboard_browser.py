"""End to end in a real headless Chromium: the real `syncviz dash` server on a free port, sample runs
(test_dashboard.build_root), play / pause, the step slider, hover, many ranks, broken runs, Live.
Screenshots of every page go to $SYNCVIZ_SHOTS (default /tmp/syncviz-dashboard-shots)."""
from __future__ import annotations

import re
import time

import pytest

from browser_helpers import SHOTS, WAIT_S, dash_server, js_errors, text
from browser_helpers import wait_for as _wait_for
from test_dashboard import append_live_step, build_root, write_live_steps

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = build_root(tmp_path_factory.mktemp("dashb") / "runs")
    with dash_server(root) as base:
        yield base, root


# The Replay's timeline on screen: of its two stacked timelines, the one in front (pages/replay.py)
TIMELINE = ".timeline.front"
GRAPH_STATE = """
var gd = document.querySelector(arguments[0] + ' .js-plotly-plot');
if (!gd || !gd._fullLayout || !gd.data) return null;
return {meta: gd._fullLayout.meta || null,
        traces: gd.data.map(t => [t.name, t.type, (t.y || t.z || []).length, (t.meta && t.meta.role) || null]),
        ticks: (gd._fullLayout.yaxis || {}).ticktext || null, title: ((gd._fullLayout.title || {}).text) || ''};
"""


def graph(driver, gid):
    return driver.execute_script(GRAPH_STATE, TIMELINE if gid == "replay-timeline" else "#" + gid)


def wait_for(fn, what, timeout=WAIT_S, driver=None):
    """browser_helpers.wait_for; with ``driver``, a timeout says what the Replay page showed."""
    state = None
    if driver is not None:
        def state():
            return f"page: {text(driver, '#replay-error, #replay-status')!r}, graph: {graph(driver, 'replay-timeline')}"
    return _wait_for(fn, what, timeout, state=state)


# The Replay's two stacked timelines: [box id, front or back, step drawn]
STACK_JS = """
return Array.from(document.querySelectorAll('.timeline-stage > .timeline')).map(function (b) {
  var gd = b.querySelector('.js-plotly-plot');
  return [b.id, b.classList.contains('front') ? 'front' : 'back', ((gd && gd.layout && gd.layout.meta) || {}).step];
});
"""


def shown_step(driver):
    g = graph(driver, "replay-timeline")
    return g["meta"]["step"] if g and g["meta"] else None


def test_replay_play_pause_and_slider(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    base, _ = server
    browser.get(f"{base}/replay?run=synth8")
    wait_for(lambda: shown_step(browser) == 1, "opens at step 1 (after warm-up)")
    g = graph(browser, "replay-timeline")
    traces = {name: n for name, _, n, role in g["traces"] if role in ("bar", "exposed", None)}
    assert traces["all_reduce waiting (hollow)"] == 8 * 6 and "exposed comm (no compute)" in traces   # a whole span each
    assert [t for t in g["ticks"] if t.endswith("compute")] == [f"rank {r} · compute" for r in range(8)]
    browser.save_screenshot(str(SHOTS / "replay.png"))

    play = browser.find_element(By.ID, "replay-play")
    play.click()
    wait_for(lambda: (shown_step(browser) or 0) >= 3, "playing reaches step 3")
    assert "Pause" in play.text
    play.click()
    wait_for(lambda: "Play" in play.text, "paused")
    time.sleep(1.0)   # let a step already requested land
    paused_at = shown_step(browser)
    time.sleep(2.0)
    assert shown_step(browser) == paused_at, "still moving after pause"

    thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
    thumb.send_keys(Keys.END)
    wait_for(lambda: shown_step(browser) == 11, "slider to the last step")
    browser.execute_script(CALLS_JS)
    thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
    thumb.send_keys(Keys.HOME)
    wait_for(lambda: shown_step(browser) == 0, "slider to the first step")
    thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
    thumb.send_keys(Keys.ARROW_RIGHT)
    wait_for(lambda: shown_step(browser) == 1, "slider one step right")
    assert "step 1" in graph(browser, "replay-timeline")["title"]
    assert "server time" not in text(browser, "#replay-info")

    # The step after the one on screen is drawn ahead and kept in the page: one more step right is
    # drawn from that copy, and the server is asked only for the step after it.
    wait_for(lambda: ahead_done(browser, 1), "step 2 drawn ahead")
    time.sleep(0.3)                      # its response applied to the page's store
    cards_before = text(browser, "#replay-info")
    front_before = next(b for b, side, _ in browser.execute_script(STACK_JS) if side == "front")
    browser.execute_script("window.__calls.length = 0;")
    thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
    thumb.send_keys(Keys.ARROW_RIGHT)
    wait_for(lambda: shown_step(browser) == 2, "slider to step 2")
    assert "step 2" in graph(browser, "replay-timeline")["title"]
    wait_for(lambda: ahead_done(browser, 2), "step 3 drawn ahead")
    outputs = [c["out"] for c in browser.execute_script("return window.__calls;")]
    assert not [o for o in outputs if "replay-timeline.figure" in o], outputs     # no draw asked of the server
    assert text(browser, "#replay-info") and text(browser, "#replay-info") != cards_before   # step 2's cards
    browser.save_screenshot(str(SHOTS / "replay-step-drawn-ahead.png"))
    # The copy was painted in the timeline behind and brought to the front: the timelines took turns,
    # and the one behind now holds step 3. A zoom on the one in front goes with the step to the next.
    stack = {side: (box, step) for box, side, step in browser.execute_script(STACK_JS)}
    assert stack["front"] == ("replay-next-box" if front_before == "replay-timeline-box" else "replay-timeline-box", 2)
    wait_for(lambda: {side: step for _, side, step in browser.execute_script(STACK_JS)}["back"] == 3,
             "step 3 drawn behind")
    browser.execute_script("Plotly.relayout(document.querySelector(arguments[0] + ' .js-plotly-plot'), "
                           "{'xaxis.range': [10, 20]});", TIMELINE)
    browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]").send_keys(Keys.ARROW_RIGHT)
    wait_for(lambda: shown_step(browser) == 3, "slider to step 3")
    assert next(b for b, side, _ in browser.execute_script(STACK_JS) if side == "front") == stack["back"][0]
    assert browser.execute_script("return document.querySelector(arguments[0] + ' .js-plotly-plot')._fullLayout"
                                  ".xaxis.range;", TIMELINE) == [10, 20]
    # a jump has no copy: the server draws it
    browser.execute_script("window.__calls.length = 0;")
    thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
    thumb.send_keys(Keys.END)
    wait_for(lambda: shown_step(browser) == 11, "slider to the last step again")
    outputs = [c["out"] for c in browser.execute_script("return window.__calls;")]
    assert [o for o in outputs if "replay-timeline.figure" in o], outputs
    assert not js_errors(browser)


def test_a_run_traced_again_is_not_shown_from_the_old_copy(server, browser):
    """A finished run traced again into its folder while its Replay is open (8 ranks, then 4): the
    step kept in the page is of the old run; once shown, the server is asked for it again and the
    new run's step replaces it."""
    import shutil
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from syncviz.dashboard.data.synth import write_synth_run
    base, root = server
    run_dir = root / "again"
    write_synth_run(run_dir, world=8, steps=5, n_buckets=3)
    try:
        browser.get(f"{base}/replay?run=again")
        wait_for(lambda: shown_step(browser) == 1, "opens at step 1", driver=browser)
        browser.execute_script(CALLS_JS)
        thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
        thumb.send_keys(Keys.ARROW_RIGHT)                       # step 2, drawn by the server
        wait_for(lambda: shown_step(browser) == 2 and ahead_done(browser, 2), "step 3 drawn ahead", driver=browser)
        time.sleep(0.3)
        assert len(lanes(browser)) == 8
        shutil.rmtree(run_dir)
        write_synth_run(run_dir, world=4, steps=5, n_buckets=3)   # traced again: 4 ranks
        browser.execute_script("window.__calls.length = 0;")
        thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
        thumb.send_keys(Keys.ARROW_RIGHT)                       # step 3: the page's copy, of the old run
        wait_for(lambda: shown_step(browser) == 3 and len(lanes(browser)) == 4, "step 3 of the new run", driver=browser)
        outputs = [c["out"] for c in browser.execute_script("return window.__calls;")]
        assert [o for o in outputs if "replay-timeline.figure" in o], outputs     # asked of the server again
        browser.save_screenshot(str(SHOTS / "replay-traced-again.png"))
        assert not js_errors(browser)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def lanes(driver) -> list:
    """The compute lanes of the Replay's timeline (one a rank when each rank is drawn)."""
    return [t for t in (graph(driver, "replay-timeline") or {}).get("ticks") or [] if t.endswith("compute")]


# Records the page's callback requests: what each outputs, its inputs' values, whether it came back.
CALLS_JS = """
window.__calls = [];
if (!window.__fetchWrapped) {
  window.__fetchWrapped = true;
  const f = window.fetch;
  window.fetch = function (url, opts) {
    let rec = null;
    try {
      if (String(url).indexOf('_dash-update-component') >= 0) {
        const b = JSON.parse(opts.body);
        rec = {out: b.output, inputs: (b.inputs || []).map(i => i.value), done: false};
        window.__calls.push(rec);
      }
    } catch (e) {}
    const p = f.apply(this, arguments);
    if (rec) { p.then(() => { rec.done = true; }, () => {}); }
    return p;
  };
}
"""


def ahead_done(driver, step) -> bool:
    """The draw-ahead request made once ``step`` was on screen (for the step after it) came back."""
    calls = driver.execute_script("return window.__calls;")
    return any("replay-ahead.data" in c["out"] and c["done"] and (c["inputs"][0] or [None, None])[1] == step
               for c in calls)


def test_a_late_server_draw_never_replaces_the_step_moved_to(server, browser):
    """A step asked of the server and answered after the user moved on (to a step drawn from the
    page's copy, or back to the step on screen) must not land over it: the page would show one step
    while its slider says another. The server's answers are held back ~1.5 s (Chromium's own network
    emulation) while the keys are pressed, so each move is made with a draw in flight."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    base, _ = server
    browser.get(f"{base}/replay?run=synth8")
    wait_for(lambda: shown_step(browser) == 1, "opens at step 1", driver=browser)
    wait_for(lambda: {side: step for _, side, step in browser.execute_script(STACK_JS)}.get("back") == 2,
             "step 2 drawn behind", driver=browser)

    def slow(latency_ms):
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": False, "latency": latency_ms, "downloadThroughput": -1, "uploadThroughput": -1})

    def thumb():
        return browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")

    def settled_on(step):
        slow(0)
        time.sleep(3.0)          # every answer held back has landed by now
        assert browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]").get_attribute(
            "aria-valuenow") == str(step)
        assert shown_step(browser) == step, browser.execute_script(STACK_JS)

    try:
        # a jump (drawn by the server, held back), then the step drawn ahead: shown from the copy at once
        slow(1500)
        thumb().send_keys(Keys.END)
        browser.execute_script("dash_clientside.set_props('replay-step', {value: 2});")
        wait_for(lambda: shown_step(browser) == 2, "step 2 from the copy", timeout=1.0, driver=browser)
        settled_on(2)
        # a step back (drawn by the server, held back), then forward again to the step on screen
        slow(1500)
        thumb().send_keys(Keys.ARROW_LEFT)
        thumb().send_keys(Keys.ARROW_RIGHT)
        settled_on(2)
        browser.save_screenshot(str(SHOTS / "replay-after-late-answers.png"))   # slider and timeline: step 2
    finally:
        slow(0)
    assert not js_errors(browser)


def test_hover_shows_bucket_details(server, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    base, _ = server
    browser.get(f"{base}/replay?run=ddp")
    wait_for(lambda: shown_step(browser) == 1, "ddp drawn")
    gd = browser.find_element(By.CSS_SELECTOR, ".timeline.front .js-plotly-plot")
    # the middle of rank 0's bucket 0 bar ([16, 26] ms on row 1, "rank 0 · comm"), in page pixels
    x, y, w, h = browser.execute_script("""
        var gd = arguments[0], L = gd._fullLayout, r = gd.getBoundingClientRect();
        return [L._size.l + L.xaxis.l2p(21), L._size.t + L.yaxis.l2p(1), r.width, r.height];""", gd)
    ActionChains(browser).move_to_element_with_offset(gd, int(x - w / 2), int(y - h / 2)).perform()
    hover = wait_for(lambda: text(browser, ".timeline.front .hoverlayer"), "hover label", timeout=10)
    assert "bucket 0" in hover and "busbw" in hover and "fc2.weight" in hover and "4.00 MB" in hover
    assert "start 16.000 ms · end 26.000 ms · duration 10.000 ms" in hover and "+" not in hover


def test_many_ranks_aggregated(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    base, _ = server
    browser.get(f"{base}/replay?run=synth24")
    wait_for(lambda: shown_step(browser) == 1, "synth24 drawn")
    ticks = graph(browser, "replay-timeline")["ticks"]
    assert any("fastest step" in t for t in ticks) and any("launches last" in t for t in ticks)
    # the first open's heatmap comes after the timeline is painted (heatmap_after_paint): until then
    # the graph holds no traces, so wait for the step's own heatmap, not for any figure
    heat = wait_for(lambda: (graph(browser, "replay-lateness") or {}).get("meta") == {"step": 1} and
                    graph(browser, "replay-lateness"), "lateness heatmap")
    assert heat["traces"][0][1] == "heatmap" and heat["traces"][0][2] == 24 and heat["meta"] == {"step": 1}
    # a step drawn by the server: its heatmap follows the painted timeline, and is no longer dimmed
    last = int(browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]").get_attribute("aria-valuemax"))
    browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]").send_keys(Keys.END)
    wait_for(lambda: shown_step(browser) == last, "the last step drawn", driver=browser)
    wait_for(lambda: (graph(browser, "replay-lateness") or {}).get("meta") == {"step": last}, "its heatmap")
    wait_for(lambda: not browser.find_element(By.ID, "replay-lateness-box").get_attribute("style"), "heatmap shown in full")
    # keys pressed faster than steps are drawn: the page settles on the slider's step, with that
    # step's heatmap in full and the step after it drawn behind (not a step left on the way)
    thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
    for key in (Keys.HOME, Keys.ARROW_RIGHT, Keys.END, Keys.ARROW_LEFT, Keys.ARROW_LEFT, Keys.HOME, Keys.ARROW_RIGHT):
        thumb.send_keys(key)
    wait_for(lambda: shown_step(browser) == 1, "settled on step 1", driver=browser)
    wait_for(lambda: (graph(browser, "replay-lateness") or {}).get("meta") == {"step": 1}, "step 1's heatmap")
    wait_for(lambda: {side: step for _, side, step in browser.execute_script(STACK_JS)}.get("back") == 2,
             "step 2 drawn behind", driver=browser)
    assert not browser.find_element(By.ID, "replay-lateness-box").get_attribute("style")
    assert not js_errors(browser)
    browser.save_screenshot(str(SHOTS / "replay-24-ranks.png"))


def test_replay_without_request_idle_callback(server, browser):
    """Safari has no requestIdleCallback: the wait for the paint falls back to a timeout, so the
    heatmap of a step the server drew still arrives, and the step after it is still drawn behind."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    base, _ = server
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                     {"source": "delete window.requestIdleCallback; window.requestIdleCallback = undefined;"})
    try:
        browser.get(f"{base}/replay?run=synth24")
        wait_for(lambda: shown_step(browser) == 1, "synth24 drawn", driver=browser)
        assert browser.execute_script("return typeof window.requestIdleCallback;") == "undefined"
        thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
        last = int(thumb.get_attribute("aria-valuemax"))
        thumb.send_keys(Keys.END)
        wait_for(lambda: shown_step(browser) == last, "the last step drawn", driver=browser)
        thumb.send_keys(Keys.HOME)                  # step 0: drawn by the server, with a step after it
        wait_for(lambda: shown_step(browser) == 0, "step 0 drawn", driver=browser)
        wait_for(lambda: (graph(browser, "replay-lateness") or {}).get("meta") == {"step": 0}, "step 0's heatmap")
        wait_for(lambda: {side: step for _, side, step in browser.execute_script(STACK_JS)}.get("back") == 1,
                 "step 1 drawn behind", driver=browser)
        assert not js_errors(browser)
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


# When each callback request was sent, when each idle callback of the Replay's paint wait ran (the
# one asked with {timeout: 200}: replay_browser.py), and each Plotly.react: [start, end, graph, step].
ORDER_JS = """
window.__sent = []; window.__idleRuns = []; window.__reacts = [];
const f = window.fetch;
window.fetch = function (url, opts) {
  try {
    if (String(url).indexOf('_dash-update-component') >= 0) {
      window.__sent.push([JSON.parse(opts.body).output, performance.now()]);
    } else if (String(url).indexOf('_syncviz/replay-heatmap') >= 0) {    // replay.add_routes
      window.__sent.push(['replay-heatmap', performance.now()]);
    }
  } catch (e) {}
  return f.apply(this, arguments);
};
const ric = window.requestIdleCallback;
window.requestIdleCallback = function (cb, opts) {
  const ours = opts && opts.timeout === 200;
  return ric.call(window, function (d) { if (ours) { window.__idleRuns.push(performance.now()); } return cb(d); }, opts);
};
const watch = setInterval(function () {
  const P = window.Plotly;
  if (!P || !P.react) { return; }
  clearInterval(watch);
  const react = P.react;
  P.react = function (gd) {
    const t = performance.now(), out = react.apply(this, arguments);
    const el = typeof gd === 'string' ? document.getElementById(gd) : gd;
    const box = el && el.closest('[id]');
    window.__reacts.push([t, performance.now(), box ? box.id : '?', ((el && el.layout && el.layout.meta) || {}).step]);
    return out;
  };
}, 1);
"""


def test_a_drawn_steps_heatmap_is_asked_for_right_after_its_paint_frame(server, browser):
    """A step the server drew: the page asks for its heatmap (of replay.add_routes' route, not a Dash
    callback) right after the frame that paints the
    timeline, not once idle after it, when it asks for the step after it (replay_browser.py: the
    browser rasterizes the timeline in between; on the 10^8-event ZeRO-3 run that was ~50-60 ms).
    So, on the page's clock: the timeline handed to Plotly, then the heatmap asked for, then the
    paint wait's idle callback, then the step after asked for; the heatmap drawn after the timeline."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    base, _ = server
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": ORDER_JS})
    try:
        browser.get(f"{base}/replay?run=synth24")
        wait_for(lambda: shown_step(browser) == 1, "synth24 drawn", driver=browser)
        wait_for(lambda: (graph(browser, "replay-lateness") or {}).get("meta") == {"step": 1}, "step 1's heatmap")
        wait_for(lambda: {side: step for _, side, step in browser.execute_script(STACK_JS)}.get("back") == 2,
                 "step 2 drawn behind", driver=browser)
        t0 = browser.execute_script("return performance.now();")
        browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]").send_keys(Keys.HOME)  # drawn by the server
        wait_for(lambda: (graph(browser, "replay-lateness") or {}).get("meta") == {"step": 0}, "step 0's heatmap")
        wait_for(lambda: {side: step for _, side, step in browser.execute_script(STACK_JS)}.get("back") == 1,
                 "step 1 drawn behind", driver=browser)
        sent, idles, reacts = browser.execute_script("return [window.__sent, window.__idleRuns, window.__reacts];")
        sent = [(out, t) for out, t in sent if t > t0]
        timeline = [r for r in reacts if r[0] > t0 and r[2] == "replay-timeline" and r[3] == 0]
        heatmap = [r for r in reacts if r[0] > t0 and r[2] == "replay-lateness"]
        asked = [t for out, t in sent if out == "replay-heatmap"]
        ahead = [t for out, t in sent if "replay-ahead.data" in out]
        assert timeline and heatmap and len(asked) == 1 and ahead, (sent, reacts)
        idle = [t for t in idles if t > timeline[0][1]]
        assert timeline[0][1] <= asked[0] < idle[0] <= ahead[0], (timeline, asked, idle, ahead)
        assert heatmap[0][0] >= timeline[0][1]
        assert not js_errors(browser)
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


GL_CANVAS_JS = """
var done = arguments[arguments.length - 1];
var div = document.createElement('div');
document.body.appendChild(div);
Plotly.newPlot(div, [{type: 'scattergl', mode: 'lines', x: [0, 1, 2], y: [0, 1, 0]}],
               {width: 400, height: 300, margin: {l: 0, r: 0, t: 0, b: 0}}).then(function () {
  var c = div.querySelector('canvas.gl-canvas-context');
  var out = [window.devicePixelRatio, c.width, c.height];
  Plotly.purge(div); div.remove(); done(out);
});
"""


def test_webgl_is_drawn_at_the_screens_pixel_ratio(server, browser):
    """assets/gl_pixel_ratio.js: a WebGL plot's canvas has the screen's pixels (Plotly's default
    draws twice as many each way, four times the work where WebGL is drawn in software), on a
    screen of ratio 1 and on one of ratio 2."""
    base, _ = server
    try:
        for ratio in (1, 2):
            browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                    {"width": 1400, "height": 1000, "deviceScaleFactor": ratio, "mobile": False})
            browser.get(f"{base}/replay?run=synth24")
            wait_for(lambda: shown_step(browser) == 1, "synth24 drawn")
            browser.set_script_timeout(30)
            assert browser.execute_async_script(GL_CANVAS_JS) == [ratio, 400 * ratio, 300 * ratio]
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_pages_run_without_the_babel_polyfill(server, browser):
    """page_scripts.py: the page loads no @babel/polyfill, Dash's bundles find the regenerator
    runtime they call (assets/regenerator_runtime.js: without it no graph is drawn, so every other
    browser test here fails too), and the Replay draws with no error in the console."""
    base, _ = server
    browser.get(f"{base}/replay?run=synth24")
    wait_for(lambda: shown_step(browser) == 1, "synth24 drawn", driver=browser)
    assert browser.execute_script("return [window._babelPolyfill === undefined, typeof window.core, "
                                  "typeof regeneratorRuntime.mark, Array.from(document.scripts)"
                                  ".filter(s => /polyfill/.test(s.src)).length]") == [True, "undefined", "function", 0]
    assert not js_errors(browser)


# Every graph's trace types on the page, and the trace types its plotly.js holds
TRACE_TYPES_JS = """
return [Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => (g.data || []).map(t => t.type || 'scatter')).flat(),
        Object.keys(Plotly.PlotSchema.get().traces).sort()];
"""


def test_every_page_draws_with_the_partial_plotly_js(server, browser):
    """page_scripts.py: the pages load the partial plotly.js (page_scripts.TRACES, not Dash's full
    one), and every graph of every page draws only trace types it holds (an unregistered type would
    be drawn as nothing, with no error)."""
    from syncviz.dashboard import page_scripts as P
    from plotly.offline import get_plotlyjs_version
    base, _ = server
    drawn = set()
    for page, run, graphs in (("replay", "synth24", ["replay-lateness"]),
                              ("buckets", "synth8", ["buckets-map", "buckets-duration", "buckets-busbw", "buckets-delay"]),
                              ("ratios", "synth8", ["ratios-steps", "ratios-skew"]),
                              ("strategies", "synth8", ["strategies-split", "strategies-bytes"]),
                              ("distributed", "synth8", ["distributed-ranks"])):
        browser.get(f"{base}/{page}?run={run}")
        if page == "replay":
            wait_for(lambda: shown_step(browser) == 1, "synth24 drawn", driver=browser)
        for gid in graphs:
            wait_for(lambda: (graph(browser, gid) or {}).get("traces"), f"{page}: {gid} drawn")
        types, held = browser.execute_script(TRACE_TYPES_JS)
        if P.serves_bundle():
            assert held == sorted(P.TRACES), held
        else:       # the plotly package ships another plotly.js than the bundle's: Dash's full one is served
            assert P.bundle_version() != get_plotlyjs_version() and len(held) > len(P.TRACES)
        assert set(types) <= set(held), (page, types)
        drawn |= set(types)
    assert {"bar", "box", "heatmap", "scatter"} <= drawn, drawn
    assert not js_errors(browser)


def test_unknown_run_in_the_address_is_an_error(server, browser):
    base, _ = server
    browser.get(f"{base}/replay?run=does-not-exist")
    wait_for(lambda: "does-not-exist" in text(browser, "#url-error .error-card"), "error card for the unknown run")
    assert not (graph(browser, "replay-timeline") or {}).get("meta"), "another run was drawn"


def test_broken_runs_show_error_cards_rest_works(server, browser):
    base, _ = server
    browser.get(f"{base}/")
    wait_for(lambda: "corrupt JSON" in text(browser, ".runs-table"), "error card of the corrupt run")
    wait_for(lambda: "GB/s" in text(browser, ".runs-table"), "numbers of the good runs")
    assert "not an Arrow IPC stream" in text(browser, ".runs-table")
    browser.save_screenshot(str(SHOTS / "runs.png"))
    browser.get(f"{base}/replay?run=dash_bad_stream")
    wait_for(lambda: "not an Arrow IPC stream" in text(browser, "#replay-error .error-card"), "replay error card")
    browser.get(f"{base}/replay?run=synth8")
    wait_for(lambda: shown_step(browser) == 1, "a good run after a broken one")
    assert not text(browser, "#replay-error")


def test_other_pages_draw(server, browser):
    base, _ = server
    for page, graphs in (("buckets", ["buckets-map", "buckets-duration", "buckets-busbw", "buckets-delay"]),
                         ("ratios", ["ratios-steps", "ratios-skew"]),
                         ("strategies", ["strategies-split", "strategies-bytes"])):
        browser.get(f"{base}/{page}?run=synth8")
        for gid in graphs:
            wait_for(lambda: (graph(browser, gid) or {}).get("traces"), f"{page}: {gid} drawn")
        browser.save_screenshot(str(SHOTS / f"{page}.png"))
    assert "synth8" in text(browser, ".compare-table")
    calls = browser.execute_script("var g = document.querySelector('#strategies-bytes .js-plotly-plot');"
                                   "return g.data.map(t => t.customdata).flat();")
    assert calls and all(re.fullmatch(r"\d+(–\d+)?", str(c)) for c in calls), calls     # counts, never "7.0"
    browser.get(f"{base}/distributed?run=synth8")
    wait_for(lambda: (graph(browser, "distributed-ranks") or {}).get("traces"), "distributed: ranks drawn")
    rows = wait_for(lambda: browser.execute_script(
        "return Array.from(document.querySelectorAll('#distributed-kinds tbody tr'))"
        ".map(r => Array.from(r.cells).map(c => c.textContent));"), "distributed: collectives table")
    head = text(browser, "#distributed-kinds thead th").split()
    assert head[:2] == ["collective", "calls"] and [r[:2] for r in rows] == [["all_reduce", "6"]], rows
    browser.save_screenshot(str(SHOTS / "distributed.png"))
    browser.get(f"{base}/strategies?run=ddp&run=synth8")
    wait_for(lambda: "ddp" in text(browser, ".compare-table th") and "synth24" not in text(browser, ".compare-table th"),
             "compare link selects its runs")


def test_live_run_shows_new_steps(server, browser):
    base, root = server
    writers = write_live_steps(root / "live", steps=2)
    try:
        browser.get(f"{base}/replay?run=live")
        wait_for(lambda: shown_step(browser) == 1, "live run drawn", driver=browser)
        assert "recording" in text(browser, "#replay-status")
        # following: the slider moves to the newest step once a live tick sees the flushed files,
        # from wherever it was (before, it followed only from the last step and stayed on step 1)
        browser.find_element("css selector", "#replay-step [role=slider]").send_keys("\ue011")   # Home: step 0
        wait_for(lambda: shown_step(browser) == 0, "moved back to step 0", driver=browser)
        append_live_step(writers, 2)
        wait_for(lambda: shown_step(browser) == 2, "the flushed step 2 shown", driver=browser)
        append_live_step(writers, 3)
        wait_for(lambda: shown_step(browser) == 3, "the flushed step 3 shown", driver=browser)
        browser.save_screenshot(str(SHOTS / "live.png"))
    finally:
        for w in writers:
            w.close()


# Every bar of the Replay figure as the browser holds it: role "bar" marks the bars that must not
# share time on a row (compute, and the whole span of each collective: in SVG a layout shape draws
# those, and their hover points hold start and end in customdata); a figure without roles (as drawn
# before this check existed) counts every bar but the exposed overlay.
FIGURE_BARS = """
var gd = document.querySelector('.timeline.front .js-plotly-plot');
if (!gd || !gd.data || !gd.data.length) return null;
var out = [];
gd.data.forEach(function (t) {
  var role = t.meta && t.meta.role;
  if (t.type !== 'bar' && role === 'bar') {     // a bar drawn by a shape, held by its hover points
    var at = /forward|backward|optimizer/.test(t.name) ? 1 : 2;      // a compute bar's start, a collective's
    for (var j = 0; j < t.y.length; j++) out.push([t.name, +t.y[j], +t.customdata[j][at], +t.customdata[j][at + 1]]);
    return;
  }
  if (t.type !== 'bar') return;
  if (role ? role !== 'bar' : /exposed/.test(t.name)) return;
  for (var i = 0; i < t.y.length; i++) out.push([t.name, +t.y[i], +t.base[i], +t.base[i] + (+t.x[i])]);
});
return {bars: out, rows: (gd.layout.meta || {}).rows || null, step: (gd.layout.meta || {}).step};
"""


def overlapping(bars):
    by_row = {}
    for name, y, s, e in bars:
        by_row.setdefault(y, []).append((s, e, name))
    out = []
    for y, row in by_row.items():
        row.sort()
        out += [(y, a, b) for a, b in zip(row, row[1:]) if b[0] < a[1] - 1e-9]
    return out


def test_replay_no_bar_hides_another(server, browser):
    """Queued DDP buckets (synth8) and ZeRO-3 all-gathers issued under a reduce-scatter (zero3,
    hand-built): in the figure's data no two bars of one row overlap in time, every all-gather is
    drawn, and hovering one gives its start, end and duration."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    base, _ = server
    for run in ("synth8", "zero3"):
        browser.get(f"{base}/replay?run={run}")
        fig = wait_for(lambda: browser.execute_script(FIGURE_BARS), f"{run} drawn", driver=browser)
        assert fig["bars"] and not overlapping(fig["bars"]), overlapping(fig["bars"])[:3]
    gathers = [b for b in fig["bars"] if b[0].startswith("all_gather")]
    assert len(gathers) == 3 and len({b[1] for b in gathers[1:]}) == 2      # two backward AGs, two rows
    browser.save_screenshot(str(SHOTS / "replay-zero3.png"))
    _, y, s, e = next(b for b in gathers if b[2] >= 25 - 1e-6 and b[2] <= 25 + 1e-6)
    gd = browser.find_element(By.CSS_SELECTOR, ".timeline.front .js-plotly-plot")
    x, yy, w, h = browser.execute_script("""
        var gd = arguments[0], L = gd._fullLayout, r = gd.getBoundingClientRect();
        return [L._size.l + L.xaxis.l2p(arguments[1]), L._size.t + L.yaxis.l2p(arguments[2]), r.width, r.height];""",
        gd, (s + e) / 2, y)
    ActionChains(browser).move_to_element_with_offset(gd, int(x - w / 2), int(yy - h / 2)).perform()
    hover = wait_for(lambda: text(browser, ".timeline.front .hoverlayer"), "hover label", timeout=10)
    assert "all_gather" in hover and "start 25.000 ms · end 30.000 ms · duration 5.000 ms" in hover, hover


def test_replay_hovers_what_paths_draw(server, browser):
    """synth8's service parts are narrow (~1.4 ms of a 100 ms step): each op's are drawn in one path
    (a layout shape), as are the hollow whole spans; hovering near the end of a narrow service part,
    and inside a span's waiting part, gives that collective's numbers in the real browser."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    base, _ = server
    browser.get(f"{base}/replay?run=synth8")
    wait_for(lambda: shown_step(browser) == 1, "synth8 step 1 drawn", driver=browser)
    gd = browser.find_element(By.CSS_SELECTOR, ".timeline.front .js-plotly-plot")
    shapes = browser.execute_script("return arguments[0].layout.shapes.map(function (s) { return s.name; });", gd)
    assert shapes == ["all_reduce waiting (hollow)", "all_reduce", "gradients ready"], shapes
    for role, where, at in (("service", "end", 0), ("bar", "waiting", 0.1), ("bar", "waiting", 0.9)):
        # the collective with the longest wait (~70 px of it): its service part's end, or a point
        # 10% or 90% of the way along its waiting part (farther from that part's middle than Plotly's
        # hover distance: reached by the points along it)
        x, y, w, h, start = browser.execute_script("""
            var gd = arguments[0], role = arguments[1], where = arguments[2], at = arguments[3];
            var L = gd._fullLayout, r = gd.getBoundingClientRect(), best = null;
            gd.data.forEach(function (t) {
              if (!(t.meta && t.meta.role === role && t.type === 'scatter')) return;
              for (var i = 0; i < t.y.length; i++) {
                var c = t.customdata[i], wait = parseFloat(c[5]), svc = parseFloat(c[6]);
                var x = where === 'end' ? c[3] - 0.02 : c[2] + at * (c[3] - svc - c[2]);
                if (!best || wait > best[3]) best = [x, +t.y[i] + 0.25, c[2], wait];
              }
            });
            return [L._size.l + L.xaxis.l2p(best[0]), L._size.t + L.yaxis.l2p(best[1]), r.width, r.height, best[2]];""",
            gd, role, where, at)
        ActionChains(browser).move_to_element_with_offset(gd, int(x - w / 2), int(y - h / 2)).perform()
        hover = wait_for(lambda: text(browser, ".timeline.front .hoverlayer"), f"hover on a {where} part ({at})", timeout=10)
        assert "all_reduce" in hover and f"start {start:.3f} ms" in hover, (where, hover)
        ActionChains(browser).move_by_offset(0, -400).perform()
        wait_for(lambda: not text(browser, ".timeline.front .hoverlayer"), "hover label gone", timeout=10)


# Hover at the two ends (``px`` inside) and the middle of every bar of the timeline in front, with
# Plotly's own mouse handling (a mousemove on its drag layer, as the real mouse sends one; selenium's
# moves take ~0.3 s each here, these ~0.1 s): [part, the bar's identity, the identity hovered]. A
# comm part's identity is its collective's start (customdata[2] of the role-"bar" points, one a
# collective: whole span and service time), a compute bar's its own start (customdata[1]).
# Positions are taken when each probe is made: the page may redraw the step meanwhile (the run's
# block tables arriving) with another time axis. Probes ``from`` .. ``from + count`` of them (one
# script call stays well inside the driver's 120 s), and how many there are.
HOVER_SWEEP_JS = r"""
var gd = arguments[0], px = arguments[1], from = arguments[2], count = arguments[3], every = arguments[4];
var done = arguments[arguments.length - 1], drag = gd.querySelector('.nsewdrag'), parts = [];
var isCompute = function (name) { return /forward|backward|optimizer/.test(name); };
gd.data.forEach(function (t) {
  var role = t.meta && t.meta.role;
  if (role === 'bar' && t.type === 'scatter' && isCompute(t.name)) {       // every bar a path (timeline.PATH_BARS)
    for (var i = 0; i < t.y.length; i++) { var c = t.customdata[i]; parts.push([+t.y[i], c[1], c[2], t.name, 'compute ' + c[1]]); }
  } else if (role === 'exposed' && t.customdata) {
    for (var i = 0; i < t.y.length; i++) {
      var c = t.customdata[i], a = t.type === 'bar' ? +t.base[i] : c[0];
      parts.push([+t.y[i], a, t.type === 'bar' ? a + (+t.x[i]) : c[1], 'exposed', 'exposed ' + c[0]]);
    }
  } else if (role === 'bar' && t.type === 'scatter') {
    for (var i = 0; i < t.y.length; i++) {
      var c = t.customdata[i], svc = parseFloat(c[6]), v = c[3] - (svc >= 0 ? svc : 0);
      parts.push([+t.y[i], c[2], v, 'waiting', 'comm ' + c[2]], [+t.y[i], v, c[3], 'service', 'comm ' + c[2]]);
    }
  } else if (role === 'bar' && t.type === 'bar') {
    for (var i = 0; i < t.y.length; i++) { var c = t.customdata[i]; parts.push([+t.y[i], c[1], c[2], t.name, 'compute ' + c[1]]); }
  }
});
var probes = [];
parts = parts.filter(function (p, i) { return i % every === 0; });
parts.forEach(function (p) { [[px, 0], [0, 0.5], [-px, 1]].forEach(function (o) { probes.push([p, o, 0]); }); });
var total = probes.length, out = [], i = 0;
probes = probes.slice(from, from + count);
function next() {
  if (i >= probes.length) { done([total, out]); return; }
  var pr = probes[i], p = pr[0], L = gd._fullLayout, box = drag.getBoundingClientRect();
  var a = L.xaxis.l2p(p[1]), b = L.xaxis.l2p(p[2]), x = a + pr[1][0] + pr[1][1] * (b - a);
  if (b - a < 2 * px + 1 || x <= 0 || x >= L._size.w) { i++; next(); return; }    // too narrow, or off the axis
  drag.dispatchEvent(new MouseEvent('mousemove', {clientX: box.left + x, clientY: box.top + L.yaxis.l2p(p[0]), bubbles: true}));
  setTimeout(function () {
    var h = (gd._hoverdata || [])[0], got = null;
    if (h) got = !h.customdata ? 'no numbers: ' + h.data.name :
                 isCompute(h.data.name) ? 'compute ' + h.customdata[1] :
                 /exposed/.test(h.data.name) ? 'exposed ' + h.customdata[0] : 'comm ' + h.customdata[2];
    Plotly.Fx.unhover(gd);
    if (got !== p[4] && pr[2] < 2) { pr[2]++; setTimeout(next, 200); return; }   // a redraw under the probe: again
    out.push([p[3], p[4], got, x]);
    i++;
    setTimeout(next, 55);
  }, 70);
}
next();
"""


@pytest.fixture(scope="module")
def many_buckets(tmp_path_factory):
    """Runs whose buckets queue one behind another on each rank: each collective's waiting part
    starts where the one before it ends, after a service part a few px wide ("queued": 32 a step);
    "wide": 200 a step on 4 ranks, 1,616 bars, so every bar is drawn in a path (timeline.PATH_BARS)."""
    from syncviz.dashboard.data.synth import write_synth_run
    root = tmp_path_factory.mktemp("dashq") / "runs"
    write_synth_run(root / "queued", world=2, steps=3, n_buckets=32, straggler=1, straggle_ms=6)
    write_synth_run(root / "wide", world=4, steps=3, n_buckets=200, straggler=1, straggle_ms=6)
    with dash_server(root) as base:
        yield base


@pytest.mark.parametrize("run", ["synth24", "ddp", "queued", "wide"])
def test_replay_hover_names_the_bar_under_the_cursor(server, many_buckets, browser, run):
    """Near both ends and at the middle of every bar (compute, exposed, and each collective's waiting
    and service parts, which the figure draws as bar traces or as paths with hover points, see
    views/timeline.py), the hover gives that bar's numbers, not a neighbour's: synth24's rows are
    dense, ddp's service parts are wide enough to be bar traces, in "queued" each collective's
    waiting part starts where the one before ends, after a narrow service part, and "wide" has every
    bar in a path (every 7th bar of its 1,616 probed; its collectives wait for no peer). Before each span had a point just inside its
    start and end (timeline_marks.ends), 16 of 285 probes there showed the collective before (and 32 of 81
    on the 10^8-event DDP run's step); the points along waiting parts left out (timeline_marks.spread
    giving none) fails it too."""
    from selenium.webdriver.common.by import By
    base = many_buckets if run in ("queued", "wide") else server[0]
    browser.get(f"{base}/replay?run={run}")
    wait_for(lambda: shown_step(browser) == 1, f"{run} step 1 drawn", driver=browser)
    gd = browser.find_element(By.CSS_SELECTOR, ".timeline.front .js-plotly-plot")
    bar_traces = browser.execute_script("return arguments[0].data.filter(t => t.type === 'bar' && t.y.length > 1).length", gd)
    assert (bar_traces == 0) == (run == "wide"), bar_traces           # every bar in a path, or some bar traces
    browser.set_script_timeout(110)
    probes, at, total = [], 0, 1
    while at < total:
        total, more = browser.execute_async_script(HOVER_SWEEP_JS, gd, 2, at, 150, 7 if run == "wide" else 1)
        probes, at = probes + more, at + 150
    kinds = {p[0] for p in probes}
    need = {"service", "forward", "backward compute", "exposed"} | ({"waiting"} if run != "wide" else set())
    assert need <= kinds and len(probes) > 30, (kinds, len(probes))       # "wide" waits for no peer
    wrong = [p for p in probes if p[2] != p[1]]
    assert not wrong, f"{len(wrong)} of {len(probes)} probes hovered another bar: {wrong[:6]}"


def test_run_too_big_to_read_whole(tmp_path_factory, browser):
    """A run over --max-run-gb, after `syncviz summary`: the Replay reads each step alone (the
    last step from where its batches lie), and Ratios, Buckets, Strategies and Distributed draw
    from what the summary kept."""
    import subprocess
    import sys
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from syncviz.dashboard.data.synth import write_synth_run
    root = tmp_path_factory.mktemp("dashbig") / "runs"
    big = write_synth_run(root / "big", world=32, steps=40, n_buckets=8, straggler=5, straggle_ms=4)
    assert sum(p.stat().st_size for p in big.glob("rank-*.arrow")) > 1.2e6       # over --max-run-gb 0.001
    r = subprocess.run([sys.executable, "-m", "syncviz", "summary", str(big)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with dash_server(root, "--max-run-gb", "0.001") as base:
        browser.get(f"{base}/replay?run=big")
        wait_for(lambda: shown_step(browser) == 1, "big: step 1 drawn", driver=browser)
        assert any("fastest step" in t for t in graph(browser, "replay-timeline")["ticks"])
        thumb = browser.find_element(By.CSS_SELECTOR, "#replay-step [role=slider]")
        thumb.send_keys(Keys.END)
        wait_for(lambda: shown_step(browser) == 39, "big: the last step drawn", driver=browser)
        assert graph(browser, "replay-timeline")["meta"]["source"] == "kept tables and the drawn ranks"
        heat = wait_for(lambda: (graph(browser, "replay-lateness") or {}).get("meta") == {"step": 39} and
                        graph(browser, "replay-lateness"), "big: the last step's lateness heatmap")
        assert heat["traces"][0][2] == 32
        browser.save_screenshot(str(SHOTS / "replay-big-run.png"))
        # the Buckets page's distributions from what the summary kept (a box per bucket)
        browser.get(f"{base}/buckets?run=big")
        boxes = wait_for(lambda: (graph(browser, "buckets-duration") or {}).get("traces"), "big: bucket durations drawn")
        assert [t[1] for t in boxes] == ["box", "scatter"] and boxes[1][2] == 8, boxes     # a median per bucket
        assert not text(browser, "#buckets-error")
        browser.save_screenshot(str(SHOTS / "buckets-big-run.png"))
        # Strategies: compare's numbers and bytes per op from what the summary kept
        browser.get(f"{base}/strategies?run=big")
        split = wait_for(lambda: (graph(browser, "strategies-split") or {}).get("traces"), "big: strategies drawn")
        assert split and not text(browser, "#strategies-errors") and "big" in text(browser, "#strategies-table")
        browser.save_screenshot(str(SHOTS / "strategies-big-run.png"))
        # Distributed: per rank where the step goes (a bar of each part per rank) and the collectives'
        # table, from what the summary kept
        browser.get(f"{base}/distributed?run=big")
        parts = wait_for(lambda: (graph(browser, "distributed-ranks") or {}).get("traces"), "big: distributed drawn")
        assert len(parts) == 5 and all(t[2] == 32 for t in parts), parts
        assert "all_reduce" in text(browser, "#distributed-kinds") and not text(browser, "#distributed-error")
        browser.save_screenshot(str(SHOTS / "distributed-big-run.png"))
        browser.get(f"{base}/ratios?run=big")
        wait_for(lambda: (graph(browser, "ratios-steps") or {}).get("traces"), "big: ratios over steps drawn")
        # the rank × step lateness map, from the table the summary kept (a row per rank)
        skew = wait_for(lambda: (graph(browser, "ratios-skew") or {}).get("traces"), "big: ratios lateness map drawn")
        assert skew[0][1] == "heatmap" and skew[0][2] == 32, skew
        browser.save_screenshot(str(SHOTS / "ratios-big-run.png"))
        assert not js_errors(browser)
