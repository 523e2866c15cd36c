"""DDP's default bucket all-reduce timed through the reducer's process group (record/reducer_group.py),
on real DDP configurations with real torchrun on gloo: the training is bit for bit the same as
without syncviz, every bucket is numbered and mapped to its parameters as DDP itself has them
(DDP's own logging data), and the rows are the ones the comm-hook path records (slow)."""
import pytest
import torch

from syncviz.trace import load_run
from syncviz.trace import schema as S
from test_e2e_ddp import SCRIPTS, syncviz, torchrun

pytestmark = pytest.mark.slow
CONFIGS = ["default", "unused", "static", "view", "accum", "join", "buffers"]


def _rebuilt(saved: dict) -> dict[int, list[str]]:
    """DDP's rebuilt layout, bucket -> parameter names, from its logging data ("7 6, 5 4 3, …")."""
    names = saved["names"]
    return {b: [names[int(i)] for i in part.split()] for b, part in enumerate(saved["rebuilt"].split(", "))}


@pytest.mark.parametrize("config", CONFIGS)
def test_default_allreduce_timed_without_a_hook(tmp_path, config):
    args = [SCRIPTS / "ddp_configs.py", "--config", config, "--steps", 4]
    torchrun(2, *args, "--save", tmp_path / "plain.pt")
    syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet", *args, "--save", tmp_path / "traced.pt")
    plain, traced = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "traced.pt")
    for k, v in plain["params"].items():           # DDP's fused 1/N, untouched: bit for bit
        assert torch.equal(v, traced["params"][k]), k
    run = load_run(tmp_path / "run")
    assert run.meta["ddp"]["comm_hook"] == "default (allreduce, 1/N)"
    ev = run.events
    b = ev[ev["kind"] == S.BUCKET]
    lay = run.layouts
    grad_bytes = int(lay[(lay["layout"] == 0) & (lay["rank"] == 0)]["numel"].sum()) * 4
    synced = b if config != "accum" else b[b["micro"] == 1]
    assert config != "accum" or (b["micro"] == 1).all()          # no bucket in a no_sync micro-step
    for (rank, step), f in synced.groupby(["rank", "step"]):
        # every bucket once, numbered 0..n-1, carrying every gradient byte once
        assert sorted(f["bucket"]) == list(range(len(f))), (rank, step, f["bucket"].tolist())
        assert int(f["bytes"].sum()) == grad_bytes, (rank, step)
        assert (f["launch_ns"] == f["start_ns"]).all() and (f["end_ns"] >= f["start_ns"]).all()
        assert (f["ready_ns"] > 0).all() and (f["launch_ns"] >= f["ready_ns"]).all()
    # each bucket's own all_reduce row, issued inside it
    c = ev[(ev["kind"] == S.COLLECTIVE) & (ev["bucket"] >= 0)]
    assert len(c) == len(b) and set(c["op"]) == {"all_reduce"}
    # the bucket -> parameter map syncviz wrote is DDP's own (its logging data), where DDP rebuilt
    if plain["rebuilt"]:
        mine = lay[(lay["rank"] == 0) & (lay["layout"] == 1)].sort_values(["bucket", "offset"])
        assert {int(k): g["param"].tolist() for k, g in mine.groupby("bucket")} == _rebuilt(traced)
        # layout 0 until DDP rebuilt its buckets (step 1's forward; static_graph: step 2's), then 1
        first = b.groupby("layout")["step"].agg(["min", "max"])
        assert list(first.index) == [0, 1] and first.loc[0, "min"] == 0 and first.loc[0, "max"] < first.loc[1, "min"]
    else:
        assert config in ("unused",) and set(b["layout"]) == {0}   # find_unused_parameters: DDP never rebuilds
    if config == "join":
        # rank 1 ran out of batches after step 2; DDP's join shadows its all-reduces for rank 0's step 3
        # (numbered on the way, so rank 0's buckets matched them), but no optimizer step ends rank 1's
        # step 3: it is not written (as with the comm hook path)
        assert sorted(b[b["rank"] == 1]["step"].unique()) == [0, 1, 2]
        assert sorted(b[b["rank"] == 0]["step"].unique()) == [0, 1, 2, 3]


def test_grad_values_and_user_hooks_keep_the_comm_hook(tmp_path):
    """--grad-values reads a bucket before it is scaled: that run keeps the comm hook, numbering the
    buckets as the reducer's own calls do (the same rows, the same numerics)."""
    args = [SCRIPTS / "ddp_configs.py", "--config", "default", "--steps", 3]
    syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "a", "--quiet", *args, "--save", tmp_path / "a.pt")
    syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "b", "--quiet", "--grad-values", *args,
            "--save", tmp_path / "b.pt")
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    for k, v in a["params"].items():
        assert torch.equal(v, b["params"][k]), k
    key = ["rank", "step", "micro", "bucket", "layout", "bytes", "name", "op"]
    rows = [load_run(tmp_path / d).events.query("kind == 'bucket'")[key].sort_values(key).reset_index(drop=True)
            for d in ("a", "b")]
    assert len(rows[0]) and rows[0].equals(rows[1])
