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

from syncviz.profiling import (StepProfiler, bucket_label, parse_profile_steps, profiler_dir)


def load_trace(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def names(trace: dict, prefix: str) -> list[str]:
    return sorted({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith(prefix)})


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def train(model, prof: StepProfiler, steps: int, call_begin: bool, fake_buckets=False, seed=0):
    """A plain training loop reporting step boundaries; returns per-step wall times (ns) measured
    from step begin to after on_step_end (so the profiler's own stop/write cost is included)."""
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
        prof.on_step_end(step)
        times.append(time.perf_counter_ns() - t0)
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


def profile_ddp(run_dir: Path, first=3, last=4, steps=10, world=2) -> list[list[int]]:
    """Train a small MLP under DDP on ``world`` gloo ranks, profiling steps first..last into
    ``run_dir/profiler``; returns each rank's step times (ns)."""
    import torch.multiprocessing as mp
    run_dir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_ddp_rank, args=(world, free_port(), str(run_dir), first, last, steps), nprocs=world)
    return [json.loads(Path(run_dir, f"step-times-{r}.json").read_text()) for r in range(world)]


def overhead_report(times: list[list[int]], first: int, last: int) -> str:
    """Median step time inside vs outside the window (step 0 and the step after the window
    excluded: warm-up, and first step after kineto teardown)."""
    lines = []
    for rank, t in enumerate(times):
        inside = [t[s] / 1e6 for s in range(first, last + 1)]
        outside = [t[s] / 1e6 for s in range(1, len(t)) if not first <= s <= last]
        lines.append(f"rank {rank}: profiled steps {first}-{last} median {statistics.median(inside):.2f} ms "
                     f"({', '.join(f'{v:.2f}' for v in inside)}); other steps median "
                     f"{statistics.median(outside):.2f} ms; all: {', '.join(f'{v / 1e6:.2f}' for v in t)}")
    return "\n".join(lines)


@pytest.mark.slow
def test_ddp_two_ranks_one_trace_per_rank(tmp_path):
    times = profile_ddp(tmp_path, first=3, last=4, steps=10)
    print("\n" + overhead_report(times, 3, 4))
    for rank in range(2):
        files = sorted(profiler_dir(tmp_path).glob(f"rank-{rank}.*.pt.trace.json.gz"))
        assert len(files) == 1
        trace = load_trace(files[0])
        assert trace["distributedInfo"]["world_size"] == 2 and trace["distributedInfo"]["rank"] == rank
        assert names(trace, "ProfilerStep#") == ["ProfilerStep#3", "ProfilerStep#4"]
        assert "gloo:all_reduce" in names(trace, "gloo:")
        buckets = names(trace, "bucket ")
        assert len(buckets) >= 2 and all(b.endswith(" MB") for b in buckets)
