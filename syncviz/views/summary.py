"""``syncviz summary RUN``: a terminal report of a recorded run (rich tables) or ``--json``.
Every number comes from syncviz.analysis; this module only lays them out."""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import click
import pandas as pd
from rich.console import Console
from rich.table import Table

from syncviz import analysis as A
from syncviz.analysis import jsonrows
from syncviz.analysis.partitioned import SummaryTables
from syncviz.trace import Run, TraceError, load_run, warn_problems
from syncviz.views import refuse_with_whole
from syncviz.views import runcache as RC


def _f(x, fmt="{:.2f}", none="–"):
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return none
    return fmt.format(x)


def _mb(b) -> str:
    return f"{b / 1e6:.2f}"


# A run of many steps prints a step table of its first and last steps and the slowest between them
# (a 10^8-event run's 781 rows took 2.5 s to lay out and ~800 lines of terminal); --all-steps, --json
# and the dashboard have every step.
STEP_ROWS = 30
STEP_ENDS = 10
STEP_SLOWEST = 5


def shown_steps(table: pd.DataFrame, every: bool = False) -> tuple[list[int], str]:
    """Positions of ``table``'s rows the step table prints (all, or the first and last STEP_ENDS and
    the STEP_SLOWEST slowest between them, by mean step time) and what its title says of them."""
    n = len(table)
    if every or n <= STEP_ROWS:
        return list(range(n)), ""
    ends = set(range(STEP_ENDS)) | set(range(n - STEP_ENDS, n))
    between = table["step_ns"].iloc[STEP_ENDS:n - STEP_ENDS]
    slow = between.reset_index(drop=True).sort_values(ascending=False, kind="stable", na_position="last")
    keep = sorted(ends | {int(i) + STEP_ENDS for i in slow.index[:STEP_SLOWEST]})
    return keep, (f"; {len(keep)} of {n} steps: the first and last {STEP_ENDS} and the {STEP_SLOWEST} slowest "
                  "between them (--all-steps: every step)")


def step_table(table: pd.DataFrame, every: bool = False) -> Table:
    rows, note = shown_steps(table, every)
    t = Table(title=f"Per step (mean over ranks; overlap % and comp/comm from those means; times in ms{note})",
              title_justify="left")
    evals = bool((table["eval_ns"] > 0).any())
    columns = ("step", "time", "fwd", "bwd", "opt") + (("eval",) if evals else ()) + (
        "comm", "exposed", "overlap%", "comp/comm", "MB")
    for c in columns:
        t.add_column(c, justify="right")
    for before, at in zip([-1] + rows, rows):
        if at > before + 1:         # steps left out here
            t.add_row("⋮", *[""] * (len(columns) - 1))
        r = table.iloc[at]
        t.add_row(str(int(r["step"])), _f(r["step_ns"] / 1e6), _f(r["forward_ns"] / 1e6), _f(r["backward_ns"] / 1e6),
                  _f(r["optimizer_ns"] / 1e6), *((_f(r["eval_ns"] / 1e6),) if evals else ()),
                  _f(r["comm_busy_ns"] / 1e6), _f(r["exposed_ns"] / 1e6),
                  _f(r["overlap_pct"], "{:.0f}"), _f(r["compute_comm_ratio"]), _mb(r["bytes"]))
    return t


def bucket_table(table: pd.DataFrame) -> Table:
    t = Table(title="Per bucket (median over headline steps and ranks; hook = comm-hook entry → collective call; "
              "queue = call → service start, "
              "of it waiting for peers; service = service start → done; bandwidths on service time)",
              title_justify="left")
    for c in ("layout", "bucket", "params", "MB", "dtype", "delay ms", "hook ms", "queue ms", "peers ms", "service ms",
              "algbw GB/s", "busbw GB/s", "exposed ms"):
        t.add_column(c, justify="right")
    for (layout, bucket), r in table.iterrows():
        t.add_row(str(layout), str(bucket), str(r["params"]), _mb(r["bytes"]), r["dtype"],
                  _f(r["launch_delay_ns"] / 1e6), _f(r["hook_to_launch_ns"] / 1e6), _f(r["queue_ns"] / 1e6),
                  _f(r["wait_peers_ns"] / 1e6),
                  _f(r["duration_ns"] / 1e6), _f(r["algbw_gbps"], "{:.3f}"),
                  _f(r["busbw_gbps"], "{:.3f}"), _f(r["exposed_ns"] / 1e6))
    return t


def collective_table(table: pd.DataFrame) -> Table:
    t = Table(title="Collectives per step (all torch.distributed calls, mean over rank-steps; exposed time "
              "attributed once)", title_justify="left")
    for c in ("phase", "op", "calls/step", "MB/step", "service ms/step", "exposed ms/step", "queue ms", "busbw GB/s"):
        t.add_column(c, justify="right")
    for (phase, op), r in table.iterrows():
        t.add_row(phase, op, _f(r["calls"], "{:.1f}"), _mb(r["bytes"]), _f(r["duration_ns"] / 1e6),
                  _f(r["exposed_ns"] / 1e6), _f(r["queue_ns"] / 1e6), _f(r["busbw_gbps"], "{:.3f}"))
    return t


def straggler_table(s: dict) -> Table:
    t = Table(title="Who launched last (collectives seen on every rank; headline steps)", title_justify="left")
    for c in ("rank", "last", "of", "last %", "mean late ms", "others waited ms/step"):
        t.add_column(c, justify="right")
    for r in s["stragglers"]:
        t.add_row(str(r["rank"]), str(r["last"]), str(r["events"]), _f(r["last_pct"], "{:.0f}"),
                  _f(r["mean_late_ms"], "{:.3f}"), _f(r["waited_for_ms_per_step"]))
    return t


def whole_run_tables(run: Run) -> SummaryTables:
    """The summary's tables from a run loaded whole (load_run): the reference the partitioned path
    (analysis.partitioned.summarize, the default for ``syncviz summary``) must equal."""
    s = A.run_summary(run)
    steps = A.step_metrics(run)
    comm = A.comm_metrics(run, kinds=("bucket", "collective"))
    hsteps = set(s["headline_steps"])
    buckets = comm[(comm["kind"] == "bucket") & comm["step"].isin(hsteps)]
    coll = comm[(comm["kind"] == "collective") & comm["step"].isin(hsteps)]
    return SummaryTables(path=run.path, meta=run.meta, layouts=run.layouts, problems=run.problems, summary=s,
                         steps=steps, step_table=A.step_table(run) if len(steps) else pd.DataFrame(),
                         bucket_table=A.bucket_layout_table(buckets, run.layouts) if len(buckets) else pd.DataFrame(),
                         collective_table=A.collective_table(coll) if len(coll) else pd.DataFrame(),
                         offload=A.offload_table(run, s["headline_steps"]) if s.get("offload_ms") else pd.DataFrame(),
                         incomplete_ranks=run.incomplete_ranks)


def print_summary(run: Run | SummaryTables, console: Console | None = None, all_steps: bool = False) -> dict:
    """Print the report of a loaded run (Run) or of partitioned.summarize's tables (``all_steps``:
    every row of the step table, however many; else see STEP_ROWS)."""
    tabs = run if isinstance(run, SummaryTables) else whole_run_tables(run)
    # Wide enough for the tables when piped (rich assumes 80 columns without a terminal).
    console = console or Console(width=None if sys.stdout.isatty() else 130)
    s = tabs.summary
    m = tabs.meta
    model = m.get("model") or {}
    ddp = m.get("ddp") or {}
    console.print(f"[bold]{s['name']}[/]  {tabs.path}")
    console.print(f"strategy {s['strategy']} · engine {s['engine']} · {s['world_size']} ranks on "
                  f"{m.get('nodes', 1)} node(s) · backend {m.get('backend', '?')} · device {m.get('device', '?')}")
    if model:
        console.print(f"model {model.get('name', '?')}: {model.get('params', 0) / 1e6:.2f} M params, "
                      f"{model.get('grad_bytes', 0) / 1e6:.2f} MB of gradients")
    if ddp:
        console.print(f"DDP: bucket cap {ddp.get('bucket_cap_mb')} MB (first {ddp.get('first_bucket_cap_mb')} MB), "
                      f"comm hook {ddp.get('comm_hook')}, gradient_as_bucket_view {ddp.get('gradient_as_bucket_view')}")
    ds = m.get("deepspeed") or {}
    if ds:
        console.print(f"DeepSpeed {ds.get('version')}: ZeRO stage {ds.get('stage')}, offload optimizer "
                      f"{ds.get('offload_optimizer')} / params {ds.get('offload_param')}, reduce bucket "
                      f"{ds.get('reduce_bucket_size'):,} elements, overlap_comm {ds.get('overlap_comm')}, "
                      f"{ds.get('precision')}, {ds.get('optimizer')}", highlight=False)
    ranks = m.get("ranks") or []
    if ranks:
        worst = max(ranks, key=lambda r: abs(r.get("clock_error_ns", 0)))
        console.print(f"clocks aligned to rank 0: max error bound {worst.get('clock_error_ns', 0) / 1e3:.1f} µs")
    for p in s["problems"]:
        console.print(f"[yellow]warning:[/] {p}")
    if not len(tabs.steps):
        console.print("[red]No complete step recorded.[/]")
        return s
    console.print(step_table(tabs.step_table, all_steps))
    if len(tabs.bucket_table):
        console.print(bucket_table(tabs.bucket_table))
    if len(tabs.collective_table):
        console.print(collective_table(tabs.collective_table))
    if s["top_exposed"]:
        t = Table(title="Top exposed communication", title_justify="left")
        for c in ("what", "MB", "exposed ms/step", "exposed ms/event", "share of exposed", "after backward"):
            t.add_column(c, justify="right")
        for e in s["top_exposed"]:
            what = f"bucket {e['bucket']}" if e["kind"] == "bucket" else f"{e['op']} ({e['name']})"
            t.add_row(what, _mb(e["bytes"]), _f(e["exposed_ms_per_step"]), _f(e["exposed_ms_per_event"]),
                      f"{e['exposed_share_pct']:.0f}%", f"{e['after_backward_pct']:.0f}%")
        console.print(t)
    if s["stragglers"]:
        console.print(straggler_table(s))
    hs = s["headline_steps"]
    console.print(f"Headline ({s['aggregate']}: {hs[0]}–{hs[-1]}): step {_f(s['step_ms'])} ms, comm busy "
                  f"{_f(s['comm_busy_ms'])} ms, exposed {_f(s['exposed_ms'])} ms ({_f(s['exposed_pct'], '{:.0f}')}%), "
                  f"overlap {_f(s['overlap_pct'], '{:.0f}')}%; per collective (median): queue {_f(s['queue_ms'])} ms, "
                  f"service {_f(s['service_ms'])} ms, busbw {_f(s['busbw_gbps'], '{:.3f}')} GB/s")
    if s.get("offload_ms"):
        parts = ", ".join(f"{r.name} {r.ms_per_step:.2f}" for r in tabs.offload.itertuples())
        console.print(f"Offloading (inside compute): {_f(s['offload_ms'])} ms per step ({parts})", highlight=False)
    console.print(f"[bold]Verdict:[/] {s['verdict']}")
    return s


def write_json(run: Run | SummaryTables, out=None) -> None:
    """``syncviz summary --json``: the headline (run_summary's dict), ``steps_table`` (step_metrics
    rows), ``buckets_table`` (bucket_metrics rows less the name; one per bucket event) and ``meta``.
    From a loaded run, or from summarize(..., json_dir=) whose workers wrote the bucket rows: the two
    print the same bytes (analysis.jsonrows), the second in memory bounded by one partition."""
    out = out or sys.stdout
    if isinstance(run, SummaryTables):
        s, steps, buckets = run.summary, run.steps, run.bucket_json
    else:
        s, steps, buckets = A.run_summary(run), A.step_metrics(run), [A.bucket_metrics(run).drop(columns=["name"])]
    marks = {"steps_table": "\x00steps\x00", "buckets_table": "\x00buckets\x00"}
    head = json.dumps(_clean({**s, **marks, "meta": run.meta}), indent=1, default=str)
    before, rest = head.split(json.dumps(marks["steps_table"]))
    middle, after = rest.split(json.dumps(marks["buckets_table"]))
    out.write(before)
    jsonrows.array(out, [steps])
    out.write(middle)
    jsonrows.array(out, buckets)
    out.write(after + "\n")


@click.command("summary", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: the headline, the per-step table and "
              "the per-bucket table (a row per bucket event: large for big runs; written piece by piece).")
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Worker processes for the report, one partition of ranks each at a time [CPU count].")
@click.option("--whole", is_flag=True, help="Load the whole run into memory at once (the former way; same numbers, "
              "memory grows with the run). Default: by partitions of ranks, memory bounded by one partition.")
@click.option("--dask", "dask_address", metavar="ADDRESS|local", default=None,
              help="Run the partitions on a Dask cluster: a scheduler address (tcp://host:8786) or 'local' (a LocalCluster "
              "of --jobs worker processes). For runs beyond one machine: the workers read the rank files themselves, so the "
              "run directory and --scratch must be on a filesystem they share, at the same path. Needs dask[distributed].")
@click.option("--scratch", type=click.Path(file_okay=False), default=None,
              help="Directory for the summary's scratch files (a few MB per partition) [system temp dir]; with a remote "
              "--dask cluster, one every worker can write to.")
@click.option("--fresh", is_flag=True, help="Summarize the rank files again even where the run's cache "
              "(.syncviz-cache, left by `syncviz trace` or an earlier summary) holds the report for exactly these "
              "files and this syncviz. Without it (and without --json or --dask) such a report is printed from the cache, "
              "with a line on stderr saying so.")
@click.option("--all-steps", is_flag=True, help=f"Print every step's row. Default: a run of more than {STEP_ROWS} "
              f"steps prints its first and last {STEP_ENDS} and the {STEP_SLOWEST} slowest between them (--json has "
              "every step).")
@click.option("--keep-passes", is_flag=True, help="First write each rank's first pass where the run keeps none from "
              "this syncviz (.syncviz-cache/ranks: a run recorded by an older syncviz, or whose ranks kept none), so that "
              "this and every later summary combine those instead of reading every event (about half the time on a big "
              "run). Costs ~0.1 s of CPU a rank per 100,000 events, once.")
def summary_command(run, as_json, jobs, whole, dask_address, scratch, fresh=False, all_steps=False, keep_passes=False):
    """Per-step and per-bucket report of a recorded run (RUN is its directory)."""
    refuse_with_whole(whole, keep_passes=keep_passes, dask=dask_address is not None, scratch=scratch is not None,
                      jobs=jobs is not None)
    if keep_passes:                 # (with --whole refused above)
        _keep_passes(run, jobs)
    if whole:
        r = load_run(run)
        if as_json:
            warn_problems(r)
            write_json(r)
        else:
            print_summary(r, all_steps=all_steps)
    else:
        def progress(msg):
            if sys.stderr.isatty():
                click.echo(f"syncviz summary: {msg}", err=True)
        from syncviz.trace.read import read_meta
        read_meta(run)              # a wrong path is one line (before any cluster starts)
        sig = RC.signature(Path(run))
        # a kept report, unless asked to compute (--json's bucket rows are not kept; --dask names where to)
        kept = None if as_json or fresh or dask_address is not None else RC.kept_report(run, sig)
        if kept is not None:
            click.echo(f"syncviz summary: printed from {Path(run) / RC.CACHE_DIR}, kept for exactly these files "
                       "(--fresh summarizes them again)", err=True)
            print_summary(kept, all_steps=all_steps)
            return
        with contextlib.ExitStack() as stack:
            # --json: the workers write the bucket rows as JSON text here (a place they all reach)
            json_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="syncviz-json-", dir=scratch)) \
                if as_json else None
            # what the dashboard's Replay keeps of every rank (moved into the run's cache by put_summary)
            replay_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="syncviz-replay-", dir=scratch))
            opts = dict(jobs=jobs, progress=progress, scratch=scratch, json_dir=json_dir,
                        json_room=json_room(json_dir) if as_json else None)
            if dask_address is None:
                tables = RC.summarize_to_keep(run, replay_dir, **opts)
            else:
                from syncviz.analysis.cluster import ClusterError, dask_executor
                try:
                    with dask_executor(dask_address, jobs) as (executor, where):
                        progress(f"on {where}")
                        tables = RC.summarize_to_keep(run, replay_dir, executor=executor, **opts)
                except ClusterError as e:
                    raise click.UsageError(str(e)) from None
            if as_json:
                warn_problems(tables)
                write_json(tables)
            else:
                print_summary(tables, all_steps=all_steps)
            _hint_keep_passes(run, tables)
            # what the dashboard needs to open this run without reading it whole (views/runcache.py)
            if RC.put_summary(run, tables, sig):
                progress(f"kept the summary for `syncviz dash` in {Path(run) / RC.CACHE_DIR}")


# A run whose ranks kept no first pass from this syncviz (recorded by another version, or a recording
# that did not close) is summarized from every event: benchmarks/scale.py's 10^8-event DDP run in 92.8 s,
# against 48.0 s from its kept passes (session 39). Worth a line from this many events read that way.
PASS_HINT_EVENTS = 5_000_000


def _hint_keep_passes(run, tables) -> None:
    """One line on stderr when the summary read at least PASS_HINT_EVENTS events from rank files
    whose ranks kept no first pass: what --keep-passes would save."""
    if tables.events_read >= PASS_HINT_EVENTS:
        click.echo(f"syncviz summary: read {tables.events_read:,} events from rank files that kept no first pass "
                   f"from this syncviz (recorded by another version, or the recording did not close); "
                   f"`syncviz summary --keep-passes {run}` writes those passes once, and later summaries of "
                   f"this run take about half the time", err=True)


def _keep_passes(run, jobs) -> None:
    """--keep-passes: the ranks' first passes written where missing or stale, one line on stderr."""
    import time

    from syncviz.analysis import rank_pass
    from syncviz.trace.read import read_meta
    read_meta(run)                  # a wrong path is one line, before any worker starts
    click.echo("syncviz summary: writing each rank's first pass where the run keeps none from this syncviz ...", err=True)
    t0 = time.monotonic()
    n = rank_pass.write_run(run, jobs, missing_only=True)
    click.echo(f"syncviz summary: {n:,} ranks' first passes written in {time.monotonic() - t0:.1f} s "
               f"({Path(run) / RC.CACHE_DIR / rank_pass.DIR})", err=True)


# Room left on the disk after --json's pieces (and its output, where that file shares the disk): the
# system and other programs keep working while the summary finishes.
JSON_RESERVE_BYTES = 256 << 20


def json_room(json_dir: str):
    """The check ``summarize(json_room=)`` calls after each JSON piece: stop with one line, before the
    disk is full, when the pieces still to come (and stdout's copy of them all, where stdout is a file
    on the same disk) will not fit in the free space of ``json_dir``'s disk."""
    out_too = _file_on_same_disk(sys.stdout, json_dir)

    def check(total: int, written: int) -> None:
        need = total - written + (total if out_too else 0)
        free = free_bytes(json_dir)
        if need > free - JSON_RESERVE_BYTES:
            where = str(Path(json_dir).parent)
            raise TraceError(
                f"summary --json: the bucket rows come to ~{_gb(total)} of JSON (projected from the {_gb(written)} "
                f"written so far), written once to a scratch folder in {where}"
                + (" and again to stdout's file on that disk" if out_too else "")
                + f"; {_gb(free)} free there, {_gb(JSON_RESERVE_BYTES)} of it left to the system: stopped before "
                "the disk is full (--scratch DIR puts the pieces on another disk)")
    return check


def free_bytes(path: str) -> int:
    """Free bytes on ``path``'s disk. SYNCVIZ_FREE_BYTES, when set, is taken instead: tests use it to
    stand for a nearly full disk, which a test cannot make of the machine's own."""
    override = os.environ.get("SYNCVIZ_FREE_BYTES")
    if override:
        return int(override)
    return shutil.disk_usage(path).free


def _file_on_same_disk(stream, path: str) -> bool:
    try:
        st = os.fstat(stream.fileno())
        return stat.S_ISREG(st.st_mode) and st.st_dev == os.stat(path).st_dev
    except (OSError, ValueError, AttributeError):
        return False       # a pipe, a terminal, a stream with no file


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _clean(o):
    """NaN/inf are not JSON: write them as null."""
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_clean(v) for v in o]
    return o
