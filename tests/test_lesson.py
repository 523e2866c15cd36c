"""``syncviz lesson`` and the dashboard's Lesson page: the page's figures from a hand-built lesson
directory (runs from tracebuild, gradient values, a ring transcript), the page served by the real
Dash callback endpoint, and the command's own steps (memory: instant; averaging: real ranks, slow)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tracebuild import make_ddp_run

from syncviz.analysis import grads as G
from syncviz.trace.grads import load_grads
from syncviz.analysis import ring as RM
from syncviz.trace import schema as S


def _ring_json(n: int, d: int = 12000) -> dict:
    t, k = [], 0
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            for r in range(n):
                c = (r - s) % n if phase == "reduce-scatter" else (r + 1 - s) % n
                t.append({"phase": phase, "step": s, "chunk": c, "src": r, "dst": (r + 1) % n, "bytes": d // n,
                          "start_ns": k * 1_000_000, "end_ns": k * 1_000_000 + 800_000})
            k += 1
    sent = 2 * (n - 1) * d // n
    ranks = [{"rank": r, "ring": {"payload_bytes": sent, "kernel_bytes": sent + 96, "same_as_all_reduce": True},
              "all_to_all": {"payload_bytes": (n - 1) * d, "kernel_bytes": (n - 1) * d, "same_as_all_reduce": True},
              "parameter_server": {"payload_bytes": d, "kernel_bytes": d, "same_as_all_reduce": True},
              "torch_all_reduce": {"payload_bytes": -1, "kernel_bytes": sent, "same_as_all_reduce": True},
              "float_max_abs_diff": 0.0} for r in range(n)]
    return {"world_size": n, "bytes": d, "elements": d // 4, "formulas": RM.formulas(n, d), "ranks": ranks,
            "transfers": t}


def _grads(run_dir: Path, world: int = 2) -> None:
    """Hand-written grads-<rank>.arrow: random "before" values per rank, "after" = DDP's mean."""
    rng = np.random.default_rng(0)
    params = ("fc1.weight", "fc2.weight")
    before = {p: rng.standard_normal((world, 3)).astype(np.float32) * np.float32(1e-3) for p in params}
    for rank in range(world):
        rows = []
        for i, p in enumerate(params):
            after = G.ddp_mean(before[p], "float32")
            for when, vals in (("before", before[p][rank]), ("after", after)):
                rows.append((0, 0, 0, 0, p, i, 3, when, 1.0, [float(x) for x in vals], "float32"))
        cols = list(zip(*rows))
        with pa.OSFile(str(run_dir / S.grads_file(rank)), "wb") as f, pa.ipc.new_stream(f, S.GRADS_SCHEMA) as w:
            w.write_batch(pa.RecordBatch.from_arrays([pa.array(list(c), type=fl.type)
                                                      for c, fl in zip(cols, S.GRADS_SCHEMA)], schema=S.GRADS_SCHEMA))


STALE = {"stale": 2, "steps": [0, 1, 2, 3], "loss_stale": [6.2, 6.1, 6.0, 5.95], "loss_sync": [6.2, 6.0, 5.8, 5.6],
         "drift_max": [0.001, 0.002, 0.003, 0.0035], "drift_rel": [0.01, 0.02, 0.025, 0.03]}
DPNUM = {"gpus": [2, 4, 8], "dp_ms": [236.5, 388.8, 693.2], "ddp_ms": [89.4, 122.1, 139.7],
         "dp_gpu0_mb": [3776.0, 11327.0, 26431.0], "ddp_mb": [2839.0, 4258.0, 4968.0],
         "dp_gpu0_share": [0.53, 0.28, 0.15], "model": "gpt2-medium", "link": "pcie"}


def build_lesson(root: Path) -> Path:
    """root/lesson: lesson.json, four runs, ring/ring-N2.json and ring-N4.json."""
    out = root / "lesson"
    for name in ("1-averaging", "2-manual", "3-ddp-buckets", "4-straggler"):
        make_ddp_run(out / name, steps=3, straggler=1 if name == "4-straggler" else None, straggle_ms=3)
    _grads(out / "1-averaging")
    (out / "ring").mkdir()
    for n in (2, 4):
        (out / "ring" / f"ring-N{n}.json").write_text(json.dumps(_ring_json(n)))
    steps = [("Gradient averaging: every rank ends up with the mean", ["1-averaging"], {}),
             ("DDP by hand: broadcast weights, all-reduce every gradient", ["2-manual"], {}),
             ("DDP's buckets: gradients travel while backward is still computing", ["3-ddp-buckets"], {}),
             ("A straggler: synchronous training", ["4-straggler"], {}),
             ("Ring all-reduce: why the bytes per rank do not grow", [], {}),
             ("Memory: why 70B parameters need ZeRO-3", [], {"ddp": 840.0, "zero1": 350.0, "zero2": 227.5,
                                                             "zero3": 105.0}),
             ("Asynchronous updates: stale gradients, and the replicas drift apart", [], STALE),
             ("DataParallel vs DDP: one process and GPU 0 against one process per GPU", [], DPNUM)]
    doc = {"nproc": 2, "fast": True, "steps": [
        {"number": i + 1, "title": t, "text": [f"narration {i + 1}"], "page": "Lesson",
         "runs": [f"lesson/{r}" for r in runs], "numbers": nums} for i, (t, runs, nums) in enumerate(steps)]}
    (out / "lesson.json").write_text(json.dumps(doc))
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lessondash") / "runs"
    build_lesson(root)
    return root


def test_figures(root):
    from syncviz.dashboard.figures import lesson as LC
    check = G.averaging_check(load_grads(root / "lesson" / "1-averaging"))
    assert check["exact"].all() and len(check) == 2
    fig = LC.averaging_figure(check)
    assert [t["name"] for t in fig["data"]] == ["after all-reduce (every rank)", "rank 0 before", "rank 1 before"]
    # the bar (after) sits at the mean of the dots (before), parameter by parameter
    bar, r0, r1 = (t["y"] for t in fig["data"])
    assert np.allclose(bar, (np.array(r0) + np.array(r1)) / 2)
    res = _ring_json(4)
    anim = LC.ring_animation(RM.ring_states(res["transfers"], 4), 4, 0.003)
    assert len(anim["frames"]) == 1 + 2 * 3 and len(anim["layout"]["sliders"][0]["steps"]) == 7
    assert anim["frames"][-1]["data"][0]["z"] == [[4] * 4] * 4
    assert "reduce-scatter step 1/3" in anim["frames"][1]["layout"]["title"]["text"]
    tl = LC.ring_timeline(res["transfers"], 4)
    assert sum(len(t["y"]) for t in tl["data"]) == 4 * 6
    by = LC.ring_bytes_figure([_ring_json(2), _ring_json(4)])
    ring_formula = next(t for t in by["data"] if t["name"].startswith("ring 2"))
    assert ring_formula["y"] == pytest.approx([0.012, 0.018])
    mem = LC.memory_figure({"ddp": 840.0, "zero3": 105.0})
    assert mem["data"][0]["y"] == [840.0, 105.0]
    st = LC.stale_figure(STALE)
    assert [t["y"] for t in st["data"]] == [STALE["loss_sync"], STALE["loss_stale"], STALE["drift_max"]]
    assert st["data"][2]["yaxis"] == "y2" and "2 steps stale" in st["layout"]["title"]["text"]
    dp = LC.dataparallel_figure(DPNUM)
    assert [t["name"] for t in dp["data"]] == ["DDP", "DataParallel"]
    assert dp["data"][1]["y"] == DPNUM["dp_ms"] and dp["data"][0]["x"] == ["2 GPUs", "4 GPUs", "8 GPUs"]
    assert not LC.stale_figure({})["data"] and not LC.dataparallel_figure({})["data"]


def test_page_callbacks(root):
    from syncviz.dashboard.app import create_app
    create_app(root)
    from syncviz.dashboard.pages import lesson as P
    assert list(P.lessons()) == ["lesson"]
    body = P.draw("lesson")
    assert len(body) == 8
    text = str(body)
    assert "cannot draw" not in text.lower() and "narration 8" in text
    assert "lesson-stale" in text and "lesson-dataparallel" in text
    assert "lesson-ring-anim" in text and "lesson-averaging" in text and "lesson-split-manual" in text
    anim, timeline = P.draw_ring(1, "lesson")
    assert len(anim["frames"]) == 7 and timeline["data"]
    # a name that is not a lesson under the root draws nothing (the browser sends it)
    empty, _ = P.draw_ring(0, "../../etc")
    assert not empty.get("frames")
    assert "No lesson here yet" in str(P.draw(None))


def test_lesson_cli_memory_step_and_errors(tmp_path):
    p = subprocess.run([sys.executable, "-m", "syncviz", "lesson", "--only", "6", "--out", str(tmp_path / "l")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "[6/8] Memory" in p.stdout and "840.0 GB" in p.stdout and "-> dashboard: Strategies" in p.stdout
    doc = json.loads((tmp_path / "l" / "lesson.json").read_text())
    assert doc["steps"][0]["numbers"]["zero2"] == pytest.approx(227.5)
    for args, msg in ((["--only", "9"], "steps are numbered 1 to 8"), (["--only", "x"], "step numbers like")):
        p = subprocess.run([sys.executable, "-m", "syncviz", "lesson", *args], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_lesson_averaging_step_on_real_ranks(tmp_path):
    p = subprocess.run([sys.executable, "-m", "syncviz", "lesson", "--fast", "--only", "1", "--out", str(tmp_path / "l")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads((tmp_path / "l" / "lesson.json").read_text())
    n = doc["steps"][0]["numbers"]
    assert n["checked"] > 0 and n["exact"] == n["checked"] and n["after"] == n["mean"]
    assert "after == mean bit for bit" in p.stdout and "-> dashboard: Lesson" in p.stdout


def test_lesson_dataparallel_step_prints_the_model(tmp_path):
    from syncviz.model import dataparallel as DP
    p = subprocess.run([sys.executable, "-m", "syncviz", "lesson", "--only", "8", "--out", str(tmp_path / "l")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "[8/8] DataParallel vs DDP" in p.stdout and "GIL" in p.stdout
    nums = json.loads((tmp_path / "l" / "lesson.json").read_text())["steps"][0]["numbers"]
    for n, dp_ms, ddp_ms in zip(nums["gpus"], nums["dp_ms"], nums["ddp_ms"]):
        r = DP.row(DP.inputs(), n)
        assert dp_ms == pytest.approx(r.dp_step_s * 1e3) and ddp_ms == pytest.approx(r.ddp_step_s * 1e3)
        line = next(l for l in p.stdout.splitlines() if l.strip().startswith(f"{n} "))
        assert f"{r.dp_gpu0_bytes / 1e6:,.0f}" in line and f"{r.dp_step_s * 1e3:.1f}" in line


@pytest.mark.slow
def test_lesson_stale_step_on_real_ranks(tmp_path):
    p = subprocess.run([sys.executable, "-m", "syncviz", "lesson", "--only", "7", "--fast", "--out", str(tmp_path / "l")],
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "[7/8] Asynchronous updates" in p.stdout and "0/28 parameters equal" in p.stdout
    step = json.loads((tmp_path / "l" / "lesson.json").read_text())["steps"][0]
    drift = json.loads((tmp_path / "l" / "7-stale-params" / "drift.json").read_text())
    nums = step["numbers"]
    assert nums["drift_max"] == [r["drift_max"] for r in drift] and len(nums["loss_sync"]) == len(drift) == 10
    assert nums["loss_stale"][0] == nums["loss_sync"][0] and nums["loss_stale"] != nums["loss_sync"]
    assert step["runs"] == ["l/7-stale"] and (tmp_path / "l" / "7-stale" / "run.json").exists()
