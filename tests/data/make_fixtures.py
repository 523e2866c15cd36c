"""Regenerate the frozen scenario fixtures under tests/data/<scenario>/ and their expected numbers.

    python tests/data/make_fixtures.py            # runs, then expected.json
    python tests/data/make_fixtures.py --expected # only recompute expected.json from the runs

The runs are frozen: tests/test_fixtures.py checks that today's reader and analysis give exactly
the numbers in each expected.json. Regenerate expected.json only when a metric's definition changes
on purpose, and say so in the commit.

Scenarios:
  ddp-2rank       a real 2-rank DDP run of the built-in tiny GPT on gloo (several buckets)
  zero2           a real 2-rank FSDP2 (reshard_after_forward=False) run of the same model
  straggler       a simulated 4-rank DDP run with rank 2 slowed by 30%
  truncated-rank  ddp-2rank with rank 1's stream cut inside its last step (the rank died)
  old-minor       ddp-2rank written without the logical_bytes column (an older minor version)
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

HERE = Path(__file__).resolve().parent
SCENARIOS = ("ddp-2rank", "zero2", "straggler", "truncated-rank", "old-minor")


def _syncviz(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "syncviz", *args], check=True)


def make_runs() -> None:
    common = ["--preset", "tiny", "--steps", "4", "--nproc", "2", "--batch", "2", "--seq", "32"]
    _syncviz("demo", *common, "--bucket-cap-mb", "0.05", "--out", str(HERE / "ddp-2rank"))
    _syncviz("demo", *common, "--strategy", "zero2", "--out", str(HERE / "zero2"))
    _syncviz("simulate", "--model", "gpt2-medium", "--world-size", "4", "--steps", "5", "--straggler", "2:0.3",
             "--seed", "1", "--out", str(HERE / "straggler"), "--overwrite")
    src = HERE / "ddp-2rank"
    for name in ("truncated-rank", "old-minor"):
        shutil.rmtree(HERE / name, ignore_errors=True)
        shutil.copytree(src, HERE / name, ignore=shutil.ignore_patterns("profiler", "expected.json"))
        meta = json.loads((HERE / name / "run.json").read_text())
        meta["name"] = name
        (HERE / name / "run.json").write_text(json.dumps(meta, indent=1))
    # truncated-rank: cut rank 1 in the middle of its last record batch (no end-of-stream marker)
    f = HERE / "truncated-rank" / "rank-1.arrow"
    data = f.read_bytes()
    with pa.ipc.open_stream(pa.py_buffer(data)) as r:
        sizes = [b.nbytes for b in r]
    f.write_bytes(data[: len(data) - 8 - sizes[-1] // 2])
    # old-minor: every rank stream rewritten without the column a later minor version added
    for f in (HERE / "old-minor").glob("rank-*.arrow"):
        with pa.ipc.open_stream(f.read_bytes()) as r:
            table = r.read_all()
            meta = dict(r.schema.metadata or {})
        table = table.drop(["logical_bytes"])
        meta[b"syncviz.minor"] = b"0"
        table = table.replace_schema_metadata(meta)
        with pa.OSFile(str(f), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            for b in table.to_batches():
                w.write_batch(b)


def numbers(run_dir: Path) -> dict:
    """The numbers a fixture freezes: the run summary and the per-step table (what the views print)."""
    from syncviz import analysis as A
    from syncviz.trace import load_run
    run = load_run(run_dir)
    s = A.run_summary(run)
    steps = A.step_table(run)
    out = {"summary": {k: v for k, v in s.items() if k not in ("name", "problems", "verdict")},
           "verdict": s["verdict"], "problems": len(s["problems"]),
           "step_table": json.loads(steps.to_json(orient="records")),
           "events": int(len(run.events))}
    return json.loads(json.dumps(out, default=_plain))


def _plain(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return x.item() if hasattr(x, "item") else str(x)


def write_expected() -> None:
    for name in SCENARIOS:
        (HERE / name / "expected.json").write_text(json.dumps(numbers(HERE / name), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expected", action="store_true", help="only recompute expected.json")
    if not ap.parse_args().expected:
        make_runs()
    write_expected()
