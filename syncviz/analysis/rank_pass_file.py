"""The file a rank keeps its first pass in (analysis.rank_pass): a magic line, the header's length
(8 bytes), a JSON header, and the arrays' bytes in two LZ4 frames, the second read only when one
of its arrays is (``Packed``). No pickle: a file is data, whoever wrote it.
"""
from __future__ import annotations

import json
import mmap
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa


_MAGIC = b"syncviz rank pass\n"
# LZ4, not zstd (sessions 21-45). A rank of the 10^8-event DDP run keeps 8.5 MB of arrays in 4.7 MB
# (zstd 3.5 MB; 1.54 MB with the differences below); its two frames decompress in 0.52 ms against 3.38 ms (60 ranks' frames in memory,
# `/tmp/exp46/dec.py`), and a summary decompresses each rank 1.5 times: zstd's decompression was 10.7 s
# of ~80 s of CPU in that run's summary (cProfile, one process, session 46).
CODEC = "lz4"
# What a reader decompresses: the header names its frames' codec, so this code can also time passes
# written in zstd beside LZ4 ones (session 46 did, with CODEC set to "zstd" while writing).
CODECS = ("lz4", "zstd")


def write_file(fh, head: dict, arrays: dict, second) -> None:
    """The magic line, the header's length (8 bytes), the header (JSON: ``head``, each array's name,
    dtype, shape, frame and place in it, and each frame's packed and unpacked size) and the arrays'
    bytes in two frames (``CODEC``): those ``second(name)`` is false of (what pass 1 reads), then the
    rest. One header, not an .npy per array: ~60 small arrays a rank, and parsing their .npy headers was
    60% of loading a partition's files (84 ranks of the 10^7-event run: 0.29 of 0.49 s). Each summary
    decompresses every rank's first frame in pass 1 and both in pass 2, so pass 1 leaves the second
    frame packed."""
    groups: list[list] = [[], []]
    for k, v in arrays.items():
        groups[bool(second(k))].append((k, *_stored(np.ascontiguousarray(v))))
    places, frames, packed = [], [], []
    for i, group in enumerate(groups):
        at = 0
        for k, v, delta in group:
            places.append([k, v.dtype.str, list(v.shape), i, at, v.nbytes, delta])
            at += v.nbytes
        packed.append(pa.compress(b"".join(v.tobytes() for _, v, _ in group), codec=CODEC, asbytes=True))
        frames.append([len(packed[-1]), at])
    text = json.dumps({**head, "arrays": places, "frames": frames, "codec": CODEC}).encode()
    fh.write(_MAGIC + len(text).to_bytes(8, "little") + text)
    for b in packed:
        fh.write(b)


# Integer columns whose neighbours are close (timestamps, row positions) are kept as differences from
# the row before: LZ4 finds no repeats in nanosecond timestamps, but their differences repeat. A rank
# of the 10^8-event DDP run: 4.74 MB of LZ4 frames, 1.54 MB with its launch, hook, ready and end times
# and its row positions so kept (zstd: 3.5 MB). The differences wrap as the integers do, so the sum
# that undoes them (Packed) gives back every value, whatever its range.
DELTA_MIN = 1024            # values: a column this short is kept as it is
DELTA_GAIN = 0.8            # kept as differences only where they pack into less than this share


def _stored(v: np.ndarray) -> tuple[np.ndarray, int]:
    """A column as its frame holds it, and 1 where that is its differences (see DELTA_MIN)."""
    if v.ndim != 1 or v.dtype.kind not in "iu" or len(v) < DELTA_MIN:
        return v, 0
    d = np.diff(v, prepend=v.dtype.type(0))
    packs = [len(pa.compress(x, codec=CODEC, asbytes=True)) for x in (v, d)]
    return (d, 1) if packs[1] < DELTA_GAIN * packs[0] else (v, 0)


def read_file(path: Path) -> tuple[dict, memoryview]:
    """The header and the packed frames (a view of the file memory-mapped: nothing copied, and a
    frame is read from the file only when it is decompressed). Why mapped: reading every rank's whole
    file into fresh memory was ~3.4 ms of a DDP rank's ~8 ms in pass 1, which decompresses only the
    first frame (a quarter of the file); pass 1 of 40 partitions of the 10^8-event DDP run, alternated
    (`/tmp/exp/mmbench.py`, three rounds): 56-63 -> 50-53 ms a partition, system time 0.16-0.19 ->
    0.04-0.06 s; pass 2's loads 58-60 -> 52-53 ms. Files are only ever replaced whole (rank_pass.write:
    a new file renamed over the old), so a mapping never sees its file shrink. ValueError for an empty
    file or one that is not a pass."""
    with open(path, "rb") as f:
        data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    if bytes(data[:len(_MAGIC)]) != _MAGIC:
        raise ValueError("not a rank pass file")
    n = int.from_bytes(data[len(_MAGIC):len(_MAGIC) + 8], "little")
    body = len(_MAGIC) + 8 + n
    head = json.loads(bytes(data[len(_MAGIC) + 8:body]))
    return head, data[body:]


# A frame said to unpack to more than this many times its packed size (plus 1 MB) is damage: LZ4 packs
# at most ~255:1 (its length codes). Not less: with the differences, regular columns pack far (a DDP
# rank's row positions 378 KB -> 1.6 KB) and a frame of the 10^8-event DDP run reached 14.5:1; a pass
# rejected here is not an error, but its whole partition is then read from the rank files.
_MAX_RATIO = 256


class Packed(Mapping):
    """A rank's kept arrays by name, each frame decompressed when one of its arrays is first read:
    read-only views of the frame's buffer (merge copies every array it keeps), or, for a column kept
    as differences, a new array of their running sum."""

    def __init__(self, head: dict, packed: bytes | memoryview):
        self.places = {k: (fr, dt, shape, at, nbytes, delta) for k, dt, shape, fr, at, nbytes, delta in head["arrays"]}
        starts = np.cumsum([0] + [n for n, _ in head["frames"]]).tolist()
        if starts[-1] != len(packed) or any(not 0 <= raw <= _MAX_RATIO * n + (1 << 20) for n, raw in head["frames"]):
            raise ValueError("frames do not match the file")   # more than LZ4 made of these bytes: not ours
        self.codec = head.get("codec")
        if self.codec not in CODECS:
            raise ValueError(f"frames packed by {self.codec!r}, not one of {', '.join(CODECS)}")
        whole = memoryview(packed)
        self.frames = [(whole[a:a + n], raw) for a, (n, raw) in zip(starts, head["frames"])]
        self.raw: dict[int, object] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        fr, dt, shape, at, nbytes, delta = self.places[key]
        if not nbytes:
            return np.zeros(shape, dtype=np.dtype(dt))
        v = np.frombuffer(self.frame(fr), dtype=np.dtype(dt), count=nbytes // np.dtype(dt).itemsize, offset=at).reshape(shape)
        return np.cumsum(v, dtype=v.dtype) if delta else v

    def frame(self, fr: int):
        """Frame ``fr`` decompressed (once)."""
        if fr not in self.raw:
            b, size = self.frames[fr]
            self.raw[fr] = pa.decompress(b, decompressed_size=size, codec=self.codec)
        return self.raw[fr]

    def __iter__(self):
        return iter(self.places)

    def __len__(self) -> int:
        return len(self.places)
