"""Read the bucket layouts of a run directory (``layout-<rank>.arrow``: which parameters each
bucket holds, per layout version; the format is in schema.py)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from syncviz.trace import schema as S
from syncviz.trace import validate as V
from syncviz.trace.streams import TraceError, _read_stream

_LAYOUT_RE = re.compile(r"^layout-(\d+)\.arrow$")


def load_layouts(run_dir: Path, lowest: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Bucket layouts of every rank; a damaged layout file is named and left out. ``lowest``: only
    the lowest rank's that has rows, the one analysis.bucket_map draws (a dashboard opening a run
    from its cache reads one file, not 1,024: 0.19 s of a first open's 0.37 s on the 10^8-event DDP
    run, 0.40 s with its files out of the page cache; session 43)."""
    tables, problems = [], []
    files = [(p, int(m.group(1))) for p in sorted(run_dir.glob("layout-*.arrow")) if (m := _LAYOUT_RE.match(p.name))]
    for p, rank in sorted(files, key=lambda f: f[1]) if lowest else files:
        try:
            batches, problem = _read_stream(p, S.LAYOUT_SCHEMA)
            if problem:
                problems.append(f"{p.name}: {problem}")
            if batches:
                t, bad = V.conform(pa.Table.from_batches(batches), S.LAYOUT_SCHEMA, {})
                if bad:
                    problems.append(f"{p.name}: {sum(int(b.sum()) for b in bad.values())} unreadable values")
                tables.append(t.append_column("rank", pa.array(np.full(t.num_rows, rank, dtype=np.int64))))
                if lowest and t.num_rows:
                    break
        except (TraceError, V.StreamError) as e:
            problems.append(f"{p.name}: unreadable, left out ({str(e).replace(str(p) + ': ', '')})")
    if not tables:
        return pd.DataFrame(columns=list(S.LAYOUT_COLUMNS) + ["rank"]), problems
    # one conversion to pandas: one per file cost 0.9 ms each, 0.9 s of a 1,024-rank run's 2.0 s (measured)
    return pa.concat_tables(tables).to_pandas(), problems
