"""The server's one protobuf boundary: requests in, engine types out; engine results in, bytes out.

Everything behind this module (the registry, the world lines, subscribers, metrics) speaks numpy arrays
and engine types only. Byte layouts are those documented in proto/sapgrid/v1/frame.proto
(``sapgrid.layout``). Only the wire's shape is checked here (byte lengths, the dims the bytes fit, the
0/1 of static flags): O(1) or one vectorised pass. The values (NaN, min > max, duplicate or unknown
ids, a bad region, a bad world configuration) are checked once, by sapcore, which changes nothing
when it refuses.

The frame RPCs (ApplyFrame, StreamFrames; Subscribe's responses) are registered with raw-bytes
(de)serializers, so the server never runs a full protobuf parse or serialize of a multi-megabyte frame:

* ``read_frame(raw)`` walks the protobuf wire format of ``ApplyFrameRequest`` / ``StreamFramesRequest``
  (both hold the Frame in field 1) and returns a ``FrameView`` whose bulk fields are memoryview slices
  of the received bytes, ready for ``np.frombuffer``. Anything unusual (a field repeated, a wrong wire
  type, a malformed varint) falls back to the regular protobuf parser, which defines the semantics.
* A Delta is serialized once (``delta_bytes``) and framed as the field of ApplyFrameResponse /
  StreamFramesResponse / SubscribeResponse without another pass through protobuf (``wrap``).

Wire format reference: https://protobuf.dev/programming-guides/encoding/
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from sapgrid.layout import F32, U32, U64, config_message, to_bytes
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb, world_pb2

from .errors import DimsMismatch, InvalidInput

DEFAULT_PAGE = 100_000
MAX_PAGE = 1_000_000

# ---- reading frames without copies -------------------------------------------------------------

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
    writer: str = ""


_U64 = (1 << 64) - 1
_MAX_FIELD = (1 << 29) - 1


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    """A varint of at most 10 bytes, its bits past the 64th dropped (as protobuf reads a uint64)."""
    result = shift = 0
    n = len(buf)
    while True:
        if i >= n or shift > 63:
            raise _Fallback
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _U64, i
        shift += 7


def _fields(buf: memoryview):
    """(field number, wire type, value) of each field; value: int or memoryview."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        number, wt = key >> 3, key & 7
        if not 1 <= number <= _MAX_FIELD:
            raise _Fallback                   # protobuf refuses field number 0 (and beyond 2**29 - 1)
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
        elif number == 11:
            if wt != _LEN:
                raise _Fallback
            view.writer = bytes(value).decode("utf-8")    # bad UTF-8: the parser refuses it
        elif number in _BYTES_FIELDS:
            if wt != _LEN:
                raise _Fallback
            setattr(view, _BYTES_FIELDS[number], value)
    return view


def read_frame(raw: bytes) -> FrameView | frame_pb2.Frame:
    """The Frame (field 1) of a serialized ApplyFrameRequest or StreamFramesRequest, without copies.

    Returns a FrameView, or a parsed frame_pb2.Frame when the fast path declines. Raises InvalidInput
    for bytes that are not a valid message at all.
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
        try:
            return pb.StreamFramesRequest.FromString(bytes(raw)).frame
        except DecodeError as exc:
            raise InvalidInput(f"frame: not a valid protobuf message ({exc})", "frame") from None


#: Requests up to this size are parsed by protobuf's own (C) parser: copying their bulk fields costs less
#: than walking the wire in Python (a 100-object frame: ~2 us against ~9 us); larger ones are read zero-copy.
PARSE_BYTES = 64 << 10


def parse_frame(raw: bytes) -> FrameView | frame_pb2.Frame:
    """The Frame of a serialized ApplyFrameRequest or StreamFramesRequest: ``read_frame`` (zero-copy) for a
    request of more than ``PARSE_BYTES``, else protobuf's parser (a frame_pb2.Frame). Raises InvalidInput
    for bytes that are not a valid message."""
    if len(raw) > PARSE_BYTES:
        return read_frame(raw)
    try:
        return pb.StreamFramesRequest.FromString(raw).frame
    except DecodeError as exc:
        raise InvalidInput(f"frame: not a valid protobuf message ({exc})", "frame") from None


# ---- frames -> engine arrays --------------------------------------------------------------------

def _ids(frame, field: str) -> np.ndarray:
    raw = getattr(frame, field)
    if len(raw) % 8:
        raise InvalidInput(f"{field}: {len(raw)} bytes is not a multiple of 8 (uint64 ids)", field)
    return np.frombuffer(raw, U64)


def _boxes(frame, field: str, n: int, dims: int, ids_field: str) -> np.ndarray:
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


def _per_add(frame, field: str, n: int, dtype: np.dtype):
    raw = getattr(frame, field)
    if not raw:
        return None
    if len(raw) != n * dtype.itemsize:
        raise InvalidInput(f"{field}: {len(raw)} bytes, expected 0 or {n * dtype.itemsize} "
                           f"({n} add_ids x {dtype.itemsize} bytes)", field)
    return np.frombuffer(raw, dtype)


_U8 = np.dtype(np.uint8)


def frame_arrays(frame, dims: int) -> dict:
    """Keyword arguments of ``sapcore.World.step`` for a frame of a ``dims``-D world (zero-copy, read-only):
    every field's array or None; a frame of updates only gives just its two arrays (none when empty)."""
    if not (frame.remove_ids or frame.add_ids or frame.add_boxes or frame.add_category or frame.add_mask
            or frame.add_static):
        # updates only (a moving world's every frame): its two arrays alone, so that ``World.step(**arrays)``
        # binds two keywords, not eight; well-formed fields are read here (each a view, as ``_ids`` and
        # ``_boxes`` make them, without their calls: ~0.4 us of a frame), anything else goes through them
        raw, boxes = frame.update_ids, frame.update_boxes
        n, row = len(raw) >> 3, 8 * dims
        if not n or len(raw) & 7 or len(boxes) != n * row:
            update_ids = _ids(frame, "update_ids")
            update_boxes = _boxes(frame, "update_boxes", len(update_ids), dims, "update_ids")
            return dict(update_ids=update_ids, update_boxes=update_boxes) if len(update_ids) else {}
        return dict(update_ids=np.frombuffer(raw, U64), update_boxes=np.ndarray((n, 2 * dims), F32, boxes))
    remove_ids = _ids(frame, "remove_ids")
    add_ids = _ids(frame, "add_ids")
    update_ids = _ids(frame, "update_ids")
    n_add = len(add_ids)
    add_boxes = _boxes(frame, "add_boxes", n_add, dims, "add_ids")
    update_boxes = _boxes(frame, "update_boxes", len(update_ids), dims, "update_ids")
    static = _per_add(frame, "add_static", n_add, _U8)
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


# ---- other requests -> engine values ------------------------------------------------------------

def world_config(msg: world_pb2.WorldConfig, default_threads: int = 0):
    """WorldConfig message -> sapcore.WorldConfig (cells picked by sapcore.auto_cells when empty).

    sapcore checks the values (ConfigError -> INVALID_ARGUMENT).
    """
    from sapcore import WorldConfig, auto_cells

    dims = int(msg.dims)
    kwargs = {}
    if msg.max_objects:
        kwargs["max_objects"] = int(msg.max_objects)
    if msg.coord_limit:
        kwargs["coord_limit"] = float(msg.coord_limit)
    threads = int(msg.threads) or int(default_threads) or None
    # Without cells, the bounds are checked first (with one cell per axis), then the grid is sized.
    config = WorldConfig(dims=dims, bounds=tuple(msg.bounds), cells=tuple(msg.cells) or (1,) * max(dims, 0),
                         threads=threads, **kwargs)
    if not msg.cells:
        config = dataclasses.replace(config, cells=tuple(auto_cells(dims, config.bounds,
                                                                    int(msg.expected_objects or 10_000))))
    return config


def region(values, dims: int) -> np.ndarray:
    """A query region: 2*dims values (the engine checks them); the other dims' length is FAILED_PRECONDITION."""
    r = np.asarray(values, dtype=np.float64)
    if len(r) == 2 * (5 - dims):
        raise DimsMismatch(f"region: {len(r)} values, expected {2 * dims} (mins then maxs of a {dims}D world)",
                           "region")
    return r


def page_size(n: int, field: str) -> int:
    if n > MAX_PAGE:
        raise InvalidInput(f"{field}: {n} is more than {MAX_PAGE}", field)
    return n or DEFAULT_PAGE


def pairs_after(pairs: np.ndarray, token: str) -> int:
    """Index of the first pair after the page token "LOW-HIGH" (pairs sorted lexicographically)."""
    try:
        lo, hi = (int(x) for x in token.split("-"))
        lo, hi = np.uint64(lo), np.uint64(hi)
    except (ValueError, OverflowError):
        raise InvalidInput(f"page_token: {token[:64]!r} is not a token this server returned", "page_token") from None
    i0 = int(np.searchsorted(pairs[:, 0], lo, side="left"))
    i1 = int(np.searchsorted(pairs[:, 0], lo, side="right"))
    return i0 + int(np.searchsorted(pairs[i0:i1, 1], hi, side="right"))


# ---- engine results -> bytes / messages ---------------------------------------------------------

def fill_stats(m: world_pb2.FrameStats, s, queue_s: float = 0.0, server_s: float = 0.0) -> world_pb2.FrameStats:
    """sapcore.FrameStats (+ the service's seconds) into the FrameStats message ``m``, a fresh one, field by
    field: a Delta's own ``stats`` is filled in place (a message built from keywords, then copied into the
    Delta, costs ~0.6 us more of every frame). The fields most frames leave at zero are set only when they
    are not (proto3 serializes a zero as nothing: the same bytes; 0.7 -> 0.4 us). Returns ``m``. (protobuf
    takes Python's and numpy's integers alike.)"""
    m.objects, m.pairs, m.swaps, m.cells_touched = s.objects, s.pairs, s.swaps, s.cells_touched
    if s.created:
        m.created = s.created
    if s.deleted:
        m.deleted = s.deleted
    if s.cell_overflows:
        m.cell_overflows = s.cell_overflows
    if s.validate_s:                # (a small frame's one call: all of it in apply_s)
        m.validate_seconds = s.validate_s
    if s.rasterize_s:
        m.rasterize_seconds = s.rasterize_s
    if s.merge_s:
        m.merge_seconds = s.merge_s
    if queue_s:
        m.queue_seconds = queue_s
    m.apply_seconds, m.engine_seconds, m.server_seconds = s.apply_s, s.total_s, server_s
    return m


#: Pairs (created + deleted) from which a Delta's pair fields are framed around protobuf's serialization of
#: its other fields instead of passing through the message (copied three times into fresh buffers: 5.8 ms
#: with the GIL held for a 100k-object frame's 170k pairs; framed, one copy).
FRAMED_PAIRS = 4096
_TAG_CREATED, _TAG_DELETED = bytes((4 << 3 | _LEN,)), bytes((5 << 3 | _LEN,))     # Delta.created, Delta.deleted


def _pairs_field(tag: bytes, pairs) -> tuple:
    """A Delta pairs field (tag, length, the array's own bytes: no copy here), or nothing when empty (proto3)."""
    a = np.ascontiguousarray(pairs, dtype=U64)
    return (tag, _encode_varint(a.nbytes), a) if a.nbytes else ()


def delta_bytes(applied) -> bytes:
    """The serialized Delta of an applied frame (registry.Applied), made once and kept on it.

    With many pairs, the bytes protobuf would give (fields in number order: seq, world, frame by
    protobuf, then created and deleted framed here, then stats and pairs_digest by protobuf), joined in
    one copy."""
    raw = applied.encoded
    if raw is None:
        d = applied.delta
        if len(d.created) + len(d.deleted) < FRAMED_PAIRS:
            message = frame_pb2.Delta(seq=applied.seq, world=applied.world, frame=applied.frame,
                                      pairs_digest=applied.digest)
            if len(d.created):                  # (most frames of a moving world start and end no pair)
                message.created = to_bytes(d.created, U64)
            if len(d.deleted):
                message.deleted = to_bytes(d.deleted, U64)
            fill_stats(message.stats, d.stats, applied.queue_s, applied.server_s)
            raw = message.SerializeToString()
        else:
            head = frame_pb2.Delta(seq=applied.seq, world=applied.world, frame=applied.frame).SerializeToString()
            tail = frame_pb2.Delta(pairs_digest=applied.digest)
            fill_stats(tail.stats, d.stats, applied.queue_s, applied.server_s)
            raw = b"".join((head, *_pairs_field(_TAG_CREATED, d.created), *_pairs_field(_TAG_DELETED, d.deleted),
                            tail.SerializeToString()))
        applied.encoded = raw
    return raw


def world_info(runner) -> world_pb2.WorldInfo:
    """WorldInfo message of a registry.WorldRunner."""
    stats = world_pb2.WorldStats(objects=runner.objects, pairs=runner.pairs, frames=runner.frames,
                                 frames_rejected=runner.rejected, queue_depth=runner.queue_depth,
                                 subscribers=runner.subscribers, pairs_digest=runner.digest,
                                 writers=runner.writers.seqs(), frozen=runner.frozen)
    last = runner.last
    if last is not None:
        fill_stats(stats.last_frame, last.delta.stats, last.queue_s, last.server_s)
    config = config_message(runner.config, expected_objects=runner.expected_objects)
    return world_pb2.WorldInfo(name=runner.name, config=config, stats=stats, generation=runner.generation)


def query_response(ids: np.ndarray, boxes: np.ndarray | None, frame: int) -> pb.QueryRegionResponse:
    return pb.QueryRegionResponse(ids=to_bytes(ids, U64), boxes=b"" if boxes is None else to_bytes(boxes, F32),
                                  frame=frame)


def pairs_page(pairs: np.ndarray, token: str, size: int, frame: int) -> pb.ListPairsResponse:
    start = pairs_after(pairs, token) if token else 0
    page = pairs[start:start + size]
    last = start + len(page) >= len(pairs)
    nxt = "" if last or not len(page) else f"{int(page[-1, 0])}-{int(page[-1, 1])}"
    return pb.ListPairsResponse(pairs=to_bytes(page, U64), next_page_token=nxt, total_pairs=len(pairs), frame=frame)


def pairs_chunks(pairs: np.ndarray, size: int, frame: int):
    total = len(pairs)
    for start in range(0, max(total, 1), size):
        yield pb.StreamPairsResponse(pairs=to_bytes(pairs[start:start + size], U64), total_pairs=total, frame=frame)


_ONE_BYTE = tuple(bytes((v,)) for v in range(0x80))


def _encode_varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:          # two bytes (a stream's seq, a small delta's length): no loop
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def wrap(field: int, payload: bytes, before: bytes = b"") -> bytes:
    """``payload`` (a serialized message) as length-delimited field ``field`` of an enclosing message, after
    ``before`` (the enclosing message's earlier fields): one copy of the payload, however large."""
    return b"".join((before, _encode_varint(field << 3 | _LEN), _encode_varint(len(payload)), payload))


def varint_field(field: int, value: int) -> bytes:
    """A uint64 field (omitted when 0, as proto3 does)."""
    return _encode_varint(field << 3 | _VARINT) + _encode_varint(value) if value else b""


def apply_response(applied) -> bytes:
    return wrap(1, delta_bytes(applied))                          # ApplyFrameResponse.delta


_STREAM_SEQ, _STREAM_DELTA = bytes((1 << 3 | _VARINT,)), bytes((2 << 3 | _LEN,))   # StreamFramesResponse's


def stream_response(seq: int, applied) -> bytes:
    """StreamFramesResponse: seq (omitted when 0), delta; ``wrap(2, delta_bytes(applied), varint_field(1,
    seq))`` written out (a frame's every answer: two calls fewer; ``_encode_varint`` has the one-byte case)."""
    delta = delta_bytes(applied)
    if not seq:
        return b"".join((_STREAM_DELTA, _encode_varint(len(delta)), delta))
    return b"".join((_STREAM_SEQ, _encode_varint(seq), _STREAM_DELTA, _encode_varint(len(delta)), delta))


def subscribe_response(applied) -> bytes:
    return wrap(1, delta_bytes(applied))                          # SubscribeResponse.delta
