"""benchmarks/fresh_memory.py runs and prints each case's time and the two ratios (README "Timing on
these machines" quotes it). Tiny sizes: what it measures is the machine, not tested here."""
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "fresh_memory.py"


def test_fresh_memory_prints_every_case_and_both_ratios():
    out = subprocess.run([sys.executable, str(SCRIPT), "--mb", "4", "--idle", "0.05", "--rounds", "2"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    for case in ("array, at once", "array, after 0.05 s idle", "file, at once", "file, after 0.05 s idle"):
        assert re.search(rf"{re.escape(case)}\s+\d+\.\d\ds\s+\d+\.\d\ds\s+\d+\.\d\d", out), out
    assert re.search(r"^array: after 0\.05 s idle / at once = \d+\.\dx$", out, re.M), out
    assert re.search(r"^file: after 0\.05 s idle / at once = \d+\.\dx$", out, re.M), out
    assert "4 MB each time, 2 rounds" in out


def test_fresh_memory_help_says_what_it_measures():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    words = " ".join(out.split())           # argparse wraps to the terminal's width
    assert "pages used again at once" in words and "--idle" in words


def test_fresh_memory_refuses_sizes_it_cannot_time_in_one_line():
    for bad in (["--mb", "0"], ["--rounds", "0"], ["--idle", "-1"], ["--idle", "inf"]):
        p = subprocess.run([sys.executable, str(SCRIPT), *bad], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (bad, p.stderr)
        assert p.stderr.strip().splitlines()[-1].endswith("--idle a number of seconds >= 0"), (bad, p.stderr)
