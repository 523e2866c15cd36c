"""Which code wrote a derived file: the run cache (views/runcache.py) and each rank's first pass
(analysis/rank_pass.py) are trusted only when written by exactly this syncviz."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from syncviz import __version__


@lru_cache(maxsize=4)
def code_digest(*packages: str) -> str:
    """A digest of syncviz's source (this package and the dashboard's): a cache written by other
    code is stale, even at the same version number (editable installs, local fixes). ``packages``:
    of those subpackages of syncviz only (with the version), for a file that only their code decides
    (rank_pass: analysis and trace, which import nothing else of syncviz's)."""
    import syncviz
    root = Path(syncviz.__file__).parent
    roots = [root / p for p in packages] if packages else [root]
    try:
        import syncviz.dashboard as dash
        if not packages:
            roots.append(Path(dash.__file__).parent)
    except ImportError:       # pragma: no cover - the dashboard is part of the package
        pass
    h = hashlib.sha1(__version__.encode())
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]
