"""Perfetto export of a step range (``--steps A:B``) and the faster exporter: the reader keeps
exactly those steps without reading past them, the range's slices are the whole-run export's,
the output is byte for byte the former column-wise exporter's (benchmarks/perfetto_columnwise.py),
and bad ranges are one line with a non-zero exit."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from syncviz.trace import load_run
from syncviz.views.export.perfetto import chrome_trace, chrome_trace_json
from test_export import check_chrome_trace
from tracebuild import make_ddp_run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = [ROOT / "traces" / "cpu-mini-ddp", ROOT / "tests" / "data" / "straggler", ROOT / "tests" / "data" / "zero2"]


def syncviz(*args):
    return subprocess.run([sys.executable, "-m", "syncviz", *args], capture_output=True, text=True, timeout=120)


def steps_of(run) -> list[int]:
    return sorted(set(run.events["step"].tolist()) - {-1})


def sliced(events, a, b) -> pd.DataFrame:
    e = events[(events["step"] >= a) & (events["step"] < b)]
    e = e.astype({c: str for c in e.columns if isinstance(e[c].dtype, pd.CategoricalDtype)})   # categories differ
    return e.sort_values(list(e.columns)).reset_index(drop=True)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_reader_keeps_exactly_the_steps(path):
    whole = load_run(path)
    steps = steps_of(whole)
    a, b = steps[1], steps[1] + 2
    part = load_run(path, steps=(a, b))
    assert set(part.events["step"]) == set(range(a, b)) & set(steps)
    pd.testing.assert_frame_equal(sliced(part.events, a, b), sliced(whole.events, a, b))
    assert len(load_run(path, steps=(steps[-1] + 1, steps[-1] + 5)).events) == 0


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_range_export_is_the_whole_exports_slices(path):
    """Every slice and instant of steps A..B-1 (tracks, names, times, args) as the whole-run export
    has them, and nothing else: the range is read with one step before it for queueing context."""
    whole_run = load_run(path)
    a = steps_of(whole_run)[1]
    b = a + 2
    whole = chrome_trace(whole_run)["traceEvents"]
    trace = chrome_trace(load_run(path, steps=(a - 1, b)), steps=(a, b))
    check_chrome_trace(trace)

    def events(evs, only_range):
        return sorted(json.dumps(e, sort_keys=True) for e in evs if e["ph"] in ("X", "i")
                      and (not only_range or a <= e["args"]["step"] < b))
    part = trace["traceEvents"]
    assert all(a <= e["args"]["step"] < b for e in part if e["ph"] in ("X", "i"))
    assert events(part, False) == events(whole, True)
    assert trace["otherData"]["steps"].startswith(f"{a}:{b}")


def test_reader_stops_after_the_range(tmp_path):
    """The damaged tail of a rank file is never read by a range that ends before it (the whole
    run reports it): the reader stops at the first batch past the range."""
    run = make_ddp_run(tmp_path / "r", steps=6)
    f = run / "rank-0.arrow"
    f.write_bytes(f.read_bytes()[: int(f.stat().st_size * 0.8)])
    assert any("truncated or corrupt" in p for p in load_run(run).problems)
    part = load_run(run, steps=(0, 2))
    assert not any("truncated or corrupt" in p for p in part.problems)
    assert any("not closed" in p for p in part.problems)     # the tail is looked at, not read
    assert set(part.events["step"]) == {0, 1} and set(part.events["rank"]) == {0, 1}


@pytest.mark.parametrize("path", [ROOT / "traces" / "sim-gpt2-medium-128", *SAMPLES], ids=lambda p: p.name)
def test_same_bytes_as_the_former_exporter(path):
    spec = importlib.util.spec_from_file_location("perfetto_columnwise", ROOT / "benchmarks" / "perfetto_columnwise.py")
    former = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(former)
    run = load_run(path)
    assert chrome_trace_json(run) == former.chrome_trace_json(run)


def test_cli_steps(tmp_path):
    run = make_ddp_run(tmp_path / "r", steps=4)
    out = tmp_path / "t.json"
    r = syncviz("export", "perfetto", str(run), "-o", str(out), "--steps", "1:3")
    assert r.returncode == 0 and "steps 1 to 2" in r.stdout, r.stderr
    trace = json.loads(out.read_bytes())
    check_chrome_trace(trace)
    assert {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2}
    r = syncviz("export", "perfetto", str(run), "-o", str(out), "--steps", "2:")
    assert r.returncode == 0, r.stderr
    assert {e["args"]["step"] for e in json.loads(out.read_bytes())["traceEvents"] if e["ph"] == "X"} == {2, 3}


def test_cli_steps_from_where_the_summary_found_them(tmp_path):
    """After `syncviz summary` (which keeps where each step lies in the rank files), a step range is
    read from those spans: the same bytes as reading each stream from its start."""
    from syncviz.views.runcache import kept_spans
    run = shutil.copytree(Path(__file__).resolve().parents[1] / "traces" / "sim-gpt2-medium-128", tmp_path / "sim",
                          ignore=shutil.ignore_patterns(".syncviz-cache"))
    plain, fast = tmp_path / "plain.json", tmp_path / "fast.json"
    assert syncviz("export", "perfetto", str(run), "-o", str(plain), "--steps", "2:4").returncode == 0
    assert kept_spans(run) is None
    assert syncviz("summary", str(run)).returncode == 0
    assert kept_spans(run) is not None and len(kept_spans(run)) == 128
    r = syncviz("export", "perfetto", str(run), "-o", str(fast), "--steps", "2:4")
    assert r.returncode == 0, r.stderr
    assert fast.read_bytes() == plain.read_bytes()


@pytest.mark.parametrize("spec, message", [
    ("x", "give A:B"), ("3", "give A:B"), ("3:1", "need 0 <= A < B"), ("-1:2", "need 0 <= A < B"),
    ("2:2", "need 0 <= A < B"), ("10:12", "no events of these steps"),
])
def test_cli_bad_steps_one_line(tmp_path, spec, message):
    run = make_ddp_run(tmp_path / "r", steps=4)
    r = syncviz("export", "perfetto", str(run), "-o", str(tmp_path / "t.json"), f"--steps={spec}")
    assert r.returncode != 0 and not (tmp_path / "t.json").exists()
    assert message in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_steps_of_a_simulated_run(tmp_path):
    """Simulated runs store ``step`` dictionary-encoded; the range reader decodes it."""
    out = tmp_path / "sim"
    r = syncviz("simulate", "--preset", "gpt2-medium-8", "--world-size", "4", "--steps", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr
    part = load_run(out, steps=(2, 4))
    assert set(part.events["step"]) == {2, 3}
    whole = load_run(out)
    pd.testing.assert_frame_equal(sliced(part.events, 2, 4), sliced(whole.events, 2, 4))
    assert np.array_equal(np.sort(part.events["rank"].unique()), np.arange(4))
    shutil.rmtree(out)
