"""benchmarks/partition_size.py refuses what it cannot run in one line, before it times anything
(what it measures needs a 10^8-event run: benchmarks/scale.py makes one; not run here)."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "partition_size.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_partition_size_refuses_bad_sizes_and_rounds_in_one_line(tmp_path):
    for bad, says in ((["--sizes", "abc"], "event counts of at least 1"), (["--sizes", ","], "event counts of at least 1"),
                      (["--sizes", "7.5e5,0"], "event counts of at least 1"), (["--rounds", "0"], "--rounds must be at least 1")):
        p = _run(str(tmp_path), *bad)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (bad, p.stderr)
        assert says in p.stderr.strip().splitlines()[-1], (bad, p.stderr)


def test_partition_size_says_when_the_folder_is_not_a_run(tmp_path):
    p = _run(str(tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip() == f"{tmp_path}: not a run folder (no run.json)"
