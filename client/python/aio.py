"""The asyncio client: ``AsyncClient`` (the methods of ``Client`` as coroutines) and ``AsyncFrameStream``."""
from __future__ import annotations

import itertools

import grpc
import numpy as np

from sapgrid.v1 import sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc

from ._calls import (DEFAULT_ADDRESS, DEFAULT_MAX_MESSAGE_BYTES, Calls, channel_options, check_size, frame_answer, subscribe_request,
                     frame_request, is_cancelled, world_metadata)
from .codec import RemoteDelta, delta_from, join_pairs, pairs_array
from .errors import from_rpc_error, unavailable


class AsyncFrameStream:
    """One StreamFrames call (asyncio). ``send`` may run ahead of ``recv``; answers come in order."""

    def __init__(self, stub: pb_grpc.SapgridServiceStub, world: str = "", timeout: float | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.world = world
        self.max_message_bytes = max_message_bytes
        self._call = stub.StreamFrames(timeout=timeout, metadata=world_metadata(world))
        self._seq = itertools.count(1)

    async def send(self, *, world: str | None = None, seq: int | None = None, **arrays) -> int:
        seq = next(self._seq) if seq is None else seq
        request = frame_request(world or self.world, seq, arrays)
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

    def stream(self, world: str = "", timeout: float | None = None) -> AsyncFrameStream:
        return AsyncFrameStream(self.stub, world, timeout, self.max_message_bytes)

    async def pairs(self, world: str, chunk_size: int = 0) -> np.ndarray:
        try:
            return join_pairs([pairs_array(r.pairs) async for r in self.stub.StreamPairs(
                pb.StreamPairsRequest(world=world, chunk_size=chunk_size), timeout=self.timeout,
                metadata=world_metadata(world))])
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def subscribe(self, world: str, timeout: float | None = None, *, region=None):
        """Async iterator of the world's RemoteDeltas (with region: of its view's changes, as Client.subscribe)."""
        call = self.stub.Subscribe(subscribe_request(world, region), timeout=timeout,
                                   metadata=world_metadata(world))
        try:
            async for resp in call:
                yield delta_from(resp.delta)
        except grpc.RpcError as err:
            if not is_cancelled(err):
                raise from_rpc_error(err) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


__all__ = ["AsyncClient", "AsyncFrameStream"]
