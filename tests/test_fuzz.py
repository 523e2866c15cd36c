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
import re
import shutil
from collections import Counter

import pytest

from fuzzcases import base_run, cases
from syncviz.cli import main

# The slow readers (rich tables, HTML with plotly, TensorBoard event files, advise's simulations:
# up to ~10 s per run on a loaded 2-core machine) see these cases; the others see all of them.
SLOW = ("summary", "summary-fresh", "tensorboard", "html", "advise")
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
        # the fixture's `summary --json` kept the report where the run allowed it: "summary" prints
        # from that (views/runcache.kept_report), "summary-fresh" computes it again
        "summary": ["summary", str(d)],
        "summary-fresh": ["summary", "--fresh", str(d)],
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
        # the store's last line of defence reads "<name>: cannot read (SomeError: ...)"
        return "INTERNAL ERROR" if re.search(r"cannot read \([A-Za-z]+: ", str(e)) else "error"
    except Exception:   # noqa: BLE001 - anything else escaping the store is a failure
        return "TRACEBACK"
    return "warned" if problems else "clean"


pytestmark = pytest.mark.slow     # ~90 runs x 9 readers: minutes on a shared 2-core machine
READERS = ("summary-json", "summary", "summary-fresh", "compare", "tensorboard", "perfetto", "html", "fit", "advise", "dashboard")
OUTCOMES: dict[str, dict[str, str]] = {}     # reader -> case -> outcome, printed by the last test


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """Every damaged run, and whether it is harmless (summary --json gives the undamaged numbers
    and no warning: then a reader may answer without a warning)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    base, sizes = base_run(tmp / "base")
    code, out, err = run_cli(["summary", "--json", str(base)])
    assert code == 0 and "warning" not in err, err
    baseline = headline(out)
    runs = []
    for name, damage in cases(sizes):
        d = tmp / "runs" / name
        shutil.copytree(base, d)
        damage(d)
        code, out, err = run_cli(["summary", "--json", str(d)])
        harmless = code == 0 and "warning" not in err and headline(out) == baseline
        runs.append((name, d, harmless, classify(code, out, err, harmless)))
    return tmp, runs


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("reader", READERS)
def test_reader_on_every_damaged_run(damaged, reader):
    tmp, runs = damaged
    got = OUTCOMES.setdefault(reader, {})
    for name, d, harmless, summary_json in runs:
        if reader in SLOW and name not in SLOW_ALWAYS:
            continue
        if reader == "summary-json":
            got[name] = summary_json
        elif reader == "dashboard":
            got[name] = dashboard_outcome(tmp / "runs", name)
        else:
            got[name] = classify(*run_cli(commands(d, tmp / "out" / name)[reader]), harmless)
    bad = {n: o for n, o in got.items() if o.isupper()}
    assert len(runs) >= 50
    assert not bad, f"{reader}: {len(bad)} failures: {bad}"
    if "undamaged" in got:
        assert got["undamaged"] == "clean"


def test_zz_matrix_counts():
    """The matrix's counts by outcome (run after the readers; for the closing note)."""
    if not OUTCOMES:
        pytest.skip("run with the reader tests")
    counts = Counter(o for got in OUTCOMES.values() for o in got.values())
    cases_seen = {n for got in OUTCOMES.values() for n in got}
    print(f"\nfuzz matrix: {len(cases_seen)} damaged runs, {sum(counts.values())} (run, reader) outcomes")
    print("by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for reader, got in OUTCOMES.items():
        print(f"  {reader:12s} " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(got.values()).items())))
    assert not [o for o in counts if o.isupper()]
