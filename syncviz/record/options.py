"""What ``syncviz trace`` tells each rank: one dataclass, carried to the ranks as one environment
variable (torchrun passes its environment to the workers), read back by the bootstrap."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

ENV = "SYNCVIZ_OPTIONS"


class StepSelection:
    """Which optimizer steps to keep: 'all', 'A:B' (inclusive A, exclusive B), or 'N,M,...'."""

    def __init__(self, spec: str | None = None):
        self.spec = (spec or "all").strip()
        self._range = None
        self._set = None
        if self.spec in ("all", ""):
            return
        try:
            if ":" in self.spec:
                a, b = self.spec.split(":", 1)
                self._range = (int(a) if a else 0, int(b) if b else None)
            else:
                self._set = {int(x) for x in self.spec.split(",") if x.strip()}
        except ValueError:
            raise ValueError(f"bad step selection {spec!r}: use 'all', 'A:B' or 'N,M,...'") from None

    def __contains__(self, step: int) -> bool:
        if self._range:
            a, b = self._range
            return step >= a and (b is None or step < b)
        if self._set is not None:
            return step in self._set
        return True

    def done_after(self, step: int) -> bool:
        return bool(self._range and self._range[1] is not None and step + 1 >= self._range[1])


@dataclass
class TraceOptions:
    """Options of one traced run, as every rank sees them."""
    out: str = ""                  # run directory (absolute); ranks write rank-<r>.arrow there
    name: str = ""                 # run name (run.json "name")
    steps: str = "all"             # optimizer steps to keep: all | A:B | N,M,...
    target: str = ""               # the user's script path, or module name when is_module
    is_module: bool = False        # target is run as ``python -m target``
    command: list[str] = field(default_factory=list)   # the traced command line (run.json)
    collectives: bool = True       # time every torch.distributed collective, not only DDP buckets
    backend: str = ""              # backend for init_process_group calls that name none
    profile: str = ""              # torch.profiler steps "A:B" ("" = off)
    grad_values: int = 0           # record this many gradient elements per parameter (0 = off; record/grads.py)

    def to_env(self) -> dict[str, str]:
        return {ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_env(cls, environ=None) -> "TraceOptions | None":
        text = (os.environ if environ is None else environ).get(ENV)
        if not text:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})
