"""Read the optional gradient values of a run (grads-<rank>.arrow, ``syncviz trace --grad-values``;
schema.GRADS_SCHEMA). syncviz.analysis.grads checks the averaging argument on them."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pyarrow as pa

from syncviz.trace import schema as S
from syncviz.trace.read import TraceError, read_meta

_GRADS_RE = re.compile(r"^grads-(\d+)\.arrow$")


def load_grads(run_dir) -> pd.DataFrame:
    """All ranks' gradient-value rows (GRADS_COLUMNS + rank); complete batches of a cut-off stream."""
    run_dir = Path(run_dir)
    read_meta(run_dir)
    frames = []
    for p in sorted(run_dir.glob("grads-*.arrow")):
        m = _GRADS_RE.match(p.name)
        if not m:
            continue
        batches = []
        try:
            reader = pa.ipc.open_stream(pa.memory_map(str(p), "r"))
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
                except (pa.ArrowInvalid, OSError):
                    break     # a rank killed mid-run: keep its complete steps
        except (pa.ArrowInvalid, OSError) as e:
            raise TraceError(f"{p}: not an Arrow IPC stream ({str(e).splitlines()[0][:120]})") from None
        if reader.schema.names != list(S.GRADS_COLUMNS):
            raise TraceError(f"{p}: columns {reader.schema.names} are not syncviz gradient values")
        if batches:
            df = pa.Table.from_batches(batches).to_pandas()
            df["rank"] = int(m.group(1))
            frames.append(df)
    if not frames:
        raise TraceError(f"{run_dir}: no gradient values recorded (trace with --grad-values)")
    return pd.concat(frames, ignore_index=True)
