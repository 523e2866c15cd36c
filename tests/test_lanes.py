"""Sub-lanes (analysis/lanes.py): intervals of one lane never overlap (or only nest), checked
against a brute-force definition on hand-picked and random intervals."""
from __future__ import annotations

import numpy as np

from syncviz.analysis.lanes import lanes


def overlaps(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def nests(a, b) -> bool:
    return (a[0] <= b[0] and b[1] <= a[1]) or (b[0] <= a[0] and a[1] <= b[1])


def check(starts, ends, groups, lane, nested):
    n = len(starts)
    for i in range(n):
        for j in range(i + 1, n):
            if groups[i] != groups[j] or lane[i] != lane[j]:
                continue
            a, b = (starts[i], ends[i]), (starts[j], ends[j])
            assert not overlaps(a, b) or (nested and nests(a, b)), (i, j, a, b, lane[i])


def test_disjoint_rows_stay_in_lane_zero():
    s, e = np.array([0, 10, 20, 30]), np.array([10, 20, 25, 40])     # touching is not overlapping
    assert lanes(s, e).tolist() == [0, 0, 0, 0]


def test_queued_collectives_get_their_own_lanes():
    # bucket 1 launched at 5 while bucket 0 [0, 10] is still in flight, bucket 2 at 12 after 0 ended
    s, e = np.array([0, 5, 12]), np.array([10, 20, 30])
    assert lanes(s, e).tolist() == [0, 1, 0]
    # three at once: three lanes; with nesting allowed, the contained one shares lane 0
    s, e = np.array([30, 33, 34]), np.array([38, 41, 36])
    assert lanes(s, e).tolist() == [0, 1, 2]
    assert lanes(s, e, nested=True).tolist() == [0, 1, 0]     # [34, 36] sits inside [30, 38]


def test_groups_are_independent():
    s, e, g = np.array([0, 5, 0, 5]), np.array([10, 20, 10, 20]), np.array([0, 0, 1, 1])
    assert lanes(s, e, g).tolist() == [0, 1, 0, 1]
    assert lanes(s, e, np.array([0, 1, 2, 3])).tolist() == [0, 0, 0, 0]


def test_random_against_brute_force():
    rng = np.random.default_rng(7)
    for nested in (False, True):
        for _ in range(40):
            n = int(rng.integers(1, 40))
            s = rng.integers(0, 100, n)
            e = s + rng.integers(1, 30, n)
            g = rng.integers(0, 3, n)
            lane = lanes(s, e, g, nested=nested)
            check(s, e, g, lane, nested)
            # greedy is optimal for interval colouring: lanes used == max overlap depth per group
            if not nested:
                for grp in set(g.tolist()):
                    m = g == grp
                    depth = max(int(((s[m] <= t) & (t < e[m])).sum()) for t in s[m].tolist())
                    widest = max(depth, 1)
                    assert lane[m].max() + 1 == widest
