"""Runs test_kernels_interpret_cases.py in its own process with TRITON_INTERPRET=1.

The variable must be set before triton and the kernel module are imported, and must not leak into
this pytest process (other tests would then run the slow interpreter), hence the subprocess."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("test_kernels_interpret_cases.py")


@pytest.mark.slow
def test_kernel_under_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
