"""numpy <-> protobuf for the client, and the client's own result types (no engine needed).

Byte layouts: ``sapgrid.layout`` (documented in proto/sapgrid/v1/frame.proto).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sapgrid.layout import F32, U32, U64, config_message, pairs_array, to_bytes
from sapgrid.v1 import frame_pb2, world_pb2

__all__ = ["FrameStats", "RemoteDelta", "WorldConfig", "WorldInfo", "config_message", "delta_from",
           "encode_frame", "info_from", "pairs_array"]


@dataclass(frozen=True)
class WorldConfig:
    """A world's configuration as the server reports it (the fields of sapcore.WorldConfig)."""

    dims: int
    bounds: tuple
    cells: tuple
    threads: int | None = None
    max_objects: int = 0
    coord_limit: float = 0.0


@dataclass
class FrameStats:
    """Work counters and engine timings of one frame (seconds), as sapcore.FrameStats."""

    objects: int = 0
    pairs: int = 0
    created: int = 0
    deleted: int = 0
    swaps: int = 0
    cells_touched: int = 0
    cell_overflows: int = 0
    validate_s: float = 0.0
    rasterize_s: float = 0.0
    apply_s: float = 0.0
    merge_s: float = 0.0
    total_s: float = 0.0


@dataclass
class RemoteDelta:
    """The answer to a frame: the pairs that started (created) and stopped (deleted) overlapping.

    created / deleted: read-only uint64 [K, 2] views of the received bytes, rows (low id, high id),
    sorted. seq: the frame's client sequence number; frame: frames the world has applied (this one
    included); world: its name; queue_s / server_s: seconds queued / from receipt to delta on the server.
    """

    created: np.ndarray
    deleted: np.ndarray
    stats: FrameStats = field(default_factory=FrameStats)
    seq: int = 0
    frame: int = 0
    world: str = ""
    queue_s: float = 0.0
    server_s: float = 0.0
    pairs_digest: int = 0             # digest of the world's pairs after the frame (sapgrid.layout.pairs_digest)


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
    generation: int = 0               # which world of this name (a re-created world has a new one)
    pairs_digest: int = 0             # digest of the active pairs (sapgrid.layout.pairs_digest)
    writers: dict = field(default_factory=dict)   # writer name -> seq of its last applied frame
    frozen: bool = False              # frames refused UNAVAILABLE "moving" (FreezeWorld)


def encode_frame(world: str, seq: int, remove_ids=None, add_ids=None, add_boxes=None, add_category=None,
                 add_mask=None, add_static=None, update_ids=None, update_boxes=None, *, writer: str = "",
                 into: frame_pb2.Frame | None = None) -> frame_pb2.Frame:
    """Frame message from numpy-compatible arrays (ids uint64, boxes float32 rows mins then maxs).

    writer: the frame's writer for exactly-once frames (see Frame.writer in the contract); "" for none.
    into: fill this (empty) Frame, e.g. ``request.frame``, instead of a new one (saves a copy).
    """
    f = frame_pb2.Frame() if into is None else into
    f.world, f.seq = world, seq
    if writer:
        f.writer = writer
    for name, value, dtype in (("remove_ids", remove_ids, U64), ("add_ids", add_ids, U64),
                               ("add_boxes", add_boxes, F32), ("add_category", add_category, U32),
                               ("add_mask", add_mask, U32), ("update_ids", update_ids, U64),
                               ("update_boxes", update_boxes, F32)):
        if value is not None:
            setattr(f, name, to_bytes(value, dtype))
    if add_static is not None:
        f.add_static = np.asarray(add_static, dtype=bool).view(np.uint8).tobytes()
    return f


def stats_from(msg: world_pb2.FrameStats) -> FrameStats:
    return FrameStats(objects=msg.objects, pairs=msg.pairs, created=msg.created, deleted=msg.deleted,
                      swaps=msg.swaps, cells_touched=msg.cells_touched, cell_overflows=msg.cell_overflows,
                      validate_s=msg.validate_seconds, rasterize_s=msg.rasterize_seconds,
                      apply_s=msg.apply_seconds, merge_s=msg.merge_seconds, total_s=msg.engine_seconds)


def delta_from(msg: frame_pb2.Delta) -> RemoteDelta:
    return RemoteDelta(created=pairs_array(msg.created), deleted=pairs_array(msg.deleted),
                       stats=stats_from(msg.stats), seq=msg.seq, frame=msg.frame, world=msg.world,
                       queue_s=msg.stats.queue_seconds, server_s=msg.stats.server_seconds,
                       pairs_digest=msg.pairs_digest)


def config_from(msg: world_pb2.WorldConfig) -> WorldConfig:
    return WorldConfig(dims=msg.dims, bounds=tuple(msg.bounds), cells=tuple(msg.cells), threads=msg.threads or None,
                       max_objects=msg.max_objects, coord_limit=msg.coord_limit)


def info_from(msg: world_pb2.WorldInfo) -> WorldInfo:
    s = msg.stats
    return WorldInfo(name=msg.name, config=config_from(msg.config), objects=s.objects, pairs=s.pairs,
                     frames=s.frames, frames_rejected=s.frames_rejected, queue_depth=s.queue_depth,
                     subscribers=s.subscribers,
                     last_frame=stats_from(s.last_frame) if s.HasField("last_frame") else None,
                     generation=msg.generation, pairs_digest=s.pairs_digest, writers=dict(s.writers),
                     frozen=s.frozen)


def query_result(resp, with_boxes: bool):
    """ids (uint64 [K]) of a QueryRegionResponse, or (ids, boxes float32 [K, 2*dims]) with boxes."""
    ids = np.frombuffer(resp.ids, U64)
    if not with_boxes:
        return ids
    boxes = np.frombuffer(resp.boxes, F32)
    return ids, boxes.reshape(len(ids), -1) if len(ids) else boxes.reshape(0, 0)


def region_values(region) -> list[float]:
    return [float(x) for x in np.asarray(region, dtype=np.float64).ravel()]


def join_pairs(chunks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(chunks) if len(chunks) > 1 else chunks[0] if chunks else pairs_array(b"")
