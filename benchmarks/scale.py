"""Analysis on big runs: `syncviz summary` by partitions of ranks (the default) beside the former
whole-run path (`--whole`), on simulated runs of 10^6, 10^7 (and 10^8) events; also the dashboard's
data layer (first open of the Replay page's step, one step change), a Perfetto export of the
whole run where it fits and of two steps (``--steps``) at every size.

    python benchmarks/scale.py                          # 1e6 and 1e7 events
    python benchmarks/scale.py --sizes 1e6,1e7,1e8      # 1e8: ~5 GB of trace, minutes
    python benchmarks/scale.py --jobs 2 --whole-max 2e7 --dashboard-max 1.1e7
    python benchmarks/scale.py --sizes 1e8 --skip-views --kind ddp   # a DDP run: 121 buckets a step
    python benchmarks/scale.py --baseline /tmp/base   # + the partitioned summary of another checkout
                                                      # (e.g. `git archive main | tar -x -C /tmp/base`)

Each size also times `syncviz compare --json`, `syncviz summary --json`, `syncviz export tensorboard`
and `syncviz export html` by partitions (the default) and with --whole, and checks that both give the
same bytes (TensorBoard's event files hold their own write times: tests compare their contents).

The summary is timed twice: with the ranks' own first passes kept beside the run (what `syncviz
trace` and `syncviz simulate` write for a run this big: analysis/rank_pass.py; their cost is timed
on its own first) and without them (every event read, as for a run an older syncviz recorded).

Each measurement is a fresh process: wall time, CPU time (user + system of it and its workers; the
system part also on its own, "sys": on these VMs it is mostly memory the guest gave back to the host
being faulted in again, README "Timing on these machines"), peak memory (the sum of the resident
sizes of the process and its workers, sampled every 50 ms: shared library pages count once per
process, so this over-states a little) and the 1-minute load average before and after, since this
machine's cores are shared. "same" says whether the partitioned summary printed exactly what --whole
printed. Targets (issue 17): 10^8 events summarized in <= 30 s within <= 4 GB; dashboard first open
<= 3 s and step change <= 200 ms.
Runs are cached under --dir and reused when their shape matches.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from syncviz.dashboard.data.store import default_max_run_bytes

EVENTS_PER_RANK_STEP = 407          # llama70b-1024 preset (ZeRO-3): 4,167,680 events for 1,024 ranks x 10 steps
# --kind: which simulated run. zero3 is the llama70b-1024 preset; ddp is the same 70B model under DDP
# with 700 MiB buckets and no gradient-ready rows (121 buckets a step, nearly every event a bucket row:
# 125 events a rank-step), the shape whose 10^8-event summary missed the 30 s target (59 s, session 28)
KINDS = {
    "zero3": (EVENTS_PER_RANK_STEP, "llama70b", ["--preset", "llama70b-1024"]),
    "ddp": (125, "ddp70b", ["--model", "llama-70b", "--strategy", "ddp", "--bucket-cap-mb", "700",
                            "--grad-ready", "none"]),
}
KIND = "zero3"                      # set from --kind in main()
PY = sys.executable
HERE = Path(__file__).resolve().parent.parent

DASH = r"""
import json, sys, time
from syncviz.dashboard.data.store import RunStore
from syncviz.dashboard.data.stepview import STEP_TABLES
from syncviz.dashboard.figures.timeline import GL_LANES
root, name = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
store = RunStore(root)
run = store.get(name)
keys = STEP_TABLES["ranks" if len(run.ranks) <= GL_LANES else "spread"]    # what the Replay draws ("auto")
start = run.start_step
view = run.step_view(start)
for k in keys:
    view.get(k)
t1 = time.perf_counter()
view = run.step_view(start + 1)
for k in keys:
    view.get(k)
t2 = time.perf_counter()
mid = int(run.step_list[len(run.step_list) // 2])      # a jump: the reader goes further into each file
view = run.step_view(mid)
for k in keys:
    view.get(k)
t3 = time.perf_counter()
# a run read one step at a time: what the Replay page starts after each draw (LoadedRun.prefetch_neighbours)
# while the user looks at the step; then the next step
run.prefetch_neighbours(mid, keys)
while run.read_ahead.busy:
    time.sleep(0.02)
t4 = time.perf_counter()
view = run.step_view(mid + 1)
for k in keys:
    view.get(k)
t5 = time.perf_counter()
print(json.dumps({"open_s": t1 - t0, "step_ms": 1e3 * (t2 - t1), "jump_ms": 1e3 * (t3 - t2), "jump_to": mid,
                  "whole": not run.partial, "prefetch_s": t4 - t3 if run.partial else None,
                  "prefetched_ms": 1e3 * (t5 - t4) if run.partial else None}))
"""


def shape(events: float) -> tuple[int, int]:
    """(ranks, steps) of a run of KIND with about ``events`` events."""
    ranks = 1024 if events >= 4e6 else 256
    return ranks, max(2, round(events / (ranks * KINDS[KIND][0])))


def simulate(root: Path, events: float) -> tuple[Path, int]:
    ranks, steps = shape(events)
    run = root / f"{KINDS[KIND][1]}-{ranks}x{steps}-b1"
    if not (run / "run.json").exists():
        shutil.rmtree(run, ignore_errors=True)
        print(f"simulating {ranks} ranks x {steps} steps -> {run}", flush=True)
        # one record batch per step, as `syncviz trace` writes (the simulator's default above 20,000
        # rank-steps packs up to 127 steps in a batch, which a reader of one step must decode whole)
        # SYNCVIZ_RANK_PASS=never: the ranks' own first passes are written (and timed) by ``rank_passes``
        subprocess.run([PY, "-m", "syncviz", "simulate", *KINDS[KIND][2], "--world-size", str(ranks),
                        "--steps", str(steps), "--steps-per-batch", "1", "--out", str(run)], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "SYNCVIZ_RANK_PASS": "never"})
    import pyarrow as pa
    n = 0
    for p in run.glob("rank-*.arrow"):
        with pa.OSFile(str(p)) as f:
            n += sum(b.num_rows for b in pa.ipc.open_stream(f))
    return run, n


RANK_PASSES = r"""
import sys
from syncviz.analysis import rank_pass
print(rank_pass.write_run(sys.argv[1]))
"""


def rank_passes(run: Path, timeout: float) -> tuple[dict, int]:
    """Write every rank's first pass (what each rank of a traced run writes when it closes: record.recorder,
    analysis.rank_pass) afresh; its cost and the bytes they take. On a real run each rank spends its
    share on its own CPU; here all of it is on this machine's."""
    shutil.rmtree(_ranks_dir(run), ignore_errors=True)
    m = measure([PY, "-c", RANK_PASSES, str(run)], timeout, cwd=str(HERE))
    return m, sum(p.stat().st_size for p in _ranks_dir(run).glob("*"))


def _ranks_dir(run: Path) -> Path:
    from syncviz.analysis import rank_pass
    return run / ".syncviz-cache" / rank_pass.DIR


def machine_line() -> str:
    """The CPU, and how fast it sorts and selects (spill.sorting_speed): figures from different machines
    are not comparable. numpy's sort of int32 ran ~12x slower on an AMD EPYC of family 25 (session 38)
    than on the machine of sessions 31-37, and the 10^8-event DDP summary's medians, then sorted, took
    16.7 s there against 3.7 s."""
    from syncviz.analysis import spill
    cpu = "?"
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines()[:30] if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        cpu = f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    except OSError:
        pass
    speed = spill.sorting_speed()
    way = "selected" if speed["select"] < speed["sort"] else "sorted"
    return (f"CPU: {cpu}; 2^18 int32 sorted in {speed['sort'] * 1e3:.1f} ms, their middle selected in "
            f"{speed['select'] * 1e3:.1f} ms: the summary's medians are {way}")


def measure(cmd: list[str], timeout: float, out: Path | None = None, cwd: str | None = None) -> dict:
    """Run ``cmd``; wall, CPU, peak RSS of its process tree, load average; stdout to ``out``.
    ``cwd``: a checkout whose syncviz `python -m syncviz` then imports (it comes first on sys.path)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(out or os.devnull, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.PIPE, cwd=cwd)
        proc, peak, status = psutil.Process(p.pid), 0, "ok"
        while p.poll() is None:
            rss = 0
            try:
                for q in [proc] + proc.children(recursive=True):
                    rss += q.memory_info().rss
            except psutil.Error:
                pass
            peak = max(peak, rss)
            if time.perf_counter() - t0 > timeout:
                for q in proc.children(recursive=True) + [proc]:
                    try:
                        q.kill()
                    except psutil.Error:
                        pass
                status = f"killed after {timeout:.0f} s"
            time.sleep(0.05)
        err = p.stderr.read().decode(errors="replace")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    sys_s = after.ru_stime - before.ru_stime
    cpu = (after.ru_utime - before.ru_utime) + sys_s
    if p.returncode and status == "ok":
        status = f"exit {p.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    return {"wall_s": wall, "cpu_s": cpu, "sys_s": sys_s, "peak_gb": peak / 1e9, "load": (load0, os.getloadavg()[0]),
            "status": status}


def row(label: str, events: int, m: dict | None, note: str = "") -> None:
    if m is None:
        print(f"{label:<34} {events / 1e6:>8.1f} M  {'—':>8} {'—':>8} {'—':>8} {'—':>8}  {'':>11}  {note}", flush=True)
        return
    ok = "" if m["status"] == "ok" else f"  [{m['status']}]"
    print(f"{label:<34} {events / 1e6:>8.1f} M  {m['wall_s']:>7.1f}s {m['cpu_s']:>7.1f}s {m['sys_s']:>7.1f}s {m['peak_gb']:>6.2f}GB  "
          f"{m['load'][0]:>4.1f}→{m['load'][1]:<4.1f}  {note}{ok}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="event counts, comma separated [1e6,1e7]")
    ap.add_argument("--dir", default="/tmp/syncviz-scale", help="where the simulated runs are cached")
    ap.add_argument("--jobs", type=int, default=None, help="summary worker processes [CPU count]")
    ap.add_argument("--whole-max", type=float, default=2e7,
                    help="largest run for the whole-run path (15.4 M events took 7.1 GB) [2e7]")
    ap.add_argument("--dashboard-max", type=float, default=1.1e7,
                    help="largest run for the dashboard data layer (it holds the whole Arrow table) [1.1e7]")
    ap.add_argument("--perfetto-max", type=float, default=1.1e6,
                    help="largest run to export whole to Perfetto (a 2-step export, --steps, runs at every size) [1.1e6]")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per measurement [900]")
    ap.add_argument("--baseline", action="append", default=[],
                    help="a checkout of former code (its repository root): its partitioned summary runs beside this one, "
                         "same run, same minute (repeatable)")
    ap.add_argument("--skip-views", action="store_true", help="only the summaries (no dashboard data layer or export)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time the summary from the kept passes this many times and show the run of median wall time "
                         "with every run's (this machine's runs differ by a few seconds at 10^8 events) [1]")
    ap.add_argument("--kind", choices=sorted(KINDS), default="zero3",
                    help="the simulated run: zero3 (llama70b-1024 preset) or ddp (the same model, 121 buckets a step) [zero3]")
    args = ap.parse_args()
    global KIND
    KIND = args.kind
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    print(f"{os.cpu_count()} CPUs; free disk under {root}: {shutil.disk_usage(root).free / 1e9:.0f} GB; "
          f"memory {psutil.virtual_memory().total / 1e9:.0f} GB", flush=True)
    print(machine_line(), flush=True)
    results = []
    for size in (float(s) for s in args.sizes.split(",")):
        need = size * 55 / 1e9
        if shutil.disk_usage(root).free / 1e9 < 2.5 * need:
            print(f"skipping {size:.0e} events: needs ~{need:.1f} GB of trace plus as much scratch, "
                  f"{shutil.disk_usage(root).free / 1e9:.0f} GB free", flush=True)
            continue
        run, n = simulate(root, size)
        print(f"\n{run.name}: {n:,} events, {sum(p.stat().st_size for p in run.iterdir()) / 1e9:.2f} GB on disk")
        print(f"{'what':<34} {'events':>10}  {'wall':>8} {'CPU':>8} {'sys':>8} {'peak':>8}  {'load 1m':>11}")
        new_out, old_out, read_out = root / "new.txt", root / "old.txt", root / "read.txt"
        # former code first: it empties the run's cache folder (rank passes included) when it keeps its report
        bases = []
        for i, b in enumerate(args.baseline):
            bases.append((measure([PY, "-m", "syncviz", "summary", "--fresh", str(run), *jobs], args.timeout,
                                  root / f"base-{i}.txt", cwd=str(Path(b).resolve())), root / f"base-{i}.txt"))
        kept, kept_bytes = rank_passes(run, args.timeout)
        row("ranks' first passes (at close)", n, kept, f"{kept_bytes / 1e9:.2f} GB kept; on a real run each rank "
            f"spends 1/{shape(size)[0]} of this CPU on its own machine")
        # --fresh: summarize even where an earlier run of this benchmark left the report in the run's cache
        tries = [measure([PY, "-m", "syncviz", "summary", "--fresh", str(run), *jobs], args.timeout, new_out, cwd=str(HERE))
                 for _ in range(max(1, args.repeat))]
        ok = sorted((t for t in tries if t["status"] == "ok"), key=lambda t: t["wall_s"])
        new = ok[(len(ok) - 1) // 2] if ok else tries[0]        # the median run (the lower of the middle two)
        every = (f"; {len(tries)} runs: " + ", ".join(f"{t['wall_s']:.1f}s" for t in tries)) if len(tries) > 1 else ""
        # the same without the ranks' first passes (a run recorded by an older syncviz, or not worth it):
        # every event read by the summary
        aside = run.parent / f".{run.name}-ranks-aside"
        shutil.rmtree(aside, ignore_errors=True)
        _ranks_dir(run).rename(aside)
        try:
            read = measure([PY, "-m", "syncviz", "summary", "--fresh", str(run), *jobs], args.timeout, read_out,
                           cwd=str(HERE))
        finally:
            aside.rename(_ranks_dir(run))
        row("summary, every event read", n, read)
        row("summary, ranks' first passes kept", n, new, "same output: " + (
            "yes" if read["status"] == new["status"] == "ok" and read_out.read_bytes() == new_out.read_bytes() else "NO")
            + f"; {read['wall_s'] / new['wall_s']:.2f}x wall{every}")
        for b, (base, base_out) in zip(args.baseline, bases):
            same = base["status"] == "ok" and new["status"] == "ok" and base_out.read_bytes() == new_out.read_bytes()
            row(f"summary, baseline {Path(b).name}"[:34], n, base)
            row("summary, this checkout", n, new, f"same output: {'yes' if same else 'NO'}; "
                f"{base['cpu_s'] / max(new['cpu_s'], 1e-9):.2f}x less CPU, {base['wall_s'] / new['wall_s']:.2f}x wall")
        old = None
        if n <= args.whole_max:
            old = measure([PY, "-m", "syncviz", "summary", "--whole", str(run)], args.timeout, old_out, cwd=str(HERE))
            same = old["status"] == "ok" and new_out.read_bytes() == old_out.read_bytes()
            row("summary --whole (former)", n, old)
            row("summary (partitioned)", n, new, f"same output: {'yes' if same else 'NO'}; "
                f"{old['wall_s'] / new['wall_s']:.2f}x wall, {old['peak_gb'] / max(new['peak_gb'], 1e-9):.1f}x less memory")
        else:
            row("summary --whole (former)", n, None, f"not run: > --whole-max {args.whole_max:.0e} "
                f"(~460 B/event: ~{n * 460 / 1e9:.0f} GB)")
            row("summary (partitioned)", n, new)
        results.append((n, new, read))
        # the same command again: printed from the report the first kept (views/runcache.kept_report)
        kept_out = root / "kept.txt"
        again = measure([PY, "-m", "syncviz", "summary", str(run), *jobs], args.timeout, kept_out, cwd=str(HERE))
        row("summary again (kept report)", n, again, f"same output: "
            f"{'yes' if again['status'] == 'ok' and kept_out.read_bytes() == new_out.read_bytes() else 'NO'}")
        # compare (one pass by partitions of ranks: analysis.partitioned.measure) and summary --json (the
        # workers write the bucket rows), each beside its --whole form, same bytes checked
        for cmd in (["compare", "--json"], ["summary", "--json"]):
            a_out, b_out = root / "cmd-new.json", root / "cmd-old.json"
            part = measure([PY, "-m", "syncviz", *cmd, str(run), *jobs], args.timeout, a_out, cwd=str(HERE))
            what = " ".join(cmd)
            if n <= args.whole_max:
                whole = measure([PY, "-m", "syncviz", *cmd, "--whole", str(run)], args.timeout, b_out, cwd=str(HERE))
                same = whole["status"] == "ok" and part["status"] == "ok" and a_out.read_bytes() == b_out.read_bytes()
                row(f"{what} --whole (former)", n, whole)
                row(f"{what} (partitioned)", n, part, f"same output: {'yes' if same else 'NO'}; "
                    f"{whole['peak_gb'] / max(part['peak_gb'], 1e-9):.1f}x less memory")
            else:
                row(f"{what} (partitioned)", n, part)
            for out in (a_out, b_out):     # summary --json of 10^7 events: 6.3 GB each; not kept
                out.unlink(missing_ok=True)
        if args.skip_views:
            continue
        # Over the dashboard's budget (store.default_max_run_bytes) a run is opened from what the summary
        # above kept beside it and read one step at a time: bounded memory at any size.
        partial = sum(p.stat().st_size for p in run.glob("rank-*.arrow")) > default_max_run_bytes()
        if n <= args.dashboard_max or partial:
            m = measure([PY, "-c", DASH, str(root), run.name], args.timeout, root / "dash.json", cwd=str(HERE))
            d = json.loads((root / "dash.json").read_text() or "{}") if m["status"] == "ok" else {}
            nan = float("nan")
            row("dashboard data: " + ("steps read alone" if partial else "open + steps"), n, m,
                f"first open {d.get('open_s', nan):.2f} s, next step {d.get('step_ms', nan):.0f} ms, "
                f"jump to step {d.get('jump_to', '?')} {d.get('jump_ms', nan):.0f} ms" +
                (f"; next step once read ahead {d['prefetched_ms']:.1f} ms (read ahead in {d['prefetch_s']:.1f} s)"
                 if d.get("prefetched_ms") is not None else ""))
        else:
            row("dashboard data layer", n, None, "not run: > --dashboard-max (loads the whole run)")
        export = [PY, "-m", "syncviz", "export", "perfetto", str(run), "-o", str(root / "p.json.gz")]
        if n <= args.perfetto_max:
            row("export perfetto (whole run)", n, measure(export, args.timeout))
        else:
            row("export perfetto (whole run)", n, None, f"not run: > --perfetto-max (~1.6 GB per 10^6 events; "
                f"~{1.6 * n / 1e6:.0f} GB)")
        # the other exports, by partitions of ranks (the default) beside --whole where it fits
        html_new, html_old = root / "report-new.html", root / "report-old.html"
        for what, cmd, check in (
                ("export tensorboard", ["export", "tensorboard", str(run), "--logdir", str(root / "tb")], None),
                ("export html", ["export", "html", str(run), "-o"], (html_new, html_old))):
            part = measure([PY, "-m", "syncviz", *cmd, *([str(html_new)] if check else []), *jobs], args.timeout,
                           cwd=str(HERE))
            if n <= args.whole_max:
                whole = measure([PY, "-m", "syncviz", *cmd, *([str(html_old)] if check else []), "--whole"],
                                args.timeout, cwd=str(HERE))
                row(f"{what} --whole", n, whole)
                same = ("; same file: " + ("yes" if part["status"] == whole["status"] == "ok"
                                            and html_new.read_bytes() == html_old.read_bytes() else "NO")) if check else ""
                row(f"{what} (partitioned)", n, part, f"{whole['peak_gb'] / max(part['peak_gb'], 1e-9):.1f}x less "
                    f"memory{same}")
            else:
                row(f"{what} (partitioned)", n, part)
        mid = shape(size)[1] // 2          # two steps from the middle: the reader stops after them
        m = measure(export + ["--steps", f"{mid}:{mid + 2}"], args.timeout)
        row(f"export perfetto --steps {mid}:{mid + 2}", 2 * n // shape(size)[1], m, "events of those 2 steps")
    print("\nTarget (issue 17): 1e8 events summarized in <= 30 s within <= 4 GB.")
    for n, new, read in results:
        for what, m in (("with the ranks' first passes", new), ("every event read", read)):
            met = m["status"] == "ok" and m["wall_s"] <= 30 and m["peak_gb"] <= 4
            verdict = ("target met" if met else "target NOT met") if n >= 0.9e8 else "(the target is for 1e8)"
            print(f"  {n / 1e6:.1f} M events, {what}: {m['wall_s']:.1f} s wall ({m['cpu_s']:.1f} s CPU, "
                  f"{1e6 * m['cpu_s'] / n:.1f} µs/event), {m['peak_gb']:.2f} GB peak: {verdict}")


if __name__ == "__main__":
    main()
