"""The snapshot format of a world (README "Snapshot format"): versioned, checksummed, little-endian.

    header (24 bytes):  magic b"SAPGSNAP" | version u32 (1) | CRC32C of the body u32 | body length u64
    body:
      name              u16 length + UTF-8
      config            dims u8 | bounds f64[2*dims] | cells u32[dims] | threads u32 (0: server default)
                        | max_objects u64 | coord_limit f64 | expected_objects u64
      counters          frames u64 (frames applied) | frames_rejected u64 | pairs_digest u64
      writers           count u32, then per writer: u8 length + name | last seq u64 | kept answers u32,
                        then per answer: seq u64 | u32 length + the serialized Delta
      objects           count u64 (n), then the arrays: ids u64[n] (in no particular order) | boxes f32[n, 2*dims]
                        | category u32[n] | mask u32[n] | static u8[n] (0/1)

``State`` is what a snapshot holds, copied from a world in its turn (``WorldRunner.state``: numpy copies,
fast), then encoded outside it (``encode``). ``decode`` refuses anything that is not a whole, valid
snapshot with ``SnapshotError`` naming what is wrong; it never returns half a state.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import google_crc32c
import numpy as np

MAGIC = b"SAPGSNAP"
VERSION = 1
_HEADER = struct.Struct("<8sIIQ")
HEADER_BYTES = _HEADER.size


class SnapshotError(ValueError):
    """Bytes that are not a valid snapshot (truncated, bad checksum, unknown version, bad values)."""


@dataclass
class State:
    """Everything a world is made of, as a snapshot holds it."""

    name: str
    dims: int
    bounds: tuple
    cells: tuple
    threads: int                  # 0: the server's default
    max_objects: int
    coord_limit: float
    expected_objects: int
    frames: int
    rejected: int
    digest: int
    writers: list = field(default_factory=list)       # [(name, last, [(seq, bytes), ...])]
    ids: np.ndarray = None        # uint64 [n], unique, in no particular order
    boxes: np.ndarray = None      # float32 [n, 2*dims]
    category: np.ndarray = None   # uint32 [n]
    mask: np.ndarray = None       # uint32 [n]
    static: np.ndarray = None     # bool [n]


def crc32c(data: bytes) -> int:
    return google_crc32c.value(bytes(data))


def encode(s: State) -> bytes:
    """The snapshot file of a state."""
    d = s.dims
    name = s.name.encode()
    parts = [struct.pack("<H", len(name)), name,
             struct.pack("<B", d), np.asarray(s.bounds, "<f8").tobytes(), np.asarray(s.cells, "<u4").tobytes(),
             struct.pack("<IQdQ", s.threads or 0, s.max_objects, s.coord_limit, s.expected_objects),
             struct.pack("<QQQ", s.frames, s.rejected, s.digest),
             struct.pack("<I", len(s.writers))]
    for wname, last, recent in s.writers:
        raw = wname.encode()
        parts += [struct.pack("<B", len(raw)), raw, struct.pack("<QI", last, len(recent))]
        for seq, delta in recent:
            parts += [struct.pack("<QI", seq, len(delta)), delta]
    n = len(s.ids)
    parts += [struct.pack("<Q", n), np.ascontiguousarray(s.ids, "<u8").tobytes(),
              np.ascontiguousarray(s.boxes, "<f4").reshape(n, 2 * d).tobytes(),
              np.ascontiguousarray(s.category, "<u4").tobytes(), np.ascontiguousarray(s.mask, "<u4").tobytes(),
              np.ascontiguousarray(s.static, np.uint8).tobytes()]
    body = b"".join(parts)
    return _HEADER.pack(MAGIC, VERSION, crc32c(body), len(body)) + body


class _Reader:
    def __init__(self, buf: memoryview):
        self.buf, self.i = buf, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.i + n > len(self.buf):
            raise SnapshotError(f"snapshot: truncated in {what} (at byte {HEADER_BYTES + self.i})")
        out = self.buf[self.i:self.i + n]
        self.i += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple:
        st = struct.Struct("<" + fmt)
        return st.unpack(self.take(st.size, what))

    def array(self, dtype: str, n: int, what: str) -> np.ndarray:
        dt = np.dtype(dtype)
        return np.frombuffer(self.take(n * dt.itemsize, what), dt).copy()


def header(data) -> tuple[int, int]:
    """(version, total bytes) of a snapshot from its first ``HEADER_BYTES`` bytes; SnapshotError if not one."""
    if len(data) < HEADER_BYTES:
        raise SnapshotError(f"snapshot: {len(data)} bytes, shorter than its {HEADER_BYTES}-byte header")
    magic, version, _, length = _HEADER.unpack(bytes(data[:HEADER_BYTES]))
    if magic != MAGIC:
        raise SnapshotError("snapshot: bad magic (not a sapgrid snapshot)")
    if version != VERSION:
        raise SnapshotError(f"snapshot: version {version} is not supported (this server reads version {VERSION})")
    return version, HEADER_BYTES + length


def decode(data: bytes) -> State:
    """The State of a snapshot file; SnapshotError if it is not a whole, valid one."""
    _, total = header(data)
    if len(data) != total:
        raise SnapshotError(f"snapshot: {len(data)} bytes, its header says {total}")
    _, _, crc, _ = _HEADER.unpack(bytes(data[:HEADER_BYTES]))
    body = memoryview(data)[HEADER_BYTES:]
    if crc32c(body) != crc:
        raise SnapshotError("snapshot: checksum mismatch (the data is damaged)")
    r = _Reader(body)
    try:
        (n_name,) = r.unpack("H", "name")
        name = bytes(r.take(n_name, "name")).decode()
        (dims,) = r.unpack("B", "config")
        if dims not in (2, 3):
            raise SnapshotError(f"snapshot: dims {dims} is not 2 or 3")
        bounds = tuple(float(x) for x in r.array("<f8", 2 * dims, "config"))
        cells = tuple(int(x) for x in r.array("<u4", dims, "config"))
        threads, max_objects, coord_limit, expected = r.unpack("IQdQ", "config")
        frames, rejected, digest = r.unpack("QQQ", "counters")
        (n_writers,) = r.unpack("I", "writers")
        writers = []
        for _ in range(n_writers):
            (n,) = r.unpack("B", "writers")
            wname = bytes(r.take(n, "writers")).decode()
            last, n_recent = r.unpack("QI", "writers")
            recent = []
            for _ in range(n_recent):
                seq, size = r.unpack("QI", "writers")
                recent.append((seq, bytes(r.take(size, "writers"))))
            writers.append((wname, last, recent))
        (n,) = r.unpack("Q", "objects")
        if n > len(body):
            raise SnapshotError(f"snapshot: {n} objects cannot fit in {len(body)} bytes")
        ids = r.array("<u8", n, "ids")
        boxes = r.array("<f4", n * 2 * dims, "boxes").reshape(n, 2 * dims)
        category = r.array("<u4", n, "category")
        mask = r.array("<u4", n, "mask")
        static = r.array("u1", n, "static")
    except UnicodeDecodeError:
        raise SnapshotError("snapshot: a name is not UTF-8") from None
    if r.i != len(body):
        raise SnapshotError(f"snapshot: {len(body) - r.i} bytes after the objects")
    if static.size and static.max() > 1:
        raise SnapshotError("snapshot: a static flag is not 0 or 1")
    return State(name, dims, bounds, cells, threads, max_objects, coord_limit, expected, frames, rejected, digest,
                 writers, ids, boxes, category, mask, static.astype(bool))
