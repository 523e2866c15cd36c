"""What ran, when no wrapper told us: the model's root module(s) (so a hand-written loop, FSDP1,
DataParallel or an engine like DeepSpeed's gets forward rows and gradient-ready times) and the
name of the strategy (run.json "strategy" and "strategy_detail").

Root discovery. Until a model is instrumented explicitly (DDP, FSDP2 ``fully_shard``,
syncviz.sync) torch's *global* module forward hooks watch every module call of the training
thread; the outermost call of a module with trainable parameters is timed as a forward. At the end
of the first optimizer step the modules whose forward a backward reached are the roots: they get
ordinary per-module hooks and the global hooks are removed, because a global hook costs every
module call of every forward (benchmarks/discovery_cost.py measures both; figures in the README).
Roots not found after ``MAX_STEPS`` steps: discovery gives up (no forward rows, backward and
optimizer rows still come from autograd and the optimizer hooks).
"""
from __future__ import annotations

import threading
from typing import Any

import torch

MAX_STEPS = 3


class RootDiscovery:
    """Global forward hooks of the first step(s); see the module docstring."""

    def __init__(self, rec):
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        self.rec = rec
        self.depth = 0
        self.top = None
        self.thread = threading.get_ident()       # DataParallel runs replicas on other threads
        self.candidates: dict[int, tuple[torch.nn.Module, list]] = {}   # id → (module, reached markers)
        self.trainable: dict[int, bool] = {}
        self.steps_left = MAX_STEPS
        self.handles = [register_module_forward_pre_hook(self.pre),
                        register_module_forward_hook(self.post, always_call=True)]

    def pre(self, module, args):
        if self.thread != threading.get_ident() or torch._C._current_graph_task_id() != -1:
            return
        d = self.depth
        self.depth = d + 1
        if d:
            return
        key = id(module)
        ok = self.trainable.get(key)
        if ok is None:
            ok = self.trainable[key] = any(p.requires_grad for p in module.parameters())
        if not ok:
            return
        self.top = module
        if key not in self.candidates:
            self.candidates[key] = (module, [])
            self.rec.index_params(module)      # gradient-ready hooks from the first step on
        self.rec.forward_pre(module, args)

    def post(self, module, args, output):
        if self.thread != threading.get_ident() or torch._C._current_graph_task_id() != -1:
            return
        self.depth = max(0, self.depth - 1)
        if self.depth or module is not self.top:
            return
        self.top = None
        self.rec.forward_post(module, args, output)
        mark = self.rec.last_forward_mark()
        if mark is not None:
            self.candidates[id(module)][1].append(mark)

    def step_ended(self) -> bool:
        """At a step boundary: the roots are the candidates a backward reached. True when done."""
        roots = [m for m, marks in self.candidates.values() if any(r[0] for r in marks)]
        self.steps_left -= 1
        if not roots and self.steps_left > 0:
            return False
        self.stop()
        for m in roots:
            self.rec.hook_forward(m, discovered=True)
            wrapper = _wrapper_name(m)
            if wrapper:
                self.rec.observe(wrappers=wrapper, **_wrapper_facts(m))
        if roots:
            self.rec.annotate_model(roots[0])
        return True

    def stop(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.candidates.clear()


# ------------------------------------------------------------------------------- model facts

_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def _wrapper_name(module) -> str:
    """The class of a data-parallel wrapper (or an engine's module keeping the model as ``.module``);
    "" for a plain model."""
    name = type(module).__name__
    return name if name in _WRAPPERS or _inner(module) is not module else ""


def _wrapper_facts(module) -> dict[str, Any]:
    if type(module).__name__ == "FullyShardedDataParallel":
        strategy = getattr(module, "sharding_strategy", None)
        return {"fsdp1_sharding": getattr(strategy, "name", str(strategy))}
    if _inner(module) is not module and type(module).__name__ not in _WRAPPERS:
        return {"engine_module": type(module).__name__}
    return {}


def _inner(module):
    """The user's model inside wrappers that keep it as ``.module`` (DDP, DataParallel, FSDP1,
    DeepSpeed's engine)."""
    seen = 0
    while isinstance(getattr(module, "module", None), torch.nn.Module) and seen < 8:
        module = module.module
        seen += 1
    return module


def _numel(p) -> int:
    """Unsharded element count: FSDP1's FlatParameter holds a shard of the flattened parameters
    (its ``_unpadded_unsharded_size`` is the whole); a DTensor's numel() is already global."""
    size = getattr(p, "_unpadded_unsharded_size", None)
    return int(size.numel()) if size is not None else p.numel()


def model_facts(module, grad_params=None) -> tuple[dict, str]:
    """run.json "model" (name, params, bytes, grad_bytes) and the device type of ``module``."""
    params = list(module.parameters())
    grads = params if grad_params is None else list(grad_params)
    inner = _inner(module)
    name = type(inner).__name__
    if name.startswith("FSDP") and len(type(inner).__mro__) > 2:   # FSDP2's FSDP<cls> subclass
        name = name[4:]
    device = params[0].device.type if params else "cpu"
    return ({"name": name, "params": sum(_numel(p) for p in params),
             "bytes": sum(_numel(p) * p.element_size() for p in params),
             "grad_bytes": sum(_numel(p) * p.element_size() for p in grads if p.requires_grad)}, device)


def params_facts(params) -> dict:
    """run.json "model" from an optimizer's parameters (no module seen)."""
    return {"name": "(optimizer parameters)", "params": sum(_numel(p) for p in params),
            "bytes": sum(_numel(p) * p.element_size() for p in params),
            "grad_bytes": sum(_numel(p) * p.element_size() for p in params if p.requires_grad)}


# ---------------------------------------------------------------------------- strategy name

def name_strategy(obs: dict) -> tuple[str, str]:
    """(run.json "strategy", "strategy_detail") from what was observed (Recorder.observe):
    wrappers seen, DDP's comm hook, FSDP2 resharding, FSDP1's sharding strategy, optimizers,
    the ops of the collectives issued. A workload that knows better calls set_strategy."""
    wrappers = obs.get("wrappers", [])
    opts = obs.get("optimizers", [])
    ops = sorted(obs.get("collective_ops", []))
    zero = "ZeroRedundancyOptimizer" in opts
    if obs.get("fsdp2"):
        reshard = obs.get("reshard_after_forward", [])
        return "fsdp2", f"FSDP2 fully_shard (reshard_after_forward: {', '.join(map(str, reshard)) or 'default'})"
    if "FullyShardedDataParallel" in wrappers:
        return "fsdp1", f"FSDP1 FullyShardedDataParallel ({obs.get('fsdp1_sharding', '?')})"
    if "DistributedDataParallel" in wrappers:
        hook = obs.get("comm_hook", "default (allreduce, 1/N)")
        return ("zero1" if zero else "ddp"), ("DDP + ZeroRedundancyOptimizer" if zero else "DDP") + f", comm hook {hook}"
    if zero:
        return "zero1", "ZeroRedundancyOptimizer (no DDP)"
    if "DataParallel" in wrappers:
        return "dataparallel", "torch.nn.DataParallel (one process)"
    engine = obs.get("engine_module")
    if engine:
        return engine.lower(), f"{engine} (its own data parallelism; collectives: {', '.join(ops) or 'none'})"
    if ops:
        return "hand-written", f"hand-written collectives ({', '.join(ops)})"
    return "none", "no data parallelism observed"
