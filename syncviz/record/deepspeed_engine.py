"""DeepSpeed instrumentation: a DeepSpeed run recorded as one, not as "ddp" with unlabelled
collectives. Part of syncviz.record (like record.ddp); read against DeepSpeed 0.19's source.

What is recorded, and where it comes from:
- run.json: strategy ``ds-zero0..3 | ds-offload | ds-zero3-offload | ds-infinity`` and a
  ``deepspeed`` block (stage, offload devices, bucket sizes, overlap, precision) from the engine's
  config; the model (``ds_numel``/``ds_shape`` where ZeRO-3 has partitioned the parameters).
- forward: the engine's forward (pre/post hooks on DeepSpeedEngine, which calls the module).
- backward: ``engine.backward(loss)`` from entry to return (autograd plus DeepSpeed's epilogue,
  where stage 1 reduces every gradient and stage 2/3 the last bucket); a torch-style
  ``loss.backward()`` is the recorder's own torch.autograd.backward row.
- optimizer: ``engine.step()`` at an accumulation boundary, depth 0; the torch optimizer inside it
  (AdamW, DeepSpeedCPUAdam) is the depth-1 row, the one analysis counts as optimizer compute. The
  optimizer step ends syncviz's step only when engine.step returns (DeepSpeed all-gathers the
  updated partitions after the inner optimizer).
- gradient ready: post-accumulate-grad hooks registered before DeepSpeed's own (so a bucket
  reduce that DeepSpeed's hook starts does not delay the ready time).
- buckets: DeepSpeed's "IPG" bucket reduce, ``reduce_ipg_grads`` (stage 1/2) and
  ``__reduce_and_partition_ipg_grads`` (stage 3): one bucket row per call, with the parameters it
  held (layout rows), the bytes its collectives sent, ready = last gradient of the bucket ready.
- offload (kind "offload", nested in backward or optimizer): the host-side optimizer step
  (DeepSpeedCPUAdam), device→host gradient copies, NVMe swaps of parameters and optimizer
  state (DeepSpeed's swappers), each call's interval on the calling thread.

Nothing here changes what DeepSpeed computes: wrappers call through with the same arguments.
Everything is reported through the Recorder's public API (recorder.py, phases.py).
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import weakref

import torch

from syncviz.trace import schema as S

ENGINE_MODULE = "deepspeed.runtime.engine"

# (module, class, method, label) of DeepSpeed work recorded as "offload" rows. Labels say what moves.
OFFLOAD_METHODS = (
    ("deepspeed.ops.adam.cpu_adam", "DeepSpeedCPUAdam", "step", "optimizer step on host (DeepSpeedCPUAdam)"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "async_inplace_copy_grad_to_fp32_buffer_from_gpu",
     "gradients device→host"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "async_accumulate_grad_in_cpu_via_gpu",
     "gradients device→host (accumulate)"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "_optimizer_states_and_gradient_swap_in",
     "optimizer state NVMe→host (swap in)"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "_optimizer_states_and_gradient_swap_out",
     "optimizer state host→NVMe (swap out)"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "_swap_out_offload_fp32_gradients",
     "gradients host→NVMe (swap out)"),
    ("deepspeed.runtime.swap_tensor.partitioned_param_swapper", "AsyncPartitionedParameterSwapper", "swap_in",
     "parameters NVMe→host (swap in)"),
    ("deepspeed.runtime.swap_tensor.partitioned_param_swapper", "AsyncPartitionedParameterSwapper",
     "swap_out_and_release", "parameters host→NVMe (swap out)"),
    ("deepspeed.runtime.swap_tensor.partitioned_param_swapper", "AsyncPartitionedParameterSwapper",
     "synchronize_reads", "parameters NVMe→host (wait)"),
    ("deepspeed.runtime.swap_tensor.partitioned_param_swapper", "AsyncPartitionedParameterSwapper",
     "synchronize_writes", "parameters host→NVMe (wait)"),
)

_INSTALLED = False
_GET_RECORDER = None     # api.get_recorder, handed over by install() (api imports this module)
_ENGINES = 0     # engines instrumented: offload work before the first is DeepSpeed's initialization


def _recorder():
    return _GET_RECORDER() if _GET_RECORDER is not None else None


# ------------------------------------------------------------------------ patch on import

class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``patch()`` right after ``deepspeed.runtime.engine`` is imported, so a script that
    never imports DeepSpeed pays nothing (importing it costs seconds and probes accelerators)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != ENGINE_MODULE:
            return None
        sys.meta_path.remove(self)          # find the real spec without us, then wrap its loader
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        with _suppress():
            sys.meta_path.remove(self)
        patch()


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], Exception)


def install(get_recorder) -> None:
    """Called when tracing starts (``get_recorder``: the active recorder or None): patch DeepSpeed
    now if imported, else when it is imported."""
    global _GET_RECORDER
    _GET_RECORDER = get_recorder
    if _INSTALLED:
        return
    if ENGINE_MODULE in sys.modules:
        patch()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def patch() -> None:
    """Instrument every DeepSpeedEngine built from now on, and time DeepSpeed's offload work."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    engine_cls = sys.modules[ENGINE_MODULE].DeepSpeedEngine
    orig_init = engine_cls.__init__

    @functools.wraps(orig_init)
    def __init__(self, args, model, *a, **kw):
        rec = _recorder()
        if rec is not None and isinstance(model, torch.nn.Module) and type(self) is engine_cls:
            # ours first: DeepSpeed's post-accumulate hooks may reduce a full bucket before returning
            rec.index_params(model)
        orig_init(self, args, model, *a, **kw)
        if rec is not None and type(self) is engine_cls:
            instrument_engine(rec, self)

    engine_cls.__init__ = __init__
    for module, cls, method, label in OFFLOAD_METHODS:
        with _suppress():
            owner = getattr(importlib.import_module(module), cls)
            setattr(owner, method, _timed_offload(getattr(owner, method), label, _WHEN.get(method)))


def _swapping(self, *args, **kwargs) -> bool:
    return getattr(self, "optimizer_swapper", None) is not None


# Stage 3 calls these whether or not it offloads (they return at once): rows only when they work.
_WHEN = {"_optimizer_states_and_gradient_swap_in": _swapping,
         "_optimizer_states_and_gradient_swap_out": _swapping,
         "_swap_out_offload_fp32_gradients": lambda self, grads=None, *a, **k: _swapping(self) and bool(grads)}


def _timed_offload(fn, label: str, when=None):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        rec = _recorder()
        if rec is None or not _ENGINES or (when is not None and not when(*args, **kwargs)):
            return fn(*args, **kwargs)
        t = rec.now()
        try:
            return fn(*args, **kwargs)
        finally:
            rec.add_phase(S.OFFLOAD, label, t, rec.now())
    return timed


# ------------------------------------------------------------------------------ the engine

def strategy_name(stage: int, offload_optimizer: str, offload_param: str) -> str:
    """syncviz's name for a DeepSpeed configuration (theory.STRATEGIES)."""
    if "nvme" in (offload_optimizer, offload_param):
        return "ds-infinity" if stage == 3 else f"ds-zero{stage}-nvme"
    if "cpu" in (offload_optimizer, offload_param):
        return "ds-offload" if stage in (1, 2) else f"ds-zero{stage}-offload"
    return f"ds-zero{stage}"


def engine_config(engine) -> dict:
    """The run.json ``deepspeed`` block: what decides DeepSpeed's communication and memory."""
    def dev(cfg):
        d = getattr(cfg, "device", None) if cfg is not None else None
        return str(getattr(d, "value", d) or "none")

    zc = engine._config.zero_config
    precision = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
    out = {"version": sys.modules["deepspeed"].__version__, "stage": int(engine.zero_optimization_stage()),
           "offload_optimizer": dev(zc.offload_optimizer), "offload_param": dev(zc.offload_param),
           "reduce_bucket_size": int(zc.reduce_bucket_size), "allgather_bucket_size": int(zc.allgather_bucket_size),
           "overlap_comm": bool(zc.overlap_comm), "contiguous_gradients": bool(zc.contiguous_gradients),
           "reduce_scatter": bool(zc.reduce_scatter),
           "use_multi_rank_bucket_allreduce": bool(getattr(zc, "use_multi_rank_bucket_allreduce", True)),
           "precision": precision, "gradient_accumulation_steps": int(engine.gradient_accumulation_steps()),
           "gradient_clipping": float(engine.gradient_clipping() or 0.0),
           "optimizer": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__,
           "zero_optimizer": type(engine.optimizer).__name__}
    if out["stage"] == 3:
        out.update(prefetch_bucket_size=int(zc.prefetch_bucket_size),
                   max_live_parameters=int(zc.max_live_parameters),
                   param_persistence_threshold=int(zc.param_persistence_threshold),
                   sub_group_size=int(zc.sub_group_size))
    for key in ("offload_optimizer", "offload_param"):
        cfg = getattr(zc, key)
        if cfg is not None and getattr(cfg, "nvme_path", None):
            out[key + "_nvme_path"] = str(cfg.nvme_path)
    return out


def _shape(p) -> list[int]:
    return list(getattr(p, "ds_shape", None) or p.shape)


def _numel(p) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())


def instrument_engine(rec, engine) -> None:
    """Hooks on one DeepSpeedEngine (see the module docstring)."""
    if getattr(engine, "_syncviz_instrumented", False):
        return
    engine._syncviz_instrumented = True
    cfg = engine_config(engine)
    rec.set_strategy(strategy_name(cfg["stage"], cfg["offload_optimizer"], cfg["offload_param"]), engine="deepspeed")
    module = engine.module
    params = list(module.parameters())
    elsize = params[0].element_size() if params else 4
    config = dict(rec.meta_extra.get("strategy_config") or {})
    config.setdefault("name", rec.strategy)
    config.setdefault("param_shapes", {n: _shape(p) for n, p in module.named_parameters() if p.requires_grad})
    config["accum"] = cfg["gradient_accumulation_steps"]
    config["itemsize"] = elsize
    # what syncviz.model.ds_theory needs: stage 3 gathers each module's own parameters (a tied one
    # once per module using it); stage 1/2 gather one flat buffer per optimizer parameter group
    names = {id(p): n for n, p in module.named_parameters()}
    config["module_params"] = [[names[id(p)] for p in m.parameters(recurse=False) if id(p) in names]
                               for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
    groups = getattr(engine.optimizer, "bit16_groups", None) or getattr(engine.optimizer, "fp16_groups", None) or []
    config["group_numels"] = [sum(_numel(p) for p in g) for g in groups] or None
    config["param_order"] = [n for n, p in module.named_parameters() if p.requires_grad]
    # whether this DeepSpeed swaps boundary gradients to NVMe too (ds_theory.memory_per_rank's nvme_gradients)
    config["nvme_gradients"] = hasattr(type(engine.optimizer), "_finalize_offload_gradient_accumulation")
    # the element size DeepSpeed's NVMe parameter swapper counts a partition in (its zero.Init dtype):
    # it swaps a partition only from 1 MiB *in that dtype* up. It is not always the parameters' own:
    # Init._set_dtype reads `dtype or torch.float16 if fp16_supported() else torch.bfloat16 if ...`,
    # which keeps the engine's fp32 only where the CPU accelerator reports fp16 (mkldnn); elsewhere it
    # is bf16. So mini's 1.5 MiB fp32 embedding partition got a file on one machine and not on one
    # without fp16 (0.75 MiB in bf16; 2026-11-29, test_memory_equal_theory[ds-infinity] on a CI machine)
    swapper = next((getattr(p, "nvme_swapper", None) for p in module.parameters()
                    if getattr(p, "nvme_swapper", None) is not None), None)
    config["nvme_param_itemsize"] = int(swapper.swap_element_size) if swapper is not None else None
    rec.annotate(deepspeed=cfg, strategy_config=config,
                 device=str(getattr(engine, "device", "cpu")).split(":")[0],
                 model={"name": type(module).__name__, "params": sum(_numel(p) for p in params),
                        "bytes": sum(_numel(p) * p.element_size() for p in params),
                        "grad_bytes": sum(_numel(p) * p.element_size() for p in params if p.requires_grad)})
    # forward: the engine's; backward from autograd when the script calls loss.backward() itself
    rec.hook_forward(engine, prepend=True)
    _wrap_backward(rec, engine)
    _wrap_step(rec, engine)
    _wrap_buckets(rec, engine.optimizer)
    global _ENGINES
    _ENGINES += 1


def _wrap_backward(rec, engine) -> None:
    orig = engine.backward
    ref = weakref.ref(rec)

    @functools.wraps(orig)
    def backward(loss, *args, **kwargs):
        r = ref()
        if r is None or r.closed:
            return orig(loss, *args, **kwargs)
        # the backward row spans DeepSpeed's epilogue too (stage 1 reduces every gradient there);
        # the torch.autograd.backward call inside is nested in it (phases.backward_begin)
        token = r.backward_begin()
        try:
            return orig(loss, *args, **kwargs)
        finally:
            r.backward_end(token)
    engine.backward = backward


def _wrap_step(rec, engine) -> None:
    orig = engine.step
    ref = weakref.ref(rec)
    name = f"DeepSpeedEngine.step (ZeRO-{engine.zero_optimization_stage()})"

    @functools.wraps(orig)
    def step(*args, **kwargs):
        r = ref()
        if r is None or r.closed:
            return orig(*args, **kwargs)
        boundary = engine.is_gradient_accumulation_boundary()
        r.begin_optimizer(name)              # the torch optimizer inside nests at depth 1
        try:
            return orig(*args, **kwargs)
        finally:
            r.end_optimizer(record=boundary)  # the outermost optimizer row ends the step
    engine.step = step


# ------------------------------------------------------------------------------- buckets

class _Buckets:
    """Bucket numbering per micro-step and layout versions: DeepSpeed fills its IPG buckets in
    gradient-ready order, which may differ in the first step; a different set of parameters
    under a bucket index starts a new layout version."""

    def __init__(self, rec, opt):
        self.rec, self.opt = rec, opt
        self.key = None
        self.index = 0
        self.layout = 0
        self.seen: dict[tuple[int, int], tuple] = {}

    def next(self, params: list) -> tuple[int, int]:
        rec = self.rec
        key = (rec.step, rec.micro)
        if key != self.key:
            self.key, self.index = key, 0
        index = self.index
        self.index += 1
        sig = tuple(id(p) for p in params)
        known = self.seen.get((self.layout, index))
        if known is not None and known != sig:
            self.layout += 1
        if (self.layout, index) not in self.seen:
            self.seen[(self.layout, index)] = sig
            rec.note_layout(self.layout, index, params, numels=[_numel(p) for p in params])
        return index, self.layout


def _wrap_buckets(rec, opt) -> None:
    """Time DeepSpeed's IPG bucket reductions and take gradient-ready times where DeepSpeed adds a
    gradient to a bucket (stage 1 without overlap adds them all in its epilogue: there the
    post-accumulate hooks give the real ready times)."""
    name = type(opt).__name__
    if name == "DeepSpeedZeroOptimizer":
        method, label = "reduce_ipg_grads", "ipg bucket (reduce_ipg_grads)"

        def bucket_params(args, kwargs):
            dtype = kwargs.get("comm_dtype", args[0] if args else None)
            buckets = [b for d, b in opt.ipg_buckets.items() if dtype is None or d == dtype]
            params = [opt.bit16_groups[i][j] for b in buckets for i, j, _ in b.params]
            elems = sum(b.elements for b in buckets)
            dt = next((d for d, b in opt.ipg_buckets.items() if b.elements and (dtype is None or d == dtype)),
                      dtype)
            return params, elems, dt
    elif name == "DeepSpeedZeroOptimizer_Stage3":
        method, label = "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads", \
            "ipg bucket (reduce_and_partition_ipg_grads)"

        def bucket_params(args, kwargs):
            dtype = kwargs.get("communication_data_type", args[0] if args else None)
            b = opt.ipg_buckets[dtype]
            return list(b.params), b.elements, dtype
    else:
        return
    orig = getattr(opt, method)
    numbering = _Buckets(rec, opt)
    ref = weakref.ref(rec)

    @functools.wraps(orig)
    def reduce(*args, **kwargs):
        r = ref()
        if r is None or r.closed:
            return orig(*args, **kwargs)
        params, elems, dtype = bucket_params(args, kwargs)
        if not params or not elems:
            return orig(*args, **kwargs)
        index, layout = numbering.next(params)
        itemsize = torch.empty(0, dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4
        call = r.begin_bucket(index, layout, int(elems) * itemsize, dtype or torch.float32, label)
        try:
            with r.in_bucket(index):
                return orig(*args, **kwargs)
        finally:
            call.done = r.now()
    setattr(opt, method, reduce)
