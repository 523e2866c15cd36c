"""The Replay's kept lateness pieces (analysis/steplateness.py): rows written by step in LZ4 blocks
of whole steps read back, step by step, exactly as written, whatever the block size."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncviz.analysis import steplateness as SL


def _late(seed: int, steps: int = 40, categorical: bool = True) -> pd.DataFrame:
    """Rows shaped like partition_joined.lateness: rank by rank, each rank's steps in order, a step's
    rows in collective order; steps of different sizes (some with one row), labels with gaps."""
    rng = np.random.default_rng(seed)
    rows = []
    for rank in (3, 4, 7):
        for step in range(steps):
            for c in range(int(rng.integers(1, 9)) if step % 7 else 1):
                rows.append((rank, step * 3, int(rng.integers(0, 2)), c, int(rng.integers(-5, 2**40)),
                             ["", f"all_gather #{c}", None][c % 3]))
    f = pd.DataFrame(rows, columns=SL.LATENESS_COLUMNS)
    if categorical:
        f["label"] = pd.Categorical(f["label"].fillna("").to_numpy(dtype=object))
    return f


@pytest.mark.parametrize("block", [1, 60, 700, SL.BLOCK_BYTES])
@pytest.mark.parametrize("categorical", [True, False])
def test_every_step_reads_back_as_written(tmp_path, monkeypatch, block, categorical):
    monkeypatch.setattr(SL, "BLOCK_BYTES", block)
    late = _late(block, categorical=categorical)
    piece = SL.write_piece(tmp_path / "p.lat", late)
    want_steps = sorted(set(late["step"]))
    assert piece["steps"] == want_steps
    blocks = SL._Piece(tmp_path / "p.lat").head["blocks"]
    assert (len(blocks) > 10) == (block <= 60), len(blocks)      # small blocks: many; the default: one here
    kept = SL.KeptLateness(tmp_path, [piece, {**piece}])           # the same piece twice: rows twice, in order
    ref = late.assign(label=late["label"].astype(object))
    for s in [*want_steps, *want_steps[::-3]]:                      # forwards, then back across blocks
        got = kept.step(s)
        one = ref[ref["step"] == s]
        want = pd.concat([one, one], ignore_index=True)
        assert got["label"].dtype == object
        pd.testing.assert_frame_equal(got, want, check_exact=True, check_dtype=False, obj=f"step {s}")
        assert [str(t) for t in got.dtypes[:-1]] == ["int32", "int64", "int32", "int64", "int64"]
    assert not len(kept.step(1))                                    # a step no piece holds: no rows
    assert list(kept.step(1).columns) == SL.LATENESS_COLUMNS


def test_a_file_that_is_not_a_piece_is_refused(tmp_path):
    late = _late(0)
    piece = SL.write_piece(tmp_path / "p.lat", late)
    data = (tmp_path / "p.lat").read_bytes()
    (tmp_path / "p.lat").write_bytes(data[: len(data) // 2])        # cut short: a block cannot decompress
    assert SL.read_back(tmp_path / "p.lat") is None
    (tmp_path / "q.lat").write_bytes(b"PAR1 not ours")
    with pytest.raises(OSError, match="not a lateness piece"):
        SL.KeptLateness(tmp_path, [{**piece, "file": "q.lat"}]).step(0)
