"""Python client of the sapgrid service: sync (``Client``) and asyncio (``AsyncClient``) APIs over numpy arrays.

For replay/bench code that works with a local ``sapcore.World`` or a remote one interchangeably:

    RemoteWorld.connect(address: str, config: sapcore.WorldConfig, name: str | None = None, *,
                        create=True) -> RemoteWorld

creates the world ``name`` (default: a unique ``remote-…`` name) on the server at ``address``
("HOST:PORT") unless ``create=False`` (then the world must exist and is not deleted), and returns an
object with the same ``step(...)`` / ``pairs()`` / ``query(region)`` signatures as ``sapcore.World``
(``step`` returns a ``sapcore.types.Delta``; frames travel over one bidirectional stream).
``close()`` deletes the world it created and closes the connection; it is a context manager.

Example::

    from sapgrid.client import Client
    with Client("127.0.0.1:50051") as c:
        c.create_world("w", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
        with c.stream("w") as s:
            d = s.step(add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
            print(d.created)          # uint64 [[1, 2]]

Errors: every failure raises a ``sapgrid.errors.SapgridError`` subclass carrying the server's
message, ``field`` and ``index`` (a rejected frame of a stream raises from ``recv``/``step`` and the
stream stays usable).
"""
from __future__ import annotations

import itertools
import queue
import threading
import uuid

import grpc
import numpy as np

from sapcore.types import Delta, WorldConfig

from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc

from .codec import RemoteDelta, WorldInfo, config_message, delta_from, encode_frame, info_from, pairs_array
from .errors import SapgridError, from_frame_error, from_rpc_error

__all__ = ["AsyncClient", "AsyncFrameStream", "Client", "FrameStream", "RemoteDelta", "RemoteWorld", "WorldInfo",
           "DEFAULT_ADDRESS", "channel_options"]

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
_END = object()


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Client channel arguments: bounded message sizes and keepalive pings for long-lived streams."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def _query_response(resp, with_boxes: bool, dims: int | None):
    ids = np.frombuffer(resp.ids, "<u8")
    if not with_boxes:
        return ids
    boxes = np.frombuffer(resp.boxes, "<f4")
    return ids, boxes.reshape(len(ids), -1) if len(ids) else boxes.reshape(0, 2 * (dims or 2))


class FrameStream:
    """One StreamFrames call (sync). ``send`` may run ahead of ``recv`` (pipelining); answers come in order."""

    def __init__(self, stub: pb_grpc.SapgridServiceStub, world: str = "", timeout: float | None = None):
        self.world = world
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = stub.StreamFrames(iter(self._requests.get, _END), timeout=timeout)
        self._seq = itertools.count(1)
        self.in_flight = 0

    def send(self, *, world: str | None = None, seq: int | None = None, **arrays) -> int:
        """Queue one frame (keyword arrays as ``sapcore.World.step``); return its sequence number."""
        seq = next(self._seq) if seq is None else seq
        request = pb.StreamFramesRequest()
        encode_frame(world or self.world, seq, **arrays, into=request.frame)
        self.send_request(request)
        return seq

    def send_message(self, frame: frame_pb2.Frame) -> None:
        """Send a ready Frame message (copied into a request)."""
        self.send_request(pb.StreamFramesRequest(frame=frame))

    def send_request(self, request: pb.StreamFramesRequest) -> None:
        """Send a ready request (no copy)."""
        self._requests.put(request)
        self.in_flight += 1

    def recv(self) -> RemoteDelta:
        """The answer to the oldest unanswered frame; raises its typed error if it was rejected."""
        try:
            resp = next(self._responses)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        except StopIteration:
            raise SapgridError("stream closed by the server", code=grpc.StatusCode.UNAVAILABLE) from None
        self.in_flight -= 1
        if resp.WhichOneof("result") == "error":
            raise from_frame_error(resp.error)
        return delta_from(resp.delta)

    def step(self, **arrays) -> RemoteDelta:
        self.send(**arrays)
        return self.recv()

    def close(self) -> None:
        """Half-close; answers still in flight are discarded."""
        self._requests.put(_END)
        self._responses.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client:
    """Synchronous client. address: "HOST:PORT"; timeout: default deadline (seconds) of unary calls."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float | None = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.address = address
        self.timeout = timeout
        self.channel = grpc.insecure_channel(address, options=channel_options(max_message_bytes))
        self.stub = pb_grpc.SapgridServiceStub(self.channel)

    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the server accepts connections (raises Unavailable after timeout)."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise SapgridError(f"server {self.address} not reachable", code=grpc.StatusCode.UNAVAILABLE) from None

    # ---- worlds -----------------------------------------------------------------------------
    def create_world(self, name: str, config: WorldConfig | None = None, *, dims: int = 2, bounds=None, cells=None,
                     expected_objects: int = 0, if_not_exists: bool = False) -> WorldInfo:
        """Create a world from a sapcore.WorldConfig, or from dims/bounds/cells (cells None: server picks)."""
        msg = config_message(config, dims=dims, bounds=bounds, cells=cells, expected_objects=expected_objects)
        resp = self._call(self.stub.CreateWorld, pb.CreateWorldRequest(name=name, config=msg,
                                                                        if_not_exists=if_not_exists))
        return info_from(resp.world)

    def delete_world(self, name: str) -> None:
        self._call(self.stub.DeleteWorld, pb.DeleteWorldRequest(name=name))

    def list_worlds(self) -> list[WorldInfo]:
        return [info_from(w) for w in self._call(self.stub.ListWorlds, pb.ListWorldsRequest()).worlds]

    def get_world(self, name: str) -> WorldInfo:
        return info_from(self._call(self.stub.GetWorld, pb.GetWorldRequest(name=name)).world)

    # ---- frames -----------------------------------------------------------------------------
    def step(self, world: str, seq: int = 0, *, timeout: float | None = None, **arrays) -> RemoteDelta:
        """Apply one frame with a unary call (arrays as ``sapcore.World.step`` keywords)."""
        resp = self._call(self.stub.ApplyFrame, pb.ApplyFrameRequest(frame=encode_frame(world, seq, **arrays)),
                          timeout)
        return delta_from(resp.delta)

    def stream(self, world: str = "", timeout: float | None = None) -> FrameStream:
        """Open a bidirectional frame stream (frames name ``world`` unless ``send(world=...)``)."""
        return FrameStream(self.stub, world, timeout)

    # ---- queries ----------------------------------------------------------------------------
    def query(self, world: str, region, include_boxes: bool = False):
        """Sorted uint64 ids of the live boxes intersecting region (2*dims floats); with boxes: (ids, boxes)."""
        resp = self._call(self.stub.QueryRegion, pb.QueryRegionRequest(
            world=world, region=[float(x) for x in np.asarray(region, dtype=np.float64).ravel()],
            include_boxes=include_boxes))
        return _query_response(resp, include_boxes, None)

    def list_pairs(self, world: str, page_size: int = 0, page_token: str = "") -> tuple[np.ndarray, str]:
        """One page of active pairs: (uint64 [K, 2], next_page_token or "")."""
        resp = self._call(self.stub.ListPairs, pb.ListPairsRequest(world=world, page_size=page_size,
                                                                    page_token=page_token))
        return pairs_array(resp.pairs), resp.next_page_token

    def pairs(self, world: str, chunk_size: int = 0) -> np.ndarray:
        """All active pairs of one snapshot, uint64 [P, 2] sorted (streamed in chunks)."""
        try:
            chunks = [pairs_array(r.pairs) for r in self.stub.StreamPairs(
                pb.StreamPairsRequest(world=world, chunk_size=chunk_size), timeout=self.timeout)]
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return np.concatenate(chunks) if len(chunks) > 1 else chunks[0]

    def subscribe(self, world: str, timeout: float | None = None):
        """Iterator of every RemoteDelta the world produces from now on; ``.cancel()`` ends it."""
        return _Subscription(self.stub.Subscribe(pb.SubscribeRequest(world=world), timeout=timeout))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Subscription:
    def __init__(self, call):
        self._call = call

    def __iter__(self):
        return self

    def __next__(self) -> RemoteDelta:
        try:
            return delta_from(next(self._call).delta)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise from_rpc_error(err) from None

    def cancel(self) -> None:
        self._call.cancel()


class AsyncFrameStream:
    """One StreamFrames call (asyncio). ``send`` may run ahead of ``recv``; answers come in order."""

    def __init__(self, stub: pb_grpc.SapgridServiceStub, world: str = "", timeout: float | None = None):
        self.world = world
        self._call = stub.StreamFrames(timeout=timeout)
        self._seq = itertools.count(1)

    async def send(self, *, world: str | None = None, seq: int | None = None, **arrays) -> int:
        seq = next(self._seq) if seq is None else seq
        request = pb.StreamFramesRequest()
        encode_frame(world or self.world, seq, **arrays, into=request.frame)
        try:
            await self._call.write(request)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return seq

    async def recv(self) -> RemoteDelta:
        try:
            resp = await self._call.read()
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        if resp is grpc.aio.EOF:
            raise SapgridError("stream closed by the server", code=grpc.StatusCode.UNAVAILABLE)
        if resp.WhichOneof("result") == "error":
            raise from_frame_error(resp.error)
        return delta_from(resp.delta)

    async def step(self, **arrays) -> RemoteDelta:
        await self.send(**arrays)
        return await self.recv()

    async def close(self) -> None:
        try:
            await self._call.done_writing()
        except grpc.RpcError:
            pass
        self._call.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class AsyncClient:
    """asyncio client with the same methods as ``Client`` (coroutines)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float | None = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.address = address
        self.timeout = timeout
        self.channel = grpc.aio.insecure_channel(address, options=channel_options(max_message_bytes))
        self.stub = pb_grpc.SapgridServiceStub(self.channel)

    async def _call(self, method, request, timeout=None):
        try:
            return await method(request, timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def create_world(self, name: str, config: WorldConfig | None = None, *, dims: int = 2, bounds=None,
                           cells=None, expected_objects: int = 0, if_not_exists: bool = False) -> WorldInfo:
        msg = config_message(config, dims=dims, bounds=bounds, cells=cells, expected_objects=expected_objects)
        resp = await self._call(self.stub.CreateWorld, pb.CreateWorldRequest(name=name, config=msg,
                                                                              if_not_exists=if_not_exists))
        return info_from(resp.world)

    async def delete_world(self, name: str) -> None:
        await self._call(self.stub.DeleteWorld, pb.DeleteWorldRequest(name=name))

    async def list_worlds(self) -> list[WorldInfo]:
        return [info_from(w) for w in (await self._call(self.stub.ListWorlds, pb.ListWorldsRequest())).worlds]

    async def get_world(self, name: str) -> WorldInfo:
        return info_from((await self._call(self.stub.GetWorld, pb.GetWorldRequest(name=name))).world)

    async def step(self, world: str, seq: int = 0, *, timeout: float | None = None, **arrays) -> RemoteDelta:
        resp = await self._call(self.stub.ApplyFrame,
                                pb.ApplyFrameRequest(frame=encode_frame(world, seq, **arrays)), timeout)
        return delta_from(resp.delta)

    def stream(self, world: str = "", timeout: float | None = None) -> AsyncFrameStream:
        return AsyncFrameStream(self.stub, world, timeout)

    async def query(self, world: str, region, include_boxes: bool = False):
        resp = await self._call(self.stub.QueryRegion, pb.QueryRegionRequest(
            world=world, region=[float(x) for x in np.asarray(region, dtype=np.float64).ravel()],
            include_boxes=include_boxes))
        return _query_response(resp, include_boxes, None)

    async def list_pairs(self, world: str, page_size: int = 0, page_token: str = "") -> tuple[np.ndarray, str]:
        resp = await self._call(self.stub.ListPairs, pb.ListPairsRequest(world=world, page_size=page_size,
                                                                          page_token=page_token))
        return pairs_array(resp.pairs), resp.next_page_token

    async def pairs(self, world: str, chunk_size: int = 0) -> np.ndarray:
        try:
            chunks = [pairs_array(r.pairs) async for r in self.stub.StreamPairs(
                pb.StreamPairsRequest(world=world, chunk_size=chunk_size), timeout=self.timeout)]
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return np.concatenate(chunks) if len(chunks) > 1 else chunks[0]

    async def subscribe(self, world: str, timeout: float | None = None):
        """Async iterator of the world's RemoteDeltas."""
        call = self.stub.Subscribe(pb.SubscribeRequest(world=world), timeout=timeout)
        try:
            async for resp in call:
                yield delta_from(resp.delta)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(err) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class RemoteWorld:
    """A world on a sapgrid server with the interface of ``sapcore.World`` (step / pairs / query).

    Use ``RemoteWorld.connect(address, config, name=None, *, create=True)``; see the module docstring.
    """

    def __init__(self, client: Client, name: str, config: WorldConfig, *, owned: bool):
        self.client = client
        self.name = name
        self.config = config
        self._owned = owned
        self._stream: FrameStream | None = None
        self._lock = threading.Lock()
        self._last: Delta | None = None

    @classmethod
    def connect(cls, address: str, config: WorldConfig | None, name: str | None = None, *, create: bool = True,
                expected_objects: int = 0, timeout: float | None = 60.0) -> "RemoteWorld":
        client = Client(address, timeout=timeout)
        name = name or f"remote-{uuid.uuid4().hex[:12]}"
        try:
            if create:
                info = client.create_world(name, config, expected_objects=expected_objects)
            else:
                info = client.get_world(name)
        except BaseException:
            client.close()
            raise
        return cls(client, name, info.config, owned=create)

    # ---- the sapcore.World interface -----------------------------------------------------------
    def step(self, remove_ids=None, add_ids=None, add_boxes=None, add_category=None, add_mask=None, add_static=None,
             update_ids=None, update_boxes=None) -> Delta:
        """Apply one frame over the world's stream; returns its Delta (a RemoteDelta)."""
        with self._lock:
            if self._stream is None:
                self._stream = self.client.stream(self.name)
            delta = self._stream.step(remove_ids=remove_ids, add_ids=add_ids, add_boxes=add_boxes,
                                      add_category=add_category, add_mask=add_mask, add_static=add_static,
                                      update_ids=update_ids, update_boxes=update_boxes)
            self._last = delta
            return delta

    def pairs(self) -> np.ndarray:
        return self.client.pairs(self.name)

    def query(self, region) -> np.ndarray:
        return self.client.query(self.name, region)

    def ids(self) -> np.ndarray:
        """All live ids, sorted (a query over the whole coordinate range)."""
        lim = float(self.config.coord_limit)
        return self.client.query(self.name, [-lim] * self.config.dims + [lim] * self.config.dims)

    def info(self) -> WorldInfo:
        return self.client.get_world(self.name)

    @property
    def object_count(self) -> int:
        return self.info().objects

    @property
    def pair_count(self) -> int:
        return self.info().pairs

    @property
    def frames(self) -> int:
        return self.info().frames

    def close(self) -> None:
        """Close the stream, delete the world if this object created it, close the connection."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        try:
            if self._owned:
                self.client.delete_world(self.name)
                self._owned = False
        finally:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
