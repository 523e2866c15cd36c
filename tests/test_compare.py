"""syncviz.model.theory (pure derivations), the analysis rules compare relies on (blocking collectives,
nested optimizers) and ``syncviz compare`` on hand-built traces: numbers, notes and clear errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from tracebuild import columns, ev

from syncviz import analysis as A
from syncviz.views import compare as C
from syncviz.model import theory as T
from syncviz.trace import TraceError, load_run, new_meta, write_run

SHAPES = {"emb": [6, 4], "w": [5, 4], "b": [5]}          # 24 + 20 + 5 = 49 elements
ELEMS = 49


# ---------------------------------------------------------------------------------- theory

def test_padded_numel_rounds_dim0_to_world():
    assert T.padded_numel([5, 4], 2) == 24
    assert T.padded_numel([6, 4], 2) == 24
    assert T.padded_numel([5], 4) == 8


def test_comm_per_step_by_strategy():
    g = ELEMS * 4
    assert T.comm_per_step("ddp", SHAPES, 2) == {"all_reduce": g}
    assert T.comm_per_step("ddp-fp16", SHAPES, 2) == {"all_reduce": g // 2}
    assert T.comm_per_step("zero1", SHAPES, 2) == {"all_reduce": g, "broadcast": g}
    padded = (24 + 24 + 6) * 4
    assert T.comm_per_step("zero2", SHAPES, 2) == {"all_gather": padded, "reduce_scatter": padded}
    assert T.comm_per_step("zero3", SHAPES, 2) == {"all_gather": 2 * padded, "reduce_scatter": padded}
    assert T.comm_per_step("zero3", SHAPES, 2, root_params=["emb"]) == {
        "all_gather": 2 * padded - 24 * 4, "reduce_scatter": padded}
    assert T.comm_per_step("zero2", SHAPES, 2, accum=3)["all_gather"] == 3 * padded


def test_powersgd_compresses_only_what_pays():
    big = {"w": [100, 50], "b": [100], "thin": [3, 2]}
    e = T.powersgd_elements(big, rank=1, min_compression_rate=2)
    # w: (100+50)*1*2 = 300 < 5000 -> P 100, Q 50; b: 1-D (100x1) and thin (6) stay uncompressed
    assert e == {"uncompressed": 106, "p": 100, "q": 50}
    assert T.comm_per_step("powersgd", big, 2) == {"all_reduce": (106 + 150) * 4}
    assert T.comm_per_step("powersgd", big, 2, compressed=False) == {"all_reduce": (5000 + 106) * 4}


def test_memory_per_rank_and_textbook():
    ddp = T.memory_per_rank("ddp", SHAPES, 2, 0)
    assert ddp == {"params_bytes": 196, "grads_bytes": 196, "optimizer_bytes": 2 * 196 + 3 * 4}
    # ZeroRedundancyOptimizer's greedy split: emb (24) -> rank 0, w (20) -> rank 1, b (5) -> rank 1
    assert T.memory_per_rank("zero1", SHAPES, 2, 0)["optimizer_bytes"] == 2 * 24 * 4 + 4
    assert T.memory_per_rank("zero1", SHAPES, 2, 1)["optimizer_bytes"] == 2 * 25 * 4 + 8
    z3 = T.memory_per_rank("zero3", SHAPES, 2, 1)     # rows 3 of emb, rows 3..4 of w (2), b[3:5]
    assert z3["params_bytes"] == (12 + 12 + 3) * 4
    assert z3["optimizer_bytes"] == 2 * (12 + 8 + 2) * 4 + 12
    tb = T.textbook_memory("zero3", 1000, 4)
    assert tb == {"params_bytes": 1000.0, "grads_bytes": 1000.0, "optimizer_bytes": 2000.0}
    assert T.textbook_comm_per_step("zero3", 10, 10) == {"all_gather": 20, "reduce_scatter": 10}


def test_unknown_strategy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown strategy 'zero4'"):
        T.comm_per_step("zero4", SHAPES, 2)
    from syncviz.workloads import strategies
    with pytest.raises(ValueError, match="unknown strategy"):
        strategies.wrap(None, type("Cfg", (), {"strategy": "fsdp9"})())


# --------------------------------------------------------------------------- analysis rules

def test_blocking_collective_is_cut_from_compute():
    events = pd.DataFrame([
        ev("forward", 0, 10), ev("backward", 10, 30),
        ev("collective", 2, 6, name="all_gather_single (blocking)", op="all_gather", nbytes=100),
        ev("collective", 20, 25, name="reduce_scatter_single (blocking)", op="reduce_scatter", nbytes=100),
        ev("collective", 12, 14, name="all_reduce", op="all_reduce", nbytes=100),  # async: overlaps
        ev("step", 0, 30)]).assign(rank=0)
    m = A.step_metrics(events).iloc[0]
    ms = 1_000_000
    assert m["forward_ns"] == 6 * ms and m["backward_ns"] == 15 * ms
    assert m["comm_busy_ns"] == 11 * ms
    assert m["overlapped_ns"] == 2 * ms and m["exposed_ns"] == 9 * ms


def test_subtract_intervals_pieces():
    a = pd.DataFrame({"rank": [0, 0, 1], "step": [0, 0, 0], "kind": ["f", "b", "f"],
                      "start_ns": [0, 100, 0], "end_ns": [50, 200, 100]})
    b = pd.DataFrame({"rank": [0, 0, 0, 1], "step": [0, 0, 0, 0],
                      "start_ns": [10, 40, 150, -5], "end_ns": [20, 120, 160, 5]})
    out = A.subtract_intervals(a, b)
    assert list(zip(out["rank"], out["kind"], out["start_ns"], out["end_ns"])) == [
        (0, "f", 0, 10), (0, "f", 20, 40), (0, "b", 120, 150), (0, "b", 160, 200), (1, "f", 5, 100)]


def test_innermost_optimizer_counts_as_compute():
    zero = ev("optimizer", 40, 60, name="ZeroRedundancyOptimizer", layout=0)
    adam = ev("optimizer", 41, 45, name="AdamW", layout=1)
    bc = ev("collective", 46, 59, name="broadcast", op="broadcast", nbytes=10)
    events = pd.DataFrame([zero, adam, bc, ev("step", 40, 60)]).assign(rank=0)
    m = A.step_metrics(events).iloc[0]
    assert m["optimizer_ns"] == 4_000_000
    assert m["exposed_ns"] == 13_000_000


# ------------------------------------------------------------------------------- compare

def _run(path, strategy, rows_per_step, *, params=ELEMS, shapes=SHAPES, probe=None, memory=None):
    meta = new_meta(path.name, 2, strategy=strategy, backend="gloo", device="cpu", engine="torch",
                    model={"name": "Toy", "params": params, "bytes": params * 4, "grad_bytes": params * 4})
    meta["strategy_config"] = {"name": strategy, "param_shapes": shapes, "accum": 1}
    if probe:
        meta["backend_probe"] = probe
    if memory:
        meta["memory"] = memory
    by_rank = {r: [columns([ev("forward", 100 * s, 100 * s + 10, step=s),
                            ev("backward", 100 * s + 10, 100 * s + 30, step=s),
                            *[_shift(x, s) for x in rows_per_step],
                            ev("optimizer", 100 * s + 40, 100 * s + 45, step=s),
                            ev("step", 100 * s, 100 * s + 50, step=s)]) for s in range(3)] for r in range(2)}
    return write_run(path, meta, by_rank, {})


def _shift(row: dict, step: int) -> dict:
    """A row written relative to its step's start, moved to step ``step`` (steps are 100 ms apart)."""
    d = 100 * step * 1_000_000
    out = dict(row, step=step)
    for c in ("start_ns", "end_ns", "launch_ns", "ready_ns"):
        if out[c] >= 0:
            out[c] += d
    return out


PADDED = (24 + 24 + 6) * 4
PROBE = {"bytes": 4194304, "world_size": 2, "backend": "gloo", "reps": 5,
         "ms": {"all_reduce": 5.0, "reduce_scatter": 10.0, "all_gather": 3.0},
         "reduce_scatter_vs_all_reduce": 2.0, "all_gather_vs_all_reduce": 0.6}


@pytest.fixture
def two_runs(tmp_path):
    ddp = _run(tmp_path / "ddp", "ddp", [ev("bucket", 12, 35, bucket=0, op="all_reduce", nbytes=ELEMS * 4,
                                            ready_ms=12)])
    z3 = _run(tmp_path / "zero3", "zero3", [
        ev("collective", 1, 3, name="all_gather_single (blocking)", op="all_gather", nbytes=PADDED),
        ev("collective", 11, 13, name="all_gather_single (blocking)", op="all_gather", nbytes=PADDED),
        ev("collective", 20, 24, name="reduce_scatter_single (blocking)", op="reduce_scatter", nbytes=PADDED)],
        probe=PROBE, memory=[{"rank": r, **T.memory_per_rank("zero3", SHAPES, 2, r),
                              "params_after_forward_bytes": 108} for r in (0, 1)])
    return ddp, z3


def test_comparison_numbers_and_notes(two_runs):
    ddp, z3 = (C.run_comparison(load_run(p)) for p in two_runs)
    assert ddp["bytes_per_step"] == ELEMS * 4
    ops = {o["op"]: o for o in z3["ops"]}
    assert ops["all_gather"]["measured_bytes"] == 2 * PADDED and ops["all_gather"]["matches"] is True
    assert ops["reduce_scatter"]["calls_per_step"] == 1.0
    assert ops["all_gather"]["textbook_bytes"] == 2 * ELEMS * 4
    assert z3["overlap_pct"] == 0 and z3["blocking_collectives"]
    assert z3["memory"]["measured"]["params_bytes"] == z3["memory"]["expected"]["params_bytes"]
    assert any("synchronous on the host" in n for n in z3["notes"])
    assert any("pads" in n for n in z3["notes"])
    notes = C.backend_notes([ddp, z3])
    assert any(n.startswith("gloo: reduce_scatter took 2.0x") and "all_reduce of the whole array" in n
               for n in notes)


def test_mismatch_is_flagged(tmp_path):
    run = _run(tmp_path / "z2", "zero2", [
        ev("collective", 1, 3, name="all_gather_single (blocking)", op="all_gather", nbytes=PADDED),
        ev("collective", 20, 24, name="reduce_scatter_single (blocking)", op="all_reduce", nbytes=PADDED)])
    c = C.run_comparison(load_run(run))
    assert {o["op"]: o["matches"] for o in c["ops"]} == {"all_gather": True, "all_reduce": None,
                                                         "reduce_scatter": False}
    assert any("reduce_scatter: measured 0.00 MB" in n for n in c["notes"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "syncviz", *args], capture_output=True, text=True, timeout=120)


def test_cli_compare_table_and_json(two_runs):
    p = _cli("compare", *map(str, two_runs))
    assert p.returncode == 0, p.stderr
    assert "Bytes per step and rank by op" in p.stdout and "zero3" in p.stdout
    p = _cli("compare", str(two_runs[0].parent), "--json")
    data = json.loads(p.stdout)
    assert [c["strategy"] for c in data] == ["ddp", "zero3"]


def test_cli_errors_are_one_line(tmp_path, two_runs):
    other = _run(tmp_path / "big", "ddp", [ev("bucket", 12, 35, bucket=0, op="all_reduce", nbytes=400)],
                 params=100, shapes={"w": [10, 10]})
    p = _cli("compare", str(two_runs[0]), str(other))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "runs of different models" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _cli("compare", str(two_runs[0]), "--strategies", "ddp,zero9")
    assert p.returncode != 0 and "unknown strategy 'zero9'" in p.stderr and "Traceback" not in p.stderr
    p = _cli("compare", str(tmp_path / "nothing"))
    assert p.returncode != 0 and "no syncviz run" in p.stderr
    p = _cli("demo", "--strategy", "zero9")
    assert p.returncode != 0 and "unknown strategy 'zero9'" in p.stderr and "Traceback" not in p.stderr


def test_load_runs_checks_models_directly(tmp_path, two_runs):
    other = _run(tmp_path / "big", "ddp", [], params=100, shapes={"w": [10, 10]})
    with pytest.raises(TraceError, match="different models"):
        C.load_runs([two_runs[0], other])
