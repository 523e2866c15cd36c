"""Where a Replay jump's time goes, from Chromium's own trace of the page (benchmarks/dashboard.py
--breakdown): key press -> the draw request sent -> its response -> its body -> Plotly holding
the new step -> painted, and of that, how long the page's thread waited for WebGL canvases to be
read back.

Why: a jump of the 1,024-rank ZeRO-3 step (benchmarks/scale.py's 10^8-event run) was painted
~250 ms after the key press while the server drew it in ~58 ms. Chromium's trace of three jumps
(session 36) put 82-98 ms of each in one compositor commit, almost all of it in GLES2::ReadPixels:
the page's thread waiting while the GPU process ran the timeline's WebGL draw in SwiftShader
(this machine has no GPU, so Chromium renders WebGL in software). The breakdown prints that part
apart: it depends on how the browser renders WebGL, the rest does not.

Request, response and read backs come from trace events (microseconds on Chromium's trace clock),
relative to each keydown; when Plotly had the step and when it was painted, from the page's own
clock (WATCH_JS), relative to the same keydown. Tracing costs some time itself, so these moves are
not the timed ones.
"""
from __future__ import annotations

import json
import shutil
import statistics
import time

DRAW_URL = "_dash-update-component"
CATEGORIES = "devtools.timeline,disabled-by-default-devtools.timeline,gpu"


def _data(e: dict) -> dict:
    return (e.get("args") or {}).get("data") or {}


def jumps(events: list[dict]) -> list[dict]:
    """Per keydown on the page (in order): ms from the key press to the draw request sent
    (``request``), its response headers (``response``) and body (``body``), and the WebGL canvas
    read backs on the page's thread after the body (``reads``: [start ms, duration ms] each);
    None / [] where the trace has no such event (a move drawn from the page's copy sends no
    request)."""
    keys = sorted((e for e in events if e.get("name") == "EventDispatch" and _data(e).get("type") == "keydown"),
                  key=lambda e: e["ts"])
    out = []
    for i, k in enumerate(keys):
        t0, end = k["ts"], keys[i + 1]["ts"] if i + 1 < len(keys) else float("inf")
        main = (k["pid"], k["tid"])
        within = sorted((e for e in events if t0 <= e.get("ts", -1) < end), key=lambda e: e["ts"])
        sent = next((e for e in within if e.get("name") == "ResourceSendRequest" and DRAW_URL in str(_data(e).get("url", ""))), None)
        row = {"request": None, "response": None, "body": None, "reads": []}
        out.append(row)
        if sent is None:
            continue
        rid = _data(sent).get("requestId")
        got = next((e for e in within if e.get("name") == "ResourceReceiveResponse" and _data(e).get("requestId") == rid), None)
        fin = next((e for e in within if e.get("name") == "ResourceFinish" and _data(e).get("requestId") == rid), None)
        row.update(request=(sent["ts"] - t0) / 1e3, response=got and (got["ts"] - t0) / 1e3,
                   body=fin and (fin["ts"] - t0) / 1e3)
        if fin is not None:
            row["reads"] = [[(e["ts"] - t0) / 1e3, e.get("dur", 0) / 1e3] for e in within
                            if e.get("name") == "GLES2::ReadPixels" and (e["pid"], e["tid"]) == main and e["ts"] >= fin["ts"]]
    return out


def summary_line(rows: list[dict], shown: list[float | None], painted: list[float | None]) -> str:
    """Medians over the jumps the server drew (those with a request); ``shown`` and ``painted``:
    each move's ms from the key press to Plotly holding its step and to its paint, on the page's
    clock (benchmarks/dashboard.py's WATCH_JS), which bound the read backs counted."""
    drawn = [(r, s, p) for r, s, p in zip(rows, shown, painted) if r["request"] is not None]
    if not drawn:
        return "no jump sent a draw request (every move was drawn from the page's copy)"

    def med(v):
        v = [x for x in v if x is not None]
        return f"{statistics.median(v):.0f}" if v else "n/a"
    wait = [sum(d for t, d in r["reads"] if r["body"] <= t <= p) if r["body"] is not None and p is not None else None
            for r, _, p in drawn]
    return (f"median of {len(drawn)} jumps, ms after the key press: draw request sent {med(r['request'] for r, _, _ in drawn)}, "
            f"response {med(r['response'] for r, _, _ in drawn)}, body {med(r['body'] for r, _, _ in drawn)}, Plotly had "
            f"the step {med(s for _, s, _ in drawn)}, painted {med(p for _, _, p in drawn)}; of that, the page's thread waited "
            f"{med(wait)} ms for WebGL canvases to be read back (their drawing runs in the GPU process: in software where "
            f"there is no GPU; 0 for a timeline drawn in SVG)")


def traced_browser(watch_js: str, flags: list[str]):
    """Headless Chromium whose performance log carries its trace events (chromedriver's perfLoggingPrefs)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    for f in flags:
        opts.add_argument(f)
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    opts.add_experimental_option("perfLoggingPrefs", {"traceCategories": CATEGORIES})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": watch_js})
    return driver


def trace_events(driver, flush_url: str) -> list[dict]:
    """Every trace event chromedriver has collected: it hands them over in chunks, the last ones
    once the trace is stopped (navigating away does it), so this reads the log until it is quiet."""
    logs = []
    for _ in range(3):
        time.sleep(1.0)
        logs += driver.get_log("performance")
    driver.get(flush_url)
    time.sleep(2.0)
    logs += driver.get_log("performance")
    events = []
    for entry in logs:
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Tracing.dataCollected":
            value = msg["params"].get("value")
            events += value if isinstance(value, list) else [msg["params"]]
    return events
