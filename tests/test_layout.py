"""The layout keeps data flowing one way (DESIGN.md): record → trace → analysis → views. Read from
the source with ast (nothing is imported), so a new back edge, cycle, private reach-in or long file
fails here rather than in review."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"syncviz": "syncviz", "syncviz.dashboard": "dashboard", "syncviz.kernels": "kernels"}
# A stage may import only stages of a lower rank (and the trace contract, rank 0).
RANK = {"trace": 0, "kernels": 0, "record": 1, "analysis": 1, "model": 2, "sync": 2,
        "views": 3, "dashboard": 3.5, "workloads": 4, "cli": 5, "__main__": 6}   # the dashboard may use views
MAX_LINES = 400
# Edges that run up the stack on purpose, each with its reason (a new one is a design decision):
# - a rank, when its recording closes, analyses its own file with the analysis package's definitions and
#   keeps the result beside it (analysis/rank_pass.py): the one place a rank has spare CPU of its own, so
#   a big run's summary need not read every event on one machine. Imported lazily, at close only.
ALLOWED_UP = {("syncviz.record.first_pass", "syncviz.analysis.rank_pass")}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in ROOTS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for t in names:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != m and not mods[t].name == "__init__.py":
                    edges[m].add(t)
    return edges


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "root"


def test_no_relative_imports_no_cycles_no_back_edges():
    mods = _modules()
    edges = _imports(mods)
    relative = [m for m, p in mods.items() for n in ast.walk(ast.parse(p.read_text()))
                if isinstance(n, ast.ImportFrom) and n.level]
    assert not relative, f"use absolute imports: {relative}"
    cycles = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    assert not cycles, cycles
    back = [(a, b) for a, bs in edges.items() for b in bs
            if _stage(a) in RANK and _stage(b) in RANK and _stage(a) != _stage(b)
            and RANK[_stage(b)] >= RANK[_stage(a)] and not (_stage(b) == "trace") and (a, b) not in ALLOWED_UP]
    assert not back, f"imports that run up (or across) the stack: {back}"


def test_files_stay_short():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_nothing_outside_the_recorder_touches_its_private_state():
    """The Recorder's state is reached through its public methods only (record/recorder.py)."""
    owners = {ROOT / "syncviz/record/recorder.py", ROOT / "syncviz/record/phases.py"}
    private = {"_phases", "_ready", "_buckets", "_collectives", "_param_index", "_hook_handles",
               "_layout_rows", "_layouts_seen", "_quiet", "_tls", "_in_bucket", "_forward_pre",
               "_forward_post", "_index_params", "_module_meta"}
    bad = []
    for path in _modules().values():
        if path in owners:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in private and isinstance(node.value, ast.Name)
                    and node.value.id in ("rec", "_rec", "recorder", "_REC")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert not bad, bad
