"""The asyncio client: ``AsyncClient`` (the methods of ``Client`` as coroutines), ``AsyncFrameStream`` and
``AsyncSubscription``."""
from __future__ import annotations

import asyncio

import grpc
import numpy as np

from sapgrid.v1 import sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc

from ._calls import (DEFAULT_ADDRESS, DEFAULT_MAX_MESSAGE_BYTES, Calls, channel_options, check_size, frame_answer,
                     frame_request, is_cancelled, restore_requests, subscribe_request, world_metadata)
from .codec import RemoteDelta, WorldInfo, delta_from, info_from, join_pairs, pairs_array
from .errors import from_rpc_error, unavailable


class AsyncFrameStream:
    """One StreamFrames call (asyncio). ``send`` may run ahead of ``recv``; answers come in order."""

    def __init__(self, stub: pb_grpc.SapgridServiceStub, world: str = "", timeout: float | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, writer: str = "", first_seq: int | None = 1,
                 where=None):
        self.world = world
        self.writer = writer
        self._where = where                 # coroutine function: the world's WorldInfo (first_seq None)
        self.max_message_bytes = max_message_bytes
        self._call = stub.StreamFrames(timeout=timeout, metadata=world_metadata(world))
        self.next_seq = first_seq

    async def send(self, *, world: str | None = None, seq: int | None = None, **arrays) -> int:
        if self.next_seq is None:
            self.next_seq = (await self._where(self.world)).writers.get(self.writer, 0) + 1
        if seq is None:
            seq = self.next_seq
        self.next_seq = max(self.next_seq, seq + 1)
        request = frame_request(world or self.world, seq, arrays, self.writer)
        check_size(request, self.max_message_bytes)
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
            raise unavailable("stream closed by the server")
        return frame_answer(resp)

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


class AsyncSubscription:
    """A world's RemoteDeltas (asyncio): ``async for d in sub``; ``cancel()`` ends it, and so does
    ``aclose()`` or dropping it. Awaiting it waits for the server to register the subscriber (Subscribe's
    response headers) and returns it; a refusal (no such world, a bad region) is raised by the first delta."""

    def __init__(self, call):
        self._call = call
        self._cancelled = False

    def __await__(self):
        return self._registered().__await__()

    async def _registered(self) -> AsyncSubscription:
        try:
            await self._call.initial_metadata()
        except grpc.RpcError:
            pass                        # the call ended: its error comes with the first delta
        return self

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> RemoteDelta:
        if self._cancelled:
            raise StopAsyncIteration
        try:
            resp = await self._call.read()
        except asyncio.CancelledError:
            if self._cancelled:         # cancel() while this read waited (a task cancelled goes on up)
                raise StopAsyncIteration from None
            raise
        except grpc.RpcError as err:
            self._call.cancel()
            if is_cancelled(err):
                raise StopAsyncIteration from None
            raise from_rpc_error(err) from None
        if resp is grpc.aio.EOF:
            raise StopAsyncIteration
        return delta_from(resp.delta)

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    async def aclose(self) -> None:
        self.cancel()

    def __del__(self):                  # a loop left with break or return drops its subscription here
        try:
            if not self._call.done():
                self._call.cancel()
        except Exception:               # noqa: BLE001 - its loop or channel is gone already: nothing to end
            pass


class AsyncClient(Calls):
    """asyncio client with the same methods as ``Client`` (coroutines)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float | None = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, tls: bool = False, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, token: str | None = None):
        self.address = address
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        from ._channel import credentials, open_channel

        # TLS with tls=True (system roots) or any of the files; token: authorization metadata (_channel.py)
        self.channel = open_channel(address, channel_options(max_message_bytes), aio=True,
                                    **credentials(tls, ca_file, cert_file, key_file, token))
        self.stub = pb_grpc.SapgridServiceStub(self.channel)

    async def _unary(self, method, request, read, timeout=None, world=""):
        try:
            resp = await method(request, timeout=timeout if timeout is not None else self.timeout,
                          metadata=world_metadata(world))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return read(resp)

    def stream(self, world: str = "", timeout: float | None = None, *, writer: str = "") -> AsyncFrameStream:
        """A frame stream (``async with c.stream(...)``). writer: exactly-once frames, numbered from where the
        writer stands in the world, read before the first frame (as ``Client.stream``; resuming after a
        broken call is ``Client``'s)."""
        return AsyncFrameStream(self.stub, world, timeout, self.max_message_bytes, writer=writer,
                                first_seq=None if writer else 1, where=self.get_world)

    async def snapshot(self, world: str) -> bytes:
        """The world's snapshot, as ``Client.snapshot``."""
        try:
            return b"".join([r.chunk async for r in self.stub.SnapshotWorld(
                pb.SnapshotWorldRequest(name=world), timeout=self.timeout, metadata=world_metadata(world))])
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def restore(self, data: bytes, name: str | None = None) -> WorldInfo:
        """Create a world from a snapshot, as ``Client.restore``."""
        try:
            resp = await self.stub.RestoreWorld(restore_requests(data, name), timeout=self.timeout,
                                                metadata=world_metadata(name or ""))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return info_from(resp.world)

    async def pairs(self, world: str, chunk_size: int = 0) -> np.ndarray:
        try:
            return join_pairs([pairs_array(r.pairs) async for r in self.stub.StreamPairs(
                pb.StreamPairsRequest(world=world, chunk_size=chunk_size), timeout=self.timeout,
                metadata=world_metadata(world))])
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def subscribe(self, world: str, timeout: float | None = None, *, region=None) -> AsyncSubscription:
        """Async iterator of the world's RemoteDeltas (with region: of its view's changes, as
        ``Client.subscribe``). ``sub = await client.subscribe(world)`` returns once the server has registered
        the subscriber: every frame applied after that is in it. ``async for d in client.subscribe(world)``
        works too (it waits at the first delta)."""
        return AsyncSubscription(self.stub.Subscribe(subscribe_request(world, region), timeout=timeout,
                                                     metadata=world_metadata(world)))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


__all__ = ["AsyncClient", "AsyncFrameStream", "AsyncSubscription"]
