"""``syncviz compare RUN [RUN...]``: strategies side by side on the same model — bytes each
collective op sent per step next to what theory predicts (torch's implementation and the
textbook, syncviz.model.theory), step time, comm busy, exposed comm, overlap %, memory per rank, and
where the backend or torch departs from the textbook.

``syncviz demo --compare`` traces DDP, ZeRO-2 and ZeRO-3 on the built-in model and prints it.
Every measured number comes from syncviz.analysis; theory from syncviz.model.theory.
"""
from __future__ import annotations

import json
import math
import sys

import click
from rich.console import Console
from rich.table import Table

from syncviz import analysis as A
from syncviz.model import theory as T
from syncviz.analysis import comparison as CM
from syncviz.analysis.partitioned import Measured, SummaryTables, measure
from syncviz.trace import Run, TraceError, find_runs, load_run, warn_problems
from syncviz.trace.read import read_meta
from syncviz.views import refuse_with_whole

MATCH_TOLERANCE = 0.005      # measured vs expected bytes: relative difference still called "equal"
SLOW_RATIO = 0.75            # RS or AG over an all_reduce of the same bytes: textbook ~0.5 (ring)


# ------------------------------------------------------------------------------- loading

def load_runs(paths, strategies: tuple[str, ...] = (), whole: bool = False, jobs: int | None = None,
              progress=None) -> list[Run | Measured]:
    """Runs at or below ``paths`` (optionally only those of ``strategies``), all of one model: each
    measured by partitions of ranks (analysis.partitioned, memory bounded by one partition), or
    loaded whole (``whole``: the reference, same numbers)."""
    for s in strategies:
        if s not in T.ALL_STRATEGIES:
            raise click.BadParameter(f"unknown strategy {s!r}; choose from {', '.join(T.ALL_STRATEGIES)}",
                                     param_hint="--strategies")
    dirs = []
    for p in paths:
        found = find_runs(p)
        if not found:
            raise TraceError(f"{p}: no syncviz run here (no run.json below it)")
        dirs.extend(d for d in found if d not in dirs)
    if strategies:     # run.json alone says the strategy: other runs are not read at all
        dirs = [d for d in dirs if read_meta(d).get("strategy") in strategies]
    runs = []
    for i, d in enumerate(dirs):
        if progress:
            progress(f"run {i + 1}/{len(dirs)}: {d}")
        runs.append(load_run(d) if whole else measure(d, jobs=jobs))
    for r in runs:
        warn_problems(r)
    if strategies and not runs:
        raise TraceError(f"no run of strategy {', '.join(strategies)} under {', '.join(map(str, paths))}")
    check_same_model(runs)
    return runs


def model_key(run: Run) -> tuple:
    model = run.meta.get("model") or {}
    shapes = (run.meta.get("strategy_config") or {}).get("param_shapes")
    return (model.get("name"), model.get("params"),
            tuple(sorted((k, tuple(v)) for k, v in shapes.items())) if shapes else None)


def check_same_model(runs: list[Run]) -> None:
    """Comparing strategies only means something on one model: refuse runs of different ones."""
    keys = {}
    for r in runs:
        k = model_key(r)
        for other, ok in keys.items():
            same = k[:2] == ok[:2] and (k[2] is None or ok[2] is None or k[2] == ok[2])
            if not same:
                def what(key):
                    return f"{key[0]} with {key[1]:,} parameters" if key[1] else f"{key[0]} (unknown size)"
                raise TraceError(f"runs of different models: {other} is {what(ok)}, {r.name} is {what(k)}; "
                                 "compare runs of one model")
        keys[r.name] = k


# ------------------------------------------------------------------------------ the numbers

def steady_steps(run: Run) -> list[int]:
    """Steps whose traffic is the strategy's steady state (analysis.comparison.steady_steps)."""
    return CM.steady_steps(run.meta, run.events["step"].unique())


def expected_bytes(meta: dict, n: int, strategy: str) -> tuple[dict, dict]:
    """(torch-expected, textbook) bytes per step by op for one rank of a run of ``n`` ranks (its
    run.json ``meta``); {} where unknown."""
    if strategy not in T.ALL_STRATEGIES:
        return {}, {}
    config = meta.get("strategy_config") or {}
    model = meta.get("model") or {}
    shapes = config.get("param_shapes")
    expected = {}
    if shapes:
        psgd = config.get("powersgd") or {}
        expected = T.comm_per_step(strategy, shapes, n, accum=int(config.get("accum", 1)),
                                   root_params=(config.get("fsdp") or {}).get("root_params", ()),
                                   powersgd_rank=psgd.get("matrix_approximation_rank", 1),
                                   min_compression_rate=psgd.get("min_compression_rate", 2.0),
                                   module_params=config.get("module_params") or (),
                                   group_numels=config.get("group_numels"))
    grad, param = model.get("grad_bytes", 0), model.get("bytes", 0)
    return expected, T.textbook_comm_per_step(strategy, grad, param)


def run_comparison(run: Run | Measured | SummaryTables, steps=None) -> dict:
    """Everything compare shows for one run (JSON-ready): a loaded run, or what
    ``analysis.partitioned.measure`` (or ``summarize(..., compare=True)``) found by partitions of
    ranks (a run of any size, same numbers).
    ``steps``: step_metrics of the whole loaded run when the caller has it."""
    if isinstance(run, Run):
        measured = CM.measure(run.events, run.meta, steps)
    else:
        measured = run.comparison
    world = run.world_size
    meta = run.meta
    strategy = meta.get("strategy", "?")
    nums = CM.numbers(measured)
    head = nums["head"]          # the same aggregate as run_summary's headline (means over rank-steps)
    measured_ops = measured["op_bytes"]
    expected, textbook = expected_bytes(meta, world, strategy)
    ops = []
    for op in sorted(set(measured_ops["op"]) | set(expected) | set(textbook)):
        row = measured_ops[measured_ops["op"] == op]
        m = float(row["bytes_per_step"].iloc[0]) if len(row) else 0.0
        e = expected.get(op)
        ops.append({"op": op, "calls_per_step": float(row["count_per_step"].iloc[0]) if len(row) else 0.0,
                    "measured_bytes": m, "bus_bytes": m * A.busbw_factor(op, world),
                    "expected_bytes": e, "textbook_bytes": textbook.get(op),
                    "matches": None if e is None else abs(m - e) <= MATCH_TOLERANCE * max(e, 1)})
    ratio = nums["ratio"]
    out = {"name": run.name, "path": str(run.path), "strategy": strategy, "world_size": world,
           "backend": meta.get("backend"), "steady_steps": measured["steady"],
           "step_ms": head["step_ms"], "comm_busy_ms": head["comm_busy_ms"],
           "exposed_ms": head["exposed_ms"], "compute_ms": head["compute_ms"],
           "overlap_pct": head["overlap_pct"], "exposed_pct": head["exposed_pct"], "aggregate": head["aggregate"],
           "bytes_per_step": sum(o["measured_bytes"] for o in ops),
           "bus_bytes_per_step": sum(o["bus_bytes"] for o in ops), "compression_ratio": ratio,
           "ops": ops, "memory": memory(meta, world, strategy), "backend_probe": meta.get("backend_probe"),
           "blocking_collectives": measured["blocking"], "model": meta.get("model")}
    if nums["collectives_busy_ms"] is not None:
        # a compression hook computes inside its bucket interval: the all-reduces alone, for contrast
        out["collectives_busy_ms"] = nums["collectives_busy_ms"]
    out["notes"] = notes(out, meta)
    return out


def memory(meta: dict, world: int, strategy: str) -> dict:
    """Measured bytes per rank (largest rank) next to torch-expected and textbook."""
    mem = meta.get("memory") or []
    predicted = {}
    if isinstance(mem, dict):
        if mem and all(isinstance(v, dict) for v in mem.values()):   # keyed by rank
            mem = list(mem.values())
        else:   # one dict for every rank: the simulator's prediction (syncviz simulate), not a measurement
            predicted = {k: v for k, v in mem.items() if k.endswith("_bytes") and isinstance(v, (int, float))}
            mem = []
    ranks = [m for m in mem if isinstance(m, dict) and m]
    keys = ("params_bytes", "grads_bytes", "optimizer_bytes", "params_after_forward_bytes",
            "comm_state_bytes", "peak_allocated_bytes")
    measured = {k: max((m[k] for m in ranks if m.get(k) is not None), default=None) for k in keys}
    shapes = (meta.get("strategy_config") or {}).get("param_shapes")
    expected, textbook = {}, {}
    if strategy in T.ALL_STRATEGIES:
        if shapes:
            sc = meta.get("strategy_config") or {}
            ds = {k: sc[k] for k in ("group_numels", "param_order", "nvme_gradients", "nvme_param_itemsize")
                  if sc.get(k)}   # DeepSpeed runs
            per_rank = [T.memory_per_rank(strategy, shapes, world, r, **ds) for r in range(world)]
            expected = {k: max(p[k] for p in per_rank) for k in per_rank[0]}
        params = (meta.get("model") or {}).get("params")
        if params:
            textbook = T.textbook_memory(strategy, params, world)
    if predicted and not expected:
        expected = predicted
    return {"measured": measured, "expected": expected, "textbook": textbook, "per_rank": ranks}


def notes(c: dict, meta: dict) -> list[str]:
    """Where torch's implementation of this run's strategy departs from the textbook (measured)."""
    out = []
    s, ops = c["strategy"], {o["op"]: o for o in c["ops"]}
    mb = lambda b: f"{b / 1e6:.2f} MB"  # noqa: E731
    if s == "zero1":
        n = ops.get("broadcast", {}).get("calls_per_step", 0)
        out.append(f"torch's ZeroRedundancyOptimizer keeps DDP's full all_reduce of the gradients and then "
                   f"broadcasts every parameter from the rank that owns it ({n:.0f} broadcasts per step); the "
                   "textbook ZeRO-1 reduce-scatters the gradients and all-gathers the parameters instead.")
    if s in T.FSDP:
        mem = c["memory"]["measured"]
        if s == "zero2" and mem.get("params_after_forward_bytes") and mem.get("params_bytes"):
            out.append(f"FSDP2 with reshard_after_forward=False shards parameters at rest too "
                       f"({mb(mem['params_bytes'])} per rank; textbook ZeRO-2 keeps full replicas) and keeps "
                       f"them gathered from forward to backward: {mb(mem['params_after_forward_bytes'])} held "
                       "at the end of forward.")
        shapes = (meta.get("strategy_config") or {}).get("param_shapes") or {}
        pad = sum(T.padded_numel(v, c["world_size"]) - T._numel(v) for v in shapes.values()) * 4
        if pad:
            out.append(f"FSDP2 pads each parameter's first dimension to a multiple of {c['world_size']} ranks: "
                       f"+{pad:,} bytes in every all_gather and reduce_scatter.")
    if c["blocking_collectives"]:
        who = "DeepSpeed" if s in T.DS_STRATEGIES else "FSDP2"
        out.append(f"This run's collectives are synchronous on the host ({who} on gloo/CPU): the rank waits in "
                   f"each one, so none of that communication can overlap compute (on CUDA, {who} overlaps "
                   "them on separate streams).")
    from syncviz.views.ds_compare import notes as ds_notes
    out.extend(ds_notes(c))
    if c.get("collectives_busy_ms") is not None:
        work = "low-rank factorization" if s == "powersgd" else "casting to 16 bits and back"
        out.append(f"its bucket intervals include the hook's own compute ({work}): "
                   f"comm busy {c['comm_busy_ms']:.2f} ms per step, of which the all_reduces themselves "
                   f"{c['collectives_busy_ms']:.2f} ms.")
    if s == "powersgd":
        start = ((meta.get("strategy_config") or {}).get("powersgd") or {}).get("start_powerSGD_iter")
        out.append(f"PowerSGD all-reduces uncompressed for the first {start} steps; bytes above are steps "
                   f"{', '.join(map(str, c['steady_steps']))}.")
        one = ((meta.get("strategy_config") or {}).get("powersgd") or {}).get("one_bucket_mb")
        if one:
            out.append(f"ran with one {one:.0f} MB bucket: with several buckets torch's PowerSGD hook issues "
                       "all-reduces from gloo callback threads in a different order on each rank and gloo "
                       "aborts (collective size mismatch), untraced as well.")
    for o in c["ops"]:
        if o["matches"] is False:
            out.append(f"{o['op']}: measured {mb(o['measured_bytes'])} per step but torch's {s} should send "
                       f"{mb(o['expected_bytes'])}.")
    return out


def backend_notes(comparisons: list[dict]) -> list[str]:
    """What the backend probe of the runs (syncviz.workloads.strategies.probe_backend) says about
    reduce_scatter and all_gather next to an all_reduce of the same bytes."""
    out = []
    for op, key, what in (
            ("reduce_scatter", "reduce_scatter_vs_all_reduce",
             "gloo runs it as a clone, an all_reduce of the whole array and a copy of its chunk "
             "(torch.profiler shows gloo:all_reduce inside c10d::_reduce_scatter_base_), so a "
             "reduce-scatter saves no bandwidth on this backend"),
            ("all_gather", "all_gather_vs_all_reduce", "")):
        probes = [c["backend_probe"] for c in comparisons
                  if c.get("backend_probe") and any(o["op"] == op and o["measured_bytes"] for o in c["ops"])]
        ratios = sorted(p[key] for p in probes if key in p)
        if not ratios:
            continue
        backend, nbytes = probes[0]["backend"], probes[0]["bytes"]
        span = f"{ratios[0]:.1f}x" if len(ratios) == 1 else f"{ratios[0]:.1f}-{ratios[-1]:.1f}x"
        text = (f"{backend}: {op} took {span} the time of an all_reduce of the same {nbytes / 1e6:.1f} MB "
                f"(probe in {len(ratios)} run{'s' if len(ratios) > 1 else ''}; a ring {op} needs ~0.5x)")
        if ratios[len(ratios) // 2] > SLOW_RATIO and what and backend == "gloo":
            text += ": " + what
        out.append(text + ".")
    return out


# ------------------------------------------------------------------------------------ views

def _f(x, fmt="{:.2f}"):
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "–"
    return fmt.format(x)


def _mb(b):
    return _f(None if b is None else b / 1e6)


def _label(c: dict, comparisons: list[dict]) -> str:
    same = sum(1 for o in comparisons if o["strategy"] == c["strategy"])
    return c["strategy"] if same == 1 else f"{c['strategy']} ({c['name']})"


def render(comparisons: list[dict], console: Console) -> None:
    base = next((c for c in comparisons if c["strategy"] == "ddp"), None)
    first = comparisons[0]
    console.print(f"[bold]compare[/bold]  {len(comparisons)} runs of "
                  f"{model_text(first)} on {first['world_size']} ranks ({first['backend']})", highlight=False)
    t = Table(title="Per step, mean over ranks and steady steps: step, comm busy and exposed comm in ms, overlap % "
                    "(100 − exposed / comm busy); per rank: MB of messages (nccl-tests bytes) and MB of bus traffic "
                    "(× busbw factor: all_reduce 2(n−1)/n, reduce_scatter/all_gather (n−1)/n), each vs DDP; "
                    "compression (bucket bytes / bytes sent)", title_justify="left")
    for col in ("strategy", "step", "comm", "exposed", "ovl%", "msg MB", "vs ddp", "bus MB", "bus vs ddp", "compr"):
        t.add_column(col, justify="left" if col == "strategy" else "right")

    def rel(c, key):
        return c[key] / base[key] if base and base.get(key) else None
    for c in comparisons:
        t.add_row(_label(c, comparisons), _f(c["step_ms"]), _f(c["comm_busy_ms"]), _f(c["exposed_ms"]),
                  _f(c["overlap_pct"], "{:.0f}"), _mb(c["bytes_per_step"]), _f(rel(c, "bytes_per_step"), "{:.2f}x"),
                  _mb(c["bus_bytes_per_step"]), _f(rel(c, "bus_bytes_per_step"), "{:.2f}x"),
                  _f(c["compression_ratio"], "{:.1f}x"))
    console.print(t)
    b = Table(title="Bytes per step and rank by op (nccl-tests convention), MB; 'impl.' = theory of the run's "
                    "implementation (torch's, or DeepSpeed's for ds-*)", title_justify="left")
    for col in ("strategy", "op", "calls", "measured", "impl.", "textbook", "equal"):
        b.add_column(col, justify="left" if col in ("strategy", "op") else "right")
    for c in comparisons:
        for o in c["ops"]:
            ok = {True: "yes", False: "NO", None: "–"}[o["matches"]]
            b.add_row(_label(c, comparisons), o["op"], _f(o["calls_per_step"], "{:.1f}"), _mb(o["measured_bytes"]),
                      _mb(o["expected_bytes"]), _mb(o["textbook_bytes"]), ok)
    console.print(b)
    mt = Table(title="Memory per rank, MB: measured after optimizer step 0 (largest rank; 'at fwd' = "
                     "parameters held when forward ends), equal to the implementation's theory?, textbook "
                     "params/grads/optim (fp32 AdamW: optimizer state K = 8 bytes per parameter, m and v; no fp32 "
                     "master copy)",
               title_justify="left")
    for col in ("strategy", "params", "grads", "optim", "at fwd", "=theory", "textbook"):
        mt.add_column(col, justify="left" if col == "strategy" else "right")
    keys = ("params_bytes", "grads_bytes", "optimizer_bytes")
    for c in comparisons:
        m, e, tb = c["memory"]["measured"], c["memory"]["expected"], c["memory"]["textbook"]
        same = None if not e or m.get("params_bytes") is None else all(m.get(k) == e.get(k) for k in keys)
        mt.add_row(_label(c, comparisons), *(_mb(m.get(k)) for k in keys), _mb(m.get("params_after_forward_bytes")),
                   {True: "yes", False: "NO", None: "–"}[same], "/".join(_mb(tb.get(k)) for k in keys))
    console.print(mt)
    from syncviz.views.ds_compare import render as render_classic
    render_classic(comparisons, console)     # DeepSpeed among the runs: the classic table
    for n in backend_notes(comparisons):
        console.print(f"• {n}", highlight=False)
    for c in comparisons:
        for n in c["notes"]:
            console.print(f"• [{_label(c, comparisons)}] {n}", highlight=False, markup=False)


def wide_console() -> Console:
    """Wide enough for the tables when piped (rich assumes 80 columns without a terminal)."""
    import sys
    return Console(width=None if sys.stdout.isatty() else 160)


def model_text(c: dict) -> str:
    m = c.get("model") or {}
    return f"{m.get('name', '?')} ({m.get('params', 0) / 1e6:.2f} M params)"


@click.command("compare", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--strategies", default="", help="Only runs of these strategies (comma-separated).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Worker processes per run, one partition of ranks each at a time [CPU count].")
@click.option("--whole", is_flag=True, help="Load each run into memory at once (same numbers; memory grows with "
              "the run). Default: by partitions of ranks, as `syncviz summary`.")
def compare_command(runs, strategies, as_json, jobs, whole):
    """Compare runs of different strategies on the same model (RUN: run directories, or a
    directory holding several)."""
    refuse_with_whole(whole, jobs=jobs is not None)
    wanted = tuple(s.strip() for s in strategies.split(",") if s.strip())

    def progress(msg):
        if sys.stderr.isatty():
            click.echo(f"syncviz compare: {msg}", err=True)
    loaded = load_runs(runs, wanted, whole=whole, jobs=jobs, progress=progress)
    comparisons = [run_comparison(r) for r in loaded]
    if as_json:
        click.echo(json.dumps(comparisons, indent=1, default=float))
        return
    render(comparisons, wide_console())
