from sapgrid.v1 import world_pb2 as _world_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Frame(_message.Message):
    __slots__ = ("world", "seq", "remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static", "update_ids", "update_boxes", "writer")
    WORLD_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REMOVE_IDS_FIELD_NUMBER: _ClassVar[int]
    ADD_IDS_FIELD_NUMBER: _ClassVar[int]
    ADD_BOXES_FIELD_NUMBER: _ClassVar[int]
    ADD_CATEGORY_FIELD_NUMBER: _ClassVar[int]
    ADD_MASK_FIELD_NUMBER: _ClassVar[int]
    ADD_STATIC_FIELD_NUMBER: _ClassVar[int]
    UPDATE_IDS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_BOXES_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    world: str
    seq: int
    remove_ids: bytes
    add_ids: bytes
    add_boxes: bytes
    add_category: bytes
    add_mask: bytes
    add_static: bytes
    update_ids: bytes
    update_boxes: bytes
    writer: str
    def __init__(self, world: _Optional[str] = ..., seq: _Optional[int] = ..., remove_ids: _Optional[bytes] = ..., add_ids: _Optional[bytes] = ..., add_boxes: _Optional[bytes] = ..., add_category: _Optional[bytes] = ..., add_mask: _Optional[bytes] = ..., add_static: _Optional[bytes] = ..., update_ids: _Optional[bytes] = ..., update_boxes: _Optional[bytes] = ..., writer: _Optional[str] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("seq", "world", "frame", "created", "deleted", "stats", "pairs_digest")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    PAIRS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    seq: int
    world: str
    frame: int
    created: bytes
    deleted: bytes
    stats: _world_pb2.FrameStats
    pairs_digest: int
    def __init__(self, seq: _Optional[int] = ..., world: _Optional[str] = ..., frame: _Optional[int] = ..., created: _Optional[bytes] = ..., deleted: _Optional[bytes] = ..., stats: _Optional[_Union[_world_pb2.FrameStats, _Mapping]] = ..., pairs_digest: _Optional[int] = ...) -> None: ...

class FrameError(_message.Message):
    __slots__ = ("code", "message", "field", "index")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    field: str
    index: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...
