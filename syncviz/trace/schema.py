"""The trace contract: what a run directory holds (see DESIGN.md, "The trace").

Every stage (record, model/simulate, analysis, views) imports this module and nothing else of the
others' internals. A run is a directory with ``run.json``, one ``rank-<r>.arrow`` Arrow IPC stream
per rank (one record batch per flushed step) and ``layout-<r>.arrow`` (bucket → parameters); while
``syncviz trace`` runs, ``inflight-<r>.json`` (each rank's unfinished collectives, removed at the
end) and, after a detected hang, ``hang.json`` (who was stuck in what).
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_NAME = "syncviz-trace"
SCHEMA_MAJOR = 1
SCHEMA_MINOR = 0
SCHEMA_VERSION = f"{SCHEMA_NAME}/{SCHEMA_MAJOR}"

RUN_FILE = "run.json"
CACHE_DIR = ".syncviz-cache"   # whole-run tables kept beside a run by its views (views/runcache.py); not trace data


def rank_file(rank: int) -> str:
    return f"rank-{rank}.arrow"


def layout_file(rank: int) -> str:
    return f"layout-{rank}.arrow"


# Event kinds. "bucket" is one DDP gradient bucket's communication as DDP sees it (comm hook
# called → future done); "collective" is one torch.distributed call (any strategy).
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
BUCKET, COLLECTIVE, GRAD_READY, STEP = "bucket", "collective", "grad_ready", "step"
# A forward no backward followed (evaluation, no_grad, inference_mode): not a micro-step, not compute
# of the training step's forward phase.
EVAL_FORWARD = "eval_forward"
# "offload": host-side work of an offloading engine (DeepSpeed's CPU optimizer step, device↔host
# copies, NVMe swaps), nested in the forward, backward or optimizer row it ran in; name says what moved.
OFFLOAD = "offload"
KINDS = (FORWARD, BACKWARD, OPTIMIZER, BUCKET, COLLECTIVE, GRAD_READY, STEP, EVAL_FORWARD, OFFLOAD)
COMPUTE_KINDS = (FORWARD, BACKWARD, OPTIMIZER)
COMM_KINDS = (BUCKET, COLLECTIVE)

# Collective ops, named as torch.distributed names them (coalesced forms map to their base op).
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
       "barrier", "send", "recv", "gather", "scatter")

PHASES = ("forward", "backward", "optimizer", "other")

# A synchronous collective on host memory: the rank waited in it until the data had moved. The
# recorder appends this suffix to the row's name; analysis cuts that time out of compute.
BLOCKING = " (blocking)"

# Strategy names, one home for every stage.
# - TORCH_STRATEGIES: what the built-in workload runs with torch's own implementations (and what
#   run.json's "strategy" holds for such runs); theory derives their bytes and memory.
# - DS_STRATEGIES: DeepSpeed's ZeRO on the built-in workload (run.json's strategy for any DeepSpeed
#   run; syncviz.model.ds_theory derives them).
# - SYNC_STRATEGIES: syncviz's own engine (syncviz.sync).
# - SIM_STRATEGIES: what the simulator replays; MODEL_STRATEGIES: what the memory/comm model prices.
TORCH_STRATEGIES = ("ddp", "ddp-fp16", "ddp-bf16", "powersgd", "zero1", "zero2", "zero3")
DDP_FAMILY = ("ddp", "ddp-fp16", "ddp-bf16", "powersgd", "zero1")
FSDP_STRATEGIES = ("zero2", "zero3")
DS_STRATEGIES = ("ds-zero1", "ds-zero2", "ds-zero3", "ds-offload", "ds-infinity")
WORKLOAD_STRATEGIES = TORCH_STRATEGIES + DS_STRATEGIES
SYNC_STRATEGIES = ("all_reduce", "reduce_scatter")
SIM_STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
MODEL_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload")


def dtype_name(dtype) -> str:
    """'float32' for torch.float32 (the trace stores dtypes as torch's names without 'torch.')."""
    return "" if dtype is None else str(dtype).replace("torch.", "")

# Event columns. Times are int64 ns on the aligned clock (ns since run start, rank 0's clock);
# -1 means "not applicable" for integer columns and "" for strings.
EVENT_SCHEMA = pa.schema([
    ("step", pa.int64()),        # optimizer step (0-based)
    ("micro", pa.int32()),       # micro-step (forward number inside the step; gradient accumulation)
    ("kind", pa.string()),       # one of KINDS
    ("name", pa.string()),       # e.g. parameter name (grad_ready), hook name (bucket), op label
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("bucket", pa.int32()),      # bucket index, -1 where none
    ("op", pa.string()),         # collective op (OPS) for bucket/collective rows
    ("bytes", pa.int64()),       # bytes for busbw per nccl-tests (whole array for RS/AG)
    ("dtype", pa.string()),
    ("group_size", pa.int32()),
    ("ready_ns", pa.int64()),    # bucket: when its last gradient was ready (this rank)
    ("launch_ns", pa.int64()),   # collective: its call; bucket: the collective's call inside the hook (start_ns = hook entry)
    ("phase", pa.string()),      # which compute phase the launch fell in (PHASES)
    ("layout", pa.int32()),      # bucket-layout version (DDP rebuilds buckets after step 0)
    ("logical_bytes", pa.int64()),  # bucket: uncompressed gradient bytes (== bytes unless compressed)
])
EVENT_COLUMNS = tuple(EVENT_SCHEMA.names)
# Columns of few distinct values that every reader (load_run, the dashboard) holds as pandas
# categoricals: one list, so a run is typed the same everywhere.
CATEGORICAL_COLUMNS = ("kind", "op", "phase", "name", "dtype")

# Defaults used for missing values and for columns an older minor version did not write.
EVENT_DEFAULTS = {
    "step": -1, "micro": 0, "kind": "", "name": "", "start_ns": -1, "end_ns": -1, "bucket": -1,
    "op": "", "bytes": 0, "dtype": "", "group_size": 0, "ready_ns": -1, "launch_ns": -1,
    "phase": "", "layout": -1, "logical_bytes": 0,
}

LAYOUT_SCHEMA = pa.schema([
    ("layout", pa.int32()),      # layout version: 0 = DDP's initial buckets, 1 = after rebuild
    ("bucket", pa.int32()),
    ("param", pa.string()),      # parameter name
    ("param_index", pa.int32()), # index in model.parameters()
    ("numel", pa.int64()),
    ("offset", pa.int64()),      # element offset of the parameter inside the bucket buffer
    ("dtype", pa.string()),
])
LAYOUT_COLUMNS = tuple(LAYOUT_SCHEMA.names)


# Optional: gradient values (``syncviz trace --grad-values [K]``, off by default), one
# ``grads-<r>.arrow`` stream per rank, one record batch per step. For every parameter of every DDP
# bucket: its first K gradient elements and its L2 norm, as this rank held them when DDP handed the
# bucket to the comm hook ("before": the local gradient, not yet scaled by 1/N) and when the
# bucket's collective completed ("after": what DDP copies into .grad). Values are float64 copies
# of the gradient dtype's values (exact for fp32/bf16/fp16). syncviz.analysis.grads checks after = mean(before).
def grads_file(rank: int) -> str:
    return f"grads-{rank}.arrow"


GRAD_BEFORE, GRAD_AFTER = "before", "after"
GRADS_SCHEMA = pa.schema([
    ("step", pa.int64()),        # optimizer step
    ("micro", pa.int32()),       # micro-step whose backward launched the bucket
    ("bucket", pa.int32()),
    ("layout", pa.int32()),      # bucket-layout version (as in layout-<r>.arrow)
    ("param", pa.string()),      # parameter name
    ("param_index", pa.int32()),
    ("numel", pa.int64()),       # parameter elements (the norm is over all of them)
    ("when", pa.string()),       # GRAD_BEFORE | GRAD_AFTER
    ("norm", pa.float64()),      # L2 norm of the whole parameter gradient
    ("values", pa.list_(pa.float64())),   # its first K elements (flattened order)
    ("dtype", pa.string()),
])
GRADS_COLUMNS = tuple(GRADS_SCHEMA.names)


def stream_metadata(rank: int) -> dict[bytes, bytes]:
    """Schema-level metadata of every rank stream: readers check the version before data."""
    return {b"syncviz.schema": SCHEMA_VERSION.encode(),
            b"syncviz.minor": str(SCHEMA_MINOR).encode(),
            b"syncviz.rank": str(rank).encode()}


def parse_version(text: str) -> int:
    """Major version of a ``syncviz-trace/N`` string; raises ValueError when it is not one."""
    name, _, major = str(text).partition("/")
    if name != SCHEMA_NAME or not major.isdigit():
        raise ValueError(f"not a syncviz trace version: {text!r}")
    return int(major)


# run.json keys (documented here once; writers fill what they know, readers use .get()).
RUN_KEYS = {
    "schema": "SCHEMA_VERSION",
    "run_id": "uuid4 hex",
    "name": "run name (directory name by default)",
    "command": "command line that was traced (list of str)",
    "created": "UTC ISO-8601 time the run started",
    "world_size": "number of ranks",
    "nodes": "number of nodes",
    "backend": "gloo | nccl | ...",
    "device": "cpu | cuda",
    "strategy": "ddp | ddp-fp16 | ddp-bf16 | powersgd | zero1 | zero2 | zero3 | syncviz-all_reduce | ... as the "
                "workload set it, else as observed: ddp | zero1 | fsdp2 | fsdp1 | dataparallel | hand-written | "
                "<engine module class, lower case> | none",
    "strategy_detail": "what was observed, in words (wrapper, comm hook, resharding, sharding strategy, ops)",
    "engine": "torch | syncviz | deepspeed | simulated",
    "torch_version": "torch.__version__",
    "syncviz_version": "syncviz.__version__",
    "model": "{params: int, bytes: int, grad_bytes: int, name: str}",
    "ddp": "{bucket_cap_mb, first_bucket_cap_mb, gradient_as_bucket_view, static_graph, "
           "find_unused_parameters, comm_hook}",
    "ranks": "[{rank, host, pid, clock_offset_ns, clock_error_ns, clock_offset_end_ns, "
             "clock_error_end_ns, local_rank, node}]",
    "steps_recorded": "number of complete steps rank 0 flushed (updated at each flush interval and at exit)",
    "finished": "true once every rank closed its stream cleanly",
    "memory": "{params_bytes, grads_bytes, optimizer_bytes, peak_allocated_bytes} per rank (optional)",
    "deepspeed": "{version, stage, offload_optimizer, offload_param (none|cpu|nvme), reduce_bucket_size, "
                 "allgather_bucket_size, overlap_comm, contiguous_gradients, reduce_scatter, precision, "
                 "gradient_accumulation_steps, optimizer, zero_optimizer, ...} (DeepSpeed runs)",
    "simulated": "cost-model parameters when engine == simulated (optional)",
    "grad_values": "{elements: K, files: 'grads-<rank>.arrow'} when gradient values were recorded "
                   "(--grad-values; optional, see GRADS_SCHEMA)",
    "gathered_ranks": "ranks of other nodes whose files rank 0 received through torchrun's store (optional)",
}
