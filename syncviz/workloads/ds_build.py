"""DeepSpeed's JIT-built C++ ops, handled for syncviz's built-in workload.

DeepSpeed installed with ``DS_BUILD_OPS=0`` compiles its ops on first use through
torch.utils.cpp_extension (ninja, in ``$TORCH_EXTENSIONS_DIR/<op>/``). Measured on this 2-core
machine (DeepSpeed 0.19.8, torch 2.13 CPU): ``cpu_adam`` 66 s on a quiet moment, ``async_io`` +
``pin_memory`` (ZeRO-Infinity's NVMe swapping, needs libaio-dev) 735 s with the machine loaded,
``deepspeed_shm_comm`` 1-4 min. Three things go wrong without care, and this module handles them:

- the build starts inside every rank at once (one builds, the others wait on a lock) with no word
  to the user: ``ensure_ops`` builds what a strategy needs once, in the launching process, saying
  so, before any rank starts;
- a build killed midway leaves ``<op>/lock`` behind, and every later load waits on it forever in
  torch.utils.file_baton: ``clean_stale_locks`` removes a lock older than a minute when no
  process works in that build directory (ninja runs with its cwd there);
- ``deepspeed.init_distributed`` builds ``deepspeed_shm_comm``, which only DeepSpeed's
  ``inference_all_reduce`` uses, never training: ``skip_shm_comm`` makes the built-in workload not
  build it (``syncviz trace`` on a user's script leaves DeepSpeed as it is).

syncviz uses a build directory of its own (``~/.cache/syncviz/torch_extensions``, or
``$SYNCVIZ_TORCH_EXTENSIONS_DIR``) unless ``TORCH_EXTENSIONS_DIR`` is set.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import click

# strategy → DeepSpeed op builders it loads (CPU accelerator names)
OPS = {"ds-offload": ("CPUAdamBuilder",), "ds-infinity": ("CPUAdamBuilder", "AsyncIOBuilder")}
STALE_AFTER_S = 60.0


def extensions_dir() -> Path:
    """Where the ops are built (and set TORCH_EXTENSIONS_DIR so the ranks use the same place)."""
    d = os.environ.get("TORCH_EXTENSIONS_DIR") or os.environ.get("SYNCVIZ_TORCH_EXTENSIONS_DIR")
    if not d:
        from syncviz.record.native import cache_root      # syncviz's one cache folder
        d = str(cache_root() / "torch_extensions")
    os.environ["TORCH_EXTENSIONS_DIR"] = d
    Path(d).mkdir(parents=True, exist_ok=True)
    return Path(d)


def _cwds() -> set[str]:
    out = set()
    for p in Path("/proc").glob("[0-9]*"):
        try:
            out.add(os.readlink(p / "cwd"))
        except OSError:
            continue
    return out


def clean_stale_locks(root: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove build locks left by killed builds; returns the removed ones."""
    root = root or extensions_dir()
    now = time.time() if now is None else now
    removed = []
    locks = [p for p in root.glob("*/lock") if now - p.stat().st_mtime > STALE_AFTER_S]
    if not locks:
        return removed
    busy = _cwds()
    for lock in locks:
        build = str(lock.parent.resolve())
        if any(c == build or c.startswith(build + os.sep) for c in busy):
            continue        # a live ninja is building there
        try:
            lock.unlink()
            removed.append(lock)
        except FileNotFoundError:
            pass
    return removed


def _built(name: str, root: Path) -> bool:
    return (root / name / f"{name}.so").exists()


def ensure_ops(strategy: str, echo=None) -> None:
    """Build (once) the ops ``strategy`` loads, in this process, with a message; raises
    click.ClickException with one clear line when DeepSpeed or a build prerequisite is missing."""
    echo = echo or (lambda m: click.echo(m, err=True))
    root = extensions_dir()
    for lock in clean_stale_locks(root):
        echo(f"[syncviz] removed a stale DeepSpeed build lock left by a killed build: {lock}")
    why = available()
    if why is not None:
        raise click.ClickException(f"strategy {strategy} needs DeepSpeed ({why}); install it with "
                                   "DS_BUILD_OPS=0 pip install 'syncviz[deepspeed]'")
    builders = OPS.get(strategy, ())
    if not builders:
        return
    from deepspeed.accelerator import get_accelerator
    for cls in builders:
        b = get_accelerator().create_op_builder(cls)
        if b is None:
            raise click.ClickException(f"DeepSpeed's accelerator has no {cls} here")
        names = [b.name] + (["pin_memory"] if cls == "AsyncIOBuilder" else [])
        if cls == "AsyncIOBuilder" and not b.is_compatible(verbose=False):
            raise click.ClickException("ZeRO-Infinity's NVMe offload needs DeepSpeed's async_io op, which needs "
                                       "libaio (Debian: apt-get install libaio-dev)")
        if all(_built(n, root) for n in names):
            continue
        echo(f"[syncviz] building DeepSpeed's {b.name} op (once; minutes on 2 cores, more on a busy machine) in {root} ...")
        t = time.monotonic()
        try:
            b.load(verbose=False)
        except Exception as e:   # a compiler error: its last line says why
            raise click.ClickException(f"building DeepSpeed's {b.name} op failed: {str(e).strip().splitlines()[-1:]}")
        echo(f"[syncviz] built {b.name} in {time.monotonic() - t:.0f} s")


def skip_shm_comm() -> None:
    """Rank side, before deepspeed.initialize: no deepspeed_shm_comm build (inference-only op)."""
    extensions_dir()
    mod = importlib.import_module("deepspeed.comm.torch")   # `deepspeed.comm.torch` the attribute is torch
    mod.build_shm_op = lambda: None


def available() -> str | None:
    """None when DeepSpeed imports, else why not (one line)."""
    if "deepspeed" in sys.modules:
        return None
    try:
        importlib.import_module("deepspeed")
    except Exception as e:  # ImportError, or a broken install raising something else
        return f"DeepSpeed is not importable: {type(e).__name__}: {e}"
    return None


def main() -> None:
    """``python -m syncviz.workloads.ds_build``: build every op the DeepSpeed strategies use, once, saying
    how long each took (CI runs it before the tests, so build time is visible on its own)."""
    why = available()
    if why is not None:
        print(f"[syncviz] DeepSpeed ops not built: {why}")
        return
    t = time.monotonic()
    try:
        for strategy in OPS:
            ensure_ops(strategy, echo=print)
    except click.ClickException as e:
        raise SystemExit(f"syncviz: {e.format_message()}")
    print(f"[syncviz] DeepSpeed ops ready in {extensions_dir()} ({time.monotonic() - t:.0f} s)")


if __name__ == "__main__":
    main()
