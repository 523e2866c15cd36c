"""A rank's first pass of its own file, kept when its recording closes (analysis/rank_pass.py)."""
from __future__ import annotations

import sys
from pathlib import Path


def keep(rank: int, world_size: int, writer, finished: bool) -> None:
    """If the rank finished and wrote a file (``writer``: its trace.write.RankWriter, or None) and the
    run is big, analyse that file now, on this rank's CPU, and keep the result beside it: the summary
    then combines the ranks' first passes instead of reading every event on one machine (10^8
    simulated events on two cores: its first pass fell from ~37 to ~6-8 s). A problem here costs the
    summary that saving, never the run: one line on stderr."""
    if not finished or writer is None:
        return
    path = Path(writer.path)
    try:
        from syncviz.analysis import rank_pass      # here, at close: the analysis stack loads only if used
        if rank_pass.worth_it(path.stat().st_size, world_size):
            rank_pass.write(rank, path)
    except Exception as e:     # noqa: BLE001 - the user's run must end as it would untraced
        print(f"[syncviz] rank {rank}: first pass not kept ({type(e).__name__}: {e}); "
              "`syncviz summary` reads this rank's events instead", file=sys.stderr, flush=True)
