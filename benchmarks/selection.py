"""analysis.selection.select beside np.partition, side by side in one run: the middle of columns
shaped like the summary's median groups (int32 durations with NAN32, float64 bandwidths with NaN),
and the ranks of an int32 column's quartiles (min, 25%, 50%, 75%, max: spill._int_quantiles_selected).

    python benchmarks/selection.py                      # 61,000 / 800,000 / 10^7 values, 7 rounds
    python benchmarks/selection.py --sizes 96600000 --rounds 3     # the 10^8-event DDP run's biggest group

Each round times both ways on a fresh copy of the same column, in alternating order, and checks they
found the same values. Prints each size's median milliseconds and the ratio partition / select (above
1: select is faster), with the rounds' lowest and highest ratio. No timing is asserted anywhere.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from syncviz.analysis import selection
from syncviz.analysis.spill_file import NAN32


def column(kind: str, n: int, rng) -> np.ndarray:
    if kind == "int32":
        x = rng.gamma(2.0, 1e5, n).astype(np.int32)
        x[rng.random(n) < 0.05] = NAN32
        return x
    x = rng.lognormal(3.0, 1.0, n)
    x[rng.random(n) < 0.05] = np.nan
    return x


def ranks_of(x: np.ndarray, what: str) -> list[list[int]]:
    lo = int(np.count_nonzero(x == NAN32)) if x.dtype == np.int32 else 0
    nv = len(x) - lo - (int(np.isnan(x).sum()) if x.dtype.kind == "f" else 0)
    if what == "median":
        return [sorted({lo + (nv - 1) // 2, lo + nv // 2})]
    at = [q * (nv - 1) for q in (0.0, 0.25, 0.5, 0.75, 1.0)]
    return [[lo + r for r in ((int(a), int(a) + 1) if a % 1 else (int(a),))] for a in at]


def by_partition(x: np.ndarray, asks: list[list[int]]) -> list:
    every = sorted({r for ranks in asks for r in ranks})
    x.partition(every)
    return [x[ranks].tolist() for ranks in asks]


def by_select(x: np.ndarray, asks: list[list[int]]) -> list:
    every = sorted({r for ranks in asks for r in ranks})
    found = dict(zip(every, selection.select(x, every).tolist()))
    return [[found[r] for r in ranks] for ranks in asks]


def timed(fn, x, asks):
    t = time.perf_counter()
    out = fn(x, asks)
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="61000,800000,10000000", help="values a column (comma-separated)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'column':<26} {'values':>11} {'partition ms':>13} {'select ms':>10} {'ratio':>6}  rounds' ratios")
    for n in (int(s) for s in args.sizes.split(",")):
        for kind, what in (("int32", "median"), ("float64", "median"), ("int32", "quartiles")):
            x = column(kind, n, rng)
            asks = ranks_of(x, what)
            part, sel = [], []
            for r in range(args.rounds):
                for fn, into in ((by_partition, part), (by_select, sel))[:: 1 if r % 2 else -1]:
                    t, out = timed(fn, x.copy(), asks)
                    into.append((t, out))
            assert all(o == part[0][1] for _, o in part + sel), "select found other values than np.partition"
            p, s = (statistics.median(t for t, _ in v) * 1e3 for v in (part, sel))
            ratios = [a[0] / b[0] for a, b in zip(part, sel)]
            print(f"{kind + ' ' + what:<26} {n:>11,} {p:>13.2f} {s:>10.2f} {p / s:>6.2f}  "
                  f"{min(ratios):.2f}-{max(ratios):.2f}", flush=True)


if __name__ == "__main__":
    main()
