"""``ResumingFrameStream``: a writer's frame stream that survives broken connections (``Client.stream(world,
writer=..., resume=True)``).

Exactly-once frames are the server's part (Frame.writer in the contract): a world remembers each writer's
last applied seq and answers a frame it has already applied with the delta it gave the first time. This
stream is the client's part:

* it numbers its frames from where the writer stands in the world (GetWorld's ``writers``) and keeps
  every frame until its answer has been handed to the caller;
* when the call breaks (the connection drops, the server restarts, a proxy resets, the world is frozen
  while it moves to another replica, a log write fails), it reconnects with exponential backoff for at
  most ``deadline`` seconds, asks the world where the writer stands, and sends the unanswered frames
  again, in order: those the server had applied are answered with their first delta, the others are
  applied now;
* the caller gets every delta exactly once and in order, as if nothing had happened (``reconnects``
  counts what happened).

A frame the server refuses for its content (a bad box, an unknown id) takes no seq: the frames sent after
it, numbered by the stream, are numbered one lower and sent again (the server had refused them as a gap),
and the refused frame's error is raised from its own ``recv``.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import grpc

from sapgrid.v1 import sapgrid_service_pb2 as pb

from ._calls import frame_request
from .codec import RemoteDelta
from .errors import DataLoss, SapgridError, make_error

# A call that ended with one of these codes is reconnected; a frame answered with one of these in its
# slot (a frozen or moving world, a failed log write; a world gone from a replica it moved away from)
# is sent again.
_CALL_RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
               grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND}
_FRAME_RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND}


@dataclass
class _Pending:
    seq: int
    request: pb.StreamFramesRequest     # encoded once, when sent (later changes to the caller's arrays are not seen)
    numbered: bool                      # numbered by the stream (renumbered after a refused frame)


class ResumingFrameStream:
    """A writer's pipelined frame stream that reconnects and resumes; see the module docstring.

    ``send`` / ``recv`` / ``step`` / ``close`` as ``FrameStream``. ``reconnects``: how many times the call was
    opened again. ``deadline``: seconds one recovery may take before its last error is raised.
    """

    def __init__(self, client, world: str, writer: str, *, timeout: float | None = None, verify: bool = False,
                 deadline: float = 60.0, backoff: float = 0.05, max_backoff: float = 1.0):
        self.client = client
        self.world = world
        self.writer = writer
        self.timeout = timeout
        self.deadline = deadline
        self.backoff, self.max_backoff = backoff, max_backoff
        self.reconnects = 0
        self._pending: deque[_Pending] = deque()
        self._stream = None
        # Opening retries a broken connection, not an unknown world (a typo should fail at once).
        opening = _CALL_RETRY - {grpc.StatusCode.NOT_FOUND}
        self.mirror = self._retrying(lambda: client.mirror(world), retry=opening) if verify else None
        self.next_seq = self._retrying(lambda: client.get_world(world), retry=opening).writers.get(writer, 0) + 1
        self._open()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _open(self) -> None:
        self._stream = self.client.open_stream(self.world, self.timeout, writer=self.writer)
        for p in self._pending:
            self._stream.send_request(p.request)

    # ---- the FrameStream interface ------------------------------------------------------------
    def send(self, *, seq: int | None = None, **arrays) -> int:
        """Queue one frame (keyword arrays as ``sapcore.World.step``); return its seq. An explicit seq is sent
        as given (one already applied is answered with its first delta, not applied again)."""
        numbered = seq is None
        if numbered:
            seq = self.next_seq
        request = frame_request(self.world, seq, arrays, self.writer)
        self._stream.send_request(request)          # checks the size first
        self.next_seq = max(self.next_seq, seq + 1)
        self._pending.append(_Pending(seq, request, numbered))
        return seq

    def recv(self) -> RemoteDelta:
        """The answer to the oldest unanswered frame, exactly once; raises its error if it was refused (or if
        the stream could not be resumed within ``deadline`` seconds)."""
        if not self._pending:
            raise make_error(grpc.StatusCode.FAILED_PRECONDITION, "recv() with no frame in flight")
        while True:
            try:
                delta = self._stream.recv()
            except SapgridError as err:
                retry = _CALL_RETRY if getattr(err, "stream_ended", False) else _FRAME_RETRY
                if err.code in retry:
                    self._resume(err)
                    continue
                self._refused()
                raise
            self._pending.popleft()
            return delta if self.mirror is None else self.mirror.apply(delta)

    def step(self, **arrays) -> RemoteDelta:
        self.send(**arrays)
        return self.recv()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- recovery -----------------------------------------------------------------------------
    def _refused(self) -> None:
        """The oldest frame was refused for its content: it took no seq. The frames after it that the stream
        numbered are numbered one lower and sent again on a new call (the server refused them as a gap)."""
        refused = self._pending.popleft()
        if not refused.numbered:
            return
        for p in self._pending:
            if p.numbered and p.seq > refused.seq:
                p.seq -= 1
                request = pb.StreamFramesRequest()
                request.CopyFrom(p.request)           # the sent message is the transport's now
                request.frame.seq = p.seq
                p.request = request
        self.next_seq -= 1
        if self._pending:
            self._stream.close()
            self._open()

    def _resume(self, cause: SapgridError) -> None:
        """Open the call again and send the unanswered frames, retrying with backoff until the deadline."""
        self._stream.close()

        def reopen():
            stands = self.client.get_world(self.world).writers.get(self.writer, 0)
            first = self._pending[0].seq if self._pending else self.next_seq
            if stands < first - 1:
                raise DataLoss(f"world {self.world!r}: writer {self.writer!r} stands at seq {stands} but the server "
                               f"had answered its frames up to seq {first - 1}: answered frames were lost "
                               f"(a server without a data directory, or with --fsync no, restarted)")
            self._open()

        self._retrying(reopen, cause)
        self.reconnects += 1

    def _retrying(self, attempt, cause: SapgridError | None = None, retry=_CALL_RETRY):
        """``attempt()``, again with exponential backoff while it fails with a code worth retrying, for at most
        ``deadline`` seconds; then its last error, saying so."""
        give_up = time.monotonic() + self.deadline
        delay = self.backoff
        last_error = cause
        while True:
            try:
                return attempt()
            except DataLoss:
                raise
            except SapgridError as err:
                if err.code not in retry:
                    raise
                last_error = err
            if time.monotonic() + delay > give_up:
                raise make_error(last_error.code, f"world {self.world!r}: could not resume writer {self.writer!r} "
                                 f"within {self.deadline:g} s: {last_error.message}") from last_error
            time.sleep(delay)
            delay = min(delay * 2, self.max_backoff)


__all__ = ["ResumingFrameStream"]
