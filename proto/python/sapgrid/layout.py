"""The byte layouts of the contract's bulk fields (proto/sapgrid/v1/frame.proto), shared by the server
and the Python client: little-endian ids uint64, boxes float32 rows of 2*dims (mins then maxs), pairs
uint64 rows (low id, high id), category/mask uint32, static one byte (0 or 1).
"""
from __future__ import annotations

import numpy as np

from sapgrid.v1 import world_pb2

U64 = np.dtype("<u8")
U32 = np.dtype("<u4")
F32 = np.dtype("<f4")
_NO_PAIRS = np.empty((0, 2), U64)
_NO_PAIRS.flags.writeable = False


def to_bytes(a, dtype: np.dtype) -> bytes:
    """An array-like as the bytes of a bulk field (b"" for None or an empty array: no conversion)."""
    if a is None or (type(a) is np.ndarray and a.size == 0):
        return b""
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def pairs_array(raw: bytes) -> np.ndarray:
    """A pairs field as a read-only uint64 [K, 2] view of its bytes (no copy)."""
    return np.frombuffer(raw, U64).reshape(-1, 2) if raw else _NO_PAIRS


def config_message(config=None, *, dims: int = 2, bounds=None, cells=None,
                   expected_objects: int = 0) -> world_pb2.WorldConfig:
    """WorldConfig message from a config object (attributes dims, bounds, cells and optionally threads,
    max_objects, coord_limit: a sapcore.WorldConfig or a sapgrid.client.WorldConfig), or from
    dims/bounds/cells (bounds None: 0..1000 on every axis; cells None: the server picks)."""
    if config is not None:
        return world_pb2.WorldConfig(dims=config.dims, bounds=list(config.bounds), cells=list(config.cells),
                                     threads=getattr(config, "threads", None) or 0,
                                     max_objects=getattr(config, "max_objects", 0) or 0,
                                     coord_limit=getattr(config, "coord_limit", 0.0) or 0.0,
                                     expected_objects=expected_objects)
    if bounds is None:
        bounds = (0.0,) * dims + (1000.0,) * dims
    return world_pb2.WorldConfig(dims=dims, bounds=list(bounds), cells=list(cells or ()),
                                 expected_objects=expected_objects)


# ---- the pair-set digest (frame.proto, Delta.pairs_digest) -------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of every element of a uint64 array (arithmetic mod 2^64)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, np.uint64) + _GOLDEN
        x = (x ^ (x >> _S30)) * _MIX1
        x = (x ^ (x >> _S27)) * _MIX2
        return x ^ (x >> _S31)


def pairs_digest(pairs) -> int:
    """The digest of a set of pairs (rows lo < hi, uint64 [K, 2]): the sum mod 2^64 of
    splitmix64(lo ^ splitmix64(hi)) over the rows. Order-independent, so a digest is kept in O(delta):
    ``(digest + pairs_digest(created) - pairs_digest(deleted)) % 2**64``."""
    p = np.asarray(pairs, np.uint64).reshape(-1, 2)
    if not len(p):
        return 0
    terms = splitmix64(p[:, 0] ^ splitmix64(p[:, 1]))
    return int(np.add.reduce(terms, dtype=np.uint64))


def digest_step(digest: int, created, deleted) -> int:
    """A pair digest after a delta: ``digest`` plus the created pairs' terms minus the deleted pairs'."""
    return (digest + pairs_digest(created) - pairs_digest(deleted)) & 0xFFFFFFFFFFFFFFFF
