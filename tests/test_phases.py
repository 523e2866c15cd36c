"""The recorder's phases in one process, no process group, on a plain nn.Module (the root found by
discovery): micro-steps are backwards, eval forwards are their own kind, ``step(closure)`` is cut
around the closure, a reentrant checkpoint's inner backward is no second micro-step, discovery's
global hooks are gone after the first step, and tracing changes no bit of training."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from syncviz.record.discover import name_strategy
from syncviz.record.recorder import Recorder
from syncviz.trace import load_run
from syncviz.trace import schema as S


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.fixture
def rec(tmp_path):
    (tmp_path / "run").mkdir()
    r = Recorder(tmp_path / "run", rank=0, world_size=1)
    yield r
    r.close()


def rows(rec):
    rec.close()
    ev = load_run(rec.run_dir).events
    return ev[ev["kind"].isin([S.FORWARD, S.EVAL_FORWARD, S.BACKWARD, S.OPTIMIZER])]


def test_accumulation_eval_and_probe(rec):
    model, x = net(), torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        with torch.no_grad():
            model(x)                      # evaluation under no_grad
        for _ in range(2):
            model(x).sum().backward()     # two micro-steps
        model(x)                          # grad enabled, never backpropagated
        opt.step()
        opt.zero_grad()
    ev = rows(rec)
    for step in range(3):
        e = ev[ev["step"] == step]
        assert sorted(e[e["kind"] == S.FORWARD]["micro"]) == [0, 1]
        assert sorted(e[e["kind"] == S.BACKWARD]["micro"]) == [0, 1]
        assert (e["kind"] == S.EVAL_FORWARD).sum() == 2
        assert (e[e["kind"] == S.OPTIMIZER]["micro"] == 1).all()
    assert load_run(rec.run_dir).meta["strategy"] == "none"
    assert load_run(rec.run_dir).meta["model"]["name"] == "Sequential"


def test_closure_is_cut_out_of_the_optimizer(rec):
    model, x = net(), torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure():
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss
    for _ in range(2):
        opt.step(closure)
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
    lbfgs.step(closure)                   # calls the closure several times
    ev = rows(rec)
    for step, g in ev.groupby("step"):
        opt_rows = g[g["kind"] == S.OPTIMIZER]
        work = g[g["kind"].isin([S.FORWARD, S.BACKWARD])]
        assert len(opt_rows) == (work["kind"] == S.BACKWARD).sum() + 1   # a piece around each closure call
        for o in opt_rows.itertuples():
            assert not ((work["start_ns"] < o.end_ns) & (work["end_ns"] > o.start_ns)).any()
    assert (ev[ev["step"] == 2]["kind"] == S.BACKWARD).sum() >= 2


def test_reentrant_checkpoint_is_one_backward(rec):
    model, x = net(), torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        checkpoint(model, x.requires_grad_(), use_reentrant=True).sum().backward()
        opt.step()
        opt.zero_grad()
    ev = rows(rec)
    assert (ev.groupby(["step", "kind"]).size().loc[(slice(None), S.BACKWARD)] == 1).all()


def test_discovery_hooks_removed_after_first_step(rec):
    from torch.nn.modules import module as M
    model, x = net(), torch.randn(8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert M._global_forward_pre_hooks
    model(x).sum().backward()
    opt.step()
    assert not M._global_forward_pre_hooks and not M._global_forward_hooks
    model(x).sum().backward()             # still timed, by the root's own hooks
    opt.step()
    ev = rows(rec)
    assert list(ev[ev["kind"] == S.FORWARD]["step"]) == [0, 1]


def test_tracing_changes_no_bit(tmp_path):
    def train(traced):
        model, opt = net(), None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        r = None
        if traced:
            (tmp_path / "t").mkdir()
            r = Recorder(tmp_path / "t", rank=0, world_size=1)
        g = torch.Generator().manual_seed(3)
        for _ in range(4):
            x = torch.randn(8, 16, generator=g)

            def closure():
                opt.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                return loss
            opt.step(closure)
        if r is not None:
            r.close()
        return [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(train(False), train(True)))


def test_strategy_names():
    assert name_strategy({"wrappers": ["DistributedDataParallel"], "comm_hook": "fp16_compress_hook"}) == \
        ("ddp", "DDP, comm hook fp16_compress_hook")
    assert name_strategy({"wrappers": ["DistributedDataParallel"], "optimizers": ["ZeroRedundancyOptimizer", "AdamW"]})[0] == "zero1"
    assert name_strategy({"fsdp2": True, "reshard_after_forward": ["False"]}) == \
        ("fsdp2", "FSDP2 fully_shard (reshard_after_forward: False)")
    assert name_strategy({"wrappers": ["FullyShardedDataParallel"], "fsdp1_sharding": "FULL_SHARD"})[0] == "fsdp1"
    assert name_strategy({"wrappers": ["DataParallel"]})[0] == "dataparallel"
    assert name_strategy({"engine_module": "SomeEngine", "collective_ops": ["all_reduce"]})[0] == "someengine"
    assert name_strategy({"collective_ops": ["broadcast", "all_reduce"]}) == \
        ("hand-written", "hand-written collectives (all_reduce, broadcast)")
    assert name_strategy({})[0] == "none"


def test_dataparallel_named_and_timed(rec):
    model, x = nn.DataParallel(net()), torch.randn(8, 16)   # on CPU: runs the module in-process
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    ev = rows(rec)
    assert list(ev[ev["kind"] == S.FORWARD]["step"]) == [0, 1]
    meta = load_run(rec.run_dir).meta
    assert meta["strategy"] == "dataparallel" and meta["model"]["name"] == "Sequential"
