"""The synchronous client: ``Client`` and its pipelined ``FrameStream``."""
from __future__ import annotations

import queue

import grpc
import numpy as np

from sapgrid.v1 import sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc

from ._calls import (DEFAULT_ADDRESS, DEFAULT_MAX_MESSAGE_BYTES, Calls, channel_options, check_size, frame_answer,
                     frame_request, is_cancelled, restore_requests, subscribe_request, world_metadata)
from .codec import RemoteDelta, WorldInfo, delta_from, info_from, join_pairs, pairs_array
from .mirror import PairMirror
from .errors import SapgridError, from_rpc_error, unavailable
from .resume import ResumingFrameStream

_END = object()


def _ended(err: SapgridError) -> SapgridError:
    """An error that ended the whole call (not one frame's refusal): ``err.stream_ended`` is True."""
    err.stream_ended = True
    return err


class FrameStream:
    """One StreamFrames call (sync). ``send`` may run ahead of ``recv`` (pipelining); answers come in order.

    writer: the frames' writer (exactly-once frames; see ``Client.stream``); ``first_seq``: the number the
    stream's own numbering starts at. mirror: a ``PairMirror`` every delta is checked against (verify).
    """

    def __init__(self, stub: pb_grpc.SapgridServiceStub, world: str = "", timeout: float | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, writer: str = "", first_seq: int = 1,
                 mirror: PairMirror | None = None):
        self.world = world
        self.writer = writer
        self.max_message_bytes = max_message_bytes
        self.mirror = mirror
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = stub.StreamFrames(iter(self._requests.get, _END), timeout=timeout,
                                            metadata=world_metadata(world))
        self.next_seq = first_seq
        self.in_flight = 0

    def send(self, *, world: str | None = None, seq: int | None = None, **arrays) -> int:
        """Queue one frame (keyword arrays as ``sapcore.World.step``); return its sequence number.

        seq None: the stream's next number. An explicit seq is sent as given (with a writer, a seq already
        applied is answered with its first delta, not applied again); the numbering goes on after it."""
        if seq is None:
            seq = self.next_seq
        self.next_seq = max(self.next_seq, seq + 1)
        self.send_request(frame_request(world or self.world, seq, arrays, self.writer))
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
            raise _ended(from_rpc_error(err)) from None
        except StopIteration:
            raise _ended(unavailable("stream closed by the server")) from None
        self.in_flight -= 1
        delta = frame_answer(resp)
        return delta if self.mirror is None else self.mirror.apply(delta)

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

    def stream(self, world: str = "", timeout: float | None = None, *, writer: str = "", resume: bool = False,
               verify: bool = False, resume_deadline: float = 60.0):
        """Open a bidirectional frame stream (frames name ``world`` unless ``send(world=...)``).

        writer: exactly-once frames (Frame.writer in the contract). The stream numbers its frames from
        where the writer stands in the world (its last applied seq + 1, read with GetWorld).
        resume (needs a writer): a ``ResumingFrameStream`` that survives a broken connection, a restarted
        server or a world moving to another replica: it reconnects with backoff for at most
        ``resume_deadline`` seconds, sends again the frames not yet answered (the server answers those it
        had applied with their first delta) and hands every delta to the caller exactly once, in order.
        verify: check every delta's ``pairs_digest`` against the client's own mirror of the pairs
        (``PairMirror``; the stream must be the world's only writer); a difference raises ``DataLoss``.
        """
        if resume:
            if not writer:
                raise ValueError("resume=True needs a writer: the server tells the frames it applied by writer and seq")
            return ResumingFrameStream(self, world, writer, timeout=timeout, verify=verify, deadline=resume_deadline)
        first = self.get_world(world).writers.get(writer, 0) + 1 if writer else 1
        return self.open_stream(world, timeout, writer=writer, first_seq=first,
                                mirror=self.mirror(world) if verify else None)

    def open_stream(self, world: str = "", timeout: float | None = None, *, writer: str = "", first_seq: int = 1,
                    mirror: PairMirror | None = None) -> FrameStream:
        """A ``FrameStream`` as given, without asking the server anything (``stream`` is the usual way)."""
        return FrameStream(self.stub, world, timeout, self.max_message_bytes, writer=writer, first_seq=first_seq,
                           mirror=mirror)

    def mirror(self, world: str) -> PairMirror:
        """A ``PairMirror`` of the world's pairs now (one consistent snapshot, with its frame)."""
        pairs, frame = self._pairs_at(world)
        return PairMirror(pairs, frame)

    def _pairs_at(self, world: str, chunk_size: int = 0) -> tuple[np.ndarray, int]:
        frame = 0
        chunks = []
        try:
            for r in self.stub.StreamPairs(pb.StreamPairsRequest(world=world, chunk_size=chunk_size),
                                           timeout=self.timeout, metadata=world_metadata(world)):
                chunks.append(pairs_array(r.pairs))
                frame = r.frame
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return join_pairs(chunks), frame

    def pairs(self, world: str, chunk_size: int = 0) -> np.ndarray:
        """All active pairs of one snapshot, uint64 [P, 2] sorted (streamed in chunks)."""
        return self._pairs_at(world, chunk_size)[0]

    def snapshot(self, world: str) -> bytes:
        """The world's snapshot (taken between two of its frames): bytes that ``restore`` turns into a world
        that continues exactly like this one."""
        try:
            return b"".join(r.chunk for r in self.stub.SnapshotWorld(
                pb.SnapshotWorldRequest(name=world), timeout=self.timeout, metadata=world_metadata(world)))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def restore(self, data: bytes, name: str | None = None) -> WorldInfo:
        """Create a world from a snapshot, under the snapshot's own name or ``name``."""
        try:
            resp = self.stub.RestoreWorld(restore_requests(data, name), timeout=self.timeout,
                                          metadata=world_metadata(name or ""))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return info_from(resp.world)

    def subscribe(self, world: str, timeout: float | None = None, *, region=None) -> Subscription:
        """Iterator of every RemoteDelta the world produces from now on; ``.cancel()`` ends it. Returns once
        the server has registered the subscriber (its response headers): every frame applied after that is
        in it. A refusal (no such world, a bad region) is raised by the first ``next``.

        region (2*dims values, mins then maxs): only the pairs entering (created) and leaving (deleted)
        the view of pairs with an object whose box intersects the region; the first delta carries the
        whole view as created."""
        call = self.stub.Subscribe(subscribe_request(world, region), timeout=timeout, metadata=world_metadata(world))
        call.initial_metadata()         # (also returns when the call ended: its error comes with the first next)
        return Subscription(call)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["Client", "FrameStream", "ResumingFrameStream", "SapgridError", "Subscription"]
