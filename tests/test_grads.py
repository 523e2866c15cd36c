"""Gradient values (``syncviz trace --grad-values``): after synchronization every rank holds the
mean of the ranks' local gradients exactly; the "after" values are what DDP left in .grad; training
is bitwise identical with the recording on. Real torchrun ranks on gloo (slow), plus reader checks
on hand-written files (fast)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from syncviz.analysis import grads as G
from syncviz.trace.grads import load_grads
from syncviz.trace import schema as S
from syncviz.trace import TraceError, new_meta, write_json_atomic

SCRIPTS = Path(__file__).parent / "scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _trace(out, nproc, *args):
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", str(nproc), "--out", str(out),
                        "--overwrite", "--quiet", *map(str, args)], capture_output=True, text=True, env=ENV,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_after_is_the_mean_of_before_and_training_is_unchanged(tmp_path):
    common = ["-m", "syncviz.workloads", "--preset", "tiny", "--steps", "3", "--bucket-cap-mb", "0.1"]
    _trace(tmp_path / "on", 2, "--grad-values", "--grad-elements", "6", *common, "--save-params", tmp_path / "on.pt")
    _trace(tmp_path / "off", 2, *common, "--save-params", tmp_path / "off.pt")
    on, off = torch.load(tmp_path / "on.pt"), torch.load(tmp_path / "off.pt")
    assert on.keys() == off.keys() and all(torch.equal(on[k], off[k]) for k in on)   # bitwise
    assert not list((tmp_path / "off").glob("grads-*.arrow"))                        # off by default
    assert json.loads((tmp_path / "on" / "run.json").read_text())["grad_values"]["elements"] == 6

    g = load_grads(tmp_path / "on")
    from syncviz.workloads.gpt import GPT, preset
    n_params = len(list(GPT(preset("tiny")).parameters()))       # the tied lm_head counts once
    assert len(g) == 3 * n_params * 2 * 2          # steps × params × {before, after} × ranks
    for (step, param), rows in g.groupby(["step", "param"]):
        before = rows[rows["when"] == "before"].sort_values("rank")
        after = rows[rows["when"] == "after"].sort_values("rank")
        b = torch.tensor(np.stack(before["values"].to_numpy()), dtype=torch.float32)
        a = torch.tensor(np.stack(after["values"].to_numpy()), dtype=torch.float32)
        assert not torch.equal(b[0], b[1])          # the ranks saw different data
        assert torch.equal(a[0], a[1])              # ... and now agree
        assert torch.equal(a[0], (b[0] + b[1]) / 2), (step, param)     # the mean, bit for bit
        assert torch.equal(a[0], b[0] * 0.5 + b[1] * 0.5)              # as DDP computes it
    check = G.averaging_check(g)
    summary = G.averaging_summary(check)
    assert summary["checked"] == 3 * n_params and summary["exact"] == summary["checked"]
    # averaging cancels noise: the averaged gradient is shorter than the ranks' on average
    shorter = (check["after_norm"] <= check["before_norms"].apply(np.mean)).mean()
    assert shorter > 0.9


@pytest.mark.slow
def test_after_is_what_ddp_left_in_dot_grad_three_ranks(tmp_path):
    _trace(tmp_path, 3, "--grad-values", SCRIPTS / "grads_check.py", tmp_path)
    g = load_grads(tmp_path)
    after = g[g["when"] == "after"]
    for rank in range(3):
        seen = json.loads((tmp_path / f"dotgrad-{rank}.json").read_text())
        mine = after[after["rank"] == rank]
        for step, grads in enumerate(seen):
            for name, values in grads.items():
                row = mine[(mine["step"] == step) & (mine["param"] == name)]
                assert len(row) == 1 and list(row["values"].iloc[0]) == values, (rank, step, name)
    check = G.averaging_check(g)
    assert check["after_equal_on_ranks"].all()
    # N = 3: DDP's Σ g_r·fl(1/3) bit for bit, in the order gloo summed that element
    assert check["exact"].all() and check["max_ulps"].max() <= 2


# ------------------------------------------------------------------------- hand-written files

def _write(run_dir, rows_by_rank):
    run_dir.mkdir()
    write_json_atomic(run_dir / S.RUN_FILE, new_meta("hand", len(rows_by_rank)))
    for rank, rows in rows_by_rank.items():
        cols = {c: [r[c] for r in rows] for c in S.GRADS_COLUMNS}
        with pa.OSFile(str(run_dir / S.grads_file(rank)), "wb") as f, pa.ipc.new_stream(f, S.GRADS_SCHEMA) as w:
            w.write_batch(pa.RecordBatch.from_pydict(cols, schema=S.GRADS_SCHEMA))


def _row(when, values, rank_norm=1.0):
    return {"step": 0, "micro": 0, "bucket": 0, "layout": 0, "param": "w", "param_index": 0, "numel": 2,
            "when": when, "norm": rank_norm, "values": values, "dtype": "float32"}


def test_check_on_hand_built_values(tmp_path):
    third = float(np.float32(1) / np.float32(3))
    b = [[0.1, 0.7], [0.2, -0.3], [0.4, 0.9]]
    mean = [float(x) for x in G.ddp_mean(np.array(b), "float32")]
    _write(tmp_path / "ok", {r: [_row("before", b[r]), _row("after", mean)] for r in range(3)})
    c = G.averaging_check(load_grads(tmp_path / "ok"))
    assert c["exact"].all() and c["max_ulps"].max() == 0 and c["ranks"].iloc[0] == 3
    assert mean[0] == float(np.float32(np.float32(np.float32(0.1) * np.float32(third))
                                       + np.float32(np.float32(0.2) * np.float32(third)))
                            + np.float32(np.float32(0.4) * np.float32(third)))
    wrong = [mean[0], float(np.nextafter(np.float32(mean[1]), np.float32(1)))]   # one ulp off
    _write(tmp_path / "off", {r: [_row("before", b[r]), _row("after", wrong)] for r in range(3)})
    c = G.averaging_check(load_grads(tmp_path / "off"))
    assert not c["exact"].any() and c["max_ulps"].iloc[0] == pytest.approx(1.0)


def test_no_grad_values_is_a_clear_error(tmp_path):
    (tmp_path / "r").mkdir()
    write_json_atomic(tmp_path / "r" / S.RUN_FILE, new_meta("hand", 2))
    with pytest.raises(TraceError, match="no gradient values recorded"):
        load_grads(tmp_path / "r")
