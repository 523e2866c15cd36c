"""Frozen scenario runs (tests/data/<scenario>/, made by tests/data/make_fixtures.py): today's reader
and analysis must give exactly the numbers recorded in each expected.json. A change here is a change
of a metric's definition (or a reader bug): regenerate with `make_fixtures.py --expected` only on
purpose."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location("make_fixtures", DATA / "make_fixtures.py")
make_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_fixtures)


def _same(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        # a key only in today's numbers is a metric added since (not a changed number); one that
        # disappeared is a change
        out = [f"{path}.{k}: no longer computed" for k in set(b) - set(a)]
        for k in set(a) & set(b):
            out += _same(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.parametrize("scenario", make_fixtures.SCENARIOS)
def test_fixture_numbers_unchanged(scenario):
    expected = json.loads((DATA / scenario / "expected.json").read_text())
    got = make_fixtures.numbers(DATA / scenario)
    diffs = _same(got, expected)
    assert not diffs, f"{scenario}: {len(diffs)} numbers changed, e.g. {diffs[:5]}"


@pytest.mark.parametrize("scenario", make_fixtures.SCENARIOS)
def test_fixture_numbers_by_partitions_unchanged(scenario):
    """`syncviz summary`'s default path (partitions of ranks on arrays, analysis/partition_*.py) gives
    the frozen numbers too: with one partition, and with one rank per partition."""
    from syncviz.analysis.partitioned import summarize
    expected = json.loads((DATA / scenario / "expected.json").read_text())
    for target in (10 ** 9, 1):
        t = summarize(DATA / scenario, jobs=1, target_events=target)
        s = t.summary
        got = json.loads(json.dumps({"summary": {k: v for k, v in s.items() if k not in ("name", "problems", "verdict")},
                                     "verdict": s["verdict"], "problems": len(s["problems"]),
                                     "step_table": json.loads(t.step_table.to_json(orient="records"))},
                                    default=make_fixtures._plain))
        want = {k: v for k, v in expected.items() if k != "events"}
        diffs = _same(got, want)
        assert not diffs, f"{scenario} ({target}): {len(diffs)} numbers changed, e.g. {diffs[:5]}"


def test_damaged_fixtures_say_so():
    truncated = make_fixtures.numbers(DATA / "truncated-rank")
    assert truncated["problems"] >= 1                   # rank 1 named incomplete, the rest read
    assert truncated["summary"]["steps"] == 4           # rank 0's steps all there
    old = json.loads((DATA / "old-minor" / "expected.json").read_text())
    new = json.loads((DATA / "ddp-2rank" / "expected.json").read_text())
    assert old["summary"]["step_ms"] == new["summary"]["step_ms"]   # a missing optional column changes no time


@pytest.mark.parametrize("sample", sorted(p.name for p in (DATA.parents[1] / "traces").iterdir() if (p / "run.json").exists()))
def test_shipped_samples_still_load(sample):
    """The sample runs under traces/ were written by earlier versions: the reader keeps reading them
    (a renamed stream-metadata key once made every one of them unreadable)."""
    from syncviz.trace import load_run
    run = load_run(DATA.parents[1] / "traces" / sample)
    assert len(run.events) and not run.problems
