"""syncviz's bucket intervals next to the device-side collective of a torch.profiler trace of the
same steps: the independent measurement of check "crosscheck".

Each rank's profile (OUT/profile-<rank>.json, torch.profiler's Chrome trace) is put on syncviz's
aligned clock as tests/crosscheck.py does: Kineto's µs since ``baseTimeNanoseconds`` are
wall-clock (CLOCK_REALTIME) nanoseconds, and run.json's per-rank ``realtime_minus_clock_ns`` (taken
at clock alignment) turns them into that rank's monotonic clock, then its ``clock_offset_ns`` and
the run's ``clock_zero_ns`` into aligned time.

What the profiler's side of one bucket is, per mode:
- ``nccl``: the NCCL kernel (name contains "nccl", category "kernel"): start and end on the GPU.
  NCCL on one rank does no device work for an in-place all-reduce (DDP's): the profile of a world
  of one held no NCCL kernel at all (H200, NCCL 2.28.9, 16 buckets, 2026-11-27). There the check
  is that syncviz measures that nothing too: the profile has no NCCL kernel, and the buckets' GPU
  intervals have a median of at most ``ONE_RANK_MEDIAN_NS``. Their tail is reported, not judged:
  on that H200 the median was 3.3 and 4.1 µs in two runs, but 1 and 5 of 16 buckets read 130 µs
  to 2.2 ms, all in two of the four profiled steps. Both events are GPU timestamps (start on the
  compute stream, end on the stream the future's callback runs on, which waits for NCCL's
  stream), so the gap is the GPU's, but why it opens there is not established.
- ``gloo-cuda``: gloo on CUDA tensors stages through host memory: start = the device-to-host
  copy of the bucket's bytes, end = the host-to-device copy back (its end).
- ``cpu`` (the self-check on machines without a GPU): start = ``c10d::allreduce_`` (the enqueue),
  end = the end of ``gloo:all_reduce`` (the work itself), as tests/crosscheck.py matches them.
Buckets (steps >= first_step) and profiler intervals are paired in time order per rank.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

MODES = ("nccl", "gloo-cuda", "cpu")
TOLERANCE = 0.05        # of the bucket's duration (the target)
FLOOR_NS = 1000         # CUDA events resolve ~0.5 µs (CUDA docs): below 1 µs nothing is measurable
ONE_RANK_MEDIAN_NS = 20_000   # two CUDA events back to back across streams: 3.3 / 4.1 µs measured (H200)
ONE_RANK_TAIL_NS = 20_000     # buckets above this are listed in the figures (long_buckets)


def _to_clock(run_meta: dict, info: dict, base_ns: int):
    def conv(us: float) -> int:
        return round(us * 1000) + base_ns - info["realtime_minus_clock_ns"] + info["clock_offset_ns"] \
            - run_meta["clock_zero_ns"]
    return conv


def device_intervals(trace: dict, mode: str, sizes: set[int] | None = None) -> list[tuple[float, float]]:
    """(start µs, end µs) of every collective's device-side (or work-side) interval, in time order."""
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    if mode == "nccl":
        ks = [e for e in ev if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
        return sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in ks)
    if mode == "gloo-cuda":
        def size_ok(e):   # a copy of a bucket's bytes (kept when the trace gives no size)
            n = (e.get("args") or {}).get("bytes")
            return sizes is None or n is None or n in sizes

        def copies(tag):
            return sorted((e for e in ev if e.get("cat") == "gpu_memcpy" and tag in e.get("name", "")
                           and size_ok(e)), key=lambda e: e["ts"])
        return [(d["ts"], h["ts"] + h.get("dur", 0)) for d, h in zip(copies("DtoH"), copies("HtoD"))]
    if mode == "cpu":
        enq = sorted(e["ts"] for e in ev if e.get("name") == "c10d::allreduce_")
        work = sorted(e["ts"] + e.get("dur", 0) for e in ev if e.get("name") == "gloo:all_reduce")
        return list(zip(enq, work))
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def compare(run, folder, mode: str, first_step: int) -> dict:
    """Per bucket: |Δstart| and |Δend| (syncviz launch/end − profiler) in µs and as a fraction of
    the collective's duration (syncviz end − launch). Medians over all ranks' buckets, and pass/fail against
    TOLERANCE (with the FLOOR_NS resolution floor)."""
    ev = run.events
    d_start, d_end, rel_start, rel_end, durs = [], [], [], [], []
    counts = []
    for info in run.meta["ranks"]:
        r = info["rank"]
        path = Path(folder) / f"profile-{r}.json"
        trace = json.loads(path.read_text())
        conv = _to_clock(run.meta, info, int(trace["baseTimeNanoseconds"]))
        b = ev[(ev["rank"] == r) & (ev["kind"] == "bucket") & (ev["step"] >= first_step)].sort_values("start_ns")
        sizes = set(int(x) for x in b["logical_bytes"]) | set(int(x) for x in b["bytes"])
        iv = device_intervals(trace, mode, sizes)
        counts.append((r, len(b), len(iv)))
        kernels = sum(e.get("cat") == "kernel" for e in trace.get("traceEvents", []))   # the profile saw the GPU
        for (s_us, e_us), row in zip(iv, b.itertuples()):
            # launch_ns: the collective call (start_ns is the DDP hook's entry, before its ×1/N)
            dur = max(row.end_ns - row.launch_ns, 1)
            ds, de = row.launch_ns - conv(s_us), row.end_ns - conv(e_us)
            d_start.append(ds / 1e3)
            d_end.append(de / 1e3)
            tol = max(TOLERANCE * dur, FLOOR_NS)
            rel_start.append(abs(ds) / tol * TOLERANCE)   # in units of the duration, floor applied
            rel_end.append(abs(de) / tol * TOLERANCE)
            durs.append(dur / 1e3)
    n = len(d_start)
    buckets = sum(c[1] for c in counts)
    out = {"mode": mode, "matched": n, "buckets": buckets,
           "per_rank": [{"rank": r, "buckets": nb, "profiler_intervals": ni} for r, nb, ni in counts]}
    if mode == "nccl" and len(counts) == 1 and counts[0][2] == 0 and buckets and kernels:
        out["profiler_kernels"] = kernels
        return _one_rank(out, ev[(ev["kind"] == "bucket") & (ev["step"] >= first_step)])
    if not n:
        out.update(ok=False, why=f"no {mode} intervals in the profiles to match {buckets} buckets")
        return out
    med = statistics.median
    out.update({
        "bucket_duration_us_median": round(med(durs), 2),
        "start_diff_us_median": round(med(d_start), 2), "end_diff_us_median": round(med(d_end), 2),
        "start_rel_median": round(med(rel_start), 4), "end_rel_median": round(med(rel_end), 4)})
    counts_ok = all(nb == ni for _, nb, ni in counts)
    within = out["start_rel_median"] <= TOLERANCE and out["end_rel_median"] <= TOLERANCE
    out["ok"] = counts_ok and within
    if not counts_ok:
        out["why"] = "bucket and profiler counts differ per rank (paired in time order anyway)"
    elif not within:
        out["why"] = f"median |difference| above {TOLERANCE:.0%} of the bucket duration"
    return out


def _one_rank(out: dict, b) -> dict:
    """NCCL, world size 1: no device work to match (module docstring); syncviz must measure none."""
    dur = (b["end_ns"] - b["launch_ns"]).astype("int64")
    out.update(one_rank=True, bucket_gpu_us_median=round(float(dur.median()) / 1e3, 2),
               bucket_gpu_us_max=round(float(dur.max()) / 1e3, 2),
               long_buckets=[[int(s), int(k), round(d / 1e3, 1)] for s, k, d in
                             zip(b["step"], b["bucket"], dur) if d > ONE_RANK_TAIL_NS][:20])   # [step, bucket, µs]
    out["ok"] = bool((dur >= 0).all() and dur.median() <= ONE_RANK_MEDIAN_NS)
    if not out["ok"]:
        out["why"] = (f"NCCL on one rank does no device work, but syncviz measured a median bucket of "
                      f"{out['bucket_gpu_us_median']} µs on the GPU (or a negative one)")
    return out
