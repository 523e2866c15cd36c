"""DDP's default bucket all-reduce timed through the reducer's process group, in C++
(record/timed_group.py, the CPU default) and in Python (record/reducer_group.py: CUDA, --profile, no
C++ build), on real DDP configurations with real torchrun on gloo: the training is bit for bit the
same as without syncviz, every bucket is numbered and mapped to its parameters as DDP itself has
them (DDP's own logging data), and the rows are the ones the comm-hook path records (slow)."""

import pytest
import torch

from syncviz.trace import load_run
from syncviz.trace import schema as S
from test_e2e_ddp import ENV, SCRIPTS, syncviz, torchrun

pytestmark = pytest.mark.slow
CONFIGS = ["default", "unused", "static", "view", "accum", "join", "buffers", "regroup"]


def _rebuilt(saved: dict) -> dict[int, list[str]]:
    """DDP's rebuilt layout, bucket -> parameter names, from its logging data ("7 6, 5 4 3, …")."""
    names = saved["names"]
    return {b: [names[int(i)] for i in part.split()] for b, part in enumerate(saved["rebuilt"].split(", "))}


# the Python group on the configurations that move its numbering most (accumulation, join, regroup)
TIMINGS = [("c++", c) for c in CONFIGS] + [("python", c) for c in ("default", "accum", "join", "regroup")]


@pytest.mark.parametrize("timing,config", TIMINGS)
def test_default_allreduce_timed_without_a_hook(tmp_path, monkeypatch, timing, config):
    if timing == "python":      # no C++ for this run (SYNCVIZ_NATIVE_HOOKS=0 reaches the ranks through ENV)
        monkeypatch.setitem(ENV, "SYNCVIZ_NATIVE_HOOKS", "0")
    args = [SCRIPTS / "ddp_configs.py", "--config", config, "--steps", 6 if config == "regroup" else 4]
    torchrun(2, *args, "--save", tmp_path / "plain.pt")
    syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet", *args, "--save", tmp_path / "traced.pt")
    plain, traced = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "traced.pt")
    for k, v in plain["params"].items():           # DDP's fused 1/N, untouched: bit for bit
        assert torch.equal(v, traced["params"][k]), k
    run = load_run(tmp_path / "run")
    assert run.meta["ddp"]["comm_hook"] == "default (allreduce, 1/N)"
    assert run.meta["ddp_bucket_timing"] == timing
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
    if config == "regroup":
        # moved to a new group after step 1: DDP reset its reducer (layout 2, step 2) and rebuilt its
        # buckets in step 3's forward (layout 3); every step's buckets timed on either side of it
        per_step = b.groupby("step")["layout"].agg(lambda x: sorted(set(x)))
        assert per_step.tolist() == [[0], [1], [2], [3], [3], [3]], per_step
        mine = lay[(lay["rank"] == 0) & (lay["layout"] == 3)].sort_values(["bucket", "offset"])
        assert {int(k): g["param"].tolist() for k, g in mine.groupby("bucket")} == _rebuilt(traced)
    elif plain["rebuilt"]:
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


@pytest.mark.parametrize("config", ["default", "regroup"])
def test_grad_values_and_user_hooks_keep_the_comm_hook(tmp_path, config):
    """--grad-values reads a bucket before it is scaled: that run keeps the comm hook, numbering the
    buckets as the reducer's own calls do (the same rows, the same numerics), and follows DDP to a
    new process group as the wrapped group does."""
    args = [SCRIPTS / "ddp_configs.py", "--config", config, "--steps", 5]
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


def _fallback_worker(rank: int, out: str, store: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from syncviz import record
    from syncviz.record import reducer_group as RG
    from syncviz.record import timed_group as TG

    def refuse(*_a, **_k):        # a torch whose reducer takes no other process group
        raise TypeError("reducer refuses a wrapped ProcessGroup")
    RG.ReducerGroup = TG.TimedBuckets = refuse
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    with record.tracing(out, name="fallback"):
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)]), bucket_cap_mb=0.005)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()
    from syncviz.record.quiesce import quiesce
    quiesce()


def test_falls_back_to_the_comm_hook_when_the_reducer_takes_no_wrapped_group(tmp_path, capfd):
    """If the reducer cannot be given the wrapped group, the run is not lost and no bucket goes
    untimed: the comm hook times them (hook entry before the collective call: the 1/N pass)."""
    import torch.multiprocessing as mp
    mp.spawn(_fallback_worker, args=(str(tmp_path / "run"), str(tmp_path / "store")), nprocs=2, join=True)
    assert "its buckets are timed by a comm hook instead" in capfd.readouterr().err
    ev = load_run(tmp_path / "run").events
    b = ev[ev["kind"] == S.BUCKET]
    assert sorted(b.groupby(["rank", "step"]).size().index.tolist()) == [(r, s) for r in (0, 1) for s in range(3)]
    for (_, step), f in b.groupby(["rank", "step"]):   # step 0: DDP's first 1 MB bucket holds them all
        assert sorted(f["bucket"]) == list(range(len(f))) and (len(f) > 1 or step == 0)
    assert (b["launch_ns"] > b["start_ns"]).all()


@pytest.mark.parametrize("sizes,calls,expect", [
    ([100, 50, 50], [100, 50, 50, 100], [0, 1, 2, 0]),    # in order, then the next backward from 0
    ([100, 50, 70], [100, 70, 100], [0, 2, 0]),           # a call skipped (out of step): matched by size
    ([], [100, 50, 70], [0, 1, 2]),                       # sizes unknown: counted in order, not all 0
])
def test_bucket_numbering(sizes, calls, expect):
    from syncviz.record.ddp import _BucketHook
    h = _BucketHook.__new__(_BucketHook)
    h._layout, h._next, h._sizes = 0, 0, ({0: sizes} if sizes else {})
    assert [h._number(n) for n in calls] == expect


def test_sparse_embedding(tmp_path):
    """nn.Embedding(sparse=True) under DDP: traced, not crashed (the reducer's buckets cannot be read
    for a sparse gradient, so such a model keeps the comm hook), training bit for bit as without
    syncviz, and the sparse bucket's bytes what gloo moves: indices and values of this rank's
    lookups (16 × 8 rows of 32 floats, 8-byte indices), not the 1000-row table's dense size."""
    args = [SCRIPTS / "ddp_sparse.py", "--steps", 3]
    torchrun(2, *args, "--save", tmp_path / "plain.pt")
    out = syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", *args, "--save", tmp_path / "traced.pt")
    assert "comm hook instead" not in out.stderr + out.stdout
    plain, traced = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "traced.pt")
    for k, v in plain.items():
        assert torch.equal(v, traced[k]), k
    run = load_run(tmp_path / "run")
    ev = run.events
    lay = run.layouts[run.layouts["rank"] == 0]
    sparse = {(int(r.layout), int(r.bucket)) for r in lay[lay["param"] == "emb.weight"].itertuples()}
    b = ev[ev["kind"] == S.BUCKET]
    assert sorted(b.groupby(["rank", "step"]).size().index.tolist()) == [(r, s) for r in (0, 1) for s in range(3)]
    payload = 16 * 8 * 32 * 4 + 16 * 8 * 8
    for r in b.itertuples():
        want = payload if (r.layout, r.bucket) in sparse else None
        if want is not None:
            assert r.bytes == want, r
    assert sum((int(r.layout), int(r.bucket)) in sparse for r in b.itertuples()) == 6    # one a (rank, step)
    c = ev[(ev["kind"] == S.COLLECTIVE) & (ev["bucket"] >= 0)]
    assert sorted(c["bytes"]) == sorted(b["bytes"])


class _FinishedFirst:
    """A real gloo group whose all-reduce has finished when the call returns, as gloo's own thread
    sometimes manages before the caller's next line: then the sparse tensor is already the
    coalesced sum of every rank's rows."""
    def __init__(self, pg):
        self.pg = pg

    def allreduce(self, tensors, opts):
        work = self.pg.allreduce(tensors, opts)
        work.wait()
        return work

    def size(self):
        return self.pg.size()


def _sparse_bytes(rank, out):
    import torch.distributed as dist

    from syncviz import record
    from syncviz.record import collectives
    pg = dist.ProcessGroupGloo(dist.FileStore(str(out / "store"), 1), 0, 1)
    rec = record.start(str(out / "run"), rank=0, world_size=1, name="sparse")
    collectives.install(rec)
    try:
        grad = torch.sparse_coo_tensor(torch.tensor([[1, 1, 2, 2, 3]]), torch.ones(5, 4), (10, 4))
        sent = collectives.tensor_bytes(grad)
        _, row = collectives.bucket_all_reduce(rec, grad, _FinishedFirst(pg), 0)
        (out / "bytes.txt").write_text(f"{sent} {row.nbytes} {collectives.tensor_bytes(grad)}")
    finally:
        collectives.uninstall()
        rec.close()


def test_sparse_bucket_bytes_are_read_before_the_collective(tmp_path):
    """The bytes of a sparse bucket are the rows this rank sends (5 rows, 4 floats and one 8-byte
    index each), even when gloo has replaced the tensor with the 3-row coalesced sum by the time
    the call returns (test_sparse_embedding caught that race once in CI: 30,872 bytes for 17,408)."""
    torch.multiprocessing.spawn(_sparse_bytes, args=(tmp_path,), nprocs=1, join=True)
    sent, recorded, after = map(int, (tmp_path / "bytes.txt").read_text().split())
    assert sent == 5 * (4 * 4 + 8) and after == 3 * (4 * 4 + 8)     # the race, made certain
    assert recorded == sent


def test_bucket_rebuilds_do_not_deadlock(tmp_path):
    # 1,000 DDP models, a bucket rebuild each. Before the wrapped group passed its broadcast through
    # Python, runs hung in DDP's rebuild (gloo's enqueue with the GIL held) 4 times in 1,800 rebuilds
    # (3 of 9 runs of 100 models, 1 of 3 runs of 300); this test failed 3 of 3 times on that code.
    # --hang-timeout ends such a run in 30 s.
    p = syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet", "--hang-timeout", 30,
                SCRIPTS / "many_rebuilds.py", "--models", 1000, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    b = load_run(tmp_path / "run").events
    b = b[b["kind"] == S.BUCKET]
    assert b["step"].nunique() == 3000 and b["layout"].max() >= 1     # every step, rebuilt layouts seen
