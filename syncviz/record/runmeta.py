"""run.json as rank 0 writes it while the run goes on (Recorder.write_meta). Part of syncviz.record."""
from __future__ import annotations

import contextlib
import json

import torch

from syncviz import __version__
from syncviz.record.discover import name_strategy
from syncviz.trace import new_meta, write_json_atomic
from syncviz.trace import schema as S


def write_run_meta(rec, identity: dict | None, steps_recorded: int, finished: bool) -> dict:
    """Write ``rec``'s run.json; returns its identity (run_id and created), kept from the first
    write (read back from the file once, so a recorder started again keeps the run's)."""
    meta = new_meta(rec.name, rec.world_size, command=rec.command, backend=None,
                    device="cpu", strategy=rec.strategy or name_strategy(rec.observed)[0], engine=rec.engine,
                    torch_version=torch.__version__, syncviz_version=__version__)
    path = rec.run_dir / S.RUN_FILE
    if identity is None:
        if path.exists():
            with contextlib.suppress(Exception):
                old = json.loads(path.read_text())
                identity = {"run_id": old["run_id"], "created": old["created"]}
        if identity is None:
            identity = {"run_id": meta["run_id"], "created": meta["created"]}
    meta.update(identity)
    meta.update(rec.meta_extra)
    meta["strategy_detail"] = name_strategy(rec.observed)[1]
    meta["steps_recorded"] = steps_recorded
    meta["finished"] = finished
    write_json_atomic(path, meta)
    return identity
