"""The gRPC servicers: protobuf in, registry call, protobuf out. No logic of their own (STYLE 13).

Errors are turned into statuses by ``errors.abort`` / ``errors.frame_error`` only.
"""
from __future__ import annotations

import time

import grpc
import numpy as np
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from sapgrid.v1 import echo_service_pb2 as echo_pb
from sapgrid.v1 import echo_service_pb2_grpc as echo_grpc
from sapgrid.v1 import sapgrid_service_pb2 as pb
from sapgrid.v1 import sapgrid_service_pb2_grpc as pb_grpc

from . import codec, wire
from .errors import Cancelled, DimsMismatch, InvalidInput, WorldNotFound, abort, frame_error
from .metrics import Metrics
from .registry import Caller, Registry

DEFAULT_PAGE = 100_000
MAX_PAGE = 1_000_000


def _page_size(n: int, field: str) -> int:
    if n > MAX_PAGE:
        raise InvalidInput(f"{field}: {n} is more than {MAX_PAGE}", field)
    return n or DEFAULT_PAGE


def _region(values, dims: int) -> np.ndarray:
    region = np.asarray(values, dtype=np.float64)
    if len(region) != 2 * dims:
        cls = DimsMismatch if len(region) == 2 * (5 - dims) else InvalidInput
        raise cls(f"region: {len(region)} values, expected {2 * dims} (mins then maxs of a {dims}D world)", "region")
    if not np.isfinite(region).all():
        raise InvalidInput("region: values must be finite", "region")
    return region


def _read(raw: bytes):
    try:
        return wire.read_frame(raw)
    except DecodeError as exc:
        raise InvalidInput(f"frame: not a valid protobuf message ({exc})", "frame") from None


def add_to_server(servicer: "SapgridServicer", server) -> None:
    """Register SapgridService: protobuf (de)serializers from the descriptors, except raw bytes for the
    hot frame methods (ApplyFrame, StreamFrames requests and responses; Subscribe responses)."""
    raw_request = {"ApplyFrame", "StreamFrames"}
    raw_response = {"ApplyFrame", "StreamFrames", "Subscribe"}
    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    service = pb.DESCRIPTOR.services_by_name["SapgridService"]
    handlers = {}
    for m in service.methods:
        request = message_factory.GetMessageClass(m.input_type)
        response = message_factory.GetMessageClass(m.output_type)
        handlers[m.name] = make[m.client_streaming, m.server_streaming](
            getattr(servicer, m.name),
            request_deserializer=None if m.name in raw_request else request.FromString,
            response_serializer=None if m.name in raw_response else response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _pairs_after(pairs: np.ndarray, token: str) -> int:
    """Index of the first pair after the page token "LOW-HIGH" (pairs sorted lexicographically)."""
    try:
        lo, hi = (int(x) for x in token.split("-"))
    except ValueError:
        raise InvalidInput(f"page_token: {token!r} is not a token this server returned", "page_token") from None
    i0 = int(np.searchsorted(pairs[:, 0], np.uint64(lo), side="left"))
    i1 = int(np.searchsorted(pairs[:, 0], np.uint64(lo), side="right"))
    return i0 + int(np.searchsorted(pairs[i0:i1, 1], np.uint64(hi), side="right"))


class SapgridServicer(pb_grpc.SapgridServiceServicer):
    """Each call runs in its own server thread and does its engine work itself (see registry.py)."""

    def __init__(self, registry: Registry, metrics: Metrics):
        self.registry = registry
        self.metrics = metrics

    # ---- worlds -----------------------------------------------------------------------------
    def CreateWorld(self, request, context):
        try:
            runner = self.registry.create(request.name, request.config, request.if_not_exists)
        except Exception as exc:
            abort(context, exc)
        return pb.CreateWorldResponse(world=runner.info())

    def DeleteWorld(self, request, context):
        try:
            self.registry.delete(request.name)
        except Exception as exc:
            abort(context, exc)
        return pb.DeleteWorldResponse()

    def ListWorlds(self, request, context):
        return pb.ListWorldsResponse(worlds=[r.info() for r in self.registry.list()])

    def GetWorld(self, request, context):
        try:
            return pb.GetWorldResponse(world=self.registry.get(request.name).info())
        except Exception as exc:
            abort(context, exc)

    # ---- frames -----------------------------------------------------------------------------
    def _runner(self, frame):
        try:
            return self.registry.get(frame.world)
        except WorldNotFound:
            self.metrics.frame_rejected(None, "not_found")
            raise

    # ApplyFrame, StreamFrames and Subscribe are registered with raw-bytes (de)serializers (see
    # ``add_to_server``): frames are read zero-copy (wire.read_frame) and the Delta, serialized once,
    # is framed into the response without another pass through protobuf.
    def ApplyFrame(self, raw: bytes, context):
        received = time.perf_counter()
        try:
            with self.registry.frame_call():
                frame = _read(raw)
                runner = self._runner(frame)
                applied = runner.apply(frame, received, Caller(context))
        except Exception as exc:
            abort(context, exc)
        runner.published(applied)
        return wire.wrap(1, applied.raw)                          # ApplyFrameResponse.delta

    def StreamFrames(self, request_iterator, context):
        # Frames are applied in arrival order, each answered before the next is read; frames the
        # client sends ahead wait in the transport (HTTP/2 flow control is the back-pressure).
        # A rejected frame gets its error in its own slot and the stream goes on.
        # A graceful shutdown lets an open stream go on until its client ends it (or the grace period ends).
        caller = Caller(context)
        with self.registry.frame_call():
            for raw in request_iterator:
                received = time.perf_counter()
                seq = 0
                try:
                    frame = _read(raw)
                    seq = frame.seq
                    runner = self._runner(frame)
                    applied = runner.apply(frame, received, caller)
                except Cancelled:
                    return
                except Exception as exc:
                    yield pb.StreamFramesResponse(seq=seq, error=frame_error(exc)).SerializeToString()
                    continue
                try:
                    yield wire.varint_field(1, seq) + wire.wrap(2, applied.raw)   # seq, delta
                finally:
                    runner.published(applied)     # once the answer is sent (or the stream is gone)

    # ---- queries ----------------------------------------------------------------------------
    def QueryRegion(self, request, context):
        try:
            runner = self.registry.get(request.world)
            region = _region(request.region, runner.dims)
            world, with_boxes = runner.world, request.include_boxes

            def work():
                ids = world.query(region)
                boxes = codec.boxes_bytes(world.boxes(ids)) if with_boxes and len(ids) else b""
                return pb.QueryRegionResponse(ids=codec.ids_bytes(ids), boxes=boxes, frame=runner.frames)

            return runner.run(work, Caller(context))
        except Exception as exc:
            abort(context, exc)

    def ListPairs(self, request, context):
        try:
            runner = self.registry.get(request.world)
            size = _page_size(request.page_size, "page_size")
            world, token = runner.world, request.page_token

            def work():
                pairs = world.pairs()
                start = _pairs_after(pairs, token) if token else 0
                page = pairs[start:start + size]
                last = start + len(page) >= len(pairs)
                nxt = "" if last or not len(page) else f"{int(page[-1, 0])}-{int(page[-1, 1])}"
                return pb.ListPairsResponse(pairs=codec.pairs_bytes(page), next_page_token=nxt,
                                            total_pairs=len(pairs), frame=runner.frames)

            return runner.run(work, Caller(context))
        except Exception as exc:
            abort(context, exc)

    def StreamPairs(self, request, context):
        try:
            runner = self.registry.get(request.world)
            size = _page_size(request.chunk_size, "chunk_size")
            world = runner.world
            pairs, frame = runner.run(lambda: (world.pairs(), runner.frames), Caller(context))
        except Exception as exc:
            abort(context, exc)
        total = len(pairs)
        for start in range(0, max(total, 1), size):
            yield pb.StreamPairsResponse(pairs=codec.pairs_bytes(pairs[start:start + size]), total_pairs=total,
                                         frame=frame)

    def Subscribe(self, request, context):
        try:
            runner = self.registry.get(request.world)
            sub = runner.subscribe()
        except Exception as exc:
            abort(context, exc)
        context.add_callback(sub.end)                   # the client went away: wake this thread
        try:
            while (raw := sub.next()) is not None:
                yield wire.wrap(1, raw)                           # SubscribeResponse.delta
        finally:
            runner.unsubscribe(sub)
        if sub.dropped:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"subscriber of world {request.world!r} fell more than "
                          f"{sub.limit} deltas behind and was dropped")


class EchoServicer(echo_grpc.EchoServiceServicer):
    """Bench-only transport baseline: answers the payload (or reply_bytes zero bytes)."""

    @staticmethod
    def _reply(payload: bytes, reply_bytes: int) -> bytes:
        return bytes(reply_bytes) if reply_bytes else payload

    def Echo(self, request, context):
        return echo_pb.EchoResponse(payload=self._reply(request.payload, request.reply_bytes))

    def EchoStream(self, request_iterator, context):
        for request in request_iterator:
            yield echo_pb.EchoStreamResponse(payload=self._reply(request.payload, request.reply_bytes))
