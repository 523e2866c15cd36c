"""DeepSpeed strategies for the built-in workload (``--strategy ds-zero1 ... ds-infinity``): the
same GPT, data and AdamW settings as torch's strategies, trained by DeepSpeed's engine.

    ds-zero1     ZeRO stage 1: optimizer states partitioned
    ds-zero2     ZeRO stage 2: + gradients partitioned
    ds-zero3     ZeRO stage 3: + parameters partitioned (gathered per module in forward and backward)
    ds-offload   ZeRO-Offload: stage 2, optimizer states and the fp32 master partition on the host,
                 updated there by DeepSpeedCPUAdam
    ds-infinity  ZeRO-Infinity: stage 3, parameters and optimizer states offloaded to NVMe

All in fp32 (as the torch strategies). Settings chosen so that what each rank sends is a function
of the model's shapes (syncviz.model.ds_theory derives it): ZeRO-3 partitions every parameter
(``stage3_param_persistence_threshold`` 0) and re-gathers each one in backward
(``stage3_max_reuse_distance`` 0). Bucket sizes come from ``--bucket-cap-mb`` (MiB of fp32
gradients → elements). Stages 1-3 use torch's AdamW as DeepSpeed's client optimizer (bitwise the
update the torch strategies make); Offload and Infinity use DeepSpeedCPUAdam (AdamW mode).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist

DS_STRATEGIES = ("ds-zero1", "ds-zero2", "ds-zero3", "ds-offload", "ds-infinity")


def ds_config(strategy: str, cfg, nvme_dir: str | None = None) -> dict:
    """The DeepSpeed config.json of ``strategy`` for workload config ``cfg``."""
    elems = int(cfg.bucket_cap_mb * 2**20 / 4) // 2 * 2   # DeepSpeed wants a multiple of 2 (fp16 alignment)
    stage = {"ds-zero1": 1, "ds-zero2": 2, "ds-zero3": 3, "ds-offload": 2, "ds-infinity": 3}[strategy]
    zero = {"stage": stage, "reduce_bucket_size": elems, "allgather_bucket_size": elems,
            "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        # no prefetch: with it, DeepSpeed keeps parameters it prefetched "for a later use" gathered
        # through backward, and what it re-gathers depends on timing (tiny GPT, 50 kB buckets: 1.41 P
        # gathered per step, none in backward; without: P + tied in forward and again in backward)
        zero.update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0,
                    stage3_prefetch_bucket_size=0, stage3_max_live_parameters=int(1e9))
    if strategy == "ds-offload":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if strategy == "ds-infinity":
        # the swap buffers must hold the largest parameter partition (GPT: the embedding)
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_dir, "pin_memory": False,
                                     "buffer_count": 4}
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_dir, "pin_memory": False,
                                 "buffer_count": 5, "buffer_size": int(1e8)}
    out = {"train_micro_batch_size_per_gpu": cfg.batch, "gradient_accumulation_steps": cfg.accum,
           "zero_optimization": zero, "gradient_clipping": 0.0, "steps_per_print": 10**9,
           "wall_clock_breakdown": False, "zero_allow_untested_optimizer": True}
    if strategy in ("ds-offload", "ds-infinity"):
        out["optimizer"] = {"type": "AdamW", "params": {"lr": cfg.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                        "weight_decay": 0.01}}
    if strategy == "ds-infinity":
        out["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False,
                      "overlap_events": True, "thread_count": 1}
    return out


def wrap(model: torch.nn.Module, cfg):
    """(engine, engine): DeepSpeed's engine is both the model and the thing that steps."""
    from syncviz.workloads import ds_build
    ds_build.skip_shm_comm()
    import deepspeed
    nvme_dir = None
    if cfg.strategy == "ds-infinity":
        root = os.environ.get("SYNCVIZ_NVME_DIR") or None
        nvme_dir = tempfile.mkdtemp(prefix=f"syncviz-nvme-r{dist.get_rank()}-", dir=root)
    config = ds_config(cfg.strategy, cfg, nvme_dir)
    client_opt = None
    if "optimizer" not in config:
        client_opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client_opt, config=config,
                                           dist_init_required=False)
    engine._syncviz_nvme_dir = nvme_dir
    api = sys.modules.get("syncviz.record.api")    # tracing? (an untraced run imports no recorder)
    rec = api.get_recorder() if api is not None else None
    if rec is not None:
        from syncviz.workloads.strategies import probe_backend
        shapes = {n: list(p.shape) for n, p in model.named_parameters() if p.requires_grad}
        probe = None
        if dist.get_world_size() > 1:
            with rec.own_collectives():
                probe = probe_backend()
        # the engine's facts (deepspeed_engine put them there at construction) win over the shapes
        rec.annotate(strategy_config={"name": cfg.strategy, "param_shapes": shapes,
                                      **(rec.meta_extra.get("strategy_config") or {}), "ds_config": config},
                     **({"backend_probe": probe} if probe else {}))
        _measure_memory(engine, rec)
    return engine, engine


def cleanup(engine) -> None:
    d = getattr(engine, "_syncviz_nvme_dir", None)
    if d:
        shutil.rmtree(d, ignore_errors=True)


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    """Full parameters of the model (ZeRO-3: gathered, a collective every rank must call)."""
    import deepspeed
    module = engine.module
    params = list(module.parameters())
    if engine.zero_optimization_stage() == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------------------ memory

def _dir_bytes(path: str | None) -> int:
    total = 0
    for root, _, files in os.walk(path or "", followlinks=False):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def measure(engine, grads_bytes: int | None) -> dict:
    """Bytes this rank holds, by what and where (device / host / NVMe), after optimizer step 0.
    On DeepSpeed's CPU accelerator "device" memory is host RAM too; the split is DeepSpeed's
    placement (what an accelerator would hold vs what offloading moved off it)."""
    from syncviz.record.deepspeed_engine import engine_config
    from syncviz.workloads.strategies import held_bytes
    opt = engine.optimizer
    cfg = engine_config(engine)
    off_opt, off_par = cfg["offload_optimizer"], cfg["offload_param"]
    stage = engine.zero_optimization_stage()
    if stage == 3:
        params = held_bytes(getattr(opt, "fp16_partitioned_groups_flat", []) or [])
        master = held_bytes(getattr(opt, "fp32_partitioned_groups_flat", []) or [])
    else:
        params = held_bytes(getattr(opt, "bit16_groups_flat", []) or [])
        master = held_bytes(getattr(opt, "single_partition_of_fp32_groups", []) or [])
    inner = getattr(opt, "optimizer", opt)
    states = held_bytes(v for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    # in memory: on the accelerator unless offloaded (to host, or to NVMe: what is not swapped out,
    # DeepSpeed keeps in host memory); on NVMe: the bytes of its swap files
    where = {"params": "device" if off_par == "none" else "host",
             "optimizer": "device" if off_opt == "none" else "host"}
    split = {"device": 0, "host": 0, "nvme": _dir_bytes(getattr(engine, "_syncviz_nvme_dir", None))}
    split[where["params"]] += params
    split[where["optimizer"]] += master + states + (grads_bytes or 0)   # gradients live with the optimizer
    return {"rank": dist.get_rank() if dist.is_initialized() else 0, "params_bytes": params,
            "grads_bytes": grads_bytes, "optimizer_bytes": master + states, "master_params_bytes": master,
            "optimizer_states_bytes": states, "device_bytes": split["device"], "host_bytes": split["host"],
            "nvme_bytes": split["nvme"], "placement": where, "params_after_forward_bytes": None,
            "peak_allocated_bytes": None}


def _grads_held(engine) -> int:
    """Gradient bytes held when backward ends (DeepSpeed frees or re-partitions them in step)."""
    from syncviz.workloads.strategies import held_bytes
    opt = engine.optimizer
    seen: set = set()
    if engine.zero_optimization_stage() == 3:
        buf = getattr(opt, "grad_partitions_flat_buffer", None)
        return held_bytes([buf] if buf is not None else [], seen)
    # stage 1/2: what is left of the gradients once DeepSpeed reduced them: this rank's partition
    # (averaged_gradients; ZeRO-Offload: the fp32 .grad of the host partition) and any .grad
    tensors = [t for ts in (getattr(opt, "averaged_gradients", {}) or {}).values() for t in (ts or [])]
    if getattr(opt, "cpu_offload", False):
        tensors += [t.grad for t in getattr(opt, "single_partition_of_fp32_groups", [])]
    tensors += [p.grad for p in engine.module.parameters()]
    return held_bytes(tensors, seen)


def _measure_memory(engine, rec) -> None:
    """Once: gradients at the end of backward 0, the rest after optimizer step 0; gathered to rank
    0's run.json ("memory", one entry per rank)."""
    orig_backward, orig_step = engine.backward, engine.step
    seen = {}

    def backward(loss, *a, **kw):
        out = orig_backward(loss, *a, **kw)
        if engine.is_gradient_accumulation_boundary() and "grads" not in seen:
            seen["grads"] = _grads_held(engine)
            engine.backward = orig_backward
        return out

    def step(*a, **kw):
        out = orig_step(*a, **kw)
        if "grads" in seen:
            engine.step = orig_step
            mine = measure(engine, seen["grads"])
            ranks = [None] * dist.get_world_size()
            with rec.own_collectives():
                dist.all_gather_object(ranks, mine)
            rec.annotate(memory=ranks)
        return out

    engine.backward, engine.step = backward, step
