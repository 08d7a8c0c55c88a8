"""Admission of calls: long calls take one of a bounded number of slots; short calls never wait for one.

Every call but a frame stream and the health check runs in a thread of the server's call pool (a
frame stream's small frames are applied in the server's loop, its others in a thread of the pool: see
aio.py), and a long call holds its thread while it is open: a subscription, a pair stream, and every
frame or query call (it may wait in its world's line). If long calls could take every thread, short
calls would wait behind them. So long calls, frame streams included, take one of ``slots`` slots, the
pool has ``slots`` threads for them plus ``RESERVED_THREADS`` that only short calls can use: world
management (create, delete, list, get) and the unary echo, all of which answer at once without waiting
for a world; the health check is answered in the loop. A long call that finds every slot taken is
answered RESOURCE_EXHAUSTED at once, naming the limit.
"""
from __future__ import annotations

import threading

import grpc

from .aio import handler_kind, streaming

#: Threads kept for short calls, beyond the slots of long calls.
RESERVED_THREADS = 16
#: Calls (fully qualified gRPC method names) that answer at once and never hold a slot.
SHORT_METHODS = frozenset({
    "/grpc.health.v1.Health/Check",
    "/sapgrid.v1.SapgridService/CreateWorld",
    "/sapgrid.v1.SapgridService/DeleteWorld",
    "/sapgrid.v1.SapgridService/ListWorlds",
    "/sapgrid.v1.SapgridService/GetWorld",
    "/sapgrid.v1.EchoService/Echo",
})


class Admission(grpc.ServerInterceptor):
    """A server interceptor that admits each long call into one of ``slots`` slots, or refuses it.

    ``on_change(in_use)`` is called whenever the number of slots in use changes (a metric);
    ``on_refused()`` when a call is refused.
    """

    def __init__(self, slots: int, on_change=None, on_refused=None):
        self.slots = slots
        self._lock = threading.Lock()
        self._in_use = 0
        self._on_change = on_change or (lambda n: None)
        self._on_refused = on_refused or (lambda: None)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method in SHORT_METHODS:
            return handler
        kind = handler_kind(handler)
        behavior = getattr(handler, kind)
        if handler.response_streaming:
            # The slot is taken at the first response the server asks for and given back when the stream
            # ends, fails or is dropped.
            return handler._replace(**{kind: streaming(behavior, self._enter, self._leave)})
        return handler._replace(**{kind: self._unary(behavior)})

    # ---- slots ------------------------------------------------------------------------------
    def _acquire(self, context) -> None:
        with self._lock:
            free = self._in_use < self.slots
            if free:
                self._in_use += 1
                self._on_change(self._in_use)     # under the lock: the gauge never shows a stale count
        if not free:
            self._on_refused()
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"server busy: all {self.slots} call slots are in use (open frame streams, "
                          f"subscriptions, frame and query calls); retry later, or raise --worker-threads")

    def _release(self) -> None:
        with self._lock:
            self._in_use -= 1
            self._on_change(self._in_use)

    def _unary(self, behavior):
        def admitted(request, context):
            self._acquire(context)
            try:
                return behavior(request, context)
            finally:
                self._release()
        return admitted

    def _enter(self, request, context):
        self._acquire(context)
        return request, None

    def _leave(self, state, context, outcome) -> None:
        self._release()
