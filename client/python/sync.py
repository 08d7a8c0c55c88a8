"""The synchronous client: ``Client`` and its pipelined ``FrameStream``."""
from __future__ import annotations

import itertools
import queue

import grpc
import numpy as np

from sapgrid.v1 import sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc

from ._calls import (DEFAULT_ADDRESS, DEFAULT_MAX_MESSAGE_BYTES, Calls, channel_options, check_size, frame_answer, subscribe_request,
                     frame_request, is_cancelled, world_metadata)
from .codec import RemoteDelta, delta_from, join_pairs, pairs_array
from .errors import SapgridError, from_rpc_error, unavailable

_END = object()


class FrameStream:
    """One StreamFrames call (sync). ``send`` may run ahead of ``recv`` (pipelining); answers come in order."""

    def __init__(self, stub: pb_grpc.SapgridServiceStub, world: str = "", timeout: float | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.world = world
        self.max_message_bytes = max_message_bytes
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = stub.StreamFrames(iter(self._requests.get, _END), timeout=timeout,
                                            metadata=world_metadata(world))
        self._seq = itertools.count(1)
        self.in_flight = 0

    def send(self, *, world: str | None = None, seq: int | None = None, **arrays) -> int:
        """Queue one frame (keyword arrays as ``sapcore.World.step``); return its sequence number."""
        seq = next(self._seq) if seq is None else seq
        self.send_request(frame_request(world or self.world, seq, arrays))
        return seq

    def send_message(self, frame) -> None:
        """Send a ready Frame message (copied into a request)."""
        self.send_request(pb.StreamFramesRequest(frame=frame))

    def send_request(self, request: pb.StreamFramesRequest) -> None:
        """Send a ready request (no copy)."""
        check_size(request, self.max_message_bytes)
        self._requests.put(request)
        self.in_flight += 1

    def recv(self) -> RemoteDelta:
        """The answer to the oldest unanswered frame; raises its typed error if it was rejected."""
        try:
            resp = next(self._responses)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        except StopIteration:
            raise unavailable("stream closed by the server") from None
        self.in_flight -= 1
        return frame_answer(resp)

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


class Subscription:
    """Iterator of a world's RemoteDeltas; ``cancel()`` ends it."""

    def __init__(self, call):
        self._call = call

    def __iter__(self):
        return self

    def __next__(self) -> RemoteDelta:
        try:
            return delta_from(next(self._call).delta)
        except grpc.RpcError as err:
            if is_cancelled(err):
                raise StopIteration from None
            raise from_rpc_error(err) from None

    def cancel(self) -> None:
        self._call.cancel()


class Client(Calls):
    """Synchronous client. address: "HOST:PORT"; timeout: default deadline (seconds) of unary calls.

    TLS: ``tls=True`` (the system's root certificates) or ``ca_file`` (the server's CA, PEM); mutual TLS
    adds ``cert_file`` and ``key_file``. ``token``: sent as ``authorization: Bearer TOKEN`` on every call.
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout: float | None = 60.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, tls: bool = False, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, token: str | None = None):
        self.address = address
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        from ._channel import credentials, open_channel

        # TLS with tls=True (system roots) or any of the files; token: authorization metadata (_channel.py)
        self.channel = open_channel(address, channel_options(max_message_bytes), aio=False,
                                    **credentials(tls, ca_file, cert_file, key_file, token))
        self.stub = pb_grpc.SapgridServiceStub(self.channel)

    def _unary(self, method, request, read, timeout=None, world=""):
        try:
            resp = method(request, timeout=timeout if timeout is not None else self.timeout,
                          metadata=world_metadata(world))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return read(resp)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the server accepts connections (raises Unavailable after timeout)."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise unavailable(f"server {self.address} not reachable") from None

    def stream(self, world: str = "", timeout: float | None = None) -> FrameStream:
        """Open a bidirectional frame stream (frames name ``world`` unless ``send(world=...)``)."""
        return FrameStream(self.stub, world, timeout, self.max_message_bytes)

    def pairs(self, world: str, chunk_size: int = 0) -> np.ndarray:
        """All active pairs of one snapshot, uint64 [P, 2] sorted (streamed in chunks)."""
        try:
            return join_pairs([pairs_array(r.pairs) for r in self.stub.StreamPairs(
                pb.StreamPairsRequest(world=world, chunk_size=chunk_size), timeout=self.timeout,
                metadata=world_metadata(world))])
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def subscribe(self, world: str, timeout: float | None = None, *, region=None) -> Subscription:
        """Iterator of every RemoteDelta the world produces from now on; ``.cancel()`` ends it.

        region (2*dims values, mins then maxs): only the pairs entering (created) and leaving (deleted)
        the view of pairs with an object whose box intersects the region; the first delta carries the
        whole view as created."""
        return Subscription(self.stub.Subscribe(subscribe_request(world, region), timeout=timeout,
                                   metadata=world_metadata(world)))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["Client", "FrameStream", "SapgridError", "Subscription"]
