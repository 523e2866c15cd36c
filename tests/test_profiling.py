"""StepProfiler: torch.profiler runs only inside the requested steps and leaves traces that
torch-tb-profiler reads (one per rank, worker rank-<r>). Driven here by hand, as the recorder
drives it: on_step_end after every step (and on_step_begin where a caller has it)."""
from __future__ import annotations

import gzip
import json
import os
import socket
import statistics
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from syncviz.record.profiling import (StepProfiler, bucket_label, parse_profile_steps, profiler_dir)


def load_trace(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def names(trace: dict, prefix: str) -> list[str]:
    return sorted({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith(prefix)})


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def train(model, prof: StepProfiler, steps: int, call_begin: bool, fake_buckets=False, seed=0):
    """A plain training loop reporting step boundaries; returns per step (step ns, on_step_end ns):
    the step's own time (from before on_step_begin to the optimizer step's end, as syncviz's step
    event spans forward → optimizer) and the time on_step_end took (profiler start/stop/write)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed)
    times = []
    for step in range(steps):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        t0 = time.perf_counter_ns()
        if call_begin:
            prof.on_step_begin(step)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if fake_buckets:
            with prof.bucket_range(0, "all_reduce", 4_000_000):
                torch.cat([p.grad.flatten() for p in model.parameters()]).sum()
        opt.step()
        opt.zero_grad()
        t1 = time.perf_counter_ns()
        prof.on_step_end(step)
        times.append((t1 - t0, time.perf_counter_ns() - t1))
    prof.close()
    return times


# ------------------------------------------------------------------------------------ fast

def test_parse_profile_steps_follows_trace_steps_convention():
    assert parse_profile_steps("2:4") == (2, 3)        # A inclusive, B exclusive, like --steps
    assert parse_profile_steps("5") == (5, 5)
    assert parse_profile_steps(None) == (2, 3)
    for bad in ("4:4", "x", "3:1", "-1:2", "1:b"):
        with pytest.raises(ValueError):
            parse_profile_steps(bad)


def test_bucket_label():
    assert bucket_label(3, "all_reduce", 25_000_000) == "bucket 3 all_reduce 25.0 MB"


def test_nothing_happens_outside_the_window(tmp_path):
    prof = StepProfiler(tmp_path, 0, 5, 6)
    for step in range(4):          # steps 0..3: step 3's end is not the step before 5
        prof.on_step_begin(step)
        assert not prof.active
        with prof.bucket_range(0, "all_reduce", 10):
            pass
        prof.on_step_end(step)
    prof.close()
    assert not prof.active and not prof.done
    assert not profiler_dir(tmp_path).exists()


def test_bad_window_rejected(tmp_path):
    with pytest.raises(ValueError):
        StepProfiler(tmp_path, 0, 3, 2)


@pytest.mark.parametrize("call_begin", [False, True], ids=["end-only", "begin-and-end"])
def test_single_process_window(tmp_path, call_begin):
    prof = StepProfiler(tmp_path, 0, 2, 3)
    train(mlp(), prof, steps=6, call_begin=call_begin, fake_buckets=True)
    files = sorted(profiler_dir(tmp_path).glob("rank-0.*.pt.trace.json.gz"))
    assert len(files) == 1 and prof.trace_path == files[0] and prof.done
    trace = load_trace(files[0])
    assert names(trace, "ProfilerStep#") == ["ProfilerStep#2", "ProfilerStep#3"]
    # one bucket range per profiled step, none from the unprofiled steps
    ranges = [e for e in trace["traceEvents"] if e.get("name") == "bucket 0 all_reduce 4.0 MB"]
    assert len(ranges) == 2
    steps = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    for r in ranges:
        assert any(s["ts"] <= r["ts"] and r["ts"] + r["dur"] <= s["ts"] + s["dur"] for s in steps)


def test_training_ending_inside_the_window_still_writes(tmp_path):
    prof = StepProfiler(tmp_path, 1, 2, 9)
    train(mlp(), prof, steps=4, call_begin=False)      # ends after step 3; close() writes
    trace = load_trace(prof.trace_path)
    # steps 2 and 3, plus the range after step 3 that close() ended (step 4 never ran)
    assert names(trace, "ProfilerStep#") == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert prof.trace_path.name.startswith("rank-1.")


# ------------------------------------------------------------------- two gloo ranks with DDP

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(rank, world, port, run_dir, first, last, steps):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = DDP(mlp(), bucket_cap_mb=0.1)           # several buckets
        prof = StepProfiler(run_dir, rank, first, last)

        def hook(state, bucket):                         # what the recorder does when profiling
            buf = bucket.buffer()
            with prof.bucket_range(bucket.index(), "all_reduce", buf.numel() * buf.element_size()):
                return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(dist.group.WORLD, hook)
        times = train(model, prof, steps, call_begin=False, seed=rank)
        Path(run_dir, f"step-times-{rank}.json").write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()
        from syncviz.record.quiesce import quiesce
        quiesce()   # gloo's threads may still hold Python objects (syncviz/record/quiesce.py)


def profile_ddp(run_dir: Path, first=3, last=4, steps=10, world=2) -> list[list]:
    """Train a small MLP under DDP on ``world`` gloo ranks, profiling steps first..last into
    ``run_dir/profiler``; returns per rank the (step ns, on_step_end ns) of every step."""
    import torch.multiprocessing as mp
    run_dir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_ddp_rank, args=(world, free_port(), str(run_dir), first, last, steps), nprocs=world)
    return [json.loads(Path(run_dir, f"step-times-{r}.json").read_text()) for r in range(world)]


def overhead_report(times: list[list], first: int, last: int) -> str:
    """Median step time before, inside and after the profiled window (step 0 and 1 left out:
    warm-up and DDP's bucket rebuild), and what on_step_end itself cost."""
    lines = []
    for rank, t in enumerate(times):
        step = [a / 1e6 for a, _ in t]
        hook = [b / 1e6 for _, b in t]
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        outside_hooks = [hook[s] for s in range(len(t)) if not first - 1 <= s <= last]
        lines.append(
            f"rank {rank}: median step ms before window {med(step[2:first]):.2f} | inside "
            f"{first}-{last} {med(step[first:last + 1]):.2f} | after {med(step[last + 1:]):.2f}; "
            f"on_step_end ms: start {hook[first - 1]:.2f}, stop+write {hook[last]:.2f}, "
            f"outside the window max {max(outside_hooks):.3f}")
    return "\n".join(lines)


@pytest.mark.slow
def test_ddp_two_ranks_one_trace_per_rank(tmp_path):
    times = profile_ddp(tmp_path, first=6, last=8, steps=16)
    print("\n" + overhead_report(times, 6, 8))
    for rank in range(2):
        files = sorted(profiler_dir(tmp_path).glob(f"rank-{rank}.*.pt.trace.json.gz"))
        assert len(files) == 1
        trace = load_trace(files[0])
        assert trace["distributedInfo"]["world_size"] == 2 and trace["distributedInfo"]["rank"] == rank
        assert names(trace, "ProfilerStep#") == ["ProfilerStep#6", "ProfilerStep#7", "ProfilerStep#8"]
        assert "gloo:all_reduce" in names(trace, "gloo:")
        buckets = names(trace, "bucket ")
        assert len(buckets) >= 2 and all(b.endswith(" MB") for b in buckets)
