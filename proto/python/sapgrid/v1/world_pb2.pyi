from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorldConfig(_message.Message):
    __slots__ = ("dims", "bounds", "cells", "threads", "max_objects", "coord_limit", "expected_objects")
    DIMS_FIELD_NUMBER: _ClassVar[int]
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    MAX_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    COORD_LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    dims: int
    bounds: _containers.RepeatedScalarFieldContainer[float]
    cells: _containers.RepeatedScalarFieldContainer[int]
    threads: int
    max_objects: int
    coord_limit: float
    expected_objects: int
    def __init__(self, dims: _Optional[int] = ..., bounds: _Optional[_Iterable[float]] = ..., cells: _Optional[_Iterable[int]] = ..., threads: _Optional[int] = ..., max_objects: _Optional[int] = ..., coord_limit: _Optional[float] = ..., expected_objects: _Optional[int] = ...) -> None: ...

class FrameStats(_message.Message):
    __slots__ = ("objects", "pairs", "created", "deleted", "swaps", "cells_touched", "cell_overflows", "validate_seconds", "rasterize_seconds", "apply_seconds", "merge_seconds", "engine_seconds", "queue_seconds", "server_seconds")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    SWAPS_FIELD_NUMBER: _ClassVar[int]
    CELLS_TOUCHED_FIELD_NUMBER: _ClassVar[int]
    CELL_OVERFLOWS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RASTERIZE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    APPLY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MERGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    objects: int
    pairs: int
    created: int
    deleted: int
    swaps: int
    cells_touched: int
    cell_overflows: int
    validate_seconds: float
    rasterize_seconds: float
    apply_seconds: float
    merge_seconds: float
    engine_seconds: float
    queue_seconds: float
    server_seconds: float
    def __init__(self, objects: _Optional[int] = ..., pairs: _Optional[int] = ..., created: _Optional[int] = ..., deleted: _Optional[int] = ..., swaps: _Optional[int] = ..., cells_touched: _Optional[int] = ..., cell_overflows: _Optional[int] = ..., validate_seconds: _Optional[float] = ..., rasterize_seconds: _Optional[float] = ..., apply_seconds: _Optional[float] = ..., merge_seconds: _Optional[float] = ..., engine_seconds: _Optional[float] = ..., queue_seconds: _Optional[float] = ..., server_seconds: _Optional[float] = ...) -> None: ...

class WorldStats(_message.Message):
    __slots__ = ("objects", "pairs", "frames", "frames_rejected", "queue_depth", "subscribers", "last_frame", "pairs_digest", "writers", "frozen")
    class WritersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    LAST_FRAME_FIELD_NUMBER: _ClassVar[int]
    PAIRS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    objects: int
    pairs: int
    frames: int
    frames_rejected: int
    queue_depth: int
    subscribers: int
    last_frame: FrameStats
    pairs_digest: int
    writers: _containers.ScalarMap[str, int]
    frozen: bool
    def __init__(self, objects: _Optional[int] = ..., pairs: _Optional[int] = ..., frames: _Optional[int] = ..., frames_rejected: _Optional[int] = ..., queue_depth: _Optional[int] = ..., subscribers: _Optional[int] = ..., last_frame: _Optional[_Union[FrameStats, _Mapping]] = ..., pairs_digest: _Optional[int] = ..., writers: _Optional[_Mapping[str, int]] = ..., frozen: _Optional[bool] = ...) -> None: ...

class WorldInfo(_message.Message):
    __slots__ = ("name", "config", "stats", "generation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: WorldConfig
    stats: WorldStats
    generation: int
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[WorldConfig, _Mapping]] = ..., stats: _Optional[_Union[WorldStats, _Mapping]] = ..., generation: _Optional[int] = ...) -> None: ...
