"""The gRPC servicers: each method decodes its request with ``protocol``, calls the registry, encodes
the answer with ``protocol``. Errors become statuses in one place: ``errors.abort`` for a call
(through ``_unary`` / ``_streaming``), ``errors.frame_error`` for a frame refused inside a stream.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import time

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from sapgrid import __version__
from sapgrid.v1 import echo_service_pb2 as echo_pb
from sapgrid.v1 import echo_service_pb2_grpc as echo_grpc
from sapgrid.v1 import sapgrid_service_pb2 as pb
from sapgrid.v1 import sapgrid_service_pb2_grpc as pb_grpc

from . import auth, cluster, protocol, snapshot
from .errors import (Cancelled, Exhausted, InvalidInput, Unavailable, WorldGone, WorldNotFound, abort,
                     frame_error, short)
from .metrics import Metrics
from .registry import Caller, Registry
from .writers import check_writer

SNAPSHOT_CHUNK = 1 << 20          # bytes per SnapshotWorld message
#: Methods with a form that runs in the server's loop: name -> the servicer's method of that form.
IN_LOOP = {"StreamFrames": "stream_frames_in_loop"}


def _unary(method):
    """A unary-response method whose exceptions end the call with their status."""
    @functools.wraps(method)
    def call(self, request, context):
        try:
            return method(self, request, context)
        except Exception as exc:
            abort(context, exc)
    return call


def _streaming(method):
    """A server-streaming method (a generator, or an async generator run in the server's loop) whose
    exceptions end the call with their status."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def in_loop(self, request, context):
            try:
                async for response in method(self, request, context):
                    yield response
            except Exception as exc:
                abort(context, exc)
        return in_loop

    @functools.wraps(method)
    def call(self, request, context):
        try:
            yield from method(self, request, context)
        except Exception as exc:
            abort(context, exc)
    return call


def _parsed(method, request_class, streaming: bool, client_streaming: bool = False):
    """A method whose request arrives as bytes and is parsed here: bytes that are not a valid message are
    INVALID_ARGUMENT (a deserializer registered with gRPC would make them INTERNAL, with a traceback).
    A client-streaming method gets an iterator of parsed messages; a bad one raises InvalidInput from it
    (the method's ``_unary`` / ``_streaming`` wrapper ends the call with its status)."""
    def parse(raw: bytes):
        try:
            return request_class.FromString(raw)
        except DecodeError as exc:
            raise InvalidInput(f"request: not a valid {request_class.DESCRIPTOR.name} ({exc})", "request") from None

    if client_streaming:
        def messages(raw_iterator):
            for raw in raw_iterator:
                yield parse(raw)

        @functools.wraps(method)
        def call(raw_iterator, context):
            return method(messages(raw_iterator), context)
        return call
    if streaming:
        @functools.wraps(method)
        def call(raw, context):
            try:
                request = parse(raw)
            except InvalidInput as exc:
                abort(context, exc)
            yield from method(request, context)
    else:
        @functools.wraps(method)
        def call(raw, context):
            try:
                request = parse(raw)
            except InvalidInput as exc:
                abort(context, exc)
            return method(request, context)
    return call


def add_to_server(servicer: "SapgridServicer", server, in_loop: bool = True) -> None:
    """Register SapgridService: requests arrive as bytes (the hot frame methods read them zero-copy, the
    others parse them in ``_parsed``); protobuf serializers from the descriptors for the responses,
    except raw bytes for the hot ones (ApplyFrame, StreamFrames, Subscribe). in_loop: the methods of
    ``IN_LOOP`` in their form that runs in the server's loop (else every method runs in a thread)."""
    raw_request = {"ApplyFrame", "StreamFrames"}
    raw_response = {"ApplyFrame", "StreamFrames", "Subscribe"}
    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    service = pb.DESCRIPTOR.services_by_name["SapgridService"]
    handlers = {}
    for m in service.methods:
        request = message_factory.GetMessageClass(m.input_type)
        response = message_factory.GetMessageClass(m.output_type)
        method = getattr(servicer, IN_LOOP[m.name] if in_loop and m.name in IN_LOOP else m.name)
        if m.name not in raw_request:
            method = _parsed(method, request, m.server_streaming, m.client_streaming)
        handlers[m.name] = make[m.client_streaming, m.server_streaming](
            method, request_deserializer=None,
            response_serializer=None if m.name in raw_response else response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


class SapgridServicer(pb_grpc.SapgridServiceServicer):
    """A frame stream runs in the server's loop (``stream_frames_in_loop``), every other call in a thread
    of the call pool; each does its engine work itself (see aio.py and registry.py)."""

    def __init__(self, registry: Registry, metrics: Metrics, ownership=None, quotas=None,
                 in_loop_frame_bytes: int = 64 << 10):
        self.registry = registry
        self.metrics = metrics
        self.ownership = ownership  # cluster.Ownership of a replica in a cluster, else None
        self.quotas = quotas        # quota.ClientQuotas (worlds per client), or None
        # A stream's frame of at most this many bytes is applied in the server's loop when its world is free
        # (~2,300 moving objects at the default), a bigger one in a thread of the call pool: the loop is
        # never held long from the other calls' messages (--in-loop-frame-bytes).
        self.in_loop_frame_bytes = in_loop_frame_bytes

    # ---- worlds -----------------------------------------------------------------------------
    @_unary
    def CreateWorld(self, request, context):
        if self.ownership is not None:
            self.ownership.check(request.name)
        config = protocol.world_config(request.config, self.registry.engine_threads)
        reserved = self.quotas is not None and request.name not in self.registry.worlds
        if reserved:
            self.quotas.world_reserve(auth.client_name(context), request.name)
        try:
            runner = self.registry.create(request.name, config, request.config.expected_objects,
                                          request.if_not_exists)
        except BaseException:
            if reserved and request.name not in self.registry.worlds:
                self.quotas.world_released(request.name)
            raise
        return pb.CreateWorldResponse(world=protocol.world_info(runner))

    @_unary
    def DeleteWorld(self, request, context):
        self.registry.delete(request.name)
        if self.quotas is not None:
            self.quotas.world_released(request.name)
        return pb.DeleteWorldResponse()

    @_unary
    def ListWorlds(self, request, context):
        if self.registry.recovering:      # a partial list would hide worlds (from a rebalance, say)
            raise Unavailable("the server is recovering its worlds from its data directory; try again soon")
        return pb.ListWorldsResponse(worlds=[protocol.world_info(r) for r in self.registry.list()
                                             if auth.may(context, auth.READER, r.name)],   # only what it may read
                                     server_version=__version__)

    @_unary
    def GetWorld(self, request, context):
        return pb.GetWorldResponse(world=protocol.world_info(self.registry.get(request.name)))

    # ---- frames -----------------------------------------------------------------------------
    def _apply(self, frame, received: float, caller: Caller, generations: dict | None = None, raw: bytes = b"",
               now: bool = False):
        """Apply one decoded frame: (runner, Applied). Refusals raise, counted per world.

        generations: a stream's worlds by name -> the generation it first wrote to; a frame for a world
        deleted and created again since is NOT_FOUND, never written into the new world.
        now: None (nothing done, nothing counted) if the frame cannot be applied at once in this thread
        (``WorldRunner.apply``); the checks before it are repeated when it is applied later."""
        if caller.identity is not None:                 # (``require`` is a no-op without auth)
            auth.require(caller.context, auth.WRITER, frame.world, "frame")   # each frame's own world
        try:
            runner = self.registry.get(frame.world)
            if generations is not None and generations.setdefault(frame.world, runner.generation) != runner.generation:
                raise WorldGone(frame.world)
        except WorldNotFound:
            self.metrics.frame_rejected(None, "not_found")
            raise
        try:
            if frame.writer:
                check_writer(frame.writer, frame.seq)
            arrays = protocol.frame_arrays(frame, runner.dims)
        except Exception as exc:
            runner.count_refusal(exc)
            raise
        applied = runner.apply(arrays, frame.seq, received, caller, frame.writer, raw, now)
        return None if applied is None else (runner, applied)

    # ApplyFrame, StreamFrames and Subscribe are registered with raw-bytes (de)serializers (see
    # ``add_to_server``): frames are read zero-copy and the Delta, serialized once, is framed into the
    # response without another pass through protobuf.
    @_unary
    def ApplyFrame(self, raw: bytes, context):
        received = time.perf_counter()
        with self.registry.frame_call():
            runner, applied = self._apply(protocol.parse_frame(raw), received, Caller(context, auth.identity(context)),
                                          raw=raw)
        runner.published(applied)
        return protocol.apply_response(applied)

    # StreamFrames: frames are applied in arrival order, each answered before the next is read; frames
    # the client sends ahead wait in the transport (HTTP/2 flow control is the back-pressure). A rejected
    # frame gets its error in its own slot and the stream goes on. A graceful shutdown lets an open stream
    # go on until its client ends it (or the grace period ends). The server runs it in its loop
    # (``stream_frames_in_loop``); ``StreamFrames`` is the same in a thread of its own (with tracing on:
    # OpenTelemetry's interceptor wraps methods of one kind).
    def StreamFrames(self, request_iterator, context):
        caller = Caller(context, auth.identity(context))
        bound = cluster.stream_world(context)  # a stream opened with x-sapgrid-world takes only that world
        generations: dict[str, int] = {}
        with self.registry.frame_call():
            for raw in request_iterator:
                try:
                    answer, done = self._stream_frame(raw, time.perf_counter(), caller, bound, generations)
                except Cancelled:
                    return
                try:
                    yield answer
                finally:
                    if done is not None:
                        done[0].published(done[1])     # once the answer is sent (or the stream is gone)
                # nothing of this frame is held while the next is awaited: a stream ended by an error keeps
                # this generator in a cycle with its traceback until a pass of the garbage collector (the
                # world, were it deleted meanwhile, and a frame's request bytes with it)
                raw = answer = done = None

    async def stream_frames_in_loop(self, request_iterator, context):
        """``StreamFrames`` in the server's loop: a frame of at most ``in_loop_frame_bytes`` whose world is
        free is applied here, any other in a thread of the call pool (the loop's executor) while this call
        waits for it; either way in arrival order."""
        caller = Caller(context, auth.identity(context))
        bound = cluster.stream_world(context)
        generations: dict[str, int] = {}
        loop, in_loop_bytes = asyncio.get_running_loop(), self.in_loop_frame_bytes
        with self.registry.frame_call():
            async for raw in request_iterator:
                received = time.perf_counter()
                try:
                    step = self._stream_frame(raw, received, caller, bound, generations, True) \
                        if len(raw) <= in_loop_bytes else None
                    if step is None:
                        step = await loop.run_in_executor(None, self._stream_frame, raw, received, caller, bound,
                                                          generations)
                except Cancelled:
                    return
                answer, done = step
                try:
                    yield answer
                finally:
                    if done is not None:
                        done[0].published(done[1])
                raw = answer = done = step = None

    def _stream_frame(self, raw: bytes, received: float, caller: Caller, bound: str, generations: dict,
                      now: bool = False):
        """One frame of a stream: (its answer, (runner, Applied) to publish once the answer is sent, or
        None for a refused frame, whose answer is its FrameError). now: None if it cannot be applied at
        once in this thread (``_apply``). Raises Cancelled when the caller has gone away."""
        seq = 0
        try:
            frame = protocol.parse_frame(raw)
            seq = frame.seq
            if bound and frame.world != bound:
                raise cluster.WrongWorld(frame.world, bound)
            done = self._apply(frame, received, caller, generations, raw, now)
        except Cancelled:
            raise
        except Exception as exc:
            return pb.StreamFramesResponse(seq=seq, error=frame_error(exc)).SerializeToString(), None
        if done is None:
            return None
        return protocol.stream_response(seq, done[1]), done

    # ---- queries ----------------------------------------------------------------------------
    @_unary
    def QueryRegion(self, request, context):
        runner = self.registry.get(request.world)
        region = protocol.region(request.region, runner.dims)
        world = runner.world

        def work():
            ids = world.query(region)
            boxes = world.boxes(ids) if request.include_boxes and len(ids) else None
            return protocol.query_response(ids, boxes, runner.frames)

        return runner.run(work, Caller(context))

    @_unary
    def ListPairs(self, request, context):
        runner = self.registry.get(request.world)
        size = protocol.page_size(request.page_size, "page_size")
        world = runner.world
        return runner.run(lambda: protocol.pairs_page(world.pairs(), request.page_token, size, runner.frames),
                          Caller(context))

    @_streaming
    def StreamPairs(self, request, context):
        runner = self.registry.get(request.world)
        size = protocol.page_size(request.chunk_size, "chunk_size")
        world = runner.world
        pairs, frame = runner.run(lambda: (world.pairs(), runner.frames), Caller(context))
        yield from protocol.pairs_chunks(pairs, size, frame)

    # ---- snapshots, restore, freeze -----------------------------------------------------------
    @_streaming
    def SnapshotWorld(self, request, context):
        # The world's state is copied between two frames (numpy copies); it is encoded and sent outside its turn.
        runner = self.registry.get(request.name)
        state = runner.run(runner.state, Caller(context))
        data = snapshot.encode(state)
        total = len(data)
        view = memoryview(data)
        for start in range(0, max(total, 1), SNAPSHOT_CHUNK):
            yield pb.SnapshotWorldResponse(chunk=bytes(view[start:start + SNAPSHOT_CHUNK]), total_bytes=total,
                                           frame=state.frames)

    @_unary
    def RestoreWorld(self, request_iterator, context):
        name, parts, size, limit = None, [], 0, None
        for request in request_iterator:
            if name is None:
                name = request.name
            parts.append(request.chunk)
            size += len(request.chunk)
            if limit is None and size >= snapshot.HEADER_BYTES:
                try:
                    _, limit = snapshot.header(b"".join(parts))
                except snapshot.SnapshotError as exc:
                    raise InvalidInput(str(exc), "chunk") from None
                budget = self.registry.budget.world_bytes
                if budget and limit > budget:        # refused before it is read: a world of it would not fit
                    raise Exhausted(f"snapshot: {limit} bytes, more than the per-world memory budget of "
                                    f"{budget >> 20} MiB (--max-world-bytes)", "chunk")
            if limit is not None and size > limit:
                raise InvalidInput(f"snapshot: more than the {limit} bytes its header says", "chunk")
        if name is None:
            raise InvalidInput("no snapshot: the call sent no message", "chunk")
        try:
            state = snapshot.decode(b"".join(parts))
        except snapshot.SnapshotError as exc:
            raise InvalidInput(str(exc), "chunk") from None
        name = name or state.name
        if self.ownership is not None:
            self.ownership.check(name)
        auth.require(context, auth.ADMIN, name, "RestoreWorld")    # the snapshot's own name too
        reserved = self.quotas is not None and name not in self.registry.worlds
        if reserved:
            self.quotas.world_reserve(auth.client_name(context), name)
        try:
            runner = self.registry.restore(name, state)
        except BaseException:
            if reserved and name not in self.registry.worlds:
                self.quotas.world_released(name)
            raise
        return pb.RestoreWorldResponse(world=protocol.world_info(runner))

    @_unary
    def FreezeWorld(self, request, context):
        runner = self.registry.get(request.name)

        def freeze():                                   # between two frames
            runner.set_frozen(request.frozen)         # with a data directory: on disk first
        runner.run(freeze, Caller(context))
        return pb.FreezeWorldResponse(world=protocol.world_info(runner))

    def Subscribe(self, request, context):
        try:
            runner = self.registry.get(request.world)
            region = protocol.region(request.region, runner.dims) if len(request.region) else None
            sub = runner.subscribe(region)
        except Exception as exc:
            abort(context, exc)
        context.add_callback(sub.end)                   # the client went away: wake this thread
        # the response headers say "subscribed": a client that waits for them sees every frame applied after
        # (the Python client's ``subscribe`` returns only then)
        context.send_initial_metadata(())
        try:
            while (applied := sub.next()) is not None:
                yield protocol.subscribe_response(applied)
        finally:
            runner.unsubscribe(sub)
        if sub.dropped:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"subscriber of world {short(request.world)} fell more than {sub.limit} deltas "
                          f"or {sub.byte_limit} bytes behind and was dropped")
        if runner.deleted:
            context.abort(grpc.StatusCode.NOT_FOUND, f"world {short(request.world)} was deleted")


class EchoServicer(echo_grpc.EchoServiceServicer):
    """Bench-only transport baseline (served only with --echo): answers the payload, or reply_bytes zero
    bytes, at most ``limit`` of them (the server's message limit): a larger ask is INVALID_ARGUMENT."""

    def __init__(self, limit: int):
        self.limit = limit

    def _reply(self, payload: bytes, reply_bytes: int) -> bytes:
        if reply_bytes > self.limit:
            raise InvalidInput(f"reply_bytes: {reply_bytes} is more than the message limit of {self.limit} bytes",
                               "reply_bytes")
        return bytes(reply_bytes) if reply_bytes else payload

    @_unary
    def Echo(self, request, context):
        return echo_pb.EchoResponse(payload=self._reply(request.payload, request.reply_bytes))

    @_streaming
    def EchoStream(self, request_iterator, context):
        for request in request_iterator:
            yield echo_pb.EchoStreamResponse(payload=self._reply(request.payload, request.reply_bytes))


class EchoServicerInLoop(EchoServicer):
    """The echo whose stream runs in the server's loop, as a frame stream's small frames do: the baseline
    of a frame's server CPU is the same transport and the same loop."""

    @_streaming
    async def EchoStream(self, request_iterator, context):
        async for request in request_iterator:
            yield echo_pb.EchoStreamResponse(payload=self._reply(request.payload, request.reply_bytes))
