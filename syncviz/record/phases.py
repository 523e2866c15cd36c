"""The compute phases of a step, from hooks: forward (module forward hooks), backward (autograd:
a pre-hook on the outputs' grad_fn starts it, an engine callback ends it), gradient-ready times
(post-accumulate-grad hooks) and optimizer steps (torch's global optimizer step hooks; the
outermost step ends the training step). Mixed into the Recorder, which owns the step state."""
from __future__ import annotations

from typing import Iterable

import torch

from syncviz.record import clock
from syncviz.record.events import Phase
from syncviz.trace import schema as S


class PhaseHooks:
    """Hook callables of the Recorder. They only append named records (DESIGN.md: no device sync,
    no I/O in a hook); the step boundary (``end_step``) turns them into a record batch."""

    # ------------------------------------------------------------------ gradient ready
    def grad_hook(self, index: int):
        """A post-accumulate-grad hook that stamps parameter ``index``'s gradient as ready."""
        ready, now = self._ready, clock.local_ns

        def hook(p, _i=index):
            # A plain tuple in GradReady's field order: building the NamedTuple here cost ~650 ns
            # more per call (timeit, min of 15), ~0.65 ms a step for 1,000 parameters; batch.py
            # names it at the step boundary.
            ready.append((_i, now(), self.micro))
        return hook

    def grad_ready(self, index: int) -> None:
        """Stamp parameter ``index``'s gradient as ready now (engines without a per-parameter hook)."""
        self._ready.append((index, clock.local_ns(), self.micro))

    # ------------------------------------------------------------------ forward / backward
    def forward_pre(self, module, args):
        # Only the outermost instrumented forward counts, and not a recomputation inside backward
        # (activation checkpointing re-runs forwards while the autograd engine is running).
        if torch._C._current_graph_task_id() != -1:
            return
        self._fwd_depth += 1
        if self._fwd_depth > 1:
            return
        t = self.now()
        if self._step_start is None:
            self._step_start = t
            if self.profiler is not None:
                self.profiler.on_step_begin(self.step)
            if self._cuda:
                anchor = torch.cuda.Event(enable_timing=True)
                anchor.record()
                self._anchor = (t, anchor)
        self.micro += 1
        self._fwd_start = t

    def forward_post(self, module, args, output):
        if self._end_forward():
            micro = self.micro
            for tensor in _tensors(output):
                if tensor.grad_fn is not None:
                    tensor.grad_fn.register_prehook(self._backward_start(micro))

    def forward_post_first(self, module, args, output):
        """forward_post for hooks that run before the module's other hooks: backward start is a
        tensor hook on the outputs, which runs before hooks registered later on the same tensors."""
        if self._end_forward():
            for tensor in _tensors(output):
                if tensor.requires_grad and tensor.grad_fn is not None:
                    tensor.register_hook(self._backward_start_tensor(self.micro))

    def _end_forward(self) -> bool:
        """Record the outermost forward's end; True when its backward start should be hooked."""
        if torch._C._current_graph_task_id() != -1:
            return False
        self._fwd_depth = max(0, self._fwd_depth - 1)
        if self._fwd_depth:
            return False
        self._phases.append(Phase(S.FORWARD, "forward", self._fwd_start, self.now(), self.micro))
        return torch.is_grad_enabled()

    def _backward_start_tensor(self, micro: int):
        # FSDP2 queues its own end-of-backward callback (the root's reduce-scatter) after ours:
        # end the backward row one callback later, after it (callbacks may queue callbacks)
        prehook = self._backward_start(micro, defer=True)

        def hook(grad):
            prehook((grad,))
        return hook

    def _backward_start(self, micro: int, defer: bool = False):
        def prehook(grad_outputs):
            if micro not in self._bwd_start:
                t = self.now()
                self._bwd_start[micro] = t
                engine = torch.autograd.Variable._execution_engine

                def end():
                    self._phases.append(Phase(S.BACKWARD, "backward", t, self.now(), micro))
                engine.queue_callback((lambda: engine.queue_callback(end)) if defer else end)
        return prehook

    # ------------------------------------------------------------------ optimizer
    def _install_optimizer_hooks(self) -> None:
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        self._opt_handles = [register_optimizer_step_pre_hook(self._opt_pre),
                             register_optimizer_step_post_hook(self._opt_post)]

    def _opt_pre(self, opt, args, kwargs):
        self._opt_stack.append((self.now(), type(opt).__name__))

    def _opt_post(self, opt, args, kwargs):
        if not self._opt_stack:
            return
        start, name = self._opt_stack.pop()
        # depth = nesting (ZeroRedundancyOptimizer's step wraps the inner AdamW's)
        self._phases.append(Phase(S.OPTIMIZER, name, start, self.now(), self.micro, len(self._opt_stack)))
        if not self._opt_stack:
            self.end_step()

    # ------------------------------------------------------------------ modules
    def instrument_module(self, module: torch.nn.Module, *, prepend: bool = True) -> torch.nn.Module:
        """Forward, backward-start and gradient-ready instrumentation of a model that is not DDP
        (an FSDP2 ``fully_shard`` module; its collectives come from syncviz.record.collectives).
        Nested instrumented modules (FSDP2 blocks inside the root) count one forward: the outermost."""
        if getattr(module, "_syncviz_instrumented", False):
            return module
        module._syncviz_instrumented = True
        self.index_params(module)
        # prepend: FSDP2's own hooks (the root's all-gather before forward, its pre-backward
        # all-gathers hooked on the outputs) must fall inside our forward and backward
        self.hook_forward(module, prepend=prepend)
        self.annotate_model(module)
        return module

    def hook_forward(self, module: torch.nn.Module, *, prepend: bool = False) -> None:
        """Time ``module``'s forward as the step's forward and hook backward start on its outputs."""
        post = self.forward_post_first if prepend else self.forward_post
        self.add_hook_handle(module.register_forward_pre_hook(self.forward_pre, prepend=prepend))
        self.add_hook_handle(module.register_forward_hook(post, prepend=prepend))

    def index_params(self, module: torch.nn.Module, hook_grads: bool = True) -> dict[int, int]:
        """Number the parameters (first seen, first numbered) and hook their gradient accumulation.
        Sharded DTensor parameters (FSDP2) get no hook: FSDP2 accumulates into separate unsharded
        tensors, and the reduce-scatter collectives mark when a group's gradients were ready.
        Returns id(param) → index for the module's parameters."""
        names = {id(p): n for n, p in module.named_parameters()}
        for p in module.parameters():
            if id(p) in self._param_index:
                continue
            i = len(self._param_index)
            self._param_index[id(p)] = (i, names.get(id(p), f"param{i}"))
            if hook_grads and p.requires_grad and not _is_dtensor(p):
                self.add_hook_handle(p.register_post_accumulate_grad_hook(self.grad_hook(i)))
        return {id(p): self._param_index[id(p)][0] for p in module.parameters()}

    def param_index(self, p) -> tuple[int, str]:
        """(index, name) of a parameter indexed by index_params; (-1, "?") otherwise."""
        return self._param_index.get(id(p), (-1, "?"))

    def annotate_model(self, module: torch.nn.Module, grad_params=None) -> None:
        """run.json's model facts (name, parameter count, bytes, gradient bytes) and device."""
        params = list(module.parameters())   # DTensor numel() is the global (unsharded) size
        grads = params if grad_params is None else list(grad_params)
        name = type(module).__name__
        if name.startswith("FSDP") and len(type(module).__mro__) > 2:   # FSDP2's FSDP<cls> subclass
            name = name[4:]
        device = params[0].device.type if params else "cpu"
        self.annotate(model={
            "name": name, "params": sum(p.numel() for p in params),
            "bytes": sum(p.numel() * p.element_size() for p in params),
            "grad_bytes": sum(p.numel() * p.element_size() for p in grads if p.requires_grad)},
            device=device)
        self._cuda = self._cuda or device == "cuda"


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" or hasattr(t, "_local_tensor")


def _tensors(obj) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, k))
