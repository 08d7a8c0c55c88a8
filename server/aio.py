"""The server's event loop: gRPC's asyncio server, with the service's own code kept as it is.

The server is ``grpc.aio.server`` running in one thread of its own (``EventLoop``, ``sapgrid-io``). A
small frame of a stream is received, applied and answered in that thread (``SapgridServicer.
stream_frames_in_loop``): no thread wakes up for it, and no thread waits for the interpreter lock
behind the others (with many small worlds that hand-over was a third of a frame's server CPU). A frame
that could hold the loop (a big one, a busy world, a heavy world, an answer waiting for a disk sync)
runs in a thread of the call pool instead, as does every other method: they are written for threads,
and ``CallContexts`` runs each in a thread of the pool (its messages handed between the loop and it).

The interceptors are written for gRPC's threaded server (``grpc.ServerInterceptor``); ``Threaded``
puts each in the asyncio server's chain as it is. They wrap a method of either kind: a method that
runs in the loop is an ``async`` function or async generator, and the interceptors' wrappers of it are
too (``streaming``).

Every method and interceptor sees a call's context through ``CallContext``: the threaded server's
context, whatever the method's kind (attributes can be set on it, ``is_active``, ``add_callback``
whose callback runs when the call ends however it ends, and returns False once it has ended,
``cancel`` from any thread, ``abort_with_status``; an abort in the loop ends the call once it reaches
``CallContexts``, the outermost interceptor). A call's end is its asyncio task's: gRPC cancels the
task when the client cancels, goes away or passes its deadline.
"""
from __future__ import annotations

import asyncio
import inspect
import threading

import grpc
from grpc import aio

HEALTH_PREFIX = "/grpc.health.v1.Health/"


def handler_kind(handler) -> str:
    """The field of a ``grpc.RpcMethodHandler`` that holds its behaviour (``unary_unary``, ``unary_stream``,
    ``stream_unary`` or ``stream_stream``): what an interceptor wraps and ``_replace``s."""
    return ("stream_" if handler.request_streaming else "unary_") + ("stream" if handler.response_streaming
                                                                     else "unary")


class EventLoop:
    """An asyncio loop running in a daemon thread of its own; ``run`` a coroutine in it from any other
    thread. Its default executor is ``pool`` (the call pool)."""

    def __init__(self, pool, name: str = "sapgrid-io"):
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(pool)
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float | None = None):
        """Run ``coroutine`` in the loop and return its result (raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, fn, *args):
        """``fn(*args)`` called in the loop's thread (what must be made there: the server)."""
        async def called():
            return fn(*args)
        return self.run(called())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.run(self.loop.shutdown_asyncgens(), 5.0)     # the calls' generators finish in the loop
        except Exception:                                    # noqa: BLE001 - stopping regardless
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)
        if not self.thread.is_alive():
            self.loop.close()


class Aborted(Exception):
    """An abort of a call, carried up to ``CallContexts``: it sends the status of a method that runs in the
    loop (the asyncio context's ``abort`` is a coroutine); for one in a thread of the pool the status is
    sent already (or the call had ended) and the method just ends."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata=()):
        super().__init__(details)
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


class CallContext:
    """A call's context as methods written for gRPC's threaded server use it (see the module docstring).

    context: gRPC's asyncio context of the call; in_loop: the method runs in the loop (else in threads of
    the pool, and its aborts are sent from the loop); task and loop: the call's asyncio task (to
    cancel it) and the server's loop."""

    def __init__(self, context, task, loop, in_loop: bool):
        self._context = context
        self._task, self._loop, self._in_loop = task, loop, in_loop
        self._code: grpc.StatusCode | None = None
        # Read while the call is open: gRPC lets go of its call once its task is done, and these then read
        # freed memory (a method's ``finally`` may run later, when its generator is closed).
        self._peer = context.peer()
        self._auth: dict | None = None
        self._cancelled = False

    def __getattr__(self, name):              # what is not here is gRPC's context's own
        return getattr(self._context, name)

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict:
        """The call's transport security (its client certificate); empty once the call has ended."""
        if self._auth is None:
            self._auth = {} if self._task.done() else self._context.auth_context()
        return self._auth

    def is_active(self) -> bool:
        return not self._task.done()

    def add_callback(self, callback) -> bool:
        """Call ``callback()`` (in the loop) once the call has ended, however it ended (its task is done:
        gRPC cancels it when the client cancels, goes away or passes its deadline); False, and never
        called, if it has already ended."""
        if self._task.done():
            return False
        if self._in_loop:
            self._task.add_done_callback(lambda _task: callback())
        else:
            self._loop.call_soon_threadsafe(self._task.add_done_callback, lambda _task: callback())
        return True

    def cancel(self, details: str = "the server ended the call") -> None:
        """End the call CANCELLED with ``details`` (from any thread but the loop's): its status goes to the
        client (once what was sent before it has gone: a stalled stream's client gets it when it reads
        again) and its task is cancelled, so a read or write it waits for ends and its termination
        callbacks run; a later abort of the method ends it quietly."""
        self._cancelled = True
        if self._task.done():
            return
        done = asyncio.run_coroutine_threadsafe(self._context.abort(grpc.StatusCode.CANCELLED, details), self._loop)
        done.add_done_callback(_ended_by_abort)
        self._loop.call_soon_threadsafe(self._task.cancel)

    def send_initial_metadata(self, metadata=()) -> None:
        """Send the call's response headers now (from a thread of the pool: sent by the loop, waited for)."""
        if self._in_loop:
            raise RuntimeError("a method in the loop awaits its context's send_initial_metadata itself")
        if not self._task.done():
            asyncio.run_coroutine_threadsafe(self._context.send_initial_metadata(tuple(metadata)), self._loop).result()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        self._context.set_code(code)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()):
        """End the call with this status (never returns: raises ``Aborted``, which ``CallContexts`` takes).
        A method in the loop sends it from there; one in a thread of the pool has it sent by the loop
        now."""
        self._code = code
        if self._in_loop or self._cancelled or self._task.done():     # (an ended call has nothing more to send)
            raise Aborted(code, details, trailing_metadata)
        sent = asyncio.run_coroutine_threadsafe(self._context.abort(code, details, tuple(trailing_metadata or ())),
                                                self._loop)
        try:
            sent.result()
        except Exception as exc:                 # gRPC's abort error, kept by gRPC until the call is freed:
            exc.__traceback__ = None             # it must not hold this thread's frames (a deleted world's)
        raise Aborted(code, details, trailing_metadata)

    def abort_with_status(self, status):
        self.abort(status.code, status.details, status.trailing_metadata)


class CallContexts(aio.ServerInterceptor):
    """The outermost interceptor: every method and interceptor gets its call's ``CallContext``, and an
    abort of a method that runs in the loop ends its call. Once ``refuse`` has been called, every new
    call but the health service's is answered UNAVAILABLE with its reason (a graceful shutdown: the
    calls already open go on)."""

    def __init__(self):
        self.refusing: str | None = None

    def refuse(self, reason: str) -> None:
        self.refusing = reason

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        kind = handler_kind(handler)
        if self.refusing is not None and not details.method.startswith(HEALTH_PREFIX):
            return handler._replace(**{kind: _refused(handler.response_streaming, self.refusing)})
        task, loop = asyncio.current_task(), asyncio.get_running_loop()    # (this runs in the call's task)
        behavior = getattr(handler, kind)
        if inspect.isasyncgenfunction(behavior):
            async def call(request, context):
                try:
                    async for response in behavior(request, CallContext(context, task, loop, True)):
                        yield response
                except Aborted as a:
                    await _abort(task, context, a)
        elif inspect.iscoroutinefunction(behavior):
            async def call(request, context):
                try:
                    return await behavior(request, CallContext(context, task, loop, True))
                except Aborted as a:
                    await _abort(task, context, a)
        elif handler.response_streaming:         # a generator, run in threads of the pool
            async def call(request, context):
                ctx = CallContext(context, task, loop, False)
                if handler.request_streaming:
                    request = _blocking(request, loop)
                responses = None
                try:
                    responses = await loop.run_in_executor(None, behavior, request, ctx)
                    while (response := await loop.run_in_executor(None, next, responses, _END)) is not _END:
                        yield response
                except Aborted as a:
                    await _abort(task, context, a)
                finally:
                    _close(responses)
        else:
            async def call(request, context):    # run in a thread of the pool
                ctx = CallContext(context, task, loop, False)
                if handler.request_streaming:
                    request = _blocking(request, loop)
                try:
                    return await loop.run_in_executor(None, behavior, request, ctx)
                except Aborted as a:
                    await _abort(task, context, a)
        return handler._replace(**{kind: call})


async def _abort(task, context, aborted: Aborted) -> None:
    """End the call with ``aborted``'s status, unless it has ended (a generator closed after its call) or
    its status is sent (``CallContext.cancel``: gRPC raises that abort's own error at the next read)."""
    if not task.done() and not context.done():
        await context.abort(aborted.code, aborted.details, aborted.trailing_metadata)


_END = object()


def _blocking(requests, loop):
    """The request messages of a call (an async iterator of the loop) as an iterator for a thread."""
    messages = requests.__aiter__()

    async def receive():
        return await messages.__anext__()
    while True:
        try:
            message = asyncio.run_coroutine_threadsafe(receive(), loop).result()
        except StopAsyncIteration:
            return
        yield message


def _close(responses) -> None:
    """Close a method's generator (its ``finally`` runs now) unless a thread of the pool runs it (it
    ends by itself: the call's termination callbacks wake what it waits for)."""
    close = getattr(responses, "close", None)
    if close is not None:
        try:
            close()
        except ValueError:                       # "generator already executing"
            pass


def _ended_by_abort(done) -> None:
    done.exception()                      # (the abort's own error, raised where it ran: taken, not logged)


def _refused(streaming: bool, reason: str):
    if streaming:
        async def refused(request, context):
            await context.abort(grpc.StatusCode.UNAVAILABLE, reason)
            yield b""                       # (never reached: an async generator, as the method it stands for)
    else:
        async def refused(request, context):
            await context.abort(grpc.StatusCode.UNAVAILABLE, reason)
    return refused


class Threaded(aio.ServerInterceptor):
    """An interceptor written for gRPC's threaded server, in the asyncio server's chain. (Each of this
    service's interceptors asks the rest of the chain first and then wraps what it got, so asking it
    before calling the interceptor is the same.)"""

    def __init__(self, interceptor: grpc.ServerInterceptor):
        self.interceptor = interceptor

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        return self.interceptor.intercept_service(lambda _details: handler, details)


def in_loop(behavior) -> bool:
    """Does a method handler's behaviour run in the loop (an async function or async generator)?"""
    return inspect.isasyncgenfunction(behavior) or inspect.iscoroutinefunction(behavior)


def streaming(behavior, enter, leave):
    """A response-streaming ``behavior`` (a generator function, or an async generator function that runs
    in the loop) wrapped, in its own kind: ``enter(request, context)`` -> (request, state) runs before
    its first response (an abort there ends the call; ``leave`` is not called), ``leave(state, context,
    outcome)`` once it has ended: outcome False (it finished), "CANCELLED" (the client went away: the
    stream was closed or its task cancelled) or True (it raised)."""
    if inspect.isasyncgenfunction(behavior):
        async def wrapped(request, context):
            request, state = enter(request, context)
            outcome = True
            try:
                async for response in behavior(request, context):
                    yield response
                outcome = False
            except (GeneratorExit, asyncio.CancelledError):
                outcome = "CANCELLED"
                raise
            finally:
                leave(state, context, outcome)
    else:
        def wrapped(request, context):
            request, state = enter(request, context)
            outcome = True
            try:
                yield from behavior(request, context)
                outcome = False
            except GeneratorExit:
                outcome = "CANCELLED"
                raise
            finally:
                leave(state, context, outcome)
    return wrapped
