"""benchmarks/dashboard_trace.py: where a Replay jump's time goes, read from Chromium trace events.
Hand-built traces: the draw request is matched by its request id (not the next response of any
request), the WebGL read backs counted are the page's own thread's between the body and the paint,
and a move with no request (drawn from the page's copy) has no figures."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("dashboard_trace", Path(__file__).parents[1] / "benchmarks" / "dashboard_trace.py")
T = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(T)

PAGE, GPU = (10, 10), (20, 20)


def ev(name, ts_ms, where=PAGE, dur_ms=None, **data):
    e = {"name": name, "ts": ts_ms * 1e3, "pid": where[0], "tid": where[1], "ph": "X" if dur_ms is not None else "I",
         "args": {"data": data}}
    if dur_ms is not None:
        e["dur"] = dur_ms * 1e3
    return e


def jump(t0, rid):
    """A jump at t0 ms: request at +15, an unrelated request's response first, its own at +90 /
    body +100, read backs on the page's thread at +141 (60 ms) and +205 (10 ms), one before the
    body, one after the paint (+300: not counted with a paint at +250), and a GPU-process read
    back that is not the page's."""
    url = "http://127.0.0.1:1/_dash-update-component"
    return [ev("EventDispatch", t0, dur_ms=5, type="keydown"),
            ev("ResourceSendRequest", t0 + 15, requestId=rid, url=url),
            ev("ResourceSendRequest", t0 + 16, requestId="other", url="http://127.0.0.1:1/assets/x.css"),
            ev("ResourceReceiveResponse", t0 + 40, requestId="other"),
            ev("ResourceFinish", t0 + 45, requestId="other"),
            ev("ResourceReceiveResponse", t0 + 90, requestId=rid),
            ev("ResourceFinish", t0 + 100, requestId=rid),
            ev("GLES2::ReadPixels", t0 + 50, dur_ms=7),
            ev("GLES2::ReadPixels", t0 + 141, dur_ms=60),
            ev("GLES2::ReadPixels", t0 + 300, dur_ms=40),
            ev("GLES2::ReadPixels", t0 + 205, dur_ms=10),
            ev("GLES2::ReadPixels", t0 + 150, where=GPU, dur_ms=500)]


def test_a_jump_split_into_request_response_and_webgl():
    events = jump(1000, "a") + [ev("EventDispatch", 2000, dur_ms=3, type="keydown")] + jump(3000, "b")
    rows = T.jumps(events[::-1])            # any order
    assert len(rows) == 3
    assert rows[0] == {"request": 15, "response": 90, "body": 100, "reads": [[141, 60], [205, 10], [300, 40]]}
    assert rows[1] == {"request": None, "response": None, "body": None, "reads": []}   # drawn from the page's copy
    assert rows[2] == rows[0]
    line = T.summary_line(rows, [110.0, 40.0, 120.0], [250.0, 60.0, 260.0])
    assert "2 jumps" in line and "request sent 15" in line and "response 90" in line and "body 100" in line
    assert "had the step 115" in line and "painted 255" in line and "waited 70 ms" in line
    assert "waited 110 ms" in T.summary_line(rows[:1], [110.0], [350.0])     # the read back at +300 now before the paint
    assert "no jump" in T.summary_line(rows[1:2], [40.0], [60.0])


def test_a_jump_whose_body_never_came():
    events = jump(0, "a")
    events = [e for e in events if not (e["name"] == "ResourceFinish" and e["args"]["data"]["requestId"] == "a")]
    row = T.jumps(events)[0]
    assert row == {"request": 15, "response": 90, "body": None, "reads": []}
    assert "waited n/a ms" in T.summary_line([row], [None], [250.0])
