"""Each rank's own first pass (analysis/rank_pass.py), written when it closes: the summary combined
from them is the summary read from every event, number by number and byte by byte, on every frozen
fixture, on simulated DDP and ZeRO-3 runs, one rank and several ranks a partition; a pass that does
not belong to exactly its rank file and this code is never used; real traced ranks write them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from syncviz.analysis import partition_facts as PF
from syncviz.analysis import rank_pass
from syncviz.analysis.partitioned import measure, summarize
from syncviz.cli import cli
from syncviz.trace import read as R
from syncviz.views import runcache as RC
from test_partitioned import _same, _text
from tracebuild import simulated_run

DATA = Path(__file__).parent / "data"
FIXTURES = ["ddp-2rank", "straggler", "zero2", "old-minor", "truncated-rank"]


@pytest.fixture
def reads(monkeypatch):
    """The rank files the summary reads (lists of rank numbers, one per partition read)."""
    seen: list[list[int]] = []
    real = PF.read_events

    def counted(files, *a, **k):
        seen.append(sorted(files))
        return real(files, *a, **k)
    monkeypatch.setattr(PF, "read_events", counted)
    return seen


def _copy(src: Path, tmp_path: Path) -> Path:
    run = tmp_path / src.name
    shutil.copytree(src, run)
    return run


def _aside(run: Path):
    """Move the ranks' first passes out of the run; returns a function that puts them back."""
    where = run / RC.CACHE_DIR / rank_pass.DIR
    away = run.parent / f"{run.name}-passes"
    where.rename(away)
    return lambda: away.rename(where)


def _equal(a, b):
    diffs = _same(a.summary, b.summary)
    assert not diffs, diffs[:5]
    for k in ("steps", "step_table", "bucket_table", "collective_table", "offload", "rank_skew", "spans"):
        x, y = getattr(a, k), getattr(b, k)
        if x is None or y is None:
            assert x is None and y is None, k
            continue
        pd.testing.assert_frame_equal(x, y, check_exact=True, obj=k)     # dtypes and index too
    assert a.facts == b.facts and a.problems == b.problems and a.incomplete_ranks == b.incomplete_ranks
    assert _text(a) == _text(b)


def _same_comparison(a, b) -> None:
    """measure()'s results (what `syncviz compare` shows of a run) equal, tables exactly."""
    assert a.problems == b.problems and a.incomplete_ranks == b.incomplete_ranks and a.world_size == b.world_size
    x, y = a.comparison, b.comparison
    assert set(x) == set(y)
    for k, v in x.items():
        if isinstance(v, pd.DataFrame):
            pd.testing.assert_frame_equal(v, y[k], check_exact=True, obj=k)
        else:
            assert v == y[k], k


def _cli(*args) -> str:
    r = CliRunner().invoke(cli, [*args, "--jobs", "1"])
    assert r.exit_code == 0, r.output
    return r.output


def _summaries(run: Path, target: int, tmp_path: Path):
    """summarize with everything the views ask of it (JSON rows, export pieces, Replay pieces)."""
    out = {}
    for k in ("json", "export", "replay"):
        (tmp_path / k).mkdir(parents=True, exist_ok=True)
    t = summarize(run, jobs=1, target_events=target, json_dir=str(tmp_path / "json"),
                  export_dir=str(tmp_path / "export"), replay_dir=str(tmp_path / "replay"))
    out["json"] = b"".join(Path(p).read_bytes() for p in t.bucket_json if p)
    out["export"] = {k: t.export[k] for k in ("bucket_table", "bucket_skew", "step_first")}
    out["replay"] = {k: t.replay[k] for k in ("origin", "joined")} if t.replay is not None else None
    out["lateness"] = [(tmp_path / "replay" / Path(p["file"]).name).read_bytes() for p in t.replay["lateness"]] \
        if t.replay is not None else None
    return t, out


def _same_pieces(a: dict, b: dict) -> None:
    assert a["json"] == b["json"] and a["lateness"] == b["lateness"]
    for part in ("export", "replay"):
        assert (a[part] is None) == (b[part] is None)
        for k, x in (a[part] or {}).items():
            y = b[part][k]
            if isinstance(x, pd.DataFrame):
                pd.testing.assert_frame_equal(x, y, check_exact=True, obj=k)
            elif isinstance(x, pd.Series):
                pd.testing.assert_series_equal(x, y, check_exact=True, obj=k)
            else:
                assert x == y, k


@pytest.mark.parametrize("target", [1, 10**9], ids=["rank-per-partition", "one-partition"])
@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_summary_from_the_ranks_first_passes(tmp_path, name, target, reads):
    run = _copy(DATA / name, tmp_path)
    files = R.rank_files(run)
    wrote = {r: rank_pass.write(r, f) for r, f in files.items()}
    read_before = list(reads)
    reads.clear()
    with_passes = summarize(run, jobs=1, target_events=target)
    used_reads = list(reads)
    reads.clear()
    measured = measure(run, jobs=1, target_events=target)
    measure_reads = list(reads)
    back = _aside(run)
    reads.clear()
    every_event = summarize(run, jobs=1, target_events=target)
    measured_every = measure(run, jobs=1, target_events=target)
    back()
    _equal(with_passes, every_event)
    _same_comparison(measured, measured_every)
    unusable = sorted(r for r, w in wrote.items() if w is None)
    # only a rank file read without a problem keeps its pass; a partition holding any other is read
    if name == "truncated-rank":
        assert unusable and with_passes.problems
    else:
        assert not unusable
    expected = [] if not unusable else ([unusable] if target == 1 else [sorted(files)])
    assert used_reads == expected, (read_before, used_reads)
    assert measure_reads == expected, "compare reads only what the summary reads"


def _simulated(tmp_path, monkeypatch, name, *args) -> Path:
    monkeypatch.setenv(rank_pass.ENV, "always")
    return simulated_run(tmp_path, name, *args)


@pytest.mark.parametrize("target", [1, 10**9], ids=["rank-per-partition", "one-partition"])
@pytest.mark.parametrize("preset", [("zero3", "--preset", "llama70b-8", "--steps", "3"),
                                    ("ddp", "--preset", "gpt2-medium-8", "--strategy", "ddp", "--steps", "3",
                                     "--straggler", "5:0.3")], ids=["zero3", "ddp-straggler"])
def test_simulated_runs_write_them_and_the_summary_is_the_same(tmp_path, monkeypatch, preset, target, reads):
    run = _simulated(tmp_path, monkeypatch, *preset)
    files = R.rank_files(run)
    assert all(rank_pass.load(r, f) is not None for r, f in files.items()), "simulate keeps every rank's pass"
    reads.clear()
    a, a_more = _summaries(run, target, tmp_path / "a")
    assert reads == [], "no rank file read where every rank kept its pass"
    back = _aside(run)
    b, b_more = _summaries(run, target, tmp_path / "b")
    back()
    _equal(a, b)
    _same_pieces(a_more, b_more)
    assert a_more["json"] or "zero3" in run.name, "the DDP run's bucket rows are compared"
    # the commands' own output, byte for byte (compare: no rank file read where every rank kept its pass)
    reads.clear()
    text, as_json = _cli("summary", "--fresh", str(run)), _cli("summary", "--json", str(run))
    compared = _cli("compare", "--json", str(run))
    assert reads == []
    back = _aside(run)
    assert _cli("summary", "--fresh", str(run)) == text
    assert _cli("summary", "--json", str(run)) == as_json
    assert _cli("compare", "--json", str(run)) == compared
    back()


def test_passes_packed_by_either_codec_give_the_same_summary(tmp_path, monkeypatch, reads):
    """A pass's header names its frames' codec (rank_pass_file.CODECS): frames written with zstd (the
    codec until session 46; a comparison can still write them) are read as LZ4 ones are, the same
    numbers, and no rank file is read for either."""
    from syncviz.analysis import rank_pass_file as RF
    run = _copy(DATA / "ddp-2rank", tmp_path)
    files = R.rank_files(run)
    got = {}
    for codec in RF.CODECS:
        monkeypatch.setattr(RF, "CODEC", codec)
        for r, f in files.items():
            assert rank_pass.write(r, f) is not None
            assert json_head(rank_pass.path_of(f))["codec"] == codec
        reads.clear()
        got[codec] = summarize(run, jobs=1, target_events=1)
        assert reads == [], codec
    _equal(got["lz4"], got["zstd"])


def test_simulate_keeps_none_below_the_threshold(tmp_path, monkeypatch):
    monkeypatch.delenv(rank_pass.ENV, raising=False)
    run = simulated_run(tmp_path, "small", "--preset", "llama70b-8", "--steps", "2")
    assert not (run / RC.CACHE_DIR / rank_pass.DIR).exists()


def test_worth_it(monkeypatch):
    monkeypatch.delenv(rank_pass.ENV, raising=False)
    assert rank_pass.worth_it(rank_pass.WORTH_BYTES // 8, 8)
    assert not rank_pass.worth_it(rank_pass.WORTH_BYTES // 8 - 1, 8)
    assert not rank_pass.worth_it(10 << 20, 2)
    assert not rank_pass.worth_it(rank_pass.MAX_BYTES + 1, 1024), "a rank bigger than two partitions keeps none"
    monkeypatch.setenv(rank_pass.ENV, "always")
    assert rank_pass.worth_it(1, 1)
    monkeypatch.setenv(rank_pass.ENV, "never")
    assert not rank_pass.worth_it(1 << 40, 1024)


def test_a_pass_not_of_exactly_this_rank_file_and_code_is_not_used(tmp_path, monkeypatch, reads):
    run = _copy(DATA / "straggler", tmp_path)
    files = R.rank_files(run)
    for r, f in files.items():
        assert rank_pass.write(r, f) is not None
    expected = summarize(run, jobs=1, target_events=1)
    # rank 1's file rewritten since (same bytes, new mtime), rank 2's pass damaged, rank 3's written by other code
    st = files[1].stat()
    os.utime(files[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    p2 = rank_pass.path_of(files[2])
    p2.write_bytes(p2.read_bytes()[: p2.stat().st_size // 2])
    with monkeypatch.context() as m:
        m.setattr(rank_pass, "code_digest", lambda *packages: "other-code")
        assert rank_pass.write(3, files[3]) is not None
    for r in (1, 2, 3):
        assert rank_pass.load(r, files[r]) is None
    assert rank_pass.load(0, files[0]) is not None
    reads.clear()
    got = summarize(run, jobs=1, target_events=1)
    _equal(got, expected)
    assert reads == [[1], [2], [3]]
    # another rank's pass under this rank's name, and a file that is no pass at all
    p0 = rank_pass.path_of(files[0])
    shutil.copy(p0, rank_pass.path_of(files[1]))
    assert rank_pass.load(1, files[1]) is None
    # a header claiming a frame LZ4 could not have made of the bytes that follow
    data = p0.read_bytes()
    n = int.from_bytes(data[len(rank_pass._MAGIC):len(rank_pass._MAGIC) + 8], "little")
    head_at = len(rank_pass._MAGIC) + 8
    head = json.loads(data[head_at:head_at + n])
    head["frames"][1][1] = 1 << 40
    text = json.dumps(head).encode()
    st0 = files[0].stat()
    p0.write_bytes(rank_pass._MAGIC + len(text).to_bytes(8, "little") + text + data[head_at + n:])

    def no_decompress(*a, **k):
        raise AssertionError("refused before allocating what the header claims")
    with monkeypatch.context() as m:
        m.setattr(rank_pass.pa, "decompress", no_decompress)
        assert rank_pass.load(0, files[0]) is None
    assert files[0].stat().st_mtime_ns == st0.st_mtime_ns
    p0.write_bytes(b"not a pass at all")
    assert rank_pass.load(0, files[0]) is None
    p0.write_bytes(b"")                 # an empty file (read memory-mapped: mmap refuses it)
    assert rank_pass.load(0, files[0]) is None
    p0.write_bytes(rank_pass._MAGIC + (1 << 40).to_bytes(8, "little") + b"{}")    # a header past the file's end
    assert rank_pass.load(0, files[0]) is None


def test_the_run_cache_keeps_them_when_it_empties(tmp_path):
    run = _copy(DATA / "ddp-2rank", tmp_path)
    files = R.rank_files(run)
    for r, f in files.items():
        rank_pass.write(r, f)
    stale = run / RC.CACHE_DIR / "old-entry.json"
    stale.write_text("{}")
    sig = RC.signature(run)
    tables = summarize(run, jobs=1)
    assert RC.put_summary(run, tables, sig)
    assert not stale.exists(), "a stale cache is emptied"
    assert all(rank_pass.load(r, f) is not None for r, f in files.items()), "but the ranks' passes are kept"


@pytest.mark.slow
def test_traced_ranks_keep_their_first_pass(tmp_path, reads):
    """Real torchrun, real DDP on gloo: with SYNCVIZ_RANK_PASS=always each rank writes its pass at close
    (this run is far below the size where that is the default), and the summary uses them."""
    script = Path(__file__).parent / "scripts" / "user_train.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", rank_pass.ENV: "always"}
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--out", str(out), "--quiet",
                        str(script), "--steps", "3"], capture_output=True, text=True, env=env, timeout=300,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "first pass not kept" not in p.stderr
    files = R.rank_files(out)
    assert sorted(files) == [0, 1]
    for r, f in files.items():
        head, _ = rank_pass.load(r, f)
        assert head["rank"] == r and head["rows"] > 0
    reads.clear()
    a = summarize(out, jobs=1)
    assert reads == []
    back = _aside(out)
    b = summarize(out, jobs=1)
    back()
    _equal(a, b)
    # the default on a run this small: none kept
    env.pop(rank_pass.ENV)
    small = tmp_path / "small"
    p = subprocess.run([sys.executable, "-m", "syncviz", "trace", "--nproc-per-node", "2", "--out", str(small), "--quiet",
                        str(script), "--steps", "2"], capture_output=True, text=True, env=env, timeout=300,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not (small / RC.CACHE_DIR / rank_pass.DIR).exists()
    assert json.loads((small / "run.json").read_text())["finished"] is True


@pytest.mark.parametrize("name", ["straggler", "zero2"])
def test_merged_arrays_are_the_partitions_own(tmp_path, name):
    """What pass 2 gets from the ranks' passes is, array by array (values and types), what reading the
    partition gives: comm rows (codes decoded to their strings), identities and the other rows' extras."""
    from syncviz.analysis import partition_facts as PF2
    from syncviz.analysis import partition_local as PL
    run = _copy(DATA / name, tmp_path)
    files = R.rank_files(run)
    for r, f in files.items():
        assert rank_pass.write(r, f) is not None
    ev, *_ = PF2.read_events(files)
    local = PL.local_pass(ev)
    want_c, want_i, want_x = local.comm, local.idents, PF2.pass2_extras(ev, local)
    got_c, got_i, got_x = rank_pass.partition_local(files)
    coded = {"name": "names", "op": "ops", "phase": "phases", "dtype": "dtypes"}
    assert set(got_c) == set(want_c)
    for k, v in want_c.items():
        if k in PL.DICTIONARIES:
            continue
        w, g = (want_c[coded[k]][v], got_c[coded[k]][got_c[k]]) if k in coded else (v, got_c[k])
        assert g.dtype == w.dtype or k in coded, (k, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w, err_msg=k)      # NaN equals NaN
    for want, got in ((want_i, got_i), (want_x, got_x)):
        assert set(got) == set(want)
        for k, v in want.items():
            assert got[k].dtype == v.dtype, k
            np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_ranks_whose_dictionaries_differ_merge_to_the_same_strings(tmp_path):
    """A rank whose passes hold their names, ops, phases and dtypes in another order (a rank that
    met them in another order) merges to the same string on every row: its codes are looked up in the
    merged dictionaries, while ranks whose entries keep their places have their codes taken as they are."""
    run = _copy(DATA / "zero2", tmp_path)
    files = R.rank_files(run)
    for r, f in files.items():
        assert rank_pass.write(r, f) is not None
    loaded = [rank_pass.load(r, f) for r, f in files.items()]
    want, _, _ = rank_pass._merged(loaded)
    head, packed = loaded[1]
    z = {k: packed[k] for k in packed}
    loaded[1] = (head, z)
    moved = 0
    for d, k in (("names", "name"), ("ops", "op"), ("phases", "phase"), ("dtypes", "dtype")):
        n = len(z[f"d_{d}"])
        if n > 1:       # the dictionary reversed, the codes with it: the same string on every row
            z[f"d_{d}"] = z[f"d_{d}"][::-1].copy()
            z[f"c_{k}"] = (n - 1 - z[f"c_{k}"].astype(np.int64)).astype(z[f"c_{k}"].dtype)
            moved += 1
    assert moved >= 2
    got, _, _ = rank_pass._merged(loaded)
    for d, k in (("names", "name"), ("ops", "op"), ("phases", "phase"), ("dtypes", "dtype")):
        np.testing.assert_array_equal(got[d], want[d])
        np.testing.assert_array_equal(got[d][got[k]], want[d][want[k]], err_msg=k)
        assert got[k].dtype == want[k].dtype, k


def test_a_pass_that_loads_but_does_not_merge_is_read_instead(tmp_path, reads):
    """A pass stamped for exactly its rank file and this code but missing part of its header (only a
    file this code did not write could be so): that partition is read, with the same numbers."""
    run = _copy(DATA / "ddp-2rank", tmp_path)
    files = R.rank_files(run)
    for r, f in files.items():
        assert rank_pass.write(r, f) is not None
    expected = summarize(run, jobs=1, target_events=1)
    p0 = rank_pass.path_of(files[0])
    data = p0.read_bytes()
    at = len(rank_pass._MAGIC)
    n = int.from_bytes(data[at:at + 8], "little")
    head = json.loads(data[at + 8:at + 8 + n])
    del head["wide"]
    text = json.dumps(head).encode()
    p0.write_bytes(rank_pass._MAGIC + len(text).to_bytes(8, "little") + text + data[at + 8 + n:])
    assert rank_pass.load(0, files[0]) is not None, "the stamp still matches"
    reads.clear()
    got = summarize(run, jobs=1, target_events=1)
    _equal(got, expected)
    assert reads == [[0]], "rank 0 read (pass 1 keeps its rows for pass 2), rank 1 from its pass"
    assert rank_pass.partition_local({0: files[0]}) is None and rank_pass.partition_pass1({0: files[0]}) is None
    assert rank_pass.partition_local({1: files[1]}) is not None
    # frames said to be packed by a codec no reader knows are never decompressed
    head = json_head(rank_pass.path_of(files[1]))
    assert head["codec"] == "lz4"
    p1 = rank_pass.path_of(files[1])
    data = p1.read_bytes()
    n = int.from_bytes(data[len(rank_pass._MAGIC):len(rank_pass._MAGIC) + 8], "little")
    text = json.dumps({**head, "codec": "brotli"}).encode()
    p1.write_bytes(rank_pass._MAGIC + len(text).to_bytes(8, "little") + text + data[len(rank_pass._MAGIC) + 8 + n:])
    assert rank_pass.load(1, files[1]) is None and rank_pass.partition_local({1: files[1]}) is None


def test_pass_1_leaves_the_second_frame_packed(tmp_path, monkeypatch, reads):
    """A kept pass is two LZ4 frames: pass 1 decompresses only the first (what it reads), pass 2 both.
    A second frame damaged after the file was written is found by pass 2, which reads that partition's
    events instead: the same numbers."""
    run = _copy(DATA / "ddp-2rank", tmp_path)
    files = R.rank_files(run)
    for r, f in files.items():
        assert rank_pass.write(r, f) is not None
    expected = summarize(run, jobs=1, target_events=1)
    unpacked = []
    real = rank_pass.pa.decompress

    def counted(buf, *a, **k):
        unpacked.append(k.get("decompressed_size"))
        return real(buf, *a, **k)
    with monkeypatch.context() as m:
        m.setattr(rank_pass.pa, "decompress", counted)
        assert rank_pass.partition_pass1(files) is not None
        first = list(unpacked)
        assert rank_pass.partition_local(files) is not None
    sizes = [json_head(rank_pass.path_of(f))["frames"] for f in files.values()]
    assert first == [fr[0][1] for fr in sizes], "pass 1: the first frame of each rank, nothing else"
    assert sorted(unpacked[len(first):]) == sorted(fr[k][1] for fr in sizes for k in (0, 1))
    assert all(fr[1][1] > 0 for fr in sizes)
    p0 = rank_pass.path_of(files[0])
    data = bytearray(p0.read_bytes())
    data[-40:] = bytes(40)                      # the end of the second frame
    p0.write_bytes(bytes(data))
    assert rank_pass.load(0, files[0]) is not None, "the first frame and the stamp are intact"
    reads.clear()
    _equal(summarize(run, jobs=1, target_events=1), expected)
    assert reads == [[0]], "pass 2 read rank 0's events; pass 1 and rank 1 used the kept passes"


def json_head(path: Path) -> dict:
    data = path.read_bytes()
    at = len(rank_pass._MAGIC)
    n = int.from_bytes(data[at:at + 8], "little")
    return json.loads(data[at + 8:at + 8 + n])


def test_summary_keep_passes_writes_the_missing_and_stale_ones(tmp_path, monkeypatch, reads):
    """`syncviz summary --keep-passes` on a run whose ranks kept no pass from this syncviz (one has none,
    one was written by other code, two are current): it writes exactly the two, says so on stderr,
    prints the report it prints without them, and the next summary reads no rank file."""
    run = _copy(DATA / "straggler", tmp_path)
    files = R.rank_files(run)
    expected = _cli("summary", "--fresh", str(run))
    for r in (0, 2):
        assert rank_pass.write(r, files[r]) is not None
    with monkeypatch.context() as m:
        m.setattr(rank_pass, "code_digest", lambda *packages: "other-code")
        assert rank_pass.write(3, files[3]) is not None
    stamps = {r: rank_pass.path_of(files[r]).stat().st_mtime_ns for r in (0, 2)}
    r = CliRunner().invoke(cli, ["summary", "--fresh", "--keep-passes", str(run), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    assert "2 ranks' first passes written" in r.stderr
    assert r.stdout == expected
    assert all(rank_pass.load(k, f) is not None for k, f in files.items())
    assert {k: rank_pass.path_of(files[k]).stat().st_mtime_ns for k in (0, 2)} == stamps, "current ones left alone"
    reads.clear()
    assert _cli("summary", "--fresh", str(run)) == expected and reads == []
    r = CliRunner().invoke(cli, ["summary", "--keep-passes", str(tmp_path / "nothing-here")])
    assert r.exit_code != 0 and "Traceback" not in r.output


def test_summary_says_when_kept_passes_would_halve_it(tmp_path, monkeypatch):
    """A summary that read PASS_HINT_EVENTS events or more from ranks that kept no first pass says, in
    one line on stderr, how many and what --keep-passes would save; not once the passes are kept, nor
    below the threshold; the report is the same either way."""
    from syncviz.trace import load_run
    from syncviz.views import summary as SV
    run = _copy(DATA / "straggler", tmp_path)
    n = len(load_run(run).events)          # every event of every rank
    monkeypatch.setattr(SV, "PASS_HINT_EVENTS", n)
    r = CliRunner().invoke(cli, ["summary", "--fresh", str(run), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    assert f"read {n:,} events from rank files that kept no first pass" in r.stderr and "--keep-passes" in r.stderr
    expected = r.stdout
    monkeypatch.setattr(SV, "PASS_HINT_EVENTS", n + 1)
    r = CliRunner().invoke(cli, ["summary", "--fresh", str(run), "--jobs", "1"])
    assert r.stdout == expected and "--keep-passes" not in r.stderr
    monkeypatch.setattr(SV, "PASS_HINT_EVENTS", 1)
    r = CliRunner().invoke(cli, ["summary", "--fresh", "--keep-passes", str(run), "--jobs", "1"])
    assert r.exit_code == 0 and r.stdout == expected and "events from rank files" not in r.stderr
    r = CliRunner().invoke(cli, ["summary", "--fresh", str(run), "--jobs", "1"])
    assert r.stdout == expected and "events from rank files" not in r.stderr


def test_kept_passes_are_keyed_on_the_code_that_decides_them():
    """A pass is trusted under the digest of syncviz/analysis and syncviz/trace only (rank_pass.CODE),
    so that holds only while their code imports nothing else of syncviz's: every import checked."""
    import ast
    import syncviz
    from syncviz.codedigest import code_digest
    root = Path(syncviz.__file__).parent
    allowed = {f"syncviz.{p}" for p in rank_pass.CODE} | {"syncviz.codedigest"}
    outside = []
    for pkg in rank_pass.CODE:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "syncviz":
                    mods = [node.module] if node.module != "syncviz" else \
                        [f"syncviz.{a.name}" for a in node.names if a.name != "__version__"]
                elif isinstance(node, ast.Import):
                    mods = [a.name for a in node.names if a.name.split(".")[0] == "syncviz"]
                else:
                    continue
                outside += [f"{path.relative_to(root)}: {m}" for m in mods
                            if not any(m == a or m.startswith(a + ".") for a in allowed)]
    assert not outside, outside
    assert code_digest(*rank_pass.CODE) not in (code_digest(), code_digest("analysis"), code_digest("trace"))


def test_identities_of_ranks_that_made_the_same_calls_are_the_first_ranks(tmp_path):
    """partition_local.identities with the ranks' row counts: where every rank's identity columns
    equal the first rank's, the first rank's numbering repeated; where one value differs, or the
    ranks' counts do, the rows grouped as a whole. Both equal the numbering without the counts, and
    so does each identity's first row in launch order, where the first rank launched its calls in
    another order than the others."""
    from syncviz.analysis import partition_local as PL
    run = _copy(DATA / "straggler", tmp_path)
    files = R.rank_files(run)
    for r, f in files.items():
        assert rank_pass.write(r, f) is not None
    c, _, x = rank_pass.partition_local(files)
    n = len(c["step"])
    blocks = [n // len(files)] * len(files)
    assert sum(blocks) == n and PL._same_calls(c, blocks) is not None

    def numbered(c, blocks, order):
        c = dict(c)
        idents = PL.identities(c, order, blocks)
        return c["ident"], idents
    for change in (None, "name", "occurrence", "counts", "launch order"):
        cc, bb, order = dict(c), list(blocks), x["order"]
        if change in ("name", "occurrence"):
            cc[change] = c[change].copy()
            cc[change][n - 1] += 1          # the last rank's last call differs
        elif change == "counts":
            bb = [blocks[0] - 1, blocks[1] + 1] + blocks[2:]
        elif change == "launch order":       # the first rank's calls launched in reverse
            order = order.copy()
            order[:blocks[0]] = order[:blocks[0]][::-1]
        assert (PL._same_calls(cc, bb) is None) == (change not in (None, "launch order")), change
        got, want = numbered(cc, bb, order), numbered(cc, None, order)
        np.testing.assert_array_equal(got[0], want[0], err_msg=str(change))
        for k in want[1]:
            np.testing.assert_array_equal(got[1][k], want[1][k], err_msg=f"{change}: {k}")


def test_close_integers_are_kept_as_differences_and_read_back_exactly(tmp_path):
    """rank_pass_file keeps a long integer column whose differences pack smaller as those differences
    (timestamps, row positions), and reads every column back bit for bit: values near the type's ends
    (whose differences wrap), unsigned and narrow types, floats, short and 2-D arrays as they are."""
    from syncviz.analysis import rank_pass_file as RF
    rng = np.random.default_rng(4)
    n = 20_000
    launch = np.cumsum(rng.integers(1_000, 90_000, n)) + (1 << 60)
    arrays = {"launch": launch, "order": np.arange(n, dtype=np.int32),
              "wraps": np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, -1, 0] * (n // 4), dtype=np.int64),
              "crossing": np.iinfo(np.int64).max - 5_000 + 7 * np.arange(n, dtype=np.int64),   # runs past the top
              "u16": np.cumsum(rng.integers(0, 3, n)).astype(np.uint16), "i8": (np.arange(n) % 100).astype(np.int8),
              "noise": rng.integers(-(1 << 62), 1 << 62, n), "floats": np.cumsum(rng.random(n)),
              "short": np.arange(10, dtype=np.int64), "grid": np.arange(4 * n, dtype=np.int64).reshape(n, 4),
              "empty": np.zeros(0, dtype=np.int64)}
    path = tmp_path / "p.pass1"
    with open(path, "wb") as fh:
        RF.write_file(fh, {"x": 1}, arrays, lambda k: k in ("noise", "grid"))
    head, packed = RF.read_file(path)
    kept = RF.Packed(head, packed)
    delta = {k: d for k, *_, d in head["arrays"]}
    assert delta["launch"] == 1 and delta["order"] == 1           # what the differences are for
    assert delta["crossing"] == 1 and arrays["crossing"][-1] < 0      # differences that wrap, summed back
    assert delta["noise"] == 0 and delta["floats"] == 0 and delta["short"] == 0 and delta["grid"] == 0
    for k, v in arrays.items():
        got = kept[k]
        assert got.dtype == v.dtype and got.shape == v.shape and np.array_equal(got, v), k
    as_they_are = b"".join(np.ascontiguousarray(v).tobytes() for k, v in arrays.items() if k not in ("noise", "grid"))
    assert head["frames"][0][0] < 0.8 * len(RF.pa.compress(as_they_are, codec=RF.CODEC, asbytes=True))
    # a frame of nothing but regular columns packs past 64:1 and is still read (not taken for damage)
    regular = {"order": np.arange(1 << 21, dtype=np.int64), "step": np.repeat(np.arange(1 << 11), 1 << 10)}
    with open(path, "wb") as fh:
        RF.write_file(fh, {}, regular, lambda k: False)
    head, packed = RF.read_file(path)
    assert head["frames"][0][1] > 64 * head["frames"][0][0] + (1 << 20)
    kept = RF.Packed(head, packed)
    assert all(np.array_equal(kept[k], v) for k, v in regular.items())
