"""DDP instrumentation: every gradient bucket's communication timed (launch when it is issued,
done when its future completes, GPU-side times from CUDA events on CUDA) whatever hook is in
force. Part of syncviz.record.

Two ways in, one row format:
- DDP's default all-reduce on CPU: no comm hook at all. The reducer's process group is wrapped
  (record/reducer_group.py) and each bucket's all-reduce is timed as the reducer issues it, with
  DDP's 1/N still fused into its copy into the bucket (a hook would need a separate pass).
- Otherwise (CUDA, ``--grad-values``, a user's or a built-in hook): one comm hook, registered when
  the DDP model is built, that reproduces DDP's default all-reduce bit for bit or calls the user's
  hook; a user's later register_comm_hook swaps its target (on CPU it is registered then)."""
from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from syncviz.record import reducer_group as RG
from syncviz.record import timed_group as TG
from syncviz.record.collectives import bucket_all_reduce, tensor_bytes
from syncviz.record.cudaclock import timing_event

if TYPE_CHECKING:
    from syncviz.record.recorder import Recorder


class _BucketHook:
    """DDP comm hook that times whatever hook is in force (torch's default all-reduce until the
    user registers one). It is registered once, at DDP construction; a user's later
    register_comm_hook swaps the target, so the user's hook, or a built-in one, is timed too."""

    def __init__(self, rec: "Recorder", ddp: torch.nn.Module, name: str = "allreduce"):
        # Weak: DDP's reducer holds this hook, so a strong reference back would make a cycle
        # through C++ that Python's GC cannot see, keeping DDP and its process group alive until
        # interpreter teardown (where gloo's threads then abort the process now and then).
        self.rec, self._ddp = rec, weakref.ref(ddp)
        self.pg = ddp.process_group
        self.target: Callable | None = None
        self.state: Any = None
        self.name = name
        self.user_registered = False
        self._layout = 0
        self._awaiting_rebuild = True               # DDP rebuilds its buckets once (and after a regroup)
        self.group: RG.ReducerGroup | None = None   # the reducer's wrapped group (default path on CPU)
        self.timed: TG.TimedBuckets | None = None   # the group in C++, where it is used (timed_group.py)
        self._next = 0                              # the bucket index of the reducer's next all-reduce
        self._sizes: dict[int, list[int]] = {}     # layout -> its buckets' element counts

    def __call__(self, state, bucket):  # DDP requires the parameter to be named `bucket`
        rec = self.rec
        buf = bucket.buffer()
        index = bucket.index()
        layout = self.layout_now()
        if not rec.layout_seen(layout, index):
            rec.note_layout(layout, index, bucket.parameters())
        nbytes = tensor_bytes(buf)        # a sparse gradient's bucket: its indices and values
        call = rec.begin_bucket(index, layout, nbytes, buf.dtype, self.name)
        # opt-in (--grad-values): copies a few values out of buf before anything scales it
        values = rec.grad_values.before(bucket, buf, layout, index) if rec.grad_values is not None else None
        # GPU-side interval from CUDA events (call.cuda = [start, end]), resolved a step later
        # (never blocks). The start event goes on the stream right before the collective is
        # issued, so the default path's 1/N scaling kernel is not counted as communication.
        cuda = buf.is_cuda
        with rec.in_bucket(index), rec.profile_range(index, nbytes):
            if self.target is None:
                # DDP's C++ default, bit for bit: it multiplies by the reciprocal of the world
                # size (at::mul_out with 1/N) while copying into the bucket, then all-reduces a
                # sum. (Dividing by N instead differs in the last bit for N=3: tested.)
                pg = self.pg
                buf.mul_(1.0 / pg.size())
                call.issued = rec.now()   # the collective call itself (hook entry is call.launch)
                if cuda:
                    call.cuda = [timing_event(buf.device), None]
                work, row = bucket_all_reduce(rec, buf, pg, index)
                if row is not None:
                    row.cuda = call.cuda     # the bucket's all_reduce row: the same GPU interval
                fut = work.get_future()
                unwrap = True
            else:
                if cuda:
                    call.cuda = [timing_event(buf.device), None]
                fut = self.target(self.state, bucket)
                unwrap, row = False, None

        def done(f, call=call, unwrap=unwrap, values=values, device=buf.device, row=row):
            call.done = rec.now()
            if row is not None:      # the all_reduce row of the default path ends with its bucket
                row.done, row.work = call.done, None
            if call.cuda is not None:
                # A CUDA future runs its callbacks on streams made to wait for the collective's
                # completion events (NCCL completes the future at enqueue, so the host time above
                # is the enqueue): an event recorded here marks the collective's GPU end.
                call.cuda[1] = timing_event(device)
            v = f.value()
            v = v[0] if unwrap else v
            if values is not None:
                rec.grad_values.after(values, v)
            return v

        return fut.then(done)

    def layout_now(self) -> int:
        """The bucket-layout version: 0, then 1 once DDP rebuilt its buckets (once, in the second
        step's forward); each change of process group (``regrouped``) and the rebuild after it
        count one more."""
        if self._awaiting_rebuild and getattr(self._ddp(), "_has_rebuilt_buckets", False):
            self._awaiting_rebuild = False
            self._layout += 1
        return self._layout

    def regrouped(self, ddp, old: dist.ProcessGroup) -> None:
        """After DDP's ``_update_process_group`` (elastic and fault-tolerant wrappers shrink or grow
        the world with it): DDP reset its reducer and will rebuild its buckets, and the reducer has
        the new group, not the wrapper. The buckets are issued on the new group from now on, by
        the comm hook (``pg``) or through a wrapper around it, and the layouts are counted anew."""
        self.layout_now()
        self._layout += 1
        self._awaiting_rebuild = True
        if ddp.process_group is old:          # this rank is not in the new group: DDP kept the old one
            return
        self.pg = ddp.process_group
        if self.group is not None:
            self.group = None
            self._drop_timed()
            self.install_group(ddp)

    # ------------------------------------------------- DDP's default all-reduce, no hook (CPU)
    def install_group(self, ddp) -> None:
        """Time DDP's own bucket all-reduces: the reducer gets a wrapped group (reducer_group.py)."""
        self.note_layouts()
        rec = self.rec
        if TG.usable(ddp, rec):       # in C++ (timed_group.py); the same records as the Python group's
            self.timed = TG.TimedBuckets(rec, self, self.pg)
            self.timed.group.set_layout(self._layout, self._sizes.get(self._layout, []))
            rec.bucket_sources.append(self.timed)
            rec.micro_sinks.append(self.timed.group)
            group = self.timed.group
        else:
            group = RG.ReducerGroup(self.pg, self.reducer_allreduce)
        rec.annotate(ddp_bucket_timing="c++" if self.timed is not None else "python")
        ddp.reducer._update_process_group(group)
        self.group = group

    def remove_group(self) -> None:
        """The reducer back on the real group (a user's hook registered, or the recorder closed)."""
        ddp = self._ddp()
        if self.group is not None and ddp is not None:
            ddp.reducer._update_process_group(self.pg)
        self.group = None
        self._drop_timed()

    def _drop_timed(self) -> None:
        """The C++ group's buckets so far go into the step's records; it records no more."""
        timed, self.timed = self.timed, None
        if timed is not None:
            timed.settle()
            self.rec.bucket_sources.remove(timed)
            self.rec.micro_sinks.remove(timed.group)

    def note_layouts(self) -> None:
        """Which parameters each bucket of the current layout holds, once a layout. DDP rebuilds its
        buckets once, in the second iteration's forward; this runs after each forward (and at
        install), never inside the reducer's all-reduce call, which holds the reducer's lock that
        _get_zeros_like_grad_buckets takes. It allocates a zeroed copy of every bucket (CPU memory,
        freed at once): the only view of the bucket -> parameters map torch gives."""
        ddp = self._ddp()
        if ddp is None or self.layout_now() in self._sizes:
            return
        sizes = []
        for b in ddp.reducer._get_zeros_like_grad_buckets():
            if not self.rec.layout_seen(self._layout, b.index()):
                self.rec.note_layout(self._layout, b.index(), b.parameters())
            sizes.append(b.buffer().numel())
        self._sizes[self._layout] = sizes
        if self.timed is not None:
            self.timed.group.set_layout(self._layout, sizes)

    def forward_pre(self, _module, _args):
        self._next = 0        # a backward pass reduces buckets from 0
        if self.timed is not None:
            self.timed.group.next_pass()

    def forward_post(self, _module, _args, _out):
        self.note_layouts()   # a no-op but for the forward that rebuilt the buckets

    def _number(self, numel: int) -> int:
        """Index of the bucket the reducer is all-reducing: the next in order, checked by its size;
        if the calls and the buckets are out of step, the next bucket of that size."""
        sizes = self._sizes.get(self._layout, ())
        i = self._next
        if i >= len(sizes) or sizes[i] != numel:
            same = [k for k, n in enumerate(sizes) if n == numel]
            if same:
                i = next((k for k in same if k >= i), same[0])
        self._next = i + 1 if i + 1 < len(sizes) or not sizes else 0
        return i

    def reducer_allreduce(self, tensors, opts):
        """ReducerGroup.allreduce: a bucket (one floating tensor) timed as the comm hook times it, with
        the same rows (bucket, and its all_reduce issued inside); anything else passed through."""
        rec = self.rec
        t = tensors[0] if len(tensors) == 1 else None
        if t is None or not t.is_floating_point() or self.target is not None or rec.closed:
            return self.pg.allreduce(tensors, opts)    # e.g. the unused-parameter map (int32)
        index = self._number(t.numel())
        nbytes = t.numel() * t.element_size()
        call = rec.begin_bucket(index, self._layout, nbytes, t.dtype, self.name)
        call.issued = call.launch     # already scaled by DDP: hook entry and collective call are one
        with rec.profile_range(index, nbytes):
            if t.is_cuda:             # GPU-side interval, as the comm hook path takes it (its __call__)
                call.cuda = [timing_event(t.device), None]
            work, row = bucket_all_reduce(rec, t, self.pg, index, opts)
            if row is not None:
                row.cuda = call.cuda         # the bucket's all_reduce row: the same GPU interval

        def done(f, call=call, row=row, device=t.device):
            call.done = rec.now()
            if row is not None:
                row.done, row.work = call.done, None
            if call.cuda is not None:   # a CUDA future's callback runs on streams that wait for the collective
                call.cuda[1] = timing_event(device)
            return f.value()
        return RG.TimedWork(work, work.get_future().then(done))


def instrument_ddp(rec, ddp: torch.nn.Module) -> torch.nn.Module:
    """Forward/backward/grad-ready hooks plus every bucket timed: through the reducer's wrapped
    group (DDP's default all-reduce) or one comm hook registered at construction; a user's
    later register_comm_hook becomes that hook's target (registered then, on the CPU path)."""
    if getattr(ddp, "_syncviz_hook", None) is not None:
        return ddp
    rec.index_params(ddp.module, held=True)     # the reducer holds their AccumulateGrad nodes
    rec.hook_forward(ddp)
    hook = _BucketHook(rec, ddp)
    ddp._syncviz_hook = hook

    def syncviz_timed_hook(state, bucket):   # DDP checks the name `bucket` and __name__
        return hook(state, bucket)

    if RG.usable(ddp) and rec.grad_values is None:   # --grad-values reads buckets before scaling: the hook
        try:
            hook.install_group(ddp)
        except Exception as e:     # a torch whose reducer takes no wrapped group: the comm hook times it
            hook.remove_group()
            print(f"[syncviz] rank {rec.rank}: DDP's reducer took no wrapped process group ({type(e).__name__}: {e}); "
                  "its buckets are timed by a comm hook instead", file=sys.stderr, flush=True)
    if hook.group is not None:
        rec.add_hook_handle(ddp.register_forward_pre_hook(hook.forward_pre))
        rec.add_hook_handle(ddp.register_forward_hook(hook.forward_post))
        rec.on_close(lambda _rec: hook.remove_group())
    else:
        ddp.register_comm_hook(state=None, hook=syncviz_timed_hook)

    ref = weakref.ref(ddp)   # no cycle through the instance's own attributes (see _BucketHook)

    def register_comm_hook(state, hook):   # torch's signature, keyword names included
        # the user's hook becomes the target of ours; DDP's "only once" rule still holds
        _ddp = ref()
        h = _ddp._syncviz_hook
        if h.user_registered:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        _ddp._check_comm_hook(hook)
        if h.group is not None:     # default path so far: the reducer back on its group, our hook in
            h.remove_group()
            type(_ddp).register_comm_hook(_ddp, None, syncviz_timed_hook)
            rec.annotate(ddp_bucket_timing="comm hook")
        h.target, h.state, h.user_registered = hook, state, True
        h.name = getattr(hook, "__qualname__", getattr(hook, "__name__", "hook"))
        _ddp.logger._set_comm_hook_name(h.name)
        _ddp._comm_hooks[-1] = (hook, state)
        ddp_meta(rec, _ddp)

    def register_builtin_comm_hook(comm_hook_type):
        # torch's C++ built-ins cannot be wrapped: time their Python twins instead
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
        kind = str(comm_hook_type).split(".")[-1]
        fn = {"ALLREDUCE": dh.allreduce_hook, "FP16_COMPRESS": dh.fp16_compress_hook}.get(kind)
        if fn is None:
            raise RuntimeError(f"syncviz cannot time built-in comm hook {comm_hook_type}")
        register_comm_hook(ref().process_group, fn)

    update_process_group = ddp._update_process_group

    def _update_process_group(new_process_group):
        _ddp = ref()
        old = _ddp.process_group
        update_process_group(new_process_group)
        _ddp._syncviz_hook.regrouped(_ddp, old)

    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = register_builtin_comm_hook
    ddp._update_process_group = _update_process_group
    ddp_meta(rec, ddp)
    return ddp


def ddp_meta(rec, ddp) -> None:
    rec.annotate_model(ddp.module)
    hook = ddp._syncviz_hook
    rec.annotate(ddp={
        "bucket_cap_mb": getattr(ddp, "bucket_bytes_cap", 0) / (1024 * 1024),
        "first_bucket_cap_mb": _first_bucket_mb(ddp),
        "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
        "comm_hook": hook.name if hook.user_registered else "default (allreduce, 1/N)"})
    rec.observe(wrappers="DistributedDataParallel",
                comm_hook=hook.name if hook.user_registered else "default (allreduce, 1/N)")


def _first_bucket_mb(ddp) -> float:
    cfg = getattr(ddp, "_bucket_config", None)
    nbytes = getattr(cfg, "first_bucket_bytes_cap", None)
    if nbytes is None:
        nbytes = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024)
    return float(nbytes) / (1024 * 1024)
