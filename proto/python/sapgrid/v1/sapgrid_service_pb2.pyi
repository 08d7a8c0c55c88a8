from sapgrid.v1 import frame_pb2 as _frame_pb2
from sapgrid.v1 import world_pb2 as _world_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateWorldRequest(_message.Message):
    __slots__ = ("name", "config", "if_not_exists")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    IF_NOT_EXISTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: _world_pb2.WorldConfig
    if_not_exists: bool
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[_world_pb2.WorldConfig, _Mapping]] = ..., if_not_exists: _Optional[bool] = ...) -> None: ...

class CreateWorldResponse(_message.Message):
    __slots__ = ("world",)
    WORLD_FIELD_NUMBER: _ClassVar[int]
    world: _world_pb2.WorldInfo
    def __init__(self, world: _Optional[_Union[_world_pb2.WorldInfo, _Mapping]] = ...) -> None: ...

class DeleteWorldRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteWorldResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorldsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorldsResponse(_message.Message):
    __slots__ = ("worlds", "server_version")
    WORLDS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    worlds: _containers.RepeatedCompositeFieldContainer[_world_pb2.WorldInfo]
    server_version: str
    def __init__(self, worlds: _Optional[_Iterable[_Union[_world_pb2.WorldInfo, _Mapping]]] = ..., server_version: _Optional[str] = ...) -> None: ...

class GetWorldRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetWorldResponse(_message.Message):
    __slots__ = ("world",)
    WORLD_FIELD_NUMBER: _ClassVar[int]
    world: _world_pb2.WorldInfo
    def __init__(self, world: _Optional[_Union[_world_pb2.WorldInfo, _Mapping]] = ...) -> None: ...

class ApplyFrameRequest(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: _frame_pb2.Frame
    def __init__(self, frame: _Optional[_Union[_frame_pb2.Frame, _Mapping]] = ...) -> None: ...

class ApplyFrameResponse(_message.Message):
    __slots__ = ("delta",)
    DELTA_FIELD_NUMBER: _ClassVar[int]
    delta: _frame_pb2.Delta
    def __init__(self, delta: _Optional[_Union[_frame_pb2.Delta, _Mapping]] = ...) -> None: ...

class StreamFramesRequest(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: _frame_pb2.Frame
    def __init__(self, frame: _Optional[_Union[_frame_pb2.Frame, _Mapping]] = ...) -> None: ...

class StreamFramesResponse(_message.Message):
    __slots__ = ("seq", "delta", "error")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    delta: _frame_pb2.Delta
    error: _frame_pb2.FrameError
    def __init__(self, seq: _Optional[int] = ..., delta: _Optional[_Union[_frame_pb2.Delta, _Mapping]] = ..., error: _Optional[_Union[_frame_pb2.FrameError, _Mapping]] = ...) -> None: ...

class QueryRegionRequest(_message.Message):
    __slots__ = ("world", "region", "include_boxes")
    WORLD_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_BOXES_FIELD_NUMBER: _ClassVar[int]
    world: str
    region: _containers.RepeatedScalarFieldContainer[float]
    include_boxes: bool
    def __init__(self, world: _Optional[str] = ..., region: _Optional[_Iterable[float]] = ..., include_boxes: _Optional[bool] = ...) -> None: ...

class QueryRegionResponse(_message.Message):
    __slots__ = ("ids", "boxes", "frame")
    IDS_FIELD_NUMBER: _ClassVar[int]
    BOXES_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    boxes: bytes
    frame: int
    def __init__(self, ids: _Optional[bytes] = ..., boxes: _Optional[bytes] = ..., frame: _Optional[int] = ...) -> None: ...

class ListPairsRequest(_message.Message):
    __slots__ = ("world", "page_size", "page_token")
    WORLD_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    world: str
    page_size: int
    page_token: str
    def __init__(self, world: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPairsResponse(_message.Message):
    __slots__ = ("pairs", "next_page_token", "total_pairs", "frame")
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PAIRS_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    pairs: bytes
    next_page_token: str
    total_pairs: int
    frame: int
    def __init__(self, pairs: _Optional[bytes] = ..., next_page_token: _Optional[str] = ..., total_pairs: _Optional[int] = ..., frame: _Optional[int] = ...) -> None: ...

class StreamPairsRequest(_message.Message):
    __slots__ = ("world", "chunk_size")
    WORLD_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    world: str
    chunk_size: int
    def __init__(self, world: _Optional[str] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class StreamPairsResponse(_message.Message):
    __slots__ = ("pairs", "total_pairs", "frame")
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PAIRS_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    pairs: bytes
    total_pairs: int
    frame: int
    def __init__(self, pairs: _Optional[bytes] = ..., total_pairs: _Optional[int] = ..., frame: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("world", "region")
    WORLD_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    world: str
    region: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, world: _Optional[str] = ..., region: _Optional[_Iterable[float]] = ...) -> None: ...

class SnapshotWorldRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SnapshotWorldResponse(_message.Message):
    __slots__ = ("chunk", "total_bytes", "frame")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    total_bytes: int
    frame: int
    def __init__(self, chunk: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., frame: _Optional[int] = ...) -> None: ...

class RestoreWorldRequest(_message.Message):
    __slots__ = ("name", "chunk")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    name: str
    chunk: bytes
    def __init__(self, name: _Optional[str] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class RestoreWorldResponse(_message.Message):
    __slots__ = ("world",)
    WORLD_FIELD_NUMBER: _ClassVar[int]
    world: _world_pb2.WorldInfo
    def __init__(self, world: _Optional[_Union[_world_pb2.WorldInfo, _Mapping]] = ...) -> None: ...

class FreezeWorldRequest(_message.Message):
    __slots__ = ("name", "frozen")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    frozen: bool
    def __init__(self, name: _Optional[str] = ..., frozen: _Optional[bool] = ...) -> None: ...

class FreezeWorldResponse(_message.Message):
    __slots__ = ("world",)
    WORLD_FIELD_NUMBER: _ClassVar[int]
    world: _world_pb2.WorldInfo
    def __init__(self, world: _Optional[_Union[_world_pb2.WorldInfo, _Mapping]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("delta",)
    DELTA_FIELD_NUMBER: _ClassVar[int]
    delta: _frame_pb2.Delta
    def __init__(self, delta: _Optional[_Union[_frame_pb2.Delta, _Mapping]] = ...) -> None: ...
