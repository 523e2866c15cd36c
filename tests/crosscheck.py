"""Put torch.profiler events and DDP's runtime-logging timers next to syncviz's numbers for the
same steps (used by test_e2e_ddp and benchmarks/crosscheck.py)."""
import json
from pathlib import Path

import numpy as np

from syncviz import analysis as A


def compare_profiler(run, folder) -> dict:
    """Match each traced bucket (steps in the profiled window) to the profiler's c10d::allreduce_
    (enqueue) and gloo:all_reduce (execution) events, in order, on our aligned clock."""
    ev = run.events
    launch, done, matched = [], [], 0
    for info in run.meta["ranks"]:
        r = info["rank"]
        d = json.loads((Path(folder) / f"profile-{r}.json").read_text())
        base = d["baseTimeNanoseconds"]

        def conv(us):
            return us * 1000 + base - info["realtime_minus_clock_ns"] + info["clock_offset_ns"] - run.meta["clock_zero_ns"]
        gl = sorted((e for e in d["traceEvents"] if e.get("name") == "gloo:all_reduce"), key=lambda e: e["ts"])
        cd = sorted((e for e in d["traceEvents"] if e.get("name") == "c10d::allreduce_"), key=lambda e: e["ts"])
        b = ev[(ev["rank"] == r) & (ev["kind"] == "bucket") & (ev["step"] >= 2)].sort_values("start_ns")
        for e, c, (_, row) in zip(gl, cd, b.iterrows()):
            launch.append((row.start_ns - conv(c["ts"])) / 1e6)
            done.append((row.end_ns - conv(e["ts"] + e["dur"])) / 1e6)
            matched += 1
    return {"matched": matched, "launch_diff_ms": np.array(launch), "done_diff_ms": np.array(done)}


def compare_ddp_timers(run, folder) -> dict:
    """DDP reports iteration k-1's timers after iteration k (sample rate 1). Relative differences
    (syncviz − DDP)/DDP for forward, backward compute and backward comm, steps ≥ 1."""
    ev = run.events
    steps = A.step_metrics(run)
    fwd, bwd, comm, n = [], [], [], 0
    for info in run.meta["ranks"]:
        r = info["rank"]
        timers = json.loads((Path(folder) / f"ddp-timers-{r}.json").read_text())
        e = ev[ev["rank"] == r]
        for k in range(2, len(timers)):
            t, s = timers[k], k - 1
            es = e[e["step"] == s]
            f = es[es["kind"] == "forward"].iloc[0]
            bw = es[es["kind"] == "backward"].iloc[0]
            b = es[es["kind"] == "bucket"]
            m = steps[(steps["rank"] == r) & (steps["step"] == s)].iloc[0]
            fwd.append((bw.start_ns - f.start_ns) / t["forward_compute_time"] - 1)
            bwd.append(m.backward_ns / t["backward_compute_time"] - 1)
            comm.append((b.end_ns.max() - b.start_ns.min()) / t["backward_comm_time"] - 1)
            n += 1
    return {"n": n, "forward_rel": np.array(fwd), "backward_rel": np.array(bwd), "comm_rel": np.array(comm)}
