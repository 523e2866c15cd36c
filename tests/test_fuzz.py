"""Fuzz: a generated matrix of damaged runs (tests/fuzzcases.py) through every command that reads a
run (summary, summary --json, compare, export tensorboard/perfetto/html, fit, advise) and the
dashboard's run store. Each outcome must be one of:

- error: non-zero exit and exactly one error line on stderr (warnings before it allowed);
- warned: exit 0 and an explicit warning;
- clean: exit 0, no warning, and the numbers are those of the undamaged run (the damage was harmless).

Never a traceback, never an internal error masked as one line, never a number that differs from the
undamaged run's without a warning. The commands run in-process through ``syncviz.cli.main`` (the
console entry point), so what is asserted is what a user sees. Prints the matrix's counts by outcome.
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections import Counter

import pytest

from fuzzcases import base_run, cases
from syncviz.cli import main

# The slow readers (rich tables, HTML with plotly, TensorBoard event files, advise's simulations:
# ~10 s per run on a loaded 2-core machine) see every third case plus these; the others see all.
SLOW = ("summary", "tensorboard", "html", "advise")
SLOW_ALWAYS = ("undamaged", "time-2^62", "world-two", "world-10^10", "world-negative", "duplicate-step-batch-2",
               "missing-column-bytes", "model-list", "ddp-string", "param-shapes-garbage", "finished-false",
               "rank1-garbage", "layout-garbage", "end-before-start")
KEYS = ("steps", "step_ms", "comm_busy_ms", "exposed_ms", "bytes_per_step", "busbw_gbps", "world_size")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def commands(d, tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        "summary": ["summary", str(d)],
        "summary-json": ["summary", "--json", str(d)],
        "compare": ["compare", str(d)],
        "tensorboard": ["export", "tensorboard", str(d), "--logdir", str(tmp / "tb")],
        "perfetto": ["export", "perfetto", str(d), "-o", str(tmp / "p.json")],
        "html": ["export", "html", str(d), "-o", str(tmp / "r.html")],
        "fit": ["fit", str(d)],
        "advise": ["advise", str(d), "--caps", "1,25"],
    }


def headline(stdout: str) -> dict:
    s = json.loads(stdout)
    return {k: s.get(k) for k in KEYS}


def classify(code: int, out: str, err: str, harmless: bool) -> str:
    text = out + err
    if "Traceback (most recent call last)" in text:
        return "TRACEBACK"
    if "--debug for the traceback" in err:
        return "INTERNAL ERROR"
    if code != 0:
        lines = [ln for ln in err.splitlines() if ln.strip() and "warning:" not in ln]
        return "error" if len(lines) == 1 else "MULTI-LINE ERROR"
    if "warning" in text.lower():
        return "warned"
    return "clean" if harmless else "SILENT WRONG"


def dashboard_outcome(root, name) -> str:
    from syncviz.dashboard.data.store import RunStore
    from syncviz.trace import TraceError
    try:
        _, _, problems = RunStore(root).summary(name)
    except TraceError as e:
        return "INTERNAL ERROR" if ": cannot read (" in str(e) else "error"
    except Exception:   # noqa: BLE001 - anything else escaping the store is a failure
        return "TRACEBACK"
    return "warned" if problems else "clean"


pytestmark = pytest.mark.slow     # ~90 runs x up to 9 readers: minutes on a shared 2-core machine


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    base, sizes = base_run(tmp / "base")
    code, out, err = run_cli(["summary", "--json", str(base)])
    assert code == 0 and "warning" not in err, err
    baseline = headline(out)
    results = []
    for i, (name, damage) in enumerate(cases(sizes)):
        d = tmp / "runs" / name
        shutil.copytree(base, d)
        damage(d)
        outcome = {}
        # harmless iff summary --json gives the undamaged numbers and no problem
        code, out, err = run_cli(["summary", "--json", str(d)])
        harmless = code == 0 and "warning" not in err and headline(out) == baseline
        outcome["summary-json"] = classify(code, out, err, harmless)
        for cmd, argv in commands(d, tmp / "out" / name).items():
            if cmd == "summary-json" or (cmd in SLOW and i % 3 and name not in SLOW_ALWAYS):
                continue
            outcome[cmd] = classify(*run_cli(argv), harmless)
        outcome["dashboard"] = dashboard_outcome(tmp / "runs", name)
        results.append((name, outcome))
    return results


def test_fuzz_matrix(matrix):
    counts = Counter(o for _, outcome in matrix for o in outcome.values())
    per_command = {c: Counter(outcome[c] for _, outcome in matrix if c in outcome) for c in matrix[0][1]}
    print(f"\nfuzz matrix: {len(matrix)} runs x {len(matrix[0][1])} readers = {sum(counts.values())} outcomes")
    print("by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for c, n in per_command.items():
        print(f"  {c:12s} " + ", ".join(f"{k} {v}" for k, v in sorted(n.items())))
    bad = [(name, c, o) for name, outcome in matrix for c, o in outcome.items() if o.isupper()]
    for name, c, o in bad:
        print(f"  FAIL {name} / {c}: {o}")
    assert len(matrix) >= 50
    assert not bad, f"{len(bad)} failures, first: {bad[:5]}"
    assert dict(matrix)["undamaged"]["summary"] == "clean"
