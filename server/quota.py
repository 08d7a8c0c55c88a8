"""Fairness between clients: per-client quotas, timeouts that free the slots of idle and stalled
streams, and the health check answered in the server's loop.

A client is its identity's name with ``--auth-file`` (a token's or a certificate's name), else its
peer address (``peer:HOST``; every connection of one host is one client). Beyond a quota the call is
answered RESOURCE_EXHAUSTED naming the quota and nothing changes; every other client is served as
before, and ``sapgrid_client_refusals_total{client, reason}`` counts the refusals.

- ``--max-calls-per-client``: long calls (the calls that hold one of the ``--worker-threads`` slots)
  one client may hold at once (``ClientCalls``, an interceptor placed before the slots are taken).
- ``--max-worlds-per-client``: worlds a client created and holds (``ClientQuotas.world_*``).
- ``--max-objects-per-client``: live objects in the worlds a client created, checked in the world's
  turn before a frame's adds (``QuotaBudget``, the registry's memory budget with this check added;
  counted before the frame's removes).

``Watchdog`` ends a frame stream that waits longer than ``--stream-idle-seconds`` for its next frame,
and any server stream whose client has not taken a message for ``--subscriber-stall-seconds`` (HTTP/2
flow control holds the sending thread): the call is cancelled and its slot is free at once.
"""
from __future__ import annotations

import logging
import threading
import time

import grpc

from . import auth
from .admission import SHORT_METHODS
from .aio import handler_kind, in_loop, streaming
from .errors import Exhausted, abort
from .registry import MemoryBudget

log = logging.getLogger("sapgrid.server")

HEALTH_CHECK = "/grpc.health.v1.Health/Check"


class ClientQuotas:
    """The per-client counts: long calls held, worlds created (by name), and the objects check."""

    def __init__(self, max_calls: int = 0, max_worlds: int = 0, max_objects: int = 0, on_refused=None):
        self.max_calls, self.max_worlds, self.max_objects = max_calls, max_worlds, max_objects
        self.on_refused = on_refused or (lambda client, reason: None)
        self._lock = threading.Lock()
        self._calls: dict[str, int] = {}
        self._owner: dict[str, str] = {}              # world name -> the client that created it
        self.registry = None                          # set by the server (objects of a client's worlds)

    def _refuse(self, client: str, reason: str, message: str):
        self.on_refused(client, reason)
        return Exhausted(f"client {client!r}: {message}", "")

    # ---- calls ---------------------------------------------------------------------------------
    def call_started(self, client: str) -> None:
        with self._lock:
            held = self._calls.get(client, 0)
            if self.max_calls and held >= self.max_calls:
                raise self._refuse(client, "calls", f"holds {held} long calls (open streams, subscriptions, frame "
                                                    f"and query calls), its quota (--max-calls-per-client "
                                                    f"{self.max_calls}); end one or retry later")
            self._calls[client] = held + 1

    def call_ended(self, client: str) -> None:
        with self._lock:
            held = self._calls.get(client, 1) - 1
            if held > 0:
                self._calls[client] = held
            else:
                self._calls.pop(client, None)

    def calls_held(self, client: str) -> int:
        with self._lock:
            return self._calls.get(client, 0)

    # ---- worlds --------------------------------------------------------------------------------
    def world_reserve(self, client: str, name: str) -> None:
        """Before CreateWorld: refuse a client at its world quota; else count ``name`` as its world."""
        with self._lock:
            held = sum(1 for owner in self._owner.values() if owner == client)
            if self.max_worlds and held >= self.max_worlds and self._owner.get(name) != client:
                raise self._refuse(client, "worlds", f"holds {held} worlds, its quota (--max-worlds-per-client "
                                                     f"{self.max_worlds}); delete one first")
            self._owner.setdefault(name, client)

    def world_released(self, name: str) -> None:
        """The world was deleted, or its creation failed."""
        with self._lock:
            self._owner.pop(name, None)

    def owner(self, name: str) -> str | None:
        with self._lock:
            return self._owner.get(name)

    # ---- objects -------------------------------------------------------------------------------
    def check_adds(self, world: str, n_add: int) -> None:
        if not self.max_objects or self.registry is None:
            return
        with self._lock:
            client = self._owner.get(world)
            if client is None:
                return
            names = [w for w, owner in self._owner.items() if owner == client]
        worlds = self.registry.worlds
        held = sum(worlds[w].objects for w in names if w in worlds)
        if held + n_add > self.max_objects:
            raise self._refuse(client, "objects", f"its worlds hold {held} objects; {n_add} more would pass its "
                                                  f"quota (--max-objects-per-client {self.max_objects})")


class QuotaBudget(MemoryBudget):
    """The registry's memory budget, plus the per-client objects quota (checked in the world's turn)."""

    def __init__(self, world_bytes: int, server_bytes: int, quotas: ClientQuotas):
        super().__init__(world_bytes, server_bytes)
        self.quotas = quotas

    def check_adds(self, name: str, n_add: int) -> None:
        self.quotas.check_adds(name, n_add)
        super().check_adds(name, n_add)


class ClientCalls(grpc.ServerInterceptor):
    """Counts each long call against its client's ``--max-calls-per-client`` before it takes a slot."""

    def __init__(self, quotas: ClientQuotas):
        self.quotas = quotas

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or details.method in SHORT_METHODS or details.method == HEALTH_CHECK:
            return handler
        kind = handler_kind(handler)
        behavior, quotas = getattr(handler, kind), self.quotas

        def enter(request, context):
            client = auth.client_name(context)
            try:
                quotas.call_started(client)
            except Exhausted as exc:
                abort(context, exc)
            return request, client

        def leave(client, context, outcome) -> None:
            quotas.call_ended(client)

        if handler.response_streaming:
            counted = streaming(behavior, enter, leave)
        else:
            def counted(request, context):
                request, client = enter(request, context)
                try:
                    return behavior(request, context)
                finally:
                    leave(client, context, None)
        return handler._replace(**{kind: counted})


class _Watched:
    __slots__ = ("context", "method", "waiting_since", "sending_since", "ended")

    def __init__(self, context, method: str):
        self.context = context
        self.method = method
        self.waiting_since: float | None = None
        self.sending_since: float | None = None
        self.ended: str | None = None


class Watchdog(grpc.ServerInterceptor):
    """Cancels streams idle (no request for ``idle_s``) or stalled (a response not taken for ``stall_s``).

    0 turns either off. One daemon thread looks at the open streams a few times a second; the call's
    own thread only stamps the time around its reads and writes.
    """

    def __init__(self, idle_s: float, stall_s: float, on_timeout=None):
        self.idle_s, self.stall_s = idle_s, stall_s
        self.on_timeout = on_timeout or (lambda client, reason: None)
        self._open: set[_Watched] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        limits = [x for x in (idle_s, stall_s) if x > 0]
        self.period = min(1.0, max(0.02, min(limits) / 4)) if limits else 0

    def start(self) -> None:
        if self.period and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sapgrid-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or not self.period:
            return handler
        idle = handler.request_streaming and self.idle_s > 0
        stall = handler.response_streaming and self.stall_s > 0
        if not (idle or stall):
            return handler
        kind = handler_kind(handler)
        behavior, method = getattr(handler, kind), details.method

        if handler.response_streaming and in_loop(behavior):
            async def watched(request, context):
                entry = self._enter(context, method)
                try:
                    out = behavior(_reading_in_loop(request, entry) if idle else request, context)
                    async for item in (_sending_in_loop(out, entry) if stall else out):
                        yield item
                finally:
                    self._leave(entry)
        elif handler.response_streaming:
            def watched(request, context):
                entry = self._enter(context, method)
                try:
                    out = behavior(_reading(request, entry) if idle else request, context)
                    yield from (_sending(out, entry) if stall else out)
                finally:
                    self._leave(entry)
        else:
            def watched(request, context):          # a client-streaming call with one response
                entry = self._enter(context, method)
                try:
                    return behavior(_reading(request, entry), context)
                finally:
                    self._leave(entry)
        return handler._replace(**{kind: watched})

    def _enter(self, context, method: str) -> _Watched:
        entry = _Watched(context, method)
        with self._lock:
            self._open.add(entry)
        return entry

    def _leave(self, entry: _Watched) -> None:
        with self._lock:
            self._open.discard(entry)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = time.monotonic()
            with self._lock:
                entries = list(self._open)
            for e in entries:
                if e.ended:
                    continue
                waiting, sending = e.waiting_since, e.sending_since
                if self.idle_s and waiting is not None and now - waiting > self.idle_s:
                    self._end(e, "idle", f"no request for {self.idle_s:g} s (--stream-idle-seconds)")
                elif self.stall_s and sending is not None and now - sending > self.stall_s:
                    self._end(e, "stalled", f"its client took no message for {self.stall_s:g} s "
                                            f"(--subscriber-stall-seconds)")

    def _end(self, entry: _Watched, reason: str, why: str) -> None:
        entry.ended = reason
        client = auth.client_name(entry.context)
        log.info("%s of client %r ended: %s; its slot is free", entry.method, client, why,
                 extra=dict(call=entry.method, client=client, reason=reason))
        self.on_timeout(client, reason)
        entry.context.cancel(f"{entry.method} ended by the server: {why}")


def _reading(iterator, entry: _Watched):
    while True:
        entry.waiting_since = time.monotonic()
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            entry.waiting_since = None
        yield item


def _sending(responses, entry: _Watched):
    for item in responses:
        entry.sending_since = time.monotonic()
        yield item
        entry.sending_since = None


async def _reading_in_loop(iterator, entry: _Watched):
    """``_reading`` of a method that runs in the server's loop."""
    iterator = iterator.__aiter__()
    while True:
        entry.waiting_since = time.monotonic()
        try:
            item = await iterator.__anext__()
        except StopAsyncIteration:
            return
        finally:
            entry.waiting_since = None
        yield item


async def _sending_in_loop(responses, entry: _Watched):
    """``_sending`` of a method that runs in the server's loop."""
    async for item in responses:
        entry.sending_since = time.monotonic()
        yield item
        entry.sending_since = None


class HealthInLoop(grpc.ServerInterceptor):
    """Answers the health check in the server's loop (aio.py): it never waits for a thread of the call
    pool, so it is answered however many calls hold one, and it is never refused with them."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or details.method != HEALTH_CHECK or handler.unary_unary is None:
            return handler
        behavior = handler.unary_unary

        async def check(request, context):      # (a look-up under a lock: nothing that waits)
            return behavior(request, context)
        return handler._replace(unary_unary=check)
