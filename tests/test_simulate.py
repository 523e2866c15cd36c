"""Simulator: DDP's bucket assignment, the pipeline checked by hand for each strategy, the written
trace read back by trace.load_run, and the `syncviz simulate` command's inputs and errors."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from syncviz import analysis as A
from syncviz.model import costmodel as CM
from syncviz.trace import schema as S
from syncviz.model import simcore as SC
from syncviz.model import simprofile as SP
from syncviz.model import simtrace as ST
from syncviz.cli import cli
from syncviz.model.simulate import predict
from syncviz.trace import load_run

MS = 1e6
MIB = 1024 * 1024
# 1 GB/s bus bandwidth, no latency: an all_reduce of n bytes on 2 ranks takes n·2(1/2)/1e9 s.
SLOW = CM.Link("slow", busbw_gbps=1.0, latency_us=0.0)


def two_tensor_profile(**kw) -> SP.Profile:
    """Gradient t0 (4 MB, last block) ready 2 ms after backward starts, t1 (2 MB) at 10 ms;
    forward 5 ms, optimizer 1 ms (unsharded), no gaps or hook overhead."""
    args = dict(forward_ns=5 * MS, optimizer_ns=1 * MS, gap_ns=0.0, hook_ns=0.0, grad_dtype="float32",
                param_dtype="float32")
    args.update(kw)
    return SP.Profile("two", ["blocks.1.w", "blocks.0.w"], np.array([1_000_000, 500_000]),
                      np.array([2 * MS, 10 * MS]), layer=np.array([1, 0]), param_index=np.array([1, 0]), **args)


def steps_of(tl, **kw):
    ev = ST.events_frame(tl, **kw)
    return ev, A.step_metrics(ev)


def cfg(strategy="ddp", **kw):
    args = dict(world_size=2, steps=3, strategy=strategy, bucket_cap_mb=3, first_bucket_cap_mb=3, link=SLOW,
                algo="ring", jitter=SC.Jitter.none())
    args.update(kw)
    return SC.SimConfig(**args)


# ------------------------------------------------------------------------------- buckets

def test_assign_buckets_like_ddp():
    mb = np.array([0.5, 0.7, 3.0, 1.0, 1.0, 1.0, 2.0]) * MIB
    # first bucket closes once it holds >= 1 MiB (0.5 + 0.7), later ones at >= 2.5 MiB
    assert SC.assign_buckets(mb, 2.5 * MIB, 1 * MIB).tolist() == [0, 0, 1, 2, 2, 2, 3]
    assert SC.assign_buckets(mb, 100 * MIB).tolist() == [0] * 7
    with pytest.raises(ValueError, match="bucket caps"):
        SC.assign_buckets(mb, 0)


# ----------------------------------------------------------------- the pipeline, by hand

def test_ddp_pipeline_by_hand():
    """Step 0: forward [0, 5]; backward from 5, t0 ready at 7, t1 at 15. Bucket 0 (4 MB) runs
    [7, 11], bucket 1 (2 MB) [15, 17]; the optimizer [17, 18]. Comm busy 6 ms, of which [15, 17]
    lies after backward compute: exposed 2 ms. Step 1 starts at 18."""
    tl = SC.Timeline(two_tensor_profile(), cfg())
    ev, steps = steps_of(tl)
    b = ev[(ev["kind"] == "bucket") & (ev["rank"] == 0) & (ev["step"] == 0)]
    assert (b[["launch_ns", "end_ns", "ready_ns"]].to_numpy() / MS).tolist() == [[7, 11, 7], [15, 17, 15]]
    assert b["bytes"].tolist() == [4_000_000, 2_000_000] and set(b["op"]) == {"all_reduce"}
    opt = ev[(ev["kind"] == "optimizer") & (ev["rank"] == 0)]
    assert (opt[["start_ns", "end_ns"]].to_numpy() / MS).tolist() == [[17, 18], [35, 36], [53, 54]]
    assert np.allclose(steps["step_ns"], 18 * MS) and np.allclose(steps["exposed_ns"], 2 * MS)
    assert np.allclose(steps["comm_busy_ns"], 6 * MS) and np.allclose(steps["backward_ns"], 10 * MS)


def test_zero2_pipeline_by_hand():
    """Reduce-scatter takes half an all-reduce: bucket 0 [7, 9], bucket 1 [15, 16]; the optimizer
    runs on a 1/2 shard [16, 16.5]; then the parameters are all-gathered (4 MB: 2 ms, 2 MB: 1 ms)
    back to back: ends 18.5 and 19.5. Exposed: [15, 16] and [16.5, 19.5] = 4 ms."""
    tl = SC.Timeline(two_tensor_profile(), cfg("zero2"))
    ev, steps = steps_of(tl)
    r0 = ev[(ev["rank"] == 0) & (ev["step"] == 0)]
    assert (r0[r0["kind"] == "bucket"][["start_ns", "end_ns"]].to_numpy() / MS).tolist() == [[7, 9], [15, 16]]
    assert set(r0[r0["kind"] == "bucket"]["op"]) == {"reduce_scatter"}
    ag = r0[r0["kind"] == "collective"]
    assert set(ag["op"]) == {"all_gather"} and (ag["end_ns"] / MS).tolist() == [18.5, 19.5]
    assert np.allclose(steps["step_ns"], 19.5 * MS) and np.allclose(steps["exposed_ns"], 4 * MS)


def test_zero1_all_reduces_then_gathers():
    tl = SC.Timeline(two_tensor_profile(), cfg("zero1"))
    ev, steps = steps_of(tl)
    assert set(ev[ev["kind"] == "bucket"]["op"]) == {"all_reduce"}
    assert set(ev[ev["kind"] == "collective"]["op"]) == {"all_gather"}
    # buckets end at 17 as for DDP, optimizer on a shard [17, 17.5], gathers end at 19.5 and 20.5
    assert np.allclose(steps["step_ns"], 20.5 * MS)


def test_zero3_pipeline_by_hand():
    """Units in forward order: block 0 (2 MB, 1/3 of the compute), block 1 (4 MB, 2/3).
    Forward: AG0 [0, 1], fwd0 [1, 2.67], AG1 (prefetched at 1) [1, 3], fwd1 [3, 6.33].
    Backward: AG1 [6.33, 8.33], bwd1 [8.33, 15], AG0 (prefetched) [8.33, 9.33], RS1 [15, 17],
    bwd0 [15, 18.33], RS0 [18.33, 19.33]; optimizer on a 1/2 shard [19.33, 19.83].
    Comm busy 9 ms, overlapped 1.67 + 1 + 2 = 4.67 ms, exposed 4.33 ms."""
    tl = SC.Timeline(two_tensor_profile(), cfg("zero3"))
    ev, steps = steps_of(tl)
    r0 = ev[(ev["rank"] == 0) & (ev["step"] == 0)]
    coll = r0[r0["kind"] == "collective"]
    got = sorted(zip(coll["op"].astype(str), coll["phase"].astype(str), (coll["start_ns"] / MS).round(2),
                     (coll["end_ns"] / MS).round(2)))
    assert got == [("all_gather", "backward", 6.33, 8.33), ("all_gather", "backward", 8.33, 9.33),
                   ("all_gather", "forward", 0.0, 1.0), ("all_gather", "forward", 1.0, 3.0),
                   ("reduce_scatter", "backward", 15.0, 17.0), ("reduce_scatter", "backward", 18.33, 19.33)]
    assert np.allclose(steps["step_ns"] / MS, 19 + 5 / 6, atol=1e-5)
    assert np.allclose(steps["comm_busy_ns"] / MS, 9, atol=1e-5)
    assert np.allclose(steps["exposed_ns"] / MS, 4 + 1 / 3, atol=1e-5)


def test_compression_halves_fp32_bytes():
    base = SC.Timeline(two_tensor_profile(), cfg())
    fp16 = SC.Timeline(two_tensor_profile(), cfg(compression="fp16"))
    assert (fp16.wire_bytes * 2 == base.wire_bytes).all() and (fp16.logical_bytes == base.logical_bytes).all()
    ev, steps = steps_of(fp16)
    b = ev[ev["kind"] == "bucket"]
    assert set(b["dtype"]) == {"float16"} and (b["logical_bytes"] == 2 * b["bytes"]).all()
    assert np.allclose(steps["exposed_ns"], 1 * MS)            # bucket 1 now takes 1 ms after backward
    psgd = SC.Timeline(two_tensor_profile(), cfg(compression="powersgd"))
    assert (psgd.wire_bytes < base.wire_bytes / 10).all()
    with pytest.raises(ValueError, match="DDP only"):
        SC.Timeline(two_tensor_profile(), cfg("zero2", compression="fp16"))


def test_contended_stream_by_hand():
    """κ = 1 (half speed) until t = 3: a 2-unit collective starting at 0 does 1.5 units by t = 3
    and the remaining 0.5 at full speed (ends 3.5); the next one, all after, ends 5.5; one that
    fits entirely before t = 3 takes twice as long."""
    ends = SC.contended_stream(np.array([[0.0, 0.0]]), np.array([[2.0, 2.0]]), np.array([3.0]), 1.0)
    assert ends.tolist() == [[3.5, 5.5]]
    assert SC.contended_stream(np.array([[0.0]]), np.array([[1.0]]), np.array([3.0]), 1.0).tolist() == [[2.0]]
    plain = SC.serial_stream(np.array([[0.0, 1.0]]), np.array([[2.0, 2.0]]))
    assert plain.tolist() == SC.contended_stream(np.array([[0.0, 1.0]]), np.array([[2.0, 2.0]]),
                                                 np.array([-1.0]), 1.0).tolist() == [[2.0, 4.0]]


def test_max_affine_is_exact():
    rng = np.random.default_rng(1)
    a, c = rng.normal(0, 1, (300, 7)), rng.lognormal(0, 0.05, (300, 7))
    y = np.sort(rng.uniform(0, 50, 40))
    brute = (a[:, :, None] + c[:, :, None] * y).max(axis=0)
    assert np.array_equal(SC.max_affine(a, c, y), brute)


def test_jitter_gives_skew_and_a_straggler():
    jit = SC.Jitter(straggler=3, straggler_slowdown=0.3, seed=7)
    tl = SC.Timeline(two_tensor_profile(), cfg(world_size=6, steps=4, jitter=jit))
    ev = ST.events_frame(tl)
    sk = A.skew(ev)
    assert sk["skew_ns"].max() > 0 and (sk[sk["bucket"] == 1]["straggler"] == 3).all()
    # collectives end together on every rank: the late rank makes the others wait
    ends = ev[ev["kind"] == "bucket"].groupby(["step", "bucket"])["end_ns"].nunique()
    assert (ends == 1).all()


# ---------------------------------------------------------------------- the written trace

@pytest.mark.parametrize("fork", [True, False])
def test_parallel_writers_fork_or_forkserver_write_the_same(tmp_path, monkeypatch, fork):
    """Workers fork only while no thread started since import (else a fresh forkserver, which
    gets the job pickled): both write what one process writes."""
    monkeypatch.setattr(ST, "_fork_safe", lambda: fork)
    tl = SC.Timeline(two_tensor_profile(), cfg(world_size=3, steps=4, jitter=SC.Jitter(seed=3)))
    meta = {"schema": S.SCHEMA_VERSION, "name": "t", "world_size": 3}
    ST.write(tmp_path / "one", tl, meta, workers=1)
    ST.write(tmp_path / "two", tl, meta, workers=2)
    a, b = load_run(tmp_path / "one"), load_run(tmp_path / "two")
    cols = list(S.EVENT_COLUMNS) + ["rank"]
    assert len(a.events) and a.events[cols].astype(str).equals(b.events[cols].astype(str))


def test_written_trace_reads_back_as_plain_columns(tmp_path):
    tl = SC.Timeline(two_tensor_profile(), cfg(world_size=3, steps=9, jitter=SC.Jitter(seed=2)))
    meta = {"schema": S.SCHEMA_VERSION, "name": "t", "world_size": 3}
    rows = ST.write(tmp_path / "a", tl, meta, steps_per_batch=4, workers=1)        # 3 batches per rank
    ST.write(tmp_path / "b", tl, meta, steps_per_batch=100, workers=2)
    a, b = load_run(tmp_path / "a"), load_run(tmp_path / "b")
    assert len(a.events) == rows and not a.problems and a.meta["finished"] is True
    assert a.meta["steps_recorded"] == 9
    cols = list(S.EVENT_COLUMNS) + ["rank"]
    assert a.events[cols].astype(str).equals(b.events[cols].astype(str))
    for f in S.EVENT_SCHEMA:                                  # dictionaries are cast back by the reader
        if f.name not in S.CATEGORICAL_COLUMNS:
            assert str(a.events[f.name].dtype) in ("int64", "int32", "object", "string", "str"), f.name
    mem = ST.events_frame(tl).sort_values(["rank", "step", "kind", "name", "start_ns"]).reset_index(drop=True)
    disk = a.events.sort_values(["rank", "step", "kind", "name", "start_ns"]).reset_index(drop=True)
    for c in ("start_ns", "end_ns", "ready_ns", "launch_ns", "bytes", "bucket"):
        assert (mem[c].to_numpy() == disk[c].to_numpy()).all(), c
    lay = a.layouts
    assert set(lay["rank"]) == {0, 1, 2} and lay[lay["rank"] == 0]["bucket"].tolist() == [0, 1]


def test_simulate_command_preset_and_views(tmp_path):
    out = tmp_path / "g"
    r = CliRunner().invoke(cli, ["simulate", "--preset", "gpt2-medium-8", "--steps", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    run = load_run(out)
    assert run.meta["engine"] == "simulated" and run.world_size == 8 and run.meta["nodes"] == 1
    assert run.meta["simulated"]["link"]["name"] == "nvlink" and run.meta["model"]["params"] > 3e8
    s = A.run_summary(run)
    assert s["steps"] == 3 and s["exposed_ms"] >= 0 and s["comm_busy_ms"] > 0
    kinds = set(run.events["kind"].astype(str))
    assert {"step", "forward", "backward", "grad_ready", "bucket", "optimizer"} <= kinds
    r = CliRunner().invoke(cli, ["simulate", "--preset", "gpt2-medium-8", "--out", str(out)])
    assert r.exit_code != 0 and "--overwrite" in r.output
    r = CliRunner().invoke(cli, ["summary", str(out)])
    assert r.exit_code == 0, r.output
    # compare (and the dashboard's Strategies page) on a simulated run: its run.json "memory" is the
    # simulator's one prediction for every rank, shown as expected, never as measured
    r = CliRunner().invoke(cli, ["compare", str(out)])
    assert r.exit_code == 0, r.output
    from syncviz.views import compare as CMP
    mem = CMP.run_comparison(run, A.step_metrics(run))["memory"]
    assert all(v is None for v in mem["measured"].values()) and mem["per_rank"] == []
    assert mem["expected"]["params_bytes"] == run.meta["memory"]["params_bytes"] > 0


def test_simulate_from_recorded_run(tmp_path, ddp_run):
    prof = SP.profile_from_run(load_run(ddp_run))
    # tracebuild: backward starts at +10 ms, fc2.weight ready at +15, fc1.weight at +30
    assert prof.tensor_names == ["fc2.weight", "fc1.weight"]
    assert prof.ready_ns.tolist() == [5 * MS, 20 * MS] and prof.forward_ns == 10 * MS
    out = tmp_path / "sim"
    r = CliRunner().invoke(cli, ["simulate", str(ddp_run), "--world-size", "16", "--link", "ib-200",
                                 "--steps", "4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    run = load_run(out)
    assert run.world_size == 16 and run.meta["simulated"]["fit"]["n"] > 0
    assert set(run.events[run.events["kind"] == "bucket"]["group_size"]) == {16}


def test_predict_matches_the_written_trace(tmp_path):
    c = cfg(world_size=4, steps=4, jitter=SC.Jitter(seed=3))
    p = predict(two_tensor_profile(), c)
    tl = SC.Timeline(two_tensor_profile(), c)
    ST.write(tmp_path / "r", tl, {"schema": S.SCHEMA_VERSION, "name": "r", "world_size": 4})
    s = A.run_summary(load_run(tmp_path / "r"))
    assert p["step_ms"] == pytest.approx(s["step_ms"]) and p["exposed_ms"] == pytest.approx(s["exposed_ms"])


@pytest.mark.parametrize("args,message", [
    (["--params", "-5", "--layers", "2", "--tokens", "10", "--tflops", "1"], "parameter count must be > 0"),
    (["--params", "1e6", "--layers", "0", "--tokens", "10", "--tflops", "1"], "layers must be >= 1"),
    (["--params", "1e6", "--layers", "2", "--tokens", "10", "--tflops", "0"], "throughput must be > 0"),
    (["--preset", "gpt2-medium-8", "--link", "custom", "--link-gbps", "0", "--link-latency-us", "5"],
     "bandwidth must be > 0"),
    (["--preset", "gpt2-medium-8", "--link-gbps", "-3"], "bandwidth must be > 0"),
    (["--preset", "gpt2-medium-8", "--world-size", "0"], "world size must be >= 1"),
    (["--preset", "gpt2-medium-8", "--bucket-cap-mb", "-1"], "bucket caps must be > 0"),
    (["--params", "1e6"], "missing --layers"),
    (["--preset", "gpt2-medium-8", "--straggler", "9:0.2"], "straggler rank 9"),
    (["--preset", "gpt2-medium-8", "--steps", "0"], "steps must be >= 1"),
])
def test_bad_model_descriptions_get_one_line_errors(tmp_path, args, message):
    p = subprocess.run([sys.executable, "-m", "syncviz", "simulate", *args, "--out", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert p.returncode != 0, p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "x").exists()


def test_scenarios_run_for_every_strategy():
    spec = SP.MODELS["gpt2-medium"]
    for strategy in SC.STRATEGIES:
        s = predict(SP.profile_from_spec(spec), SC.SimConfig(world_size=4, steps=3, strategy=strategy))
        assert s["step_ms"] > 0 and s["comm_busy_ms"] > 0, strategy
    assert json.dumps(SP.SCENARIOS["llama70b-1024"].__dict__)
