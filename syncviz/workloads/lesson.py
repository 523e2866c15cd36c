"""``syncviz lesson``: data parallelism one idea at a time, each shown by running it on real CPU
ranks (gloo) and reading the numbers back from the recorded runs.

    syncviz lesson            # 334-455 s on 2 busy shared CPU cores; --fast: 109 s
    syncviz dash traces/      # then the Lesson page tells the same story with these runs

Steps (each prints what it ran, what it measured and which dashboard page shows it):
  1. gradient averaging: per-rank gradients before and after DDP's all-reduce (values);
  2. DDP by hand: broadcast, all-reduce every gradient, divide by N; equal to DDP bit for bit;
  3. DDP's buckets: the same model, gradients all-reduced in buckets while backward runs;
  4. a straggler: one slow rank, and every other rank waits for it at the all-reduce;
  5. ring all-reduce with send/recv: bytes per rank against the naive schemes, N = 2, 4, 8;
  6. memory: why a 70B model needs ZeRO-3 (or more GPUs, or offload);
  7. asynchronous updates: gradients averaged S steps late, the replicas drift apart, the loss pays;
  8. torch.nn.DataParallel beside DDP: bytes through GPU 0, step time, GPU 0's load (the model).
Everything it runs is written under --out (runs, ring-N*.json and lesson.json for the page).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

PAGE = "Lesson"


class LessonError(Exception):
    pass


@dataclass
class Ctx:
    out: Path
    nproc: int
    fast: bool
    steps: list[dict] = field(default_factory=list)
    total: int = 6

    @property
    def model(self) -> list[str]:
        """The workload of steps 2-4: the tiny GPT in --fast mode, else the 3M-parameter mini GPT
        with 1 MB buckets (its backward is long enough to hide most buckets: ~80% on 2 CPU ranks)."""
        return ["--preset", "tiny"] if self.fast else ["--preset", "mini"]

    @property
    def cap(self) -> list[str]:
        return ["--bucket-cap-mb", "0.1" if self.fast else "1"]

    @property
    def model_name(self) -> str:
        return "tiny GPT (0.2M parameters)" if self.fast else "mini GPT (3M parameters)"

    def begin(self, title: str, doing: str) -> float:
        click.echo(f"\n[{getattr(self, 'number', len(self.steps) + 1)}/{self.total}] {title}")
        click.echo(f"      running: {doing} ...", nl=False)
        return time.monotonic()

    def end(self, t0: float, title: str, lines: list[str], page: str, runs: list[str], numbers: dict) -> None:
        click.echo(f" done ({time.monotonic() - t0:.0f} s)")
        for line in lines:
            click.echo(f"  {line}")
        click.echo(f"  -> dashboard: {page}")
        self.steps.append({"number": getattr(self, "number", len(self.steps) + 1), "title": title, "text": lines,
                           "page": page, "numbers": numbers,
                           "runs": [str(Path(r).resolve().relative_to(self.out.resolve().parent)) for r in runs]})


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run(args: list[str], what: str, timeout: int = 600) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", *map(str, args)], capture_output=True, text=True, env=_env(),
                       timeout=timeout)
    if p.returncode != 0:
        lines = [l for l in (p.stderr or p.stdout).strip().splitlines() if l.strip()]
        tail = lines[-1:] or ["(no output)"]
        raise LessonError(f"{what} failed (exit {p.returncode}): {tail[0][:200]}")
    return p


def _trace(ctx: Ctx, name: str, *args, nproc: int | None = None) -> tuple[Path, subprocess.CompletedProcess]:
    run = ctx.out / name
    p = _run(["syncviz", "trace", "--nproc-per-node", nproc or ctx.nproc, "--out", run, "--name", name,
              "--overwrite", "--quiet", *args], f"tracing {name}")
    return run, p


def _summary(run: Path) -> dict:
    from syncviz import analysis as A
    from syncviz.trace import load_run
    return A.run_summary(load_run(run))


# ------------------------------------------------------------------------------------ steps

def averaging(ctx: Ctx) -> None:
    from syncviz.analysis import grads as G
    from syncviz.trace.grads import load_grads
    title = "Gradient averaging: every rank ends up with the mean of the ranks' gradients"
    t0 = ctx.begin(title, f"the tiny GPT, DDP on {ctx.nproc} ranks, 2 steps, recording gradient values")
    run, _ = _trace(ctx, "1-averaging", "--grad-values", "-m", "syncviz.workloads", "--preset", "tiny",
                    "--steps", "2", "--bucket-cap-mb", "0.1")
    check = G.averaging_check(load_grads(run))
    s = G.averaging_summary(check)
    pick = check[check["param"] == "blocks.0.fc.weight"]
    row = (pick if len(pick) else check).iloc[-1]
    ranks = "   ".join(f"rank {r}: {v:+.7f}" for r, v in enumerate(row["before"]))
    norms = ", ".join(f"{x:.3f}" for x in row["before_norms"])
    lines = [
        "Each rank ran forward and backward on its own slice of the batch, so each has different gradients.",
        f"{row['param']}[0] at step {row['step']}, before synchronization:  {ranks}",
        f"their mean: {row['mean']:+.7f}     after DDP's all-reduce, every rank holds: {row['after']:+.7f}",
        f"after == mean bit for bit in {s['exact']}/{s['checked']} parameter-steps ({s['elements']} values per "
        f"rank); every rank holds the same after-values in {s['after_equal_on_ranks']}/{s['checked']}.",
        "Why: the loss of the global batch is the mean of the ranks' losses, so its gradient is the mean of",
        "their gradients, (1/N) sum_r grad L(B_r). DDP computes it as sum_r g_r x (1/N) with one all-reduce.",
        f"Averaging cancels noise: the norms of {row['param']} were {norms} on the ranks, "
        f"{row['after_norm']:.3f} after.",
        f"(values: {run}/grads-<rank>.arrow; `syncviz trace --grad-values` records them for any DDP script)"]
    ctx.end(t0, title, lines, f"{PAGE} (1) and Replay, run {run.name}", [run],
            {**s, "param": row["param"], "before": row["before"], "mean": row["mean"], "after": row["after"]})


def manual(ctx: Ctx) -> None:
    title = "DDP by hand: broadcast weights, all-reduce every gradient, divide by N"
    t0 = ctx.begin(title, f"syncviz/workloads/manual_ddp.py, the {ctx.model_name} on {ctx.nproc} ranks, 3 steps, "
                          "then --check against torch's DDP")
    run, p = _trace(ctx, "2-manual", "-m", "syncviz.workloads.manual_ddp", *ctx.model, "--steps", "3", "--check")
    out = [l for l in p.stdout.splitlines() if l.startswith(("broadcast:", "check:"))]
    s = _summary(run)
    from syncviz.trace import load_run
    ev = load_run(run).events
    calls = ev[(ev["kind"] == "collective") & (ev["op"] == "all_reduce") & (ev["step"] == 1) & (ev["rank"] == 0)]
    lines = [*out,
             f"One all-reduce per parameter ({len(calls)} per step), issued after backward has finished:",
             f"{s['exposed_pct']:.0f}% of the communication is exposed ({s['exposed_ms']:.1f} ms of a "
             f"{s['step_ms']:.1f} ms step); nothing computes while the gradients travel.",
             "Its core is ~40 lines: read syncviz/workloads/manual_ddp.py. --overlap starts each all-reduce from",
             "the gradient's post-accumulate hook instead, while backward still runs."]
    numbers = {"calls_per_step": int(len(calls)), "exposed_pct": s["exposed_pct"], "step_ms": s["step_ms"],
               "check": out[-1] if out else ""}
    runs = [run]
    if not ctx.fast:
        run2, _ = _trace(ctx, "2b-manual-overlap", "-m", "syncviz.workloads.manual_ddp", *ctx.model, "--steps", "3", "--overlap")
        s2 = _summary(run2)
        lines.append(f"With --overlap: {s2['overlap_pct']:.0f}% of it runs under backward; exposed "
                     f"{s2['exposed_ms']:.1f} ms, step {s2['step_ms']:.0f} ms (vs {s['step_ms']:.0f} ms). Still {len(calls)}")
        lines.append("messages per step, each paying gloo's fixed per-message cost; on few CPU cores gloo's threads")
        lines.append("also compete with backward for the cores.")
        ctx.manual_overlap = s2
        numbers["overlap_overlap_pct"] = s2["overlap_pct"]
        runs.append(run2)
    ctx.end(t0, title, lines, f"Replay, run {run.name}: the all-reduces sit after the backward bar", runs, numbers)
    ctx.manual = s


def buckets(ctx: Ctx) -> None:
    title = "DDP's buckets: gradients travel while backward is still computing"
    t0 = ctx.begin(title, f"the same {ctx.model_name} under torch's DDP, {ctx.cap[1]} MB buckets, "
                          f"{ctx.nproc} ranks, 4 steps")
    run, _ = _trace(ctx, "3-ddp-buckets", "-m", "syncviz.workloads", *ctx.model, "--steps", "4", *ctx.cap)
    s = _summary(run)
    from syncviz.trace import load_run
    r = load_run(run)
    lay = r.layouts[r.layouts["rank"] == 0]
    n0 = lay[lay["layout"] == 0]["bucket"].nunique()
    n1 = lay[lay["layout"] == lay["layout"].max()]["bucket"].nunique()
    m = getattr(ctx, "manual", None)
    lines = [f"DDP packs the gradients into {n1} buckets (its first step used {n0}, in parameter order; then it",
             "rebuilds them in the order gradients became ready) and all-reduces a bucket as soon as its last",
             f"gradient is ready: {s['overlap_pct']:.0f}% of the communication is hidden under backward, "
             f"{s['exposed_ms']:.1f} ms exposed per step."]
    if m:
        o = getattr(ctx, "manual_overlap", None)
        lines.append(f"By hand (step 2): {100 - m['exposed_pct']:.0f}% hidden, {m['exposed_ms']:.1f} ms exposed"
                     + (f"; with --overlap {o['overlap_pct']:.0f}% hidden, {o['exposed_ms']:.1f} ms exposed" if o else "")
                     + f". DDP sends {n1} buckets")
        lines.append("instead of one message per parameter. (Runs on a shared machine differ by tens of ms: compare")
        lines.append("the overlap percentages, measured within each run, more than milliseconds across runs.)")
    lines.append("`syncviz demo` runs this (mini GPT, 1 MB buckets) on any laptop.")
    ctx.end(t0, title, lines, f"Replay (buckets under backward) and Buckets (what is in each), run {run.name}",
            [run], {"buckets": int(n1), "buckets_first_step": int(n0), "overlap_pct": s["overlap_pct"],
                    "exposed_ms": s["exposed_ms"], "step_ms": s["step_ms"]})
    ctx.ddp = s


def straggler(ctx: Ctx) -> None:
    title = "A straggler: synchronous training runs at the speed of the slowest rank"
    slow = ctx.nproc - 1
    # Long enough to stand out of the noise: half the step time step 3 measured, at least 50 ms
    # (fast) or 150 ms. With 150 ms fixed, on a 2-core machine at load 14, one run in three had the
    # other rank later still (it lost more CPU time than the sleep).
    base = getattr(ctx, "ddp", None)
    ms = max(50 if ctx.fast else 150, int(0.5 * base["step_ms"]) if base else 0)
    t0 = ctx.begin(title, f"the same DDP run with rank {slow} sleeping {ms} ms before every forward")
    run, _ = _trace(ctx, "4-straggler", "-m", "syncviz.workloads", *ctx.model, "--steps", "4", *ctx.cap,
                    "--straggler", f"{slow}:{ms}")
    s = _summary(run)
    from syncviz import analysis as A
    from syncviz.trace import load_run
    r = load_run(run)
    steps = A.headline_steps(A.step_metrics(r))
    exposed = steps.groupby("rank")["exposed_ns"].median() / 1e6
    late = A.rank_step_skew(r)
    late = late[[c for c in late.columns if c in set(steps["step"])]].mean(axis=1) / 1e6
    latest = int(late.idxmax())
    lines = [f"Rank {latest} launches its buckets {late.max():.0f} ms after the others on average (steps "
             f"{steps['step'].min()}-{steps['step'].max()}): "
             + ("the rank we slowed down." if latest == slow else f"not rank {slow}: the machine's noise won."),
             "The others cannot finish an all-reduce without it; they wait inside it, so the wait shows up as",
             "their exposed communication per step:  "
             + ",  ".join(f"rank {k}: {v:.1f} ms" + (" (the slow one)" if k == slow else "") for k, v in exposed.items()),
             "Every rank must contribute to every all-reduce: that is what 'synchronous' costs. Try it:",
             f"`syncviz demo --straggler {slow}:{ms}`."]
    ctx.end(t0, title, lines, f"Replay (rank lanes), run {run.name}", [run],
            {"slowed_rank": slow, "sleep_ms": ms, "latest_rank": latest,
             "mean_lateness_ms": {int(k): float(v) for k, v in late.items()}, "step_ms": s["step_ms"],
             "exposed_ms_per_rank": {int(k): float(v) for k, v in exposed.items()}})


def ring(ctx: Ctx) -> None:
    title = "Ring all-reduce: why the bytes per rank do not grow with N"
    sizes = (2, 4) if ctx.fast else (2, 4, 8)
    mb = 1.0 if ctx.fast else 4.0
    t0 = ctx.begin(title, f"reduce-scatter + all-gather with send/recv on N = {', '.join(map(str, sizes))} "
                          f"ranks, D = {mb:g} MB, and the naive schemes")
    results = []
    for n in sizes:
        _run(["torch.distributed.run", "--nproc-per-node", n, "-m", "syncviz.workloads.ring", "--mb", mb, "--out",
              ctx.out / "ring"], f"ring all-reduce on {n} ranks")
        results.append(json.loads((ctx.out / "ring" / f"ring-N{n}.json").read_text()))
    rows = ["   N   ring 2(N-1)/N*D: formula / sent / kernel   all-to-all (N-1)*D   param server   "
            "gloo all_reduce   same sum"]
    for res in results:
        n, f = res["world_size"], res["formulas"]
        w = lambda s, k: max(r[s][k] for r in res["ranks"]) / 1e6   # noqa: E731
        same = all(r[s]["same_as_all_reduce"] for r in res["ranks"] for s in ("ring", "all_to_all", "parameter_server"))
        rows.append(f"  {n:2d}   {f['ring'] / 1e6:8.2f} / {w('ring', 'payload_bytes'):6.2f} / "
                    f"{w('ring', 'kernel_bytes'):6.2f} MB        {w('all_to_all', 'kernel_bytes'):8.2f} MB"
                    f"          {w('parameter_server', 'kernel_bytes'):6.2f} MB      "
                    f"{w('torch_all_reduce', 'kernel_bytes'):6.2f} MB     {'yes' if same else 'NO'}")
    last = results[-1]
    lines = ["The array is cut into N chunks. N-1 steps of reduce-scatter (send a chunk right, add the one",
             "arriving from the left) leave each rank with one fully summed chunk; N-1 steps of all-gather pass",
             "those around. Each rank sends 2(N-1) chunks of D/N, under 2D for any N; all-to-all sends (N-1)*D.",
             "Bytes sent per rank ('kernel': counted by Linux in /proc/self/io, gloo headers included):", *rows,
             f"gloo's own all_reduce sends what the ring sends. N = {last['world_size']}: "
             f"{len(last['transfers'])} chunk transfers recorded ({2 * (last['world_size'] - 1)} steps x "
             f"{last['world_size']} ranks)."]
    ctx.end(t0, title, lines, f"{PAGE} (ring animation)", [], {
        "sizes": list(sizes), "mb": mb,
        "ring_sent_mb": [max(r["ring"]["payload_bytes"] for r in res["ranks"]) / 1e6 for res in results],
        "all_to_all_mb": [max(r["all_to_all"]["payload_bytes"] for r in res["ranks"]) / 1e6 for res in results]})


def memory(ctx: Ctx) -> None:
    from syncviz.model import plan as P
    title = "Memory: why 70B parameters need ZeRO-3 (and 8 x 80 GB GPUs are not enough)"
    t0 = ctx.begin(title, "syncviz plan --params 70e9 --gpus 8 (the memory model, no ranks)")
    p = P.make_plan("70e9", 8, 80, 8)
    rows = {r.strategy: r for r in p.rows}
    lines = ["Model states per GPU, fp16 params and grads (2 B each), Adam m and v in fp32 (K = 8 B/param):"]
    for s in ("ddp", "zero1", "zero2", "zero3"):
        r = rows[s]
        lines.append(f"  {r.label:7s} {r.memory.gpu / 1e9:7.1f} GB   (params {r.memory.params / 1e9:6.1f}, grads "
                     f"{r.memory.grads / 1e9:6.1f}, optimizer {r.memory.optimizer / 1e9:6.1f}; sends "
                     f"{r.wire_bytes / 1e9:.0f} GB per step)")
    lines += [f"recommendation: {p.reason}.",
              "ZeRO-1/2 move the same bytes as DDP (reduce-scatter + all-gather = all-reduce); ZeRO-3 1.5x.",
              "Try: syncviz plan --params 70e9 --gpus 16 --optimizer-bytes 12 | --offload nvme"]
    ctx.end(t0, title, lines, "Strategies (measured DDP / ZeRO runs: `syncviz demo --compare`)", [],
            {s: rows[s].memory.gpu / 1e9 for s in ("ddp", "zero1", "zero2", "zero3")})


def stale(ctx: Ctx) -> None:
    from syncviz.workloads import lesson_more
    lesson_more.stale(ctx, _trace, PAGE)


def dataparallel(ctx: Ctx) -> None:
    from syncviz.workloads import lesson_more
    lesson_more.dataparallel(ctx, PAGE)


STEPS = (averaging, manual, buckets, straggler, ring, memory, stale, dataparallel)


@click.command("lesson", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", default="traces/lesson", show_default=True, help="Where the lesson's runs go.")
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(2, 4), help="CPU ranks (2-4).")
@click.option("--fast", is_flag=True, help="About half the time: the tiny GPT, no overlapped manual run, no 8-rank ring.")
@click.option("--only", default="", metavar="1,5", help="Run only these steps (numbers, comma-separated).")
def lesson_command(out, nproc, fast, only):
    """A narrated lesson on data parallelism: each step runs real ranks (gloo, CPU), prints what it
    measured and names the dashboard page that shows it. Then: syncviz dash <parent of --out>.

    \b
    Steps:
      1  gradient averaging: per-rank gradient values before/after DDP's all-reduce
      2  DDP by hand (broadcast, all-reduce each gradient, /N), checked against DDP
      3  DDP's buckets overlapping backward, on the same model
      4  a straggler rank, and the others waiting for it
      5  ring all-reduce with send/recv: bytes per rank vs naive schemes, N = 2, 4, 8
      6  memory per GPU of DDP / ZeRO-1/2/3 for 70B parameters (syncviz plan)
      7  asynchronous (stale) gradient averaging: replica drift and loss vs synchronous
      8  torch.nn.DataParallel vs DDP for 2/4/8 GPUs (syncviz dataparallel, a model)
    """
    try:
        picked = sorted({int(x) for x in only.split(",") if x.strip()}) if only else list(range(1, len(STEPS) + 1))
    except ValueError:
        raise click.ClickException(f"--only wants step numbers like 1,5 (got {only!r})") from None
    if not picked or not all(1 <= i <= len(STEPS) for i in picked):
        raise click.ClickException(f"--only: steps are numbered 1 to {len(STEPS)} (got {only!r})")
    ctx = Ctx(Path(out), nproc, fast, total=len(STEPS))
    ctx.out.mkdir(parents=True, exist_ok=True)
    click.echo(f"syncviz lesson: data parallelism on {nproc} CPU ranks, {len(picked)} of {len(STEPS)} steps "
               f"({'fast: ~2 min' if fast else '~6 min'} on 2 busy CPU cores); runs are written to {ctx.out}/")
    t0 = time.monotonic()
    try:
        for i in picked:
            ctx.number = i
            STEPS[i - 1](ctx)
    except LessonError as e:
        click.echo("")
        raise click.ClickException(str(e)) from None
    except subprocess.TimeoutExpired as e:
        click.echo("")
        raise click.ClickException(f"a lesson step took too long ({e.timeout:.0f} s): {' '.join(e.cmd[2:5])}") from None
    finally:
        (ctx.out / "lesson.json").write_text(json.dumps({"nproc": nproc, "fast": fast, "steps": ctx.steps},
                                                        indent=1, default=float))
    click.echo(f"\nDone in {time.monotonic() - t0:.0f} s. See it: syncviz dash {ctx.out.resolve().parent}  "
               f"(http://127.0.0.1:8050, page '{PAGE}')")
