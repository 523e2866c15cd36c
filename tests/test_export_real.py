"""Exports of a real run: `syncviz demo --profile` (2 gloo ranks, the built-in GPT, torch.profiler
on steps 2-3 through the recorder) exported to Perfetto, HTML and TensorBoard."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from syncviz.trace import load_run
from test_export import check_chrome_trace, check_times_equal_trace
from test_export_tensorboard import get_json, tensorboard_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "demo"
    r = subprocess.run([sys.executable, "-m", "syncviz", "demo", "--preset", "tiny", "--steps", "5",
                        "--profile", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def test_real_run_perfetto(demo_run, tmp_path):
    out = tmp_path / "demo.json.gz"
    r = subprocess.run(["syncviz", "export", "perfetto", str(demo_run), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    trace = json.loads(gzip.decompress(out.read_bytes()))
    run = load_run(demo_run)
    check_chrome_trace(trace)
    check_times_equal_trace(run, trace)
    assert sum(e["ph"] == "s" for e in trace["traceEvents"]) > 0


def test_real_run_html(demo_run, tmp_path):
    r = subprocess.run(["syncviz", "export", "html", str(demo_run), "-o", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "r.html").read_text()
    assert all(f'id="chart-{c}"' in text for c in ("timeline", "steps", "buckets"))


def test_real_run_tensorboard_and_profiler(demo_run, tmp_path):
    logdir = tmp_path / "tb"
    r = subprocess.run(["syncviz", "export", "tensorboard", str(demo_run), "--logdir", str(logdir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with tensorboard_server(logdir) as base:
        assert "comm/exposed_ms" in get_json(base, "/data/plugin/scalars/tags")["demo"]
        prof = "/data/plugin/pytorch_profiler"
        assert get_json(base, f"{prof}/runs")["runs"] == ["demo"]
        assert {"Overview", "Trace", "Distributed"} <= set(get_json(base, f"{prof}/views", run="demo"))
        span = get_json(base, f"{prof}/spans", run="demo", worker="rank-0")[0]
        overview = get_json(base, f"{prof}/overview", run="demo", worker="rank-0", span=span)
        assert [row[0] for row in overview["steps"]["rows"]][:2] == ["2", "3"]
        ops = get_json(base, f"{prof}/distributed/commops", run="demo", worker="All", span=span)
        assert ops["data"]["rank-1"]["rows"][0][0] == "gloo:all_reduce"
