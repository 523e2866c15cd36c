"""syncviz's C++ gradient-ready hooks and DDP bucket timing (syncviz/record/native): built, taken by
the ranks of a real `syncviz trace`, the same rows as the Python hooks and group they replace (the same parameters, micro-steps and
order; the training bit for bit), every hook gone at close, and a build that fails is one line once,
not a compile per run. That each stamp comes before DDP's reducer launches the bucket is checked on
every DDP configuration by test_reducer_group (launch_ns >= ready_ns): with the stamp appended after
DDP's hook instead of before it, that test fails (checked)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from syncviz.record import native
from syncviz.trace import load_run
from syncviz.trace import schema as S
from test_e2e_ddp import ENV, SCRIPTS


def test_built_and_loaded():
    assert native.build() is None        # make install built it (else it is built now)
    mod = native.load()
    assert mod is not None and hasattr(mod, "ReadyLog") and hasattr(mod, "TimedGroup")


def _trace(tmp_path, name, env):
    out = tmp_path / name
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--standalone", "--nproc-per-node", "2", "--quiet",
                        "--out", str(out), str(SCRIPTS / "ddp_configs.py"), "--config", "accum", "--steps", "3",
                        "--save", str(tmp_path / f"{name}.pt")],
                       capture_output=True, text=True, env={**ENV, **env}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return load_run(out), torch.load(tmp_path / f"{name}.pt"), p.stderr


@pytest.mark.slow
def test_the_same_rows_as_the_python_hooks(tmp_path):
    py, py_saved, _ = _trace(tmp_path, "python", {native.ENV: "0"})
    cc, cc_saved, _ = _trace(tmp_path, "cpp", {})
    assert py.meta["grad_ready_hooks"] == "python" and cc.meta["grad_ready_hooks"] == "c++"
    assert py.meta["ddp_bucket_timing"] == "python" and cc.meta["ddp_bucket_timing"] == "c++"
    for k, v in py_saved["params"].items():
        assert torch.equal(v, cc_saved["params"][k]), k
    cols = ["rank", "step", "micro", "name"]
    a = py.events[py.events["kind"] == S.GRAD_READY][cols].reset_index(drop=True)
    b = cc.events[cc.events["kind"] == S.GRAD_READY][cols].reset_index(drop=True)
    assert len(b) == 2 * 3 * 2 * 14 and a.equals(b)   # ranks × steps × micro-steps × parameters
    ev = cc.events
    g = ev[ev["kind"] == S.GRAD_READY]
    assert (g["start_ns"] == g["end_ns"]).all()
    # each bucket's ready time is its parameters' latest stamp in its micro-step, before its launch
    lay = cc.layouts
    for _, bkt in ev[ev["kind"] == S.BUCKET].iterrows():
        names = lay[(lay["rank"] == bkt["rank"]) & (lay["layout"] == bkt["layout"]) & (lay["bucket"] == bkt["bucket"])]["param"]
        mine = g[(g["rank"] == bkt["rank"]) & (g["step"] == bkt["step"]) & (g["micro"] == bkt["micro"]) & g["name"].isin(names)]
        assert len(mine) == len(names) and bkt["ready_ns"] == mine["end_ns"].max() <= bkt["launch_ns"]
    # DDP's buckets timed by the C++ group (timed_group.py): the Python group's rows, each bucket with
    # its all_reduce row, both from one launch stamp and one done stamp
    key = ["rank", "step", "micro", "bucket", "layout", "bytes", "dtype", "name", "op", "group_size", "phase"]
    for kind in (S.BUCKET, S.COLLECTIVE):
        a, b = (r.events[r.events["kind"] == kind][key].reset_index(drop=True) for r in (py, cc))
        assert len(b) >= 2 * 3 and a.equals(b), kind     # ≥ a bucket per rank and step (in its last micro-step)
    t = ["rank", "step", "bucket"]
    bkt = ev[ev["kind"] == S.BUCKET].set_index(t).sort_index()
    col = ev[ev["kind"] == S.COLLECTIVE].set_index(t).sort_index()
    assert (bkt["start_ns"] == bkt["launch_ns"]).all() and (bkt["launch_ns"] == col["start_ns"]).all()
    assert (bkt["end_ns"] == col["end_ns"]).all() and (bkt["end_ns"] > bkt["launch_ns"]).all()


# a DDP model of one rank (its reducer holds the parameters' nodes, as in any DDP run) and a recorder
PRELUDE = textwrap.dedent("""
    import gc, json, tempfile, weakref, torch
    import torch.distributed as dist
    from pathlib import Path
    from torch.nn.parallel import DistributedDataParallel as DDP
    from syncviz.record.recorder import Recorder
    out = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=0, world_size=1)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    ddp = DDP(net)
    rec = Recorder(out, rank=0, world_size=1)
    rec.stop_discovery()                 # as instrument_ddp does: no root discovery holding modules
    rec.index_params(ddp.module, held=True)
""")


def test_a_discarded_ddp_model_is_freed_with_its_hooks():
    """The log holds each node weakly: a DDP model let go of is freed (its parameters with it, on a
    GPU their memory), and its hooks with its nodes."""
    code = PRELUDE + textwrap.dedent("""
        log = rec._native
        ddp(torch.randn(3, 4)).sum().backward()
        assert len(log.take()) == 4 and log.hooks() == 4
        param = weakref.ref(net[0].weight)
        del ddp, net
        gc.collect()
        assert param() is None and log.hooks() == 0
        rec.close()
        print("OK")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


def test_every_hook_goes_at_close_and_stamps_follow_micro_steps():
    code = PRELUDE + textwrap.dedent("""
        log = rec._native
        assert log is not None and log.hooks() == 4
        for micro in (0, 1):
            rec.micro = micro
            ddp(torch.randn(3, 4)).sum().backward()
        rows = log.take()
        assert sorted(rows[:, 0].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3], rows
        assert rows[:4, 2].tolist() == [0] * 4 and rows[4:, 2].tolist() == [1] * 4
        assert (rows[1:, 1] >= rows[:-1, 1]).all()
        rec.close()
        assert log.hooks() == 0
        ddp(torch.randn(3, 4)).sum().backward()
        assert len(log.take()) == 0
        print("OK")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


def test_a_failed_build_is_one_line_once(tmp_path, monkeypatch):
    broken = tmp_path / "gradstamp.cpp"
    broken.write_text("#error not today\n")
    monkeypatch.setattr(native, "SOURCES", [broken])
    monkeypatch.setenv("SYNCVIZ_CACHE_DIR", str(tmp_path / "cache"))
    why = native.build()
    assert why and "\n" not in why
    assert "error: #error not today" in why      # the compiler's error line, not the command before it
    again = native.build()               # not compiled again: the failure is kept for this torch
    assert again.startswith(why) and "remove" in again
    assert native._library(native.build_dir()) is None
    assert not [p for p in (tmp_path / "cache" / "native").iterdir() if p.is_dir()]   # no half build left
    monkeypatch.setenv(native.ENV, "0")
    assert native.build() is None and native.load() is None       # switched off: nothing to build


def test_compiled_autograd_moves_to_the_python_hooks():
    """Compiled autograd runs a compiled graph instead of the engine: it calls Python hooks but not
    a node hook written in C++. The recorder sees it coming at the backward and switches, keeping
    the stamps it had."""
    code = textwrap.dedent("""
        import tempfile, json, torch
        from pathlib import Path
        from torch._dynamo import compiled_autograd
        from syncviz.record.recorder import Recorder
        out = tempfile.mkdtemp()
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        # the nodes held as DDP's reducer holds them (compiled autograd refuses DDP's C++ reducer)
        held = [p.view_as(p).grad_fn.next_functions[0][0] for p in net.parameters()]
        rec = Recorder(out, rank=0, world_size=1)
        rec.index_params(net, held=True)
        assert rec._native is not None
        net(torch.randn(3, 4)).sum().backward()          # eager: the C++ hooks stamp
        with compiled_autograd._enable(torch.compile(backend="eager")):
            net(torch.randn(3, 4)).sum().backward()
        assert rec._native is None
        rows = rec._take_ready()
        assert [r[2] for r in rows] == [0] * 4 + [1] * 4, rows
        assert json.loads((Path(out) / "run.json").read_text())["grad_ready_hooks"] == "python (compiled autograd)"
        rec.close()
        print("OK")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


def test_only_parameters_ddp_holds_get_the_cpp_hooks():
    """The C++ hook holds its parameter's AccumulateGrad node, as DDP's reducer does; a node held
    across a change of its parameter's shape rejects the gradient (FSDP1's flat parameters:
    test_engines' FSDP1 run failed so), so parameters no DDP holds keep the Python hooks."""
    code = textwrap.dedent("""
        import tempfile, json, torch
        from pathlib import Path
        from syncviz.record.recorder import Recorder
        out = tempfile.mkdtemp()
        net = torch.nn.Linear(4, 2)
        rec = Recorder(out, rank=0, world_size=1)
        rec.index_params(net)
        assert rec._native is None
        net(torch.randn(3, 4)).sum().backward()
        assert len(rec._take_ready()) == 2
        rec.close()
        assert json.loads((Path(out) / "run.json").read_text())["grad_ready_hooks"] == "python"
        print("OK")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]
