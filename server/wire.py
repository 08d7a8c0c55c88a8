"""Zero-copy reading of the hot request messages and pre-serialized hot responses.

The frame RPCs (ApplyFrame, StreamFrames) are registered with raw-bytes (de)serializers, so the
server never runs a full protobuf parse or serialize of a multi-megabyte frame:

* ``read_frame(raw)`` walks the protobuf wire format of ``ApplyFrameRequest`` / ``StreamFramesRequest``
  (both hold the Frame in field 1) and returns a ``FrameView`` whose bulk fields are memoryview slices
  of the received bytes, ready for ``np.frombuffer``. Anything unusual (a field repeated, a wrong wire
  type, a malformed varint) falls back to the regular protobuf parser, which defines the semantics.
* ``wrap(field, payload)`` frames already-serialized bytes as a length-delimited field, so a Delta
  serialized once is sent as ApplyFrameResponse / StreamFramesResponse /
  SubscribeResponse without another copy through protobuf.

Wire format reference: https://protobuf.dev/programming-guides/encoding/
"""
from __future__ import annotations

from dataclasses import dataclass

from sapgrid.v1 import frame_pb2

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_BYTES_FIELDS = {3: "remove_ids", 4: "add_ids", 5: "add_boxes", 6: "add_category", 7: "add_mask",
                 8: "add_static", 9: "update_ids", 10: "update_boxes"}
_EMPTY = memoryview(b"")


class _Fallback(Exception):
    """The fast reader met something only the full parser should decide."""


@dataclass
class FrameView:
    """The fields of a Frame; bulk fields are memoryviews into the request bytes (read-only)."""

    world: str = ""
    seq: int = 0
    remove_ids: memoryview = _EMPTY
    add_ids: memoryview = _EMPTY
    add_boxes: memoryview = _EMPTY
    add_category: memoryview = _EMPTY
    add_mask: memoryview = _EMPTY
    add_static: memoryview = _EMPTY
    update_ids: memoryview = _EMPTY
    update_boxes: memoryview = _EMPTY


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    n = len(buf)
    while True:
        if i >= n or shift > 63:
            raise _Fallback
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def _fields(buf: memoryview):
    """(field number, wire type, value) of each field; value: int or memoryview."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        number, wt = key >> 3, key & 7
        if wt == _VARINT:
            value, i = _varint(buf, i)
        elif wt == _LEN:
            size, i = _varint(buf, i)
            if i + size > n:
                raise _Fallback
            value, i = buf[i:i + size], i + size
        elif wt == _I64:
            value, i = None, i + 8
        elif wt == _I32:
            value, i = None, i + 4
        else:
            raise _Fallback
        if i > n:
            raise _Fallback
        yield number, wt, value


def _view(buf: memoryview) -> FrameView:
    view, seen = FrameView(), set()
    for number, wt, value in _fields(buf):
        if number in seen:
            raise _Fallback                   # repeated scalar/bytes fields: last wins in protobuf
        seen.add(number)
        if number == 1:
            if wt != _LEN:
                raise _Fallback
            view.world = bytes(value).decode("utf-8")
        elif number == 2:
            if wt != _VARINT:
                raise _Fallback
            view.seq = value
        elif number in _BYTES_FIELDS:
            if wt != _LEN:
                raise _Fallback
            setattr(view, _BYTES_FIELDS[number], value)
    return view


def read_frame(raw: bytes) -> FrameView | frame_pb2.Frame:
    """The Frame (field 1) of a serialized ApplyFrameRequest or StreamFramesRequest, without copies.

    Returns a FrameView, or a parsed frame_pb2.Frame when the fast path declines. Raises
    google.protobuf.message.DecodeError for bytes that are not a valid message at all.
    """
    buf = memoryview(raw)
    try:
        frame = None
        for number, wt, value in _fields(buf):
            if number == 1:
                if wt != _LEN or frame is not None:
                    raise _Fallback           # embedded messages repeated: protobuf merges them
                frame = value
        return _view(frame) if frame is not None else FrameView()
    except (_Fallback, UnicodeDecodeError):
        from sapgrid.v1 import sapgrid_service_pb2 as pb

        return pb.StreamFramesRequest.FromString(bytes(raw)).frame


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def wrap(field: int, payload: bytes) -> bytes:
    """``payload`` (a serialized message) as length-delimited field ``field`` of an enclosing message."""
    return _encode_varint(field << 3 | _LEN) + _encode_varint(len(payload)) + payload


def varint_field(field: int, value: int) -> bytes:
    """A uint64 field (omitted when 0, as proto3 does)."""
    return _encode_varint(field << 3 | _VARINT) + _encode_varint(value) if value else b""
