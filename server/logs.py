"""The server's logs: plain text or JSON lines (``--log-format json``), and one line per call.

JSON lines come from python-json-logger: ``time``, ``level``, ``logger``, ``message`` and the record's
extra fields. ``CallLog`` (a server interceptor) writes a line when a call ends, with ``call`` (the
method), ``peer``, ``world`` (from the call's ``x-sapgrid-world`` header, when it has one), ``status``
and ``duration_ms``: at INFO for streams and for failed calls, at DEBUG for unary calls that succeed
(a game server's frames would flood the log). Failed calls of one peer are logged at most once a second;
the ones left out are counted in the next line (``suppressed``), and every refusal is in the metrics.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

import grpc

from . import aio

log = logging.getLogger("sapgrid.calls")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
WORLD_HEADER = "x-sapgrid-world"


def configure(fmt: str = "text", level: int = logging.INFO) -> None:
    """Root logging to stderr, as text or as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("{asctime}{levelname}{name}{message}", style="{",
                                           rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    if _client_left not in grpc_log.filters:
        grpc_log.addFilter(_client_left)


def _client_left(record: logging.LogRecord) -> bool:
    """Leave out gRPC's error line (with its traceback) for an answer its client went away before taking:
    a stream's client closing its connection mid-stream is no server error (the call's line says it)."""
    return not str(record.msg).startswith("ExecuteBatchError raised in core")


class _Sampler:
    """At most one failure line per peer a second; counts the ones left out."""

    def __init__(self, period: float = 1.0):
        self.period = period
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def take(self, peer: str) -> int | None:
        """None: leave this failure out; else the number left out since the last line."""
        now = time.monotonic()
        with self._lock:
            last, skipped = self._last.get(peer, (-1e9, 0))
            if now - last < self.period:
                self._last[peer] = (last, skipped + 1)
                return None
            if len(self._last) > 10_000:             # bounded: forget old peers
                self._last.clear()
            self._last[peer] = (now, 0)
            return skipped


class CallLog(grpc.ServerInterceptor):
    """One log line per call when it ends (see the module docstring)."""

    def __init__(self):
        self._sampler = _Sampler()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        world = next((v for k, v in handler_call_details.invocation_metadata or () if k == WORLD_HEADER), "")
        kind = ("stream_" if handler.request_streaming else "unary_") + ("stream" if handler.response_streaming
                                                                       else "unary")
        streaming = handler.request_streaming or handler.response_streaming
        wrap = self._streaming if handler.response_streaming else self._unary
        return handler._replace(**{kind: wrap(getattr(handler, kind), method, world, streaming)})

    def _done(self, context, method: str, world: str, t0: float, streaming: bool, failed: bool | str) -> None:
        """failed: False, True (an exception), or the status name to report (a stream its client left)."""
        code = context.code() if hasattr(context, "code") else None
        if isinstance(code, grpc.StatusCode):
            status = code.name
        elif failed and not context.is_active():        # the client cancelled or went away
            status = "CANCELLED"
        else:
            status = failed if isinstance(failed, str) else ("UNKNOWN" if failed else "OK")
        ok = status in ("OK", "CANCELLED")          # a refusal is sampled; a client leaving is not one
        level = logging.INFO if streaming or not ok else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        peer = context.peer()
        extra = dict(call=method, peer=peer, world=world, status=status,
                     duration_ms=round((time.perf_counter() - t0) * 1e3, 3))
        if not ok:
            skipped = self._sampler.take(peer)
            if skipped is None:
                return
            extra["suppressed"] = skipped
        log.log(level, "%s %s %s", method, status, world, extra=extra)

    def _unary(self, behavior, method, world, streaming):
        def logged(request, context):
            t0, failed = time.perf_counter(), True
            try:
                out = behavior(request, context)
                failed = False
                return out
            finally:
                self._done(context, method, world, t0, streaming, failed)
        return logged

    def _streaming(self, behavior, method, world, streaming):
        def leave(t0, context, outcome) -> None:
            self._done(context, method, world, t0, streaming, outcome)
        return aio.streaming(behavior, lambda request, context: (request, time.perf_counter()), leave)
