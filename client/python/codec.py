"""numpy <-> protobuf for the client (layouts documented in proto/sapgrid/v1/frame.proto)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sapcore.types import Delta, FrameStats, WorldConfig

from sapgrid.v1 import frame_pb2, world_pb2

U64 = np.dtype("<u8")
U32 = np.dtype("<u4")
F32 = np.dtype("<f4")
_NO_PAIRS = np.empty((0, 2), U64)


@dataclass
class RemoteDelta(Delta):
    """A sapcore.types.Delta plus what the service adds.

    seq : the frame's client sequence number; frame : frames the world has applied (this one included);
    world : world name; queue_s / server_s : seconds queued / from receipt to delta on the server.
    created / deleted are read-only uint64 [K, 2] views of the received bytes.
    """

    seq: int = 0
    frame: int = 0
    world: str = ""
    queue_s: float = 0.0
    server_s: float = 0.0


@dataclass
class WorldInfo:
    """A world as the server describes it."""

    name: str
    config: WorldConfig
    objects: int
    pairs: int
    frames: int
    frames_rejected: int
    queue_depth: int
    subscribers: int
    last_frame: FrameStats | None


def _bytes(a, dtype) -> bytes:
    if a is None:
        return b""
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def encode_frame(world: str, seq: int, remove_ids=None, add_ids=None, add_boxes=None, add_category=None,
                 add_mask=None, add_static=None, update_ids=None, update_boxes=None, *,
                 into: frame_pb2.Frame | None = None) -> frame_pb2.Frame:
    """Frame message from numpy-compatible arrays (ids uint64, boxes float32 rows mins then maxs).

    into: fill this (empty) Frame, e.g. ``request.frame``, instead of a new one (saves a copy).
    """
    f = frame_pb2.Frame() if into is None else into
    f.world, f.seq = world, seq
    for name, value, dtype in (("remove_ids", remove_ids, U64), ("add_ids", add_ids, U64),
                               ("add_boxes", add_boxes, F32), ("add_category", add_category, U32),
                               ("add_mask", add_mask, U32), ("update_ids", update_ids, U64),
                               ("update_boxes", update_boxes, F32)):
        if value is not None:
            setattr(f, name, _bytes(value, dtype))
    if add_static is not None:
        f.add_static = np.asarray(add_static, dtype=bool).view(np.uint8).tobytes()
    return f


def pairs_array(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, U64).reshape(-1, 2) if raw else _NO_PAIRS


def stats_from(msg: world_pb2.FrameStats) -> FrameStats:
    return FrameStats(objects=msg.objects, pairs=msg.pairs, created=msg.created, deleted=msg.deleted,
                      swaps=msg.swaps, cells_touched=msg.cells_touched, cell_overflows=msg.cell_overflows,
                      validate_s=msg.validate_seconds, rasterize_s=msg.rasterize_seconds,
                      apply_s=msg.apply_seconds, merge_s=msg.merge_seconds, total_s=msg.engine_seconds)


def delta_from(msg: frame_pb2.Delta) -> RemoteDelta:
    return RemoteDelta(created=pairs_array(msg.created), deleted=pairs_array(msg.deleted),
                       stats=stats_from(msg.stats), seq=msg.seq, frame=msg.frame, world=msg.world,
                       queue_s=msg.stats.queue_seconds, server_s=msg.stats.server_seconds)


def config_message(cfg: WorldConfig | None = None, *, dims: int = 2, bounds=None, cells=None,
                    expected_objects: int = 0) -> world_pb2.WorldConfig:
    if cfg is not None:
        return world_pb2.WorldConfig(dims=cfg.dims, bounds=list(cfg.bounds), cells=list(cfg.cells),
                                     threads=cfg.threads or 0, max_objects=cfg.max_objects,
                                     coord_limit=cfg.coord_limit, expected_objects=expected_objects)
    if bounds is None:
        bounds = (0.0,) * dims + (1000.0,) * dims
    return world_pb2.WorldConfig(dims=dims, bounds=list(bounds), cells=list(cells or ()),
                                 expected_objects=expected_objects)


def config_from(msg: world_pb2.WorldConfig) -> WorldConfig:
    return WorldConfig(dims=msg.dims, bounds=tuple(msg.bounds), cells=tuple(msg.cells), threads=msg.threads or None,
                       max_objects=msg.max_objects, coord_limit=msg.coord_limit)


def info_from(msg: world_pb2.WorldInfo) -> WorldInfo:
    s = msg.stats
    return WorldInfo(name=msg.name, config=config_from(msg.config), objects=s.objects, pairs=s.pairs,
                     frames=s.frames, frames_rejected=s.frames_rejected, queue_depth=s.queue_depth,
                     subscribers=s.subscribers, last_frame=stats_from(s.last_frame) if s.HasField("last_frame")
                     else None)
