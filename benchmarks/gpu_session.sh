#!/bin/bash
# A lent GPU's whole check in one call of ~9 minutes (a session gets 15 minutes of device time, the
# machine's start included), each part under its own timeout so that a slow part cannot cost the
# others their results. Run from the repository root on the GPU machine, e.g. through the device
# tool: run(command="bash benchmarks/gpu_session.sh", timeout_s=600). Nothing is fetched there:
# it installs this checkout without dependencies (the machine's image has torch, triton, pandas,
# pyarrow, click, rich, pytest; dash and plotly are not needed by the checks).
#
# What comes back under $OUT (at most 8 files): session.log (every part's output and the reports
# as text), crosscheck.json, cuda_tests.json + cuda_tests.log, checks.json (sync_debug, engine),
# overhead.json (benchmarks/overhead.py --json), enqueued.json (plain vs traced host enqueue times),
# pyspy.txt (collapsed stacks, plain;... and traced;..., where py-spy was carried).
# Session 22 (2026-11-27) ran these parts by hand: the crosscheck alone ~35 s, sync_debug + engine
# ~70 s, the native build 34 s, 5 launches of the overhead harness ~200 s; pytest -m cuda did not
# finish in 250 s (now its log is written as it runs).
set -u
OUT=${OUT:-gpu-session}; mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 SYNCVIZ_CACHE_DIR=${SYNCVIZ_CACHE_DIR:-/tmp/syncviz-cache}
t0=$(date +%s); at() { echo "== $1 (at $(( $(date +%s) - t0 )) s)"; }
py=${PYTHON:-python3}

at "machine"
nvidia-smi -L
$py -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'triton', triton.__version__)"
$py -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install -e . failed: the checks use the checkout as is"

at "C++ recording hooks"
$py -m syncviz.record.native
$py -c "import syncviz.record.native as n; m = n.load(); print('loaded:', m is not None, '| TimedGroup:', hasattr(m, 'TimedGroup'))"

check() {   # check NAME SECONDS GROUPS: one gpu_check run, its report kept as NAME.json
  timeout "$2" $py benchmarks/gpu_check.py --out "$OUT/$1.d" --only "$3"
  [ -f "$OUT/$1.d/report.md" ] && cat "$OUT/$1.d/report.md"
  [ -f "$OUT/$1.d/report.json" ] && mv "$OUT/$1.d/report.json" "$OUT/$1.json"
  [ -f "$OUT/$1.d/cuda_tests.log" ] && mv "$OUT/$1.d/cuda_tests.log" "$OUT/cuda_tests.log"
  rm -rf "$OUT/$1.d"
}

at "crosscheck (alone on the GPU: its bucket times are GPU times)"
check crosscheck 90 crosscheck

at "cuda tests, beside sync_debug and engine"
check cuda_tests 200 cuda_tests & a=$!
check checks 150 sync_debug,engine & b=$!
wait $a $b        # by pid: a bare wait would also wait for the tee above, which never ends

at "host enqueue time, plain vs traced GPT-2 small (two alternated pairs of 30 steps)"
A="benchmarks/overhead_script.py --case gpt2-small --device cuda --steps 30 --warmup 5"
for i in 1 2; do
  timeout 60 $py -m torch.distributed.run --standalone --nproc-per-node 1 $A --out "$OUT/p$i.tmp" >/dev/null 2>&1
  timeout 60 $py -m syncviz trace --standalone --nproc-per-node 1 --quiet --overwrite --out /tmp/gpu-session-run $A --out "$OUT/s$i.tmp" >/dev/null 2>&1
done
grep -o '"grad_ready_hooks": "[^"]*"' /tmp/gpu-session-run/run.json
$py - "$OUT" <<'PY'
import json, statistics as st, sys, pathlib
out = pathlib.Path(sys.argv[1]); res = {}
for k in ("p1", "s1", "p2", "s2"):
    f = out / f"{k}.tmp"
    if not f.exists():
        print(k, "missing"); continue
    d = json.loads(f.read_text()); f.unlink()
    wall = [x[0] for b in d["blocks"] for x in b]
    res[k] = {"wall_ms": [round(1e3 * w, 2) for w in wall], "enqueued_ms": [round(1e3 * e, 2) for e in d["enqueued"]]}
    print(k, "wall %.2f ms, enqueued %.2f ms (medians)" % (1e3 * st.median(wall), 1e3 * st.median(d["enqueued"])))
(out / "enqueued.json").write_text(json.dumps(res))
PY

# Where the traced host's extra time goes (session 22: ~10 ms a step on CUDA, not established):
# py-spy's collapsed stacks of a plain and a traced run, every thread, when py-spy is there. The
# image has none: carry its wheel (README, "On a GPU") and install it with pip --target /tmp/site.
spy=$(command -v py-spy || ls /tmp/site/bin/py-spy 2>/dev/null)
if [ -n "$spy" ]; then
  at "py-spy: plain and traced GPT-2 small, 200 Hz, every thread and subprocess"
  timeout 60 "$spy" record -r 200 -f raw --subprocesses --threads --nonblocking -o "$OUT/spy-plain.tmp" -- \
    $py -m torch.distributed.run --standalone --nproc-per-node 1 $A --out /tmp/gpu-session-spy.json >/dev/null 2>&1
  timeout 60 "$spy" record -r 200 -f raw --subprocesses --threads --nonblocking -o "$OUT/spy-traced.tmp" -- \
    $py -m syncviz trace --standalone --nproc-per-node 1 --quiet --overwrite --out /tmp/gpu-session-spy \
    $A --out /tmp/gpu-session-spy.json >/dev/null 2>&1
  { sed 's/^/plain;/' "$OUT/spy-plain.tmp"; sed 's/^/traced;/' "$OUT/spy-traced.tmp"; } > "$OUT/pyspy.txt" 2>/dev/null
  rm -f "$OUT"/spy-*.tmp; wc -l "$OUT/pyspy.txt"
fi

at "overhead: benchmarks/overhead.py, GPT-2 small, plain vs traced"
timeout 230 $py benchmarks/overhead.py --device cuda --cases gpt2-small --tools syncviz --launches 4 --rounds 40 \
  --steps 10 --warmup 5 --json "$OUT/overhead.json" | grep -v " round "
at "done"
