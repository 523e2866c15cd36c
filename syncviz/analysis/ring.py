"""The ring all-reduce's arithmetic (no torch: the dashboard imports it): bytes per rank of each
scheme, and the replay of recorded chunk transfers into per-step states (workloads/ring.py records
them)."""
from __future__ import annotations


def formulas(n: int, d: float) -> dict[str, float]:
    """Bytes each rank sends (the most-loaded rank for the parameter server)."""
    return {"ring": 2 * (n - 1) / n * d, "all_to_all": (n - 1) * d, "parameter_server": (n - 1) * d,
            "parameter_server_worker": d}


def ring_states(transfers: list[dict], n: int) -> list[dict]:
    """Replay recorded transfers: after each ring step, how many ranks' contributions every rank
    holds for every chunk (N = fully summed). Reduce-scatter adds the sender's count to the
    receiver's; all-gather overwrites it. Returns [{phase, step, counts (ranks × chunks),
    moves [(src, dst, chunk)]}], starting with the initial state (every count 1)."""
    counts = [[1] * n for _ in range(n)]
    out = [{"phase": "start", "step": -1, "counts": [row[:] for row in counts], "moves": []}]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            moves = [t for t in transfers if t["phase"] == phase and t["step"] == s]
            before = [row[:] for row in counts]      # all ranks send at once: read the old state
            for t in moves:
                got = before[t["src"]][t["chunk"]]
                counts[t["dst"]][t["chunk"]] = counts[t["dst"]][t["chunk"]] + got if phase == "reduce-scatter" else got
            out.append({"phase": phase, "step": s, "counts": [row[:] for row in counts],
                        "moves": [(t["src"], t["dst"], t["chunk"]) for t in moves]})
    return out
