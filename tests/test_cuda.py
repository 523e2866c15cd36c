"""CUDA/NCCL path: GPU-side bucket times from CUDA events, resolved a step later without blocking.
Skipped cleanly where there is no GPU (CI never has one)."""
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_single_gpu_nccl_run_has_gpu_side_bucket_times(tmp_path):
    from syncviz.trace import load_run
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.distributed as dist, torch.nn as nn\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('nccl'); torch.cuda.set_device(0)\n"
        "m = DDP(nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)]).cuda(), bucket_cap_mb=8)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for _ in range(5):\n"
        "    m(torch.randn(64, 2048, device='cuda')).sum().backward(); opt.step(); opt.zero_grad()\n"
        "dist.destroy_process_group()\n")
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--standalone", "--nproc-per-node", "1", "--out",
                        str(tmp_path / "run"), "--quiet", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    run = load_run(tmp_path / "run")
    assert run.meta["device"] == "cuda" and run.meta["backend"] == "nccl"
    b = run.events[run.events["kind"] == "bucket"]
    assert sorted(b["step"].unique()) == [0, 1, 2, 3, 4]
    assert (b["end_ns"] >= b["start_ns"]).all() and (b["end_ns"] > 0).all()
