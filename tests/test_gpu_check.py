"""benchmarks/gpu_check.py --quick on a machine without a GPU (CUDA hidden even where there is
one): every check is in the report, each GPU check says "skipped: no CUDA device", and the CPU
self-checks of the same machinery ran and passed."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_CHECKS = ["cuda_tests", "crosscheck_nccl_ws1", "crosscheck_gloo_cuda_ws2", "sync_debug", "overhead_gpt2_gpu",
              "kernel_bandwidth", "kernel_block_sweep", "engine_nccl_ws1", "engine_gloo_cuda_ws2"]
CPU_CHECKS = ["cuda_tests_skip_cleanly", "crosscheck_cpu", "overhead_cpu", "kernel_interpret", "engine_cpu"]


@pytest.mark.slow
def test_quick_without_gpu_reports_every_check(tmp_path):
    pytest.importorskip("triton")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((tmp_path / "report.json").read_text())
    by_id = {c["id"]: c for c in rep["checks"]}
    assert list(by_id) == ["cuda_tests", "cuda_tests_skip_cleanly", "crosscheck_nccl_ws1", "crosscheck_gloo_cuda_ws2",
                           "crosscheck_cpu", "sync_debug", "overhead_gpt2_gpu", "overhead_cpu", "kernel_bandwidth",
                           "kernel_block_sweep", "kernel_interpret", "engine_nccl_ws1", "engine_gloo_cuda_ws2",
                           "engine_cpu"]
    for i in GPU_CHECKS:
        assert by_id[i]["part"] == "gpu" and by_id[i]["status"] == "skip", by_id[i]
        assert by_id[i]["reason"] == "skipped: no CUDA device"
    for i in CPU_CHECKS:
        assert by_id[i]["part"] == "cpu" and by_id[i]["status"] == "pass", by_id[i]
    assert rep["summary"] == {"pass": 5, "fail": 0, "skip": 9}
    assert rep["environment"]["gpu"] == "none"
    # the self-checks measured what they claim
    cc = by_id["crosscheck_cpu"]["figures"]
    assert cc["matched"] == cc["buckets"] > 0
    eng = by_id["engine_cpu"]["figures"]
    assert eng["all_reduce"]["bitwise"] and eng["reduce_scatter"]["close"] and eng["ddp_moved_from_init"] > 0
    assert by_id["kernel_interpret"]["figures"]["dtypes"] == ["fp32", "bf16", "fp16"]
    ov = by_id["overhead_cpu"]["figures"]       # benchmarks/overhead.py's harness ran every job and paired it
    assert ov["launches"] == 1 and ov["rounds"] == 2 and ov["plain_step_ms_median"] > 0
    for tool in ("syncviz", "profiler", "plain_again"):
        assert ov[f"ratio_{tool}"] > 0 and len(ov[f"ci95_{tool}_wall"]) == 2
    assert by_id["cuda_tests_skip_cleanly"]["figures"]["skipped"] >= 1
    md = (tmp_path / "report.md").read_text()
    assert "## On the GPU" in md and "## CPU self-checks" in md and "still to be measured" in md
    for i in GPU_CHECKS + CPU_CHECKS:
        assert f"`{i}`" in md


def test_bad_group_is_one_line_and_nonzero(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--only", "nope", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("gpu_check: unknown group nope") and "Traceback" not in p.stderr


def test_match_pairs_profiler_intervals_by_mode():
    """The profiler side of the cross-check, on hand-written Chrome-trace events."""
    from benchload import gpu_checks
    match = gpu_checks("match")
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "ts": 20.0, "dur": 5.0},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "ts": 10.0, "dur": 4.0},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "ts": 0.0, "dur": 9.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 1.0, "dur": 2.0, "args": {"bytes": 64}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 2.0, "dur": 2.0, "args": {"bytes": 8}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 7.0, "dur": 1.0, "args": {"bytes": 64}},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 3.0, "dur": 1.0},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 4.0, "dur": 6.0},
    ]}
    assert match.device_intervals(trace, "nccl") == [(10.0, 14.0), (20.0, 25.0)]
    assert match.device_intervals(trace, "gloo-cuda", {64}) == [(1.0, 8.0)]
    assert match.device_intervals(trace, "cpu") == [(3.0, 10.0)]
    with pytest.raises(ValueError):
        match.device_intervals(trace, "mpi")


def test_one_gpu_allows_only_the_two_gpu_skips():
    """The GPU run's cuda_tests check: with one GPU only the tests that need two may skip."""
    from benchload import gpu_checks
    ck = gpu_checks("checks_kernel")
    out = ("SKIPPED [2] tests/test_dataparallel_cuda.py:21: needs 2 or more CUDA GPUs\n"
           "SKIPPED [1] tests/test_cuda_path.py:69: needs triton\n")
    reasons, allowed = ck.skips_allowed(out, gpus=1)
    assert allowed == 2 and len(reasons) == 2          # 3 skipped, 2 allowed: the check fails
    assert ck.skips_allowed(out, gpus=2)[1] == 0       # with two GPUs nothing may skip
    assert ck.skips_allowed("3 passed\n", gpus=1) == ([], 0)


def test_one_rank_nccl_judges_the_typical_bucket_and_lists_the_tail():
    """NCCL on one rank runs no kernel: the typical bucket must measure ~nothing; the tail is listed."""
    import pandas as pd
    from benchload import gpu_checks
    match = gpu_checks("match")

    def rows(durs_us):
        launch = [1_000_000 * i for i in range(len(durs_us))]
        return pd.DataFrame({"step": [2] * len(durs_us), "bucket": range(len(durs_us)), "launch_ns": launch,
                             "end_ns": [t + round(d * 1e3) for t, d in zip(launch, durs_us)]})
    ok = match._one_rank({}, rows([3.0, 4.0, 5.0, 225.5]))
    assert ok["ok"] and ok["bucket_gpu_us_median"] == 4.5 and ok["long_buckets"] == [[2, 3, 225.5]]
    assert not match._one_rank({}, rows([30.0, 40.0, 50.0]))["ok"]          # 40 µs typical: measured time that is not there
    assert not match._one_rank({}, rows([3.0, -1.0, 4.0]))["ok"]            # an end before its start
