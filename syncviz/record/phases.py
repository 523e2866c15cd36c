"""The compute phases of a step, from hooks, whatever engine runs the loop (DDP, FSDP, DeepSpeed,
Lightning, accelerate, a hand-written loop):

- forward: forward hooks on the model's root module(s): the DDP / FSDP2 / syncviz.sync module when
  one is built, else the roots discovery.py finds (outermost module calls with trainable
  parameters). A forward is provisional until a backward reaches its outputs (a ``grad_fn``
  pre-hook marks it); one no backward reached by the end of the step, or one run with grad
  disabled (``no_grad``, ``inference_mode``, evaluation), is an ``eval_forward`` and no micro-step.
- backward: autograd itself. ``torch.autograd.backward`` (which ``Tensor.backward`` calls, whatever
  calls that: DeepSpeed's engine, Lightning, accelerate, a loop) is wrapped; its outermost call is
  the backward row and starts a micro-step. A backward run inside the engine (reentrant activation
  checkpointing) is part of the outer one.
- gradient-ready times: post-accumulate-grad hooks on the model's and the optimizer's parameters.
- optimizer: torch's global optimizer step hooks; the outermost step ends the training step. The
  part of ``step(closure)`` spent in the closure (Lightning runs forward and backward there) is cut
  out: the optimizer row is split into pieces around each closure call.

Mixed into the Recorder, which owns the step state. Hooks only append named records (DESIGN.md:
no device sync, no I/O in a hook); the step boundary turns them into a record batch.
"""
from __future__ import annotations

import functools
import time
import weakref
from typing import Iterable

import numpy as np
import torch

from syncviz.record import clock, native
from syncviz.record.cudaclock import timing_event
from syncviz.record.events import Phase
from syncviz.trace import schema as S

_BACKWARD_TARGET = None     # the recorder the torch.autograd.backward wrapper reports to
_ORIG_BACKWARD = None


def _install_backward_wrapper(rec) -> None:
    """Route ``torch.autograd.backward`` through one wrapper (installed once per process); the
    latest recorder receives its calls. Tensor.backward looks the function up at call time."""
    global _BACKWARD_TARGET, _ORIG_BACKWARD
    _BACKWARD_TARGET = rec
    if _ORIG_BACKWARD is not None:
        return
    orig = _ORIG_BACKWARD = torch.autograd.backward

    @functools.wraps(orig)
    def backward(*args, **kwargs):
        rec = _BACKWARD_TARGET
        if rec is None:
            return orig(*args, **kwargs)
        token = rec.backward_begin()
        try:
            return orig(*args, **kwargs)
        finally:
            rec.backward_end(token)

    backward.__wrapped__ = orig
    torch.autograd.backward = backward


def release_backward_wrapper(rec) -> None:
    global _BACKWARD_TARGET
    if _BACKWARD_TARGET is rec:
        _BACKWARD_TARGET = None


class PhaseHooks:
    """Hook callables of the Recorder."""

    def _init_phases(self) -> None:
        self._fwd_depth = 0                     # nesting of instrumented modules' forwards
        self._fwd_start = -1
        self._micro_before = -1
        self._fwd_open: list[list] = []          # [start, end, micro, reached] grad forwards not yet backpropagated
        self._micros = 0                        # backward calls (micro-steps) started in this step
        self._bwd_depth = 0
        self._opt_stack: list[list] = []         # [piece start, name] per optimizer step in progress
        self._optimizers_seen: dict[int, str] = {}
        self._install_optimizer_hooks()
        _install_backward_wrapper(self)

    def _reset_phases(self) -> None:
        if self._native is not None:
            self._native.clear()                # a step not recorded (--steps) was not taken
        self._fwd_depth = 0
        self._fwd_open = []
        self._micros = 0
        self._bwd_depth = 0

    def _begin_step(self, t: int) -> None:
        self._step_start = t
        if self.profiler is not None:
            self.profiler.on_step_begin(self.step)
        if self._cuda:
            self._anchor = (t, timing_event(self._gpu_clock.device))

    def _settle_forwards(self) -> None:
        """Step boundary: forwards no backward reached were evaluation, not micro-steps."""
        for start, end, micro, _ in self._fwd_open:
            self._phases.append(Phase(S.EVAL_FORWARD, "forward", start, end, micro))
        self._fwd_open = []

    # ------------------------------------------------------------------ gradient ready
    def _native_log(self):
        """The C++ gradient-ready log (record/native), created at the first parameter given to it;
        None where it is not built or is switched off: the Python hooks below record the same rows."""
        if self._native is None and not self._native_tried:
            self._native_tried = True
            mod = native.load()
            if mod is not None:
                self._native = mod.ReadyLog()
                self.micro_sinks.append(self._native)   # the micro-step its stamps belong to
                self._native.set_micro(self._micro)
                self._native_params: list = []         # (weakref to param, index): _python_hooks_instead
                self.add_hook_handle(native.Hooks(self._native, self._native_params))   # gone at close
            self.annotate(grad_ready_hooks="c++" if mod is not None else "python")   # run.json says which
        return self._native

    def _python_hooks_instead(self, why: str) -> None:
        """Move every parameter from the C++ hooks to the Python ones, for the rest of the run.
        Compiled autograd runs a compiled graph in place of the autograd engine, and that graph
        calls the Python hooks but not a node hook written in C++ (checked: 0 stamps there)."""
        self._ready[:] = [tuple(r) for r in self._take_ready().tolist()]   # this step's stamps stay
        log, self._native = self._native, None
        self.micro_sinks.remove(log)
        params = [(ref(), i) for ref, i in self._native_params]
        native.Hooks(log, self._native_params).remove()
        for p, i in params:
            if p is not None:
                self.add_hook_handle(p.register_post_accumulate_grad_hook(self.grad_hook(i)))
        self.annotate(grad_ready_hooks=f"python ({why})")

    def _take_ready(self):
        """This step's gradient-ready records: the Python list, or an (n, 3) int64 array (param,
        local ns, micro) when the C++ hooks stamped them (rows of both: in stamp order)."""
        if self._native is None:
            return self._ready
        rows = self._native.take()
        if clock.skewed():
            rows[:, 1] += clock.skew_ns()               # local_ns's clock (tests only), in place
        if not self._ready:
            return rows
        both = np.concatenate([rows, np.asarray(self._ready, dtype=np.int64).reshape(-1, 3)])
        return both[np.argsort(both[:, 1], kind="stable")]

    def grad_hook(self, index: int):
        """A post-accumulate-grad hook that stamps parameter ``index``'s gradient as ready."""
        # time.monotonic_ns itself when no test skew is set: one Python call less per parameter
        ready, now = self._ready, (clock.local_ns if clock.skewed() else time.monotonic_ns)
        self.meta_extra.setdefault("grad_ready_hooks", "python")    # run.json, unless c++ came first

        def hook(p, _i=index):
            # A plain tuple in GradReady's field order: building the NamedTuple here cost ~650 ns
            # more per call (timeit, min of 15), ~0.65 ms a step for 1,000 parameters; batch.py
            # names it at the step boundary.
            ready.append((_i, now(), self._micro))     # the attribute: no property call per parameter
        return hook

    def grad_ready(self, index: int) -> None:
        """Stamp parameter ``index``'s gradient as ready now (engines without a per-parameter hook)."""
        self._ready.append((index, clock.local_ns(), self.micro))

    # ------------------------------------------------------------------ forward
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
            self._begin_step(t)
        self._micro_before = self.micro
        self.micro = self._micros       # the micro-step this forward starts, if a backward follows
        self._fwd_start = t

    def forward_post(self, module, args, output):
        if torch._C._current_graph_task_id() != -1:
            return
        self._fwd_depth = max(0, self._fwd_depth - 1)
        if self._fwd_depth:
            return
        t = self.now()
        if torch.is_grad_enabled():
            reached = [False]

            def mark(grad_outputs, _r=reached):
                _r[0] = True
            hooked = False
            for tensor in _tensors(output):
                if tensor.grad_fn is not None:
                    tensor.grad_fn.register_prehook(mark)
                    hooked = True
            if hooked:
                self._fwd_open.append([self._fwd_start, t, self.micro, reached])
                return
        # no_grad / inference_mode / nothing to backpropagate: evaluation, never a micro-step; what
        # follows (the optimizer after an evaluation) stays in the micro-step it was in
        self._phases.append(Phase(S.EVAL_FORWARD, "forward", self._fwd_start, t, self.micro))
        self.micro = self._micro_before

    # ------------------------------------------------------------------ backward
    def backward_begin(self):
        """An outermost ``torch.autograd.backward`` call starts: a new micro-step. Returns a token
        for backward_end (None for a nested call)."""
        if self._bwd_depth or torch._C._current_graph_task_id() != -1:
            self._bwd_depth += 1
            return None
        self._bwd_depth = 1
        if self._native is not None and native.compiled_autograd_on():
            self._python_hooks_instead("compiled autograd")
        t = self.now()
        if self._step_start is None:
            self._begin_step(t)
        self.micro = self._micros
        self._micros += 1
        return t

    def backward_end(self, token) -> None:
        self._bwd_depth = max(0, self._bwd_depth - 1)
        if token is None:
            return
        micro = self.micro
        self._phases.append(Phase(S.BACKWARD, "backward", token, self.now(), micro))
        # the forwards this backward reached are this micro-step's; the others stay provisional
        still = []
        for f in self._fwd_open:
            if f[3][0]:
                self._phases.append(Phase(S.FORWARD, "forward", f[0], f[1], micro))
            else:
                still.append(f)
        self._fwd_open = still

    # ------------------------------------------------------------------ optimizer
    def _install_optimizer_hooks(self) -> None:
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        self._opt_handles = [register_optimizer_step_pre_hook(self._opt_pre),
                             register_optimizer_step_post_hook(self._opt_post)]

    def _opt_pre(self, opt, args, kwargs):
        t = self.now()
        if self._step_start is None:
            self._begin_step(t)
        if self._micros:   # after a provisional forward (no backward yet): the last micro-step's
            self.micro = self._micros - 1
        if id(opt) not in self._optimizers_seen:
            self._first_sight_of_optimizer(opt)
        entry = [t, type(opt).__name__]
        depth = len(self._opt_stack)
        self._opt_stack.append(entry)
        # step(closure): time the closure (forward and backward, in Lightning) out of the row
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 else None)
        if closure is None or not callable(closure):
            return None
        def closure_timed(*a, **k):
            self._phases.append(Phase(S.OPTIMIZER, entry[1], entry[0], self.now(), self.micro, depth))
            try:
                return closure(*a, **k)
            finally:
                entry[0] = self.now()

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_timed}
        return (args[0], closure_timed, *args[2:]), kwargs

    def _opt_post(self, opt, args, kwargs):
        if not self._opt_stack:
            return
        start, name = self._opt_stack.pop()
        # depth = nesting (ZeroRedundancyOptimizer's step wraps the inner AdamW's)
        self._phases.append(Phase(S.OPTIMIZER, name, start, self.now(), self.micro, len(self._opt_stack)))
        if not self._opt_stack:
            self.end_step()

    def begin_optimizer(self, name: str) -> None:
        """An engine's optimizer step begins (DeepSpeed's engine.step, which wraps torch's optimizer
        step and all-gathers the updated partitions after it): torch optimizers inside nest deeper."""
        t = self.now()
        if self._step_start is None:
            self._begin_step(t)
        if self._micros:
            self.micro = self._micros - 1
        self._opt_stack.append([t, name])

    def end_optimizer(self, record: bool = True) -> None:
        """The step begun by begin_optimizer ends; the outermost ends the training step.
        ``record=False``: no row, no step boundary (DeepSpeed's engine.step between accumulation
        boundaries)."""
        if not self._opt_stack:
            return
        start, name = self._opt_stack.pop()
        if not record:
            return
        self._phases.append(Phase(S.OPTIMIZER, name, start, self.now(), self.micro, len(self._opt_stack)))
        if not self._opt_stack:
            self.end_step()

    def _first_sight_of_optimizer(self, opt) -> None:
        """Gradient-ready hooks on the parameters an optimizer owns (those no module showed us)."""
        self._optimizers_seen[id(opt)] = type(opt).__name__
        params = [p for g in getattr(opt, "param_groups", []) for p in g.get("params", [])
                  if isinstance(p, torch.Tensor)]
        self.index_tensors(params)
        self.observe(optimizers=type(opt).__name__)
        if "model" not in self.meta_extra and params:   # no module seen: the optimizer's parameters
            from syncviz.record.discover import params_facts
            self.annotate(model=params_facts(params))

    # ------------------------------------------------------------------ modules
    def instrument_module(self, module: torch.nn.Module, *, prepend: bool = True) -> torch.nn.Module:
        """Forward and gradient-ready instrumentation of a model that is not DDP (an FSDP2
        ``fully_shard`` module; its collectives come from syncviz.record.collectives). Nested
        instrumented modules (FSDP2 blocks inside the root) count one forward: the outermost."""
        if getattr(module, "_syncviz_instrumented", False):
            return module
        module._syncviz_instrumented = True
        self.index_params(module)
        # prepend: FSDP2's own hooks (the root's all-gather before forward) fall inside our forward
        self.hook_forward(module, prepend=prepend)
        self.annotate_model(module)
        return module

    def hook_forward(self, module: torch.nn.Module, *, prepend: bool = False, discovered: bool = False) -> None:
        """Time ``module``'s forward as the step's forward (outermost call) and mark the forwards a
        backward reaches. An explicitly instrumented module ends root discovery (discovery.py)."""
        if not discovered:
            self.stop_discovery()
        self.add_hook_handle(module.register_forward_pre_hook(self.forward_pre, prepend=prepend))
        self.add_hook_handle(module.register_forward_hook(self.forward_post, prepend=prepend, always_call=True))

    def index_params(self, module: torch.nn.Module, hook_grads: bool = True, held: bool = False) -> dict[int, int]:
        """Number the parameters (first seen, first numbered) and hook their gradient accumulation.
        Sharded DTensor parameters (FSDP2) get no hook: FSDP2 accumulates into separate unsharded
        tensors, and the reduce-scatter collectives mark when a group's gradients were ready.
        ``held``: DDP's reducer holds these parameters' AccumulateGrad nodes for its life, so the
        C++ hooks (which hold them too) may take them; elsewhere a held node could outlive a change
        of its parameter's shape (FSDP1 swaps a flat parameter between its shard and the whole:
        the held node then rejected the whole gradient, checked). Returns id(param) → index."""
        names = {id(p): n for n, p in module.named_parameters()}
        self.index_tensors(module.parameters(), names, hook_grads, held)
        return {id(p): self._param_index[id(p)][0] for p in module.parameters()}

    def index_tensors(self, params: Iterable[torch.Tensor], names: dict[int, str] | None = None,
                      hook_grads: bool = True, held: bool = False) -> None:
        for p in params:
            if id(p) in self._param_index:
                continue
            i = len(self._param_index)
            self._param_index[id(p)] = (i, (names or {}).get(id(p), f"param{i}"))
            if hook_grads and p.requires_grad and p.is_leaf and not _is_dtensor(p):
                log = self._native_log() if held else None
                if log is not None:
                    log.hook(p, i)
                    self._native_params.append((weakref.ref(p), i))
                else:
                    self.add_hook_handle(p.register_post_accumulate_grad_hook(self.grad_hook(i)))

    def param_index(self, p) -> tuple[int, str]:
        """(index, name) of a parameter indexed by index_params; (-1, "?") otherwise."""
        return self._param_index.get(id(p), (-1, "?"))

    def annotate_model(self, module: torch.nn.Module, grad_params=None) -> None:
        """run.json's model facts (name, parameter count, bytes, gradient bytes) and device."""
        from syncviz.record.discover import model_facts
        facts, device = model_facts(module, grad_params)
        self.annotate(model=facts, device=device)
        if device == "cuda":
            self.use_cuda(next(module.parameters()).device)


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
