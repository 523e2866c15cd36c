"""Multi-node runs end up in one run directory: node 0's ``--out``.

With a shared ``--out`` (NFS, or one machine) every rank already writes there. Otherwise each
rank whose directory is not node 0's sends its closed stream and layout file to rank 0 through
torchrun's rendezvous store (the TCPStore that node 0's agent hosts at MASTER_ADDR:MASTER_PORT for
the whole run; workers reach it without a process group, so this works after the script destroyed
its own), and rank 0 writes them next to its own.

Which ranks share rank 0's directory is decided at start: rank 0 writes a token file into its
directory and publishes the token; a rank that finds the file in its own ``--out`` shares it.
Only multi-node runs (torchrun's GROUP_WORLD_SIZE > 1) do any of this.
"""
from __future__ import annotations

import contextlib
import os
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from syncviz.trace import schema as S

WAIT_S = 120.0          # how long rank 0 waits at exit for another node's files


def _store():
    import torch.distributed as dist
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=WAIT_S))


def _files(rank: int) -> tuple[str, ...]:
    """A rank's files in a run directory (grads-<r>.arrow only with --grad-values)."""
    return (S.rank_file(rank), S.layout_file(rank), S.grads_file(rank))


class Gather:
    def __init__(self, rec):
        self.rec = rec
        self.prefix = (f"syncviz/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/"
                       f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/")
        self.store = _store()
        self.world = rec.world_size
        out = Path(rec.run_dir)
        if rec.rank == 0:
            token = uuid.uuid4().hex
            (out / f".syncviz-node0-{token}").write_text("rank 0 of this run writes here\n")
            self.store.set(self.prefix + "token", token)
            self.token_file = out / f".syncviz-node0-{token}"
        token = self.store.get(self.prefix + "token").decode()
        self.shared = (out / f".syncviz-node0-{token}").exists()
        self.store.set(self.prefix + f"shared-{rec.rank}", "1" if self.shared else "0")
        rec.on_close(self.at_close)

    def at_close(self, rec) -> None:
        try:
            if rec.rank == 0:
                self._receive(Path(rec.run_dir))
            elif not self.shared:
                self._send(Path(rec.run_dir), rec.rank)
        except Exception as e:   # noqa: BLE001 - never fail the training run over this
            print(f"[syncviz] rank {rec.rank}: gathering trace files to node 0 failed: {e}", file=sys.stderr)

    def _send(self, out: Path, rank: int) -> None:
        for name in _files(rank):
            p = out / name
            if p.exists():
                self.store.set(self.prefix + f"file-{rank}-{name}", p.read_bytes())
        self.store.set(self.prefix + f"sent-{rank}", "1")

    def _receive(self, out: Path) -> None:
        remote = []
        for r in range(1, self.world):
            if self.store.get(self.prefix + f"shared-{r}") == b"0":
                remote.append(r)
        for r in remote:
            self.store.wait([self.prefix + f"sent-{r}"], timedelta(seconds=WAIT_S))
            for name in _files(r):
                key = self.prefix + f"file-{r}-{name}"
                if self.store.check([key]):
                    tmp = out / f".tmp-{name}"
                    tmp.write_bytes(self.store.get(key))
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, out / name)
                    self.store.delete_key(key)
        with contextlib.suppress(OSError):
            self.token_file.unlink()
        if remote:       # say so in run.json (rank 0 wrote it already, finished or not)
            import json

            from syncviz.trace import write_json_atomic
            path = out / S.RUN_FILE
            meta = json.loads(path.read_text())
            meta["gathered_ranks"] = remote
            write_json_atomic(path, meta)


def install(rec) -> Gather | None:
    """Set up gathering for a multi-node run (no-op on one node or outside torchrun)."""
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) <= 1 or "MASTER_ADDR" not in os.environ:
        return None
    try:
        return Gather(rec)
    except Exception as e:   # noqa: BLE001
        print(f"[syncviz] rank {rec.rank}: cannot reach node 0 to gather trace files ({e}); "
              f"this rank's files stay in {rec.run_dir}", file=sys.stderr)
        return None
