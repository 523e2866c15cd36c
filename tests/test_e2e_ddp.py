"""End to end with real torchrun, real DDP on gloo, real processes (slow: a few seconds each)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from syncviz import analysis as A
from syncviz.trace import load_run

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def syncviz(*args, cwd=None, check=True):
    p = subprocess.run([sys.executable, "-m", "syncviz", *map(str, args)], capture_output=True, text=True,
                       env=ENV, cwd=cwd, timeout=300)
    if check:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def torchrun(nproc, *args):
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *map(str, args)],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    p = syncviz("demo", "--preset", "tiny", "--steps", "5", "--bucket-cap-mb", "0.1", "--out", out)
    assert "Verdict:" in p.stdout
    return out


def test_every_step_has_every_bucket_on_every_rank(demo_run):
    run = load_run(demo_run)
    assert run.problems == [] and run.meta["finished"] is True
    assert run.world_size == 2 and run.meta["backend"] == "gloo"
    ev = run.events
    b = ev[ev["kind"] == "bucket"]
    per = b.groupby(["step", "rank"])["bucket"].apply(lambda s: sorted(s))
    assert len(per) == 5 * 2
    # every bucket of the layout in force, on every rank, every step (DDP starts with its initial
    # layout and rebuilds the buckets after step 0)
    n_buckets = run.layouts[run.layouts["rank"] == 0].groupby("layout")["bucket"].nunique()
    assert n_buckets[1] > 1
    for (step, rank), buckets in per.items():
        assert buckets == list(range(n_buckets[0 if step == 0 else 1]))
    # bytes per step = the model's gradient bytes, on every rank and step
    grad_bytes = run.meta["model"]["grad_bytes"]
    assert set(b.groupby(["step", "rank"])["bytes"].sum()) == {grad_bytes}
    steps = A.step_metrics(run)
    assert (steps["bytes"] == grad_bytes).all()
    # every bucket: ready <= launch <= done, and the parameters of each layout cover the model
    assert (b["ready_ns"] <= b["launch_ns"]).all() and (b["launch_ns"] <= b["end_ns"]).all()
    lay = run.layouts[run.layouts["rank"] == 0]
    assert set(lay["layout"]) == {0, 1}                          # before and after DDP's rebuild
    for v, rows in lay.groupby("layout"):
        assert rows["numel"].sum() * 4 == grad_bytes
    assert set(b[b["step"] == 0]["layout"]) == {0} and set(b[b["step"] > 0]["layout"]) == {1}
    # grad-ready rows: one per parameter per step
    nparams = len(lay[lay["layout"] == 0])
    assert (ev[ev["kind"] == "grad_ready"].groupby(["step", "rank"]).size() == nparams).all()


def test_clock_alignment_recorded(demo_run):
    run = load_run(demo_run)
    ranks = run.meta["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    # one host: offsets are ~0 within their error bound (+ scheduling noise on 2 busy cores)
    for r in ranks:
        assert abs(r["clock_offset_ns"]) <= r["clock_error_ns"] + 2_000_000
        assert "clock_offset_end_ns" in r


@pytest.mark.parametrize("world", [2, 3])
def test_tracing_is_bitwise_identical(tmp_path, world):
    common = ["-m", "syncviz.workloads", "--preset", "tiny", "--steps", "4", "--bucket-cap-mb", "0.05"]
    torchrun(world, *common, "--save-params", tmp_path / "plain.pt")
    syncviz("trace", "--nproc-per-node", world, "--out", tmp_path / "run", "--quiet", *common,
            "--save-params", tmp_path / "traced.pt")
    a, b = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "traced.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert load_run(tmp_path / "run").world_size == world


def test_user_script_unchanged_with_accumulation_and_own_hook(tmp_path):
    p = syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet",
                SCRIPTS / "user_train.py", "--steps", 3, "--accum", 2, "--hook", "mine", cwd=tmp_path)
    # the user's own output passes through unchanged
    assert [l for l in p.stdout.splitlines() if l.startswith("USER OUTPUT")] == [f"USER OUTPUT step {k}" for k in range(3)]
    assert p.stdout.count("SECOND_REGISTRATION_REFUSED") == 2   # DDP's only-once rule still holds
    run = load_run(tmp_path / "run")
    assert run.meta["ddp"]["comm_hook"] == "my_mean_hook" and run.meta["ddp_bucket_timing"] == "comm hook"
    ev = run.events
    assert set(ev[ev["kind"] == "forward"]["micro"]) == {0, 1}
    b = ev[ev["kind"] == "bucket"]
    assert set(b["micro"]) == {1} and set(b["name"]) == {"my_mean_hook"}   # only the synced micro-step
    assert (b.groupby(["step", "rank"])["bytes"].sum() == run.meta["model"]["grad_bytes"]).all()
    # the bucket's ready time is from the synced micro-step's gradients
    s = A.bucket_metrics(run)
    assert (s["launch_delay_ns"] >= 0).all()
    # `syncviz trace` left the dashboard's whole-run tables beside the run, valid for these files,
    # and they are the numbers the analysis gives
    from syncviz.dashboard.data.loaded import LoadedRun
    from syncviz.views import runcache as RC
    cached = LoadedRun("run", tmp_path / "run", RC.signature(tmp_path / "run"))
    assert not cached._opened, "the trace command should have cached the run's facts"
    assert cached.summary()["exposed_ms"] == pytest.approx(A.run_summary(run)["exposed_ms"], rel=1e-12)
    assert not cached._opened


def test_builtin_hook_is_timed_and_numerics_match(tmp_path):
    args = [SCRIPTS / "user_train.py", "--steps", 3, "--accum", 1, "--hook", "builtin-fp16"]
    torchrun(2, *args, "--save", tmp_path / "plain.pt")
    syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet", *args, "--save", tmp_path / "traced.pt")
    run = load_run(tmp_path / "run")
    assert run.meta["ddp"]["comm_hook"] == "fp16_compress_hook"
    a, b = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "traced.pt")
    # torch's C++ FP16 hook and its Python twin round identically to fp16 and back
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)


def test_rank_killed_mid_run_keeps_completed_steps(tmp_path):
    p = syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet",
                SCRIPTS / "user_train.py", "--steps", 6, "--accum", 1, "--die-at", 3, check=False)
    assert p.returncode != 0
    err = [l for l in p.stderr.splitlines() if l.startswith("Error:")]
    assert len(err) == 1 and "rank 1 failed first:" in err[0] and "SIGKILL" in err[0] and "complete steps kept" in err[0]
    assert "Traceback" not in p.stderr.split("Error:")[-1]
    run = load_run(tmp_path / "run")
    assert 1 in run.incomplete_ranks and any("rank 1 incomplete" in x for x in run.problems)
    steps1 = sorted(run.events[run.events["rank"] == 1]["step"].unique())
    assert steps1 == [0, 1, 2]
    s = syncviz("summary", tmp_path / "run")
    assert "rank 1 incomplete" in s.stdout


# Steps compared after the two warm-up steps. 4 (8 rank-steps) once gave an exposed-comm median of
# -6.4% in a full CI run, four of the eight pairs 12-35% below the profiler's rebuild (session 30).
# The cause was the rebuild's: gloo profiler ranges that end after the work completed
# (crosscheck.profiler_exposed now clips them); 16 rank-steps still make the medians steadier.
PROFILED_STEPS = 8


def test_cross_check_against_ddp_timers_and_profiler(tmp_path):
    """Independent measurements of the same steps: DDP's runtime-logging timers and the gloo
    collective events of a torch.profiler trace (see benchmarks/crosscheck.py for the figures)."""
    syncviz("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--quiet",
            SCRIPTS / "crosscheck_train.py", tmp_path, 2 + PROFILED_STEPS)
    from crosscheck import compare_ddp_timers, compare_profiler
    run = load_run(tmp_path / "run")
    prof = compare_profiler(run, tmp_path)
    # launch = the c10d enqueue, done = the gloo work's end: sub-millisecond on this machine
    assert prof["matched"] == 2 * PROFILED_STEPS * 4
    assert abs(np.median(prof["launch_diff_ms"])) < 1.0 and abs(np.median(prof["done_diff_ms"])) < 1.0
    ddp = compare_ddp_timers(run, tmp_path)
    assert ddp["n"] == 2 * PROFILED_STEPS
    # DDP: forward = forward start → its end (prepare_for_backward); comm = first launch → last done
    # ours encloses DDP's timer (the hooks run just outside it): +2..+8% a step in session 27's
    # runs, median +3..+4%; forward start → backward start read +7..+64% (median up to +17%)
    assert -0.02 < np.median(ddp["forward_rel"]) < 0.10
    assert np.median(np.abs(ddp["comm_rel"])) < 0.15
    # DDP's backward starts at the end of forward, ours at the output's grad_fn: ours is ≤ DDP's
    assert np.median(ddp["backward_rel"]) <= 0.02 and np.median(ddp["backward_rel"]) > -0.35
    # exposed comm per (rank, step) against the same definition rebuilt from the profiler alone
    from crosscheck import compare_exposed
    ex = compare_exposed(run, tmp_path)
    # The rebuild once ended backward compute at the last evaluate_function of AccumulateGrad, which
    # also holds DDP's reducer hook (copy into the bucket, launch): it read 0.8-1.3 ms (5-10%) below
    # syncviz, and this bound was "10%, or [-1, +2] ms". With DESIGN's "last gradient ready" (the
    # AccumulateGrad op's end): median -0.01..-0.03 ms, rel -0.1..-0.2% in three runs (2026-11-29).
    diff_ms = np.nanmedian(ex["syncviz_ms"] - ex["profiler_ms"])
    assert ex["n"] == 2 * PROFILED_STEPS and abs(np.nanmedian(ex["rel"])) < 0.03 and abs(diff_ms) < 0.25, (ex["rel"], diff_ms)


def test_trace_bad_arguments(tmp_path):
    p = syncviz("trace", "--nproc-per-node", 2, tmp_path / "missing.py", check=False)
    assert p.returncode == 2 and "no such script" in p.stderr and "Traceback" not in p.stderr
    p = syncviz("trace", "--steps", "x:y", "--nproc-per-node", 1, SCRIPTS / "user_train.py", check=False)
    assert p.returncode == 2 and "bad step selection" in p.stderr
    out = tmp_path / "exists"
    out.mkdir()
    (out / "run.json").write_text("{}")
    p = syncviz("trace", "--out", out, SCRIPTS / "user_train.py", check=False)
    assert p.returncode == 1 and "already holds a run" in p.stderr


@pytest.mark.parametrize("mode", ["tracing", "instrument"])
def test_traced_from_code_with_user_launched_ranks(tmp_path, mode):
    p = subprocess.run([sys.executable, str(SCRIPTS / "from_code.py"), str(tmp_path / "run"), mode],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    run = load_run(tmp_path / "run")
    assert run.problems == [] and run.world_size == 2 and run.ranks == [0, 1]
    b = run.events[run.events["kind"] == "bucket"]
    assert sorted(b["step"].unique()) == [0, 1, 2]
    assert (b.groupby(["step", "rank"])["bytes"].sum() == run.meta["model"]["grad_bytes"]).all()
