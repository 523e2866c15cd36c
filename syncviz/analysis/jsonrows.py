"""Per-event tables as JSON text that can be written piece by piece: ``syncviz summary --json`` of a
run too big to hold writes each partition's rows to a scratch file (in the worker) and copies the files
into its output in rank order, so the printed JSON is the same bytes as from the whole run, in memory
bounded by one partition.

Records are pandas' ``to_json(orient="records")`` (NaN and inf are null; 10 significant digits, as the
whole-run output always had), one per line, separated by ",\\n". A string's newline is escaped by
to_json, so a raw newline only ever separates records.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import IO, Iterable

import pandas as pd

CHUNK_ROWS = 100_000      # rows turned into text at a time (~50 MB of text for comm_metrics rows)


def text(frame: pd.DataFrame) -> str:
    """``frame``'s records, one per line, separated by ",\\n" ('' for no rows)."""
    if not len(frame):
        return ""
    return frame.to_json(orient="records", lines=True).rstrip("\n").replace("\n", ",\n")


def write(path: str | Path, frame: pd.DataFrame) -> str | None:
    """``text(frame)`` into ``path``; None (and no file) for no rows."""
    if not len(frame):
        return None
    with open(path, "w") as f:
        _frame(f, frame)
    return str(path)


def _frame(out: IO[str], frame: pd.DataFrame) -> None:
    for i in range(0, len(frame), CHUNK_ROWS):
        if i:
            out.write(",\n")
        out.write(text(frame.iloc[i:i + CHUNK_ROWS]))


def array(out: IO[str], pieces: Iterable[str | Path | pd.DataFrame | None]) -> None:
    """A JSON array of the records in ``pieces``, in order: files from ``write``, or frames."""
    out.write("[")
    first = True
    for p in pieces:
        if p is None or (isinstance(p, pd.DataFrame) and not len(p)):
            continue
        out.write("\n" if first else ",\n")
        first = False
        if isinstance(p, pd.DataFrame):
            _frame(out, p)
            continue
        with open(p) as f:
            shutil.copyfileobj(f, out)
    out.write("]" if first else "\n]")
