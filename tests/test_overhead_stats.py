"""benchmarks/overhead.py's interval: the launch (a fresh process) is the unit. Rounds of one
process share that process's own speed, so pooling them as independent samples gives an interval
that misses the truth; the launches' interval covers it."""
from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("overhead", Path(__file__).parents[1] / "benchmarks" / "overhead.py")
overhead = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(overhead)


def _runs(rng, launches=8, rounds=4, offset_sd=0.03, round_sd=0.005):
    """A/A ratios: no true difference, a per-process offset, a little per-round noise."""
    return [[math.exp(off + rng.gauss(0, round_sd)) for _ in range(rounds)]
            for off in (rng.gauss(0, offset_sd) for _ in range(launches))]


def test_launch_interval_covers_one_where_pooled_rounds_do_not():
    rng = random.Random(7)
    covered_nested = covered_pooled = 0
    for _ in range(200):
        by_launch = _runs(rng)
        _, lo, hi = overhead.nested_interval(by_launch)
        covered_nested += lo <= 1.0 <= hi
        _, lo, hi = overhead.interval([r for rs in by_launch for r in rs])
        covered_pooled += lo <= 1.0 <= hi
    assert covered_nested >= 180          # ~95% nominal
    assert covered_pooled < 160           # far below (130 of 200 here): the per-process offset is not in it


def test_one_launch_is_the_rounds_interval_and_ratios_pair_rounds():
    per = {"plain": [[(1.0, 2.0), (2.0, 4.0)]], "x": [[(1.1, 2.2), (2.2, 4.4)]]}
    assert overhead.ratios(per, "x", "plain", 1) == [[1.1, 1.1]]
    g, lo, hi = overhead.nested_interval([[1.1, 1.2, 1.0]])
    assert (g, lo, hi) == overhead.interval([1.1, 1.2, 1.0])


def test_several_checkouts_are_compared_each_under_its_folder_name(tmp_path):
    """--compare repeats (ablations side by side in one run); each row is labelled by the checkout's
    folder, so two checkouts in folders of one name would be indistinguishable: refused up front."""
    import subprocess
    import sys
    assert overhead.label_of("syncviz@/tmp/abl/nowrite") == "syncviz@nowrite"
    assert overhead.label_of("torch.profiler") == "torch.profiler"
    for d in ("a/same", "b/same"):
        (tmp_path / d / "syncviz").mkdir(parents=True)
        (tmp_path / d / "syncviz" / "__init__.py").write_text("")
    r = subprocess.run([sys.executable, str(Path(overhead.__file__)), "--cases", "short-steps", "--tools", "syncviz",
                        "--compare", str(tmp_path / "a/same"), "--compare", str(tmp_path / "b/same")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["overhead: --compare: give each checkout a folder of its own name "
                                             "(it labels the rows)"]
