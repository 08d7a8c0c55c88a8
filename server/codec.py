"""Protobuf <-> numpy for the servicer: one ``np.frombuffer`` per bulk field, no per-object Python.

Layouts are those documented in proto/sapgrid/v1/frame.proto (little-endian ids uint64, boxes
float32 rows of 2*dims, pairs uint64 rows of 2, category/mask uint32, static 1 byte). Only byte
lengths are checked here (O(1)); the values (NaN, min > max, duplicate or unknown ids...) are
validated by sapcore.World.step, which changes nothing when it refuses a frame.
"""
from __future__ import annotations

import numpy as np

from sapcore.types import Delta, FrameStats

from sapgrid.v1 import frame_pb2, world_pb2

from .errors import DimsMismatch, InvalidInput

U64 = np.dtype("<u8")
U32 = np.dtype("<u4")
F32 = np.dtype("<f4")

_EMPTY_U64 = np.empty(0, U64)


def _ids(frame: frame_pb2.Frame, field: str) -> np.ndarray:
    raw = getattr(frame, field)
    if len(raw) % 8:
        raise InvalidInput(f"{field}: {len(raw)} bytes is not a multiple of 8 (uint64 ids)", field)
    return np.frombuffer(raw, U64)


def _boxes(frame: frame_pb2.Frame, field: str, n: int, dims: int, ids_field: str) -> np.ndarray:
    raw = getattr(frame, field)
    row = 8 * dims
    if len(raw) != n * row:
        other = 5 - dims
        if n and len(raw) == n * 8 * other:
            raise DimsMismatch(f"{field}: {len(raw)} bytes for {n} boxes are {other}D boxes, but the world is {dims}D",
                               field)
        raise InvalidInput(f"{field}: {len(raw)} bytes, expected {n * row} ({n} {ids_field} x {row} bytes: "
                           f"{2 * dims} float32 per box)", field)
    return np.frombuffer(raw, F32).reshape(n, 2 * dims)


def _per_add(frame: frame_pb2.Frame, field: str, n: int, dtype: np.dtype):
    raw = getattr(frame, field)
    if not raw:
        return None
    if len(raw) != n * dtype.itemsize:
        raise InvalidInput(f"{field}: {len(raw)} bytes, expected 0 or {n * dtype.itemsize} "
                           f"({n} add_ids x {dtype.itemsize} bytes)", field)
    return np.frombuffer(raw, dtype)


def decode_frame(frame: frame_pb2.Frame, dims: int) -> dict:
    """Keyword arguments of ``World.step`` for a frame of a ``dims``-D world (zero-copy, read-only views)."""
    remove_ids = _ids(frame, "remove_ids")
    add_ids = _ids(frame, "add_ids")
    update_ids = _ids(frame, "update_ids")
    n_add = len(add_ids)
    add_boxes = _boxes(frame, "add_boxes", n_add, dims, "add_ids")
    update_boxes = _boxes(frame, "update_boxes", len(update_ids), dims, "update_ids")
    static = _per_add(frame, "add_static", n_add, np.dtype(np.uint8))
    if static is not None and n_add and static.max() > 1:
        bad = int(np.argmax(static > 1))
        raise InvalidInput(f"add_static[{bad}]: {int(static[bad])} is not 0 or 1", "add_static", bad)
    return dict(
        remove_ids=remove_ids if len(remove_ids) else None,
        add_ids=add_ids if n_add else None,
        add_boxes=add_boxes if n_add else None,
        add_category=_per_add(frame, "add_category", n_add, U32),
        add_mask=_per_add(frame, "add_mask", n_add, U32),
        add_static=None if static is None else static.view(np.bool_),
        update_ids=update_ids if len(update_ids) else None,
        update_boxes=update_boxes if len(update_ids) else None,
    )


def pairs_bytes(pairs: np.ndarray) -> bytes:
    """uint64 [K, 2] pairs -> bytes (16 per pair, little-endian)."""
    return np.ascontiguousarray(pairs, dtype=U64).tobytes()


def ids_bytes(ids: np.ndarray) -> bytes:
    return np.ascontiguousarray(ids, dtype=U64).tobytes()


def boxes_bytes(boxes: np.ndarray) -> bytes:
    return np.ascontiguousarray(boxes, dtype=F32).tobytes()


def stats_message(s: FrameStats, queue_s: float = 0.0, server_s: float = 0.0) -> world_pb2.FrameStats:
    return world_pb2.FrameStats(
        objects=int(s.objects), pairs=int(s.pairs), created=int(s.created), deleted=int(s.deleted),
        swaps=int(s.swaps), cells_touched=int(s.cells_touched), cell_overflows=int(s.cell_overflows),
        validate_seconds=s.validate_s, rasterize_seconds=s.rasterize_s, apply_seconds=s.apply_s,
        merge_seconds=s.merge_s, engine_seconds=s.total_s, queue_seconds=queue_s, server_seconds=server_s)


def delta_message(delta: Delta, seq: int, world: str, frame_no: int) -> frame_pb2.Delta:
    """Delta message of an applied frame (stats.queue/server seconds are filled in by the caller)."""
    return frame_pb2.Delta(seq=seq, world=world, frame=frame_no, created=pairs_bytes(delta.created),
                           deleted=pairs_bytes(delta.deleted), stats=stats_message(delta.stats))


def config_message(cfg, expected_objects: int = 0) -> world_pb2.WorldConfig:
    """sapcore.WorldConfig -> WorldConfig message."""
    return world_pb2.WorldConfig(dims=cfg.dims, bounds=list(cfg.bounds), cells=list(cfg.cells),
                                 threads=cfg.threads or 0, max_objects=cfg.max_objects,
                                 coord_limit=cfg.coord_limit, expected_objects=expected_objects)


def world_config(msg: world_pb2.WorldConfig, default_threads: int = 0):
    """WorldConfig message -> sapcore.WorldConfig (cells picked by sapcore.auto_cells when empty).

    Raises sapcore.ConfigError (-> INVALID_ARGUMENT) for a bad configuration.
    """
    from sapcore import WorldConfig
    from sapcore.errors import ConfigError

    dims = int(msg.dims)
    if dims not in (2, 3):
        raise ConfigError(f"dims must be 2 or 3, got {dims}")
    bounds = tuple(msg.bounds)
    cells = tuple(msg.cells)
    if not cells:
        from sapcore import auto_cells

        if len(bounds) != 2 * dims:
            raise ConfigError(f"bounds must have {2 * dims} values (mins then maxs), got {len(bounds)}")
        cells = tuple(auto_cells(dims, bounds, int(msg.expected_objects or 10_000)))
    kwargs = {}
    if msg.max_objects:
        kwargs["max_objects"] = int(msg.max_objects)
    if msg.coord_limit:
        kwargs["coord_limit"] = float(msg.coord_limit)
    threads = int(msg.threads) or int(default_threads) or None
    return WorldConfig(dims=dims, bounds=bounds, cells=cells, threads=threads, **kwargs)
