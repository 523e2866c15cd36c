"""The partitioned summary (analysis.partitioned, `syncviz summary`'s default) against the whole-run
path (`syncviz summary --whole`, load_run + the analysis functions), number by number: on every
frozen fixture and on fresh simulated multi-rank runs (DDP with a straggler, ZeRO-3 collectives),
partitioned one rank per partition so every cross-rank combination is exercised."""
from __future__ import annotations

import io
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from rich.console import Console

from syncviz import analysis as A
from syncviz.analysis import jsonrows
from syncviz.analysis.distributed import collective_kinds, rank_breakdown
from syncviz.analysis import queueing as Q
from syncviz.analysis.partitioned import measure, partitions, summarize
from syncviz.cli import cli
from syncviz.trace import TraceError, load_run
from syncviz.trace import read as R
from syncviz.trace import schema as S
from syncviz.views.compare import run_comparison
from syncviz.views.summary import _clean, print_summary, whole_run_tables, write_json
from tracebuild import simulated_run

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def small_json_chunks(monkeypatch):
    monkeypatch.setattr(jsonrows, "CHUNK_ROWS", 7)
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / "run.json").exists())


def _same(a, b, path="") -> list[str]:
    """Exact equality (NaN equals NaN); floats must be the same double, not close."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}: keys {sorted(set(a) ^ set(b))}"] if set(a) != set(b) else []
        return out + [d for k in set(a) & set(b) for d in _same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{path}[{i}]")]
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating, int, np.integer)):
        return [] if (math.isnan(a) and math.isnan(float(b))) or float(a) == float(b) else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _frame(a: pd.DataFrame, b: pd.DataFrame, what: str):
    if not len(a) and not len(b):
        return
    pd.testing.assert_frame_equal(a, b, check_exact=True, check_dtype=False, check_index_type=False,
                                  check_column_type=False, check_categorical=False, obj=what)


def _text(tables) -> str:
    buf = io.StringIO()
    print_summary(tables, Console(file=buf, width=130, color_system=None))
    return buf.getvalue()


def _compare(run_dir: Path, jobs: int = 1, target_events: int = 1):
    try:
        old = whole_run_tables(load_run(run_dir))
    except TraceError as e:             # nothing usable: the same one line from both paths
        with pytest.raises(TraceError) as got:
            summarize(run_dir, jobs=jobs, target_events=target_events)
        assert str(got.value) == str(e)
        return None, None
    with tempfile.TemporaryDirectory() as replay:   # default: one rank per partition
        new = summarize(run_dir, jobs=jobs, target_events=target_events, compare=True, replay_dir=replay)
        _same_replay(run_dir, new.replay, target_events)
    diffs = _same(new.summary, old.summary)
    assert not diffs, f"{len(diffs)} numbers differ, e.g. {diffs[:5]}"
    _frame(new.steps, old.steps, "step_metrics")
    _frame(new.step_table, old.step_table, "step_table")
    _frame(new.bucket_table, old.bucket_table, "bucket_layout_table")
    _frame(new.collective_table, old.collective_table, "collective_table")
    if old.summary.get("offload_ms"):
        _frame(new.offload, old.offload, "offload_table")
    assert new.problems == old.problems and new.incomplete_ranks == old.incomplete_ranks
    assert _text(new) == _text(old)
    # the dashboard's Distributed page, as LoadedRun.distributed computes it from the whole run
    ev = load_run(run_dir).events
    steps, comm = A.step_metrics(ev), A.comm_metrics(ev, kinds=S.COMM_KINDS)
    _frame(new.distributed[0], rank_breakdown(ev, steps, comm), "rank_breakdown")
    _frame(new.distributed[1], collective_kinds(ev, steps, comm), "collective_kinds")
    # `syncviz summary --json`: the same bytes from the partitions' bucket rows (written in chunks of
    # 7 rows here, so that chunk and partition joins are exercised), and the reference's numbers
    with tempfile.TemporaryDirectory() as d:
        whole_run = load_run(run_dir)
        got, ref = io.StringIO(), io.StringIO()
        write_json(summarize(run_dir, jobs=jobs, target_events=target_events, json_dir=d), got)
        write_json(whole_run, ref)
        assert got.getvalue() == ref.getvalue()
        reference = {**A.run_summary(whole_run),
                     "steps_table": json.loads(A.step_metrics(whole_run).to_json(orient="records")),
                     "buckets_table": json.loads(A.bucket_metrics(whole_run).drop(columns=["name"])
                                                 .to_json(orient="records")),
                     "meta": whole_run.meta}
        assert json.loads(got.getvalue()) == json.loads(json.dumps(_clean(reference), default=str))
    # what `syncviz compare` shows, from the same partitions (analysis.comparison)
    whole = run_comparison(load_run(run_dir))
    for got in (run_comparison(new), run_comparison(measure(run_dir, jobs=jobs, target_events=target_events))):
        diffs = _same(got, whole)
        assert not diffs, f"compare: {len(diffs)} numbers differ, e.g. {diffs[:5]}"
    return old, new


def _same_replay(run_dir: Path, replay: dict, target_events: int = 1):
    """What the summary keeps for the dashboard's Replay (summarize(replay_dir=)): every step's
    lateness rows read back from the partitions' pieces equal tables.sync_lateness of the whole run
    (less launch_ns), row order included; each step's origin is views.timeline.step_origin of it;
    ``joined`` is every collective's last launch over all ranks."""
    from syncviz.analysis.steplateness import KeptLateness
    from syncviz.views.timeline import step_origin
    ev = load_run(run_dir).events
    late = A.sync_lateness(ev)
    kept = KeptLateness(Path(replay["dir"]), replay["lateness"])
    steps = sorted(int(s) for s in ev.loc[ev["step"] >= 0, "step"].unique())
    with_rows = {int(r) for r in late["rank"]}                # a piece per partition with rows
    assert len(replay["lateness"]) == sum(1 for p in partitions(R.rank_files(run_dir), target_events) if set(p) & with_rows)
    for s in steps:
        got = kept.step(s)
        want = late[late["step"] == s].drop(columns="launch_ns").reset_index(drop=True)
        pd.testing.assert_frame_equal(got.assign(label=got["label"].astype(object)), want, check_exact=True,
                                      check_dtype=False, obj=f"lateness of step {s}")
        one = ev[ev["step"] == s]
        comp, comm = A.compute_intervals(one), A.comm_rows(one)
        if len(comp) or len(comm):
            assert int(replay["origin"][s]) == step_origin(comp, comm), s
    joined = replay["joined"].set_index(list(Q.EVENT_KEY))["last"]
    c = Q.occurrences(A.comm_rows(ev))
    want = c.groupby(Q.EVENT_KEY, observed=True)["launch_ns"].max()
    assert joined.sort_index().tolist() == want.sort_index().tolist() and len(joined) == len(want)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_same_numbers(fixture):
    _compare(DATA / fixture)


def test_simulated_ddp_straggler_same_numbers(tmp_path):
    run = simulated_run(tmp_path, "ddp", "--model", "gpt2-medium", "--world-size", "6", "--steps", "5",
                    "--straggler", "2:0.3", "--seed", "3")
    old, new = _compare(run)
    assert len(R.rank_files(run)) == 6 and len(partitions(R.rank_files(run), 1)) == 6
    assert old.summary["straggler"] == 2 and old.summary["stragglers"]      # the cross-rank numbers are there
    assert len(old.bucket_table) > 1


def test_simulated_zero3_same_numbers_in_worker_processes(tmp_path):
    """ZeRO-3: all-gathers and reduce-scatters (collective rows, the collective table); two worker
    processes, as `syncviz summary` runs by default."""
    run = simulated_run(tmp_path, "z3", "--model", "gpt2-medium", "--world-size", "4", "--steps", "3",
                    "--strategy", "zero3", "--grad-ready", "bucket")
    old, new = _compare(run, jobs=2)
    assert len(old.collective_table)


def test_damaged_rank_named_and_rest_summarized(tmp_path):
    run = simulated_run(tmp_path, "d", "--model", "gpt2-medium", "--world-size", "3", "--steps", "3")
    data = (run / "rank-1.arrow").read_bytes()
    (run / "rank-1.arrow").write_bytes(data[: len(data) // 2])     # truncated: rank 1 stops mid-run
    old, new = _compare(run)
    assert any("rank 1 incomplete" in p for p in new.problems)


def test_nothing_usable_is_one_line(tmp_path):
    run = simulated_run(tmp_path, "e", "--model", "gpt2-medium", "--world-size", "2", "--steps", "2")
    for p in run.glob("rank-*.arrow"):
        p.write_bytes(b"not arrow")
    with pytest.raises(TraceError):
        summarize(run, jobs=1)
    r = CliRunner().invoke(cli, ["summary", str(run)])
    assert r.exit_code != 0 and "Traceback" not in r.output


def test_summary_command_default_and_whole_print_the_same(tmp_path):
    run = simulated_run(tmp_path, "c", "--model", "gpt2-medium", "--world-size", "3", "--steps", "3")
    a = CliRunner().invoke(cli, ["summary", str(run)])
    b = CliRunner().invoke(cli, ["summary", "--whole", str(run)])
    assert a.exit_code == 0 and b.exit_code == 0 and a.output == b.output and "Verdict" in a.output
    a = CliRunner().invoke(cli, ["summary", "--json", "--jobs", "2", str(run)])
    b = CliRunner().invoke(cli, ["summary", "--json", "--whole", str(run)])
    assert a.exit_code == 0 and b.exit_code == 0 and a.output == b.output
    assert len(json.loads(a.output)["buckets_table"]) == len(A.bucket_metrics(load_run(run))) > 9


def test_whole_refuses_the_options_of_the_summary_by_partitions(tmp_path):
    """--whole reads the run at once in this process: --keep-passes, --dask, --scratch and --jobs would
    do nothing there, so each is one line and exit 2, not silently dropped (nothing read, nothing kept);
    the same for compare's and the exports' --jobs."""
    run = simulated_run(tmp_path, "w", "--model", "gpt2-medium", "--world-size", "2", "--steps", "2")
    before = sorted(p.name for p in run.rglob("*"))
    for extra in (["--keep-passes"], ["--dask", "local"], ["--scratch", str(tmp_path)], ["--jobs", "2"]):
        r = CliRunner().invoke(cli, ["summary", "--whole", *extra, str(run)])
        assert r.exit_code == 2 and "Traceback" not in r.output, (extra, r.output)
        assert f"--whole reads the run in this process, at once: {extra[0]}" in r.output
    assert sorted(p.name for p in run.rglob("*")) == before
    assert CliRunner().invoke(cli, ["summary", "--whole", "--fresh", str(run)]).exit_code == 0
    both = CliRunner().invoke(cli, ["summary", "--whole", "--jobs", "2", "--scratch", str(tmp_path), str(run)])
    assert both.exit_code == 2 and "--scratch, --jobs apply to" in both.output
    for cmd in (["compare"], ["export", "html", "-o", str(tmp_path / "r.html")]):
        r = CliRunner().invoke(cli, [*cmd, str(run), "--whole", "--jobs", "2"])
        assert r.exit_code == 2 and "--jobs applies to the reading by partitions" in r.output, (cmd, r.output)
    assert not (tmp_path / "r.html").exists()


def test_a_long_step_table_prints_its_ends_and_slowest_steps(tmp_path):
    """A run of more than STEP_ROWS steps prints its first and last STEP_ENDS steps and the
    STEP_SLOWEST slowest between them, in step order with a ⋮ row where steps are left out, and says
    so in the title; --all-steps prints every step. Both paths print the same."""
    from syncviz.views import summary as SV
    run = simulated_run(tmp_path, "long", "--model", "gpt2-medium", "--world-size", "2", "--steps", "40")
    table = summarize(run, jobs=1).step_table
    rows, note = SV.shown_steps(table)
    between = table.iloc[SV.STEP_ENDS:len(table) - SV.STEP_ENDS]
    slowest = set(between.nlargest(SV.STEP_SLOWEST, "step_ns")["step"].astype(int))
    want = set(range(SV.STEP_ENDS)) | set(range(30, 40)) | slowest
    assert [int(table["step"].iloc[i]) for i in rows] == sorted(want) and len(want) == 25
    assert "25 of 40 steps" in note and SV.shown_steps(table.iloc[:SV.STEP_ROWS])[1] == ""
    short = CliRunner().invoke(cli, ["summary", str(run)])
    whole = CliRunner().invoke(cli, ["summary", "--whole", str(run)])
    every = CliRunner().invoke(cli, ["summary", "--all-steps", str(run)])
    assert short.exit_code == whole.exit_code == every.exit_code == 0 and short.output == whole.output
    printed = lambda out: [int(line.split()[1]) for line in out.split("Per step")[1].split("Per bucket")[0].splitlines()  # noqa: E731
                           if line.startswith("│") and line.split()[1].isdigit()]
    assert printed(short.output) == sorted(want) and short.output.count("⋮") >= 2
    assert printed(every.output) == list(range(40)) and "⋮" not in every.output


def test_summary_json_stops_before_the_disk_is_full(tmp_path):
    """`summary --json` of a run whose bucket rows' JSON will not fit: one line and exit 2 after the
    first partition's piece, no output, no scratch left (a 10^8-event run once filled the disk first).
    The free space is given by SYNCVIZ_FREE_BYTES (views/summary.free_bytes): half the pieces' size
    once they are written (the command's one partition), so the same run passes with stdout a pipe and
    stops with stdout a file on the same disk, which needs a copy of them all."""
    import os
    import subprocess
    import sys
    from syncviz.views.summary import JSON_RESERVE_BYTES
    run = simulated_run(tmp_path, "j", "--model", "gpt2-medium", "--world-size", "4", "--steps", "3")
    calls = []
    with tempfile.TemporaryDirectory() as d:
        summarize(run, jobs=1, target_events=1, json_dir=d, json_room=lambda total, written: calls.append((total, written)))
        pieces = sum(p.stat().st_size for p in Path(d).iterdir())
    assert len(calls) == 4 and calls[-1] == (pieces, pieces)        # the last projection is what was written
    first_total, first_written = calls[0]
    assert 0 < first_written < first_total and abs(first_total - pieces) < 0.1 * pieces   # 1 rank in 4: ~all
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "SYNCVIZ_FREE_BYTES": str(JSON_RESERVE_BYTES + pieces // 2)}
    cmd = [sys.executable, "-m", "syncviz", "summary", "--json", "--jobs", "1", "--scratch", str(scratch), str(run)]
    # stdout a pipe: the pieces alone need room, and they have it
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["buckets_table"]) == len(A.bucket_metrics(load_run(run)))
    # stdout a file on the scratch's disk: it gets a copy of them all too, and there is no room for both
    out = tmp_path / "out.json"
    with open(out, "w") as f:
        stopped = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.PIPE, text=True, timeout=300)
    lines = stopped.stderr.strip().splitlines()
    assert stopped.returncode == 2 and len(lines) == 1 and "Traceback" not in stopped.stderr, stopped.stderr
    assert "summary --json" in lines[0] and "stopped before the disk is full" in lines[0] and "stdout" in lines[0]
    assert out.stat().st_size == 0 and not any(scratch.iterdir())


class _Stop(Exception):
    pass


def _write_pieces(folder: str) -> int:
    """A pass-2 task's writes, slowed down: 30 pieces 10 ms apart into ``folder``."""
    import time
    for i in range(30):
        (Path(folder) / f"piece-{i}").write_bytes(b"x" * 1000)
        time.sleep(0.01)
    return 30


def test_a_summary_stopped_early_waits_for_its_tasks_then_removes_its_scratch(tmp_path):
    """The scratch folder of a summary stopped while its pool's tasks still write into it (an error,
    `summary --json` stopping before a full disk): the stop is what is raised, the tasks finish (not
    their folder removed under them) and then the folder goes whole. Removed under them, the DDP
    10^8-event run's `summary --json` once raised "Directory not empty" in place of its one line."""
    import multiprocessing as mp
    import time
    from concurrent.futures import ProcessPoolExecutor
    from syncviz.analysis import summary_pool as SP
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        assert pool.submit(int, "1").result() == 1        # the worker is up
        with pytest.raises(_Stop):
            with SP.scratch_dir(str(tmp_path), pool) as d:
                task = pool.submit(_write_pieces, d)
                time.sleep(0.1)
                raise _Stop
        assert task.result(timeout=0) == 30 and not any(tmp_path.iterdir())
    run = simulated_run(tmp_path / "runs", "stop", "--model", "gpt2-medium", "--world-size", "4", "--steps", "3")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def stop(total, written):
        raise _Stop
    with tempfile.TemporaryDirectory() as d, pytest.raises(_Stop):
        summarize(run, jobs=2, target_events=1, json_dir=d, json_room=stop, scratch=str(scratch))
    assert not any(scratch.iterdir())


def test_a_run_too_big_to_read_whole_is_refused_in_one_line(tmp_path):
    """The commands that read a run whole (summary/compare --whole, a whole-run Perfetto export,
    advise) refuse one whose read would not fit in the available memory, in one line that says what
    reads it instead, before reading anything (a 10^8-event run needs ~48 GB read whole). The run is
    made too big by a sparse rank file (1 TiB, no disk used)."""
    import os
    import subprocess
    import sys
    run = simulated_run(tmp_path, "big", "--model", "gpt2-medium", "--world-size", "2", "--steps", "2")
    os.truncate(run / "rank-1.arrow", 1 << 40)
    out = tmp_path / "t.json"
    for args, hint in ((["summary", "--whole"], "without --whole"), (["compare", "--whole"], "without --whole"),
                       (["export", "perfetto", "-o", str(out)], "--steps A:B"), (["advise"], "by partitions")):
        r = subprocess.run([sys.executable, "-m", "syncviz", *args, str(run)], capture_output=True, text=True,
                           timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert "1099.5 GB of rank files" in lines[0] and "GB of memory" in lines[0] and hint in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("compression", ["fp16", "powersgd"])
def test_compare_of_a_compressed_run_same_numbers(tmp_path, compression):
    """A compression hook: logical bytes above wire bytes, so compare also shows the collectives'
    own busy time (step_metrics of the non-bucket rows, one table per partition)."""
    run = simulated_run(tmp_path, compression, "--model", "gpt2-medium", "--world-size", "3", "--steps", "4",
                    "--compression", compression)
    _, new = _compare(run)
    c = run_comparison(new)
    assert c["compression_ratio"] > 1.01 and c["collectives_busy_ms"] is not None   # 0 here: the simulator
    # writes no collective rows inside its bucket hooks


def test_compare_steady_steps_of_deepspeed_zero3_same_numbers(tmp_path):
    """DeepSpeed ZeRO-3's steady steps start at step 2: the partitions get the run's, not their own."""
    run = simulated_run(tmp_path, "dsz3", "--model", "gpt2-medium", "--world-size", "3", "--steps", "5",
                    "--strategy", "zero3")
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "strategy": "ds-zero3"}))
    _, new = _compare(run)
    assert run_comparison(new)["steady_steps"] == [2, 3, 4]


def test_compare_command_default_and_whole_print_the_same(tmp_path):
    simulated_run(tmp_path, "a", "--model", "gpt2-medium", "--world-size", "3", "--steps", "3")
    simulated_run(tmp_path, "b", "--model", "gpt2-medium", "--world-size", "3", "--steps", "3", "--strategy", "zero2")
    for extra in ([], ["--json"]):
        a = CliRunner().invoke(cli, ["compare", str(tmp_path), *extra])
        b = CliRunner().invoke(cli, ["compare", "--whole", str(tmp_path), *extra])
        assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
        assert a.output == b.output and "zero2" in a.output and "ddp" in a.output
    only = CliRunner().invoke(cli, ["compare", str(tmp_path), "--strategies", "zero2", "--json", "--jobs", "2"])
    assert only.exit_code == 0 and [c["strategy"] for c in json.loads(only.output)] == ["zero2"]


def test_replay_tables_kept_whole_or_not_at_all(tmp_path, monkeypatch):
    """A lateness piece that does not read back equal (here: the second partition's file comes back a
    row short) means no Replay tables for the run, never a heatmap missing some ranks; the summary's
    numbers are the same either way, and the dashboard then reads every rank, as without them."""
    from syncviz.analysis import steplateness
    run = DATA / "straggler"
    plain = summarize(run, jobs=1, target_events=1)
    real, read = steplateness.read_back, []

    def short_second(path, *args, **kwargs):
        read.append(path)
        piece = real(path, *args, **kwargs)
        if len(read) == 2:
            piece = {k: v[1:] if isinstance(v, np.ndarray) else v for k, v in piece.items()}
        return piece
    monkeypatch.setattr(steplateness, "read_back", short_second)
    got = summarize(run, jobs=1, target_events=1, replay_dir=str(tmp_path))
    assert len(read) >= 2 and got.replay is None
    assert not _same(got.summary, plain.summary)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(p).name for p in read if Path(p).name != "lateness-000001.lat")
    monkeypatch.setattr(steplateness, "read_back", real)
    (tmp_path / "again").mkdir()
    kept = summarize(run, jobs=1, target_events=1, replay_dir=str(tmp_path / "again"))
    assert kept.replay is not None and len(kept.replay["lateness"]) == len(read)


def test_straggler_rows_kept_small_count_as_every_row(tmp_path):
    """partition_joined.write_straggler_rows keeps each rank's collectives once per distinct list and
    the rows launched last apart; partials._straggler_rows' counts from it equal those over every
    (rank, collective, launched last) row, exactly, on random partitions: ranks in any order, ranks
    sharing one list or not, a collective twice in one rank's rows, no row launched last."""
    from syncviz.analysis.partials import _straggler_rows
    from syncviz.analysis.partition_joined import write_straggler_rows
    rng = np.random.default_rng(5)
    for trial in range(150):
        n_ev = int(rng.integers(1, 40))
        ranks = np.sort(rng.choice(3000, size=int(rng.integers(1, 7)), replace=False))
        shared = rng.permutation(n_ev)[:int(rng.integers(1, n_ev + 1))]
        rows = [(r, e) for r in ranks
                for e in (shared if rng.random() < 0.7 else rng.integers(0, n_ev, size=int(rng.integers(1, 2 * n_ev))))]
        if trial % 3 == 0:
            rng.shuffle(rows)
        rank, ev = np.array([r for r, _ in rows], dtype=np.int32), np.array([e for _, e in rows], dtype=np.int64)
        at_max = rng.random(len(ev)) < (0.3 if trial % 5 else 0.0)
        unique, event_wait = rng.random(n_ev) < 0.6, rng.random(n_ev) * 1e6
        late = pd.Series(rng.random(len(ranks)) * 1e6, index=pd.Index(ranks, name="rank"))
        path = str(tmp_path / "st.arrays")
        write_straggler_rows(path, rank, ev, at_max)
        got = _straggler_rows((path, late, unique, event_wait))
        inv = np.searchsorted(ranks, rank)                  # every row, as the combine summed them before
        counted, is_last = unique[ev], at_max & unique[ev]
        want = pd.DataFrame({"events": np.bincount(inv[counted], minlength=len(ranks)).astype(np.int64),
                             "last": np.bincount(inv[is_last], minlength=len(ranks)).astype(np.int64),
                             "mean_late_ns": late.to_numpy(),
                             "wait_ns": np.bincount(inv, weights=np.where(is_last, event_wait[ev], 0.0), minlength=len(ranks))},
                            index=pd.Index(ranks.astype(np.int32), name="rank"))
        pd.testing.assert_frame_equal(got, want, check_exact=True)
