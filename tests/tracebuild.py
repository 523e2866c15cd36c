"""Hand-built traces for tests: every number in them is chosen so metrics can be checked by hand."""
from __future__ import annotations

from pathlib import Path

from syncviz.trace import schema as S
from syncviz.trace import new_meta, write_run

MS = 1_000_000  # ns


def ev(kind, start_ms, end_ms, *, step=0, micro=0, name="", bucket=-1, op="", nbytes=0, dtype="float32",
       group_size=2, ready_ms=None, phase="", layout=-1):
    return dict(step=step, micro=micro, kind=kind, name=name or kind, start_ns=int(start_ms * MS),
                end_ns=int(end_ms * MS), bucket=bucket, op=op, bytes=nbytes, dtype=dtype,
                group_size=group_size, ready_ns=int(ready_ms * MS) if ready_ms is not None else -1,
                launch_ns=int(start_ms * MS) if kind in S.COMM_KINDS else -1, phase=phase,
                layout=layout, logical_bytes=nbytes)


def columns(events):
    return {c: [e[c] for e in events] for c in S.EVENT_COLUMNS}


def simple_step(step, t0, *, world=2, straggle_ms=0.0):
    """One DDP-like step starting at t0 ms: fwd 10 ms, bwd 20 ms (grads ready at +15 and +30),
    two buckets: bucket 0 [t0+16, t0+26] fully overlapped... see test_analysis for the arithmetic."""
    s = straggle_ms
    evs = [
        ev("step", t0, t0 + 45 + s, step=step),
        ev("forward", t0, t0 + 10, step=step),
        ev("backward", t0 + 10, t0 + 32 + s, step=step),
        ev("grad_ready", t0 + 15, t0 + 15, step=step, name="fc2.weight", bucket=0),
        ev("grad_ready", t0 + 30 + s, t0 + 30 + s, step=step, name="fc1.weight", bucket=1),
        # bucket 0: ready 15, launched 16, done 26 -> entirely under backward compute [10, 30]
        ev("bucket", t0 + 16, t0 + 26, step=step, bucket=0, op="all_reduce", nbytes=4_000_000,
           ready_ms=t0 + 15, phase="backward", layout=0),
        # bucket 1: ready 30, launched 30, done 40 -> all 10 ms after backward compute ends at 30
        ev("bucket", t0 + 30 + s, t0 + 40 + s, step=step, bucket=1, op="all_reduce", nbytes=2_000_000,
           ready_ms=t0 + 30 + s, phase="backward", layout=0),
        ev("optimizer", t0 + 40 + s, t0 + 45 + s, step=step),
    ]
    return evs


def make_ddp_run(path: Path, steps=3, world=2, straggler=None, straggle_ms=0.0) -> Path:
    meta = new_meta(path.name, world, strategy="ddp", backend="gloo", device="cpu", engine="torch",
                    model={"params": 1_500_000, "bytes": 6_000_000, "grad_bytes": 6_000_000})
    by_rank = {}
    for r in range(world):
        s = straggle_ms if r == straggler else 0.0
        by_rank[r] = [columns(simple_step(k, 100 * k, world=world, straggle_ms=s)) for k in range(steps)]
    layouts = {r: [{"layout": [0, 0], "bucket": [0, 1], "param": ["fc2.weight", "fc1.weight"],
                    "param_index": [1, 0], "numel": [1_000_000, 500_000], "offset": [0, 0],
                    "dtype": ["float32", "float32"]}] for r in range(world)}
    meta["ranks"] = [{"rank": r, "host": "localhost", "pid": 1000 + r, "clock_offset_ns": 0,
                      "clock_error_ns": 0} for r in range(world)]
    return write_run(path, meta, by_rank, layouts)


def simulated_run(tmp_path: Path, name: str, *args: str) -> Path:
    """A run written by `syncviz simulate <args>` into tmp_path/name."""
    from click.testing import CliRunner

    from syncviz.cli import cli
    out = tmp_path / name
    r = CliRunner().invoke(cli, ["simulate", *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out
