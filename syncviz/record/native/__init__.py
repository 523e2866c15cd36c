"""syncviz's C++, one extension built once per torch and Python with torch's own extension builder:
gradient-ready stamps without a Python call per parameter (gradstamp.cpp), and DDP's bucket
all-reduce timed in a process group without Python (timedgroup.cpp, record/timed_group.py).

Built by ``syncviz trace`` before it starts the ranks (and by ``make install``:
``python -m syncviz.record.native``), never inside a rank: a rank only imports a finished build,
and uses the Python hooks and group when there is none (``syncviz.instrument`` outside ``syncviz
trace`` on a machine that never built it, no compiler, ``SYNCVIZ_NATIVE_HOOKS=0``). Both give the
same rows.

Builds go to ``<cache>/native/gradstamp-<key>/`` (``$SYNCVIZ_CACHE_DIR``, else
``$XDG_CACHE_HOME/syncviz`` or ``~/.cache/syncviz``), where the key digests the sources, torch's
version and ABI, and Python's. Each build runs in a fresh folder of its own, renamed into place
when done: a build killed midway leaves only a folder nobody waits on (torch's own builder waits
forever on a lock a killed build left behind).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

NAME = "syncviz_gradstamp"
SOURCES = [Path(__file__).with_name(n) for n in ("gradstamp.cpp", "timedgroup.cpp")]
ENV = "SYNCVIZ_NATIVE_HOOKS"
_loaded: dict = {}


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("0", "false", "no", "off")


def _key() -> str:
    import torch
    h = hashlib.sha1()
    for src in SOURCES:
        h.update(src.read_bytes())
    for part in (torch.__version__, getattr(torch.version, "git_version", ""), str(torch._C._GLIBCXX_USE_CXX11_ABI),
                 sys.version, sys.platform):
        h.update(str(part).encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    root = os.environ.get("SYNCVIZ_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "syncviz"


def build_dir() -> Path:
    return cache_root() / "native" / f"gradstamp-{_key()}"


def _library(folder: Path) -> Path | None:
    found = sorted(folder.glob(f"{NAME}*.so")) if folder.is_dir() else []
    return found[0] if found else None


def load():
    """The built module, or None (not built, disabled, or it does not import here)."""
    if not enabled():
        return None
    if "module" in _loaded:
        return _loaded["module"]
    module = None
    try:
        lib = _library(build_dir())
        if lib is not None:
            import importlib.util
            spec = importlib.util.spec_from_file_location(NAME, lib)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except (ImportError, OSError):
        module = None
    _loaded["module"] = module
    return module


def build(say=None) -> str | None:
    """Build it unless a build for this torch and Python is there. Returns None when it is ready,
    else why not (one line: no compiler, a failed build, an unwritable cache)."""
    if not enabled():
        return None
    try:
        final = build_dir()
        if _library(final) is not None:
            return None
        failed = final.with_name(final.name + ".failed")
        if failed.exists():           # tried with this torch and failed: not 30 s again per run
            return f"{failed.read_text().strip()} (remove {failed} to try again)"
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as e:
        return f"cannot write the build cache: {e}"
    if say:
        say("[syncviz] building syncviz's C++ recording hooks for this torch (once, ~45 s)")
    try:
        from torch.utils.cpp_extension import load as torch_load
        torch_load(NAME, [str(s) for s in SOURCES], build_directory=str(work), extra_cflags=["-O2"], verbose=False)
        try:
            os.rename(work, final)
        except OSError:               # another build finished first: keep it, drop ours
            if _library(final) is None:
                raise
            shutil.rmtree(work, ignore_errors=True)
        return None
    except Exception as e:            # a compiler error, no compiler, no ninja: the Python hooks stay
        shutil.rmtree(work, ignore_errors=True)
        why = f"{type(e).__name__}: {_first_error(str(e))[:200]}"
        try:
            failed.write_text(why + "\n")
        except OSError:
            pass
        return why


def _first_error(text: str) -> str:
    """The line of a failed build that says why: the compiler's first ``error:`` line (torch's
    message starts with the compile command, which says nothing), else the message's first line."""
    lines = text.strip().splitlines() or [""]
    return next((ln.strip() for ln in lines if "error:" in ln), lines[0])


class Hooks:
    """A ReadyLog's hooks as one hook handle (Recorder.add_hook_handle): remove() takes every hook
    off and lets go of the parameters."""

    def __init__(self, log, params: list):
        self.log, self.params = log, params

    def remove(self) -> None:
        self.log.remove()
        self.params.clear()


def compiled_autograd_on() -> bool:
    """Whether torch's compiled autograd may run the next backward (only if torch._dynamo is loaded).
    Its module flag alone: ``torch._dynamo.config.compiled_autograd`` takes effect by running each
    compiled frame inside ``compiled_autograd._enable``, which sets the flag (eval_frame.py, torch
    2.13), and reading the config (a ConfigModule's ``__getattr__``) cost ~3 µs warm, several
    times that once a backward with cold caches."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and bool(getattr(ca, "compiled_autograd_enabled", False))


def main() -> int:
    why = build(lambda msg: print(msg, file=sys.stderr))
    if why:
        print(f"[syncviz] C++ recording hooks not built ({why}); the Python ones will be used", file=sys.stderr)
        return 0          # not an install failure: the Python hooks record the same rows
    print(f"[syncviz] C++ recording hooks: {_library(build_dir())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
