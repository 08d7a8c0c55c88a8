"""World registry: named worlds, each with a bounded queue and one worker that applies its work in order.

Every piece of engine work for a world (frames, queries, pair lists) is a job in that world's bounded
queue. Each world has one worker: at most one of its jobs runs at a time, in the shared thread pool,
and when it finishes the next one starts. So the event loop never blocks, a world sees its jobs
strictly in order, and a heavy world never blocks another (each has its own worker; they share the
pool, sized by ``worker_threads``).

Deadlines and cancellation: a caller that goes away cancels its job's future; a job whose future is
cancelled before it starts is skipped (a frame is then never applied). A job already running
finishes (frames are atomic) and its delta still goes to subscribers and metrics.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapgrid.v1 import frame_pb2, world_pb2

from . import codec
from .engine_lock import make_engine_lock
from .errors import Exhausted, InvalidInput, ShuttingDown, WorldExists, WorldNotFound, outcome
from .metrics import Metrics

log = logging.getLogger("sapgrid.server")

NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
OCCUPANCY_PERIOD_S = 1.0
_END = object()


@dataclass
class Job:
    fn: Callable[[], Any]                     # runs in a worker thread
    future: asyncio.Future
    enqueued: float
    after: Callable[[Any, float], Any] | None = None   # on the loop, with (result, start time): frames only
    failed: Callable[[BaseException], None] | None = None
    published: Callable[[Any], None] | None = None     # on the loop, after the caller got the result
    started: float = 0.0
    begun: asyncio.Future | None = None     # resolved once the job runs in its thread (or will never run)


def _guarded(lock, fn, on_start=None):
    if on_start is not None:
        on_start()
    with lock:
        return fn()


def _done_future() -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass
class Applied:
    """An applied frame: its Delta message, the same serialized (sent as is), a cell occupancy sample or None."""

    delta: frame_pb2.Delta
    raw: bytes
    occupancy: Any = None


class Subscriber:
    """A Subscribe stream's buffer: serialized deltas, then _END; ``dropped`` when it fell too far behind."""

    def __init__(self, limit: int):
        self.limit = limit
        self.queue: asyncio.Queue = asyncio.Queue()
        self.dropped = False

    def offer(self, item) -> None:
        if self.dropped:
            return
        if item is not _END and self.queue.qsize() >= self.limit:
            self.dropped = True
            item = _END
        self.queue.put_nowait(item)

    async def next(self):
        """The next serialized Delta, or None at the end of the stream."""
        item = await self.queue.get()
        return None if item is _END else item


@dataclass
class WorldRunner:
    """One world: the engine object, its bounded job queue, subscribers and live counters.

    The "worker" of the world is a chain of jobs: at most one job of the world is in the thread pool at
    a time; when it finishes (its completion is posted back to the loop), the next queued job starts.
    This keeps the world's work strictly ordered with a single hop to the pool and back per job.
    """

    name: str
    world: Any
    config: Any                       # sapcore.WorldConfig
    expected_objects: int
    pool: Executor
    metrics: Metrics
    queue_size: int
    subscriber_limit: int
    validate: bool = False
    engine_lock: Any = field(default_factory=contextlib.nullcontext)   # see engine_lock.py
    frames: int = 0
    rejected: int = 0
    objects: int = 0
    pairs: int = 0
    last_stats: world_pb2.FrameStats | None = None
    subscribers: set = field(default_factory=set)
    closed: bool = False              # no new jobs (deleted, or the server is shutting down)
    deleted: bool = False             # deleted: its metric series are gone

    def __post_init__(self):
        self.loop = asyncio.get_running_loop()
        self.pending: deque[Job] = deque()      # queued jobs (not running), at most queue_size
        self.running: Job | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self._last_occupancy = -1e9

    @property
    def dims(self) -> int:
        return self.config.dims

    # ---- the worker -------------------------------------------------------------------------
    def _start_next(self) -> None:
        """Start the oldest queued job whose caller is still waiting (on the loop)."""
        while self.pending:
            job = self.pending.popleft()
            if job.future.cancelled():        # deadline passed or caller gone: never applied
                _resolve(job.begun)
                continue
            self.running = job
            self.idle.clear()
            job.started = time.perf_counter()
            begun = job.begun
            self.pool.submit(_guarded, self.engine_lock, job.fn,
                             lambda: self.loop.call_soon_threadsafe(_resolve, begun)).add_done_callback(
                lambda f, job=job: self.loop.call_soon_threadsafe(self._finish, job, f))
            self._queue_depth()
            return
        self.running = None
        self.idle.set()
        self._queue_depth()

    def _queue_depth(self) -> None:
        if not self.deleted:                  # a deleted world's series are gone; never re-create them
            self.metrics.set_queue_depth(self.name, len(self.pending))

    def _finish(self, job: Job, f) -> None:
        """A job's completion, on the loop: results, metrics, subscribers; then the next job."""
        exc = ShuttingDown("server is shutting down") if f.cancelled() else f.exception()
        _resolve(job.begun)
        try:
            if exc is not None:
                if job.failed is not None:
                    job.failed(exc)
                if not job.future.done():
                    job.future.set_exception(exc)
            else:
                result = f.result()
                if job.after is not None:
                    result = job.after(result, job.started)
                if not job.future.done():
                    job.future.set_result(result)
                if job.published is not None:
                    # After the caller's answer: set_result scheduled the caller first (call_soon is FIFO).
                    self.loop.call_soon(job.published, result)
        finally:
            self._start_next()

    def submit(self, fn: Callable[[], Any], after=None, failed=None, published=None) -> asyncio.Future:
        """Queue a job; its future gets fn's result (after ``after``). Full queue: RESOURCE_EXHAUSTED."""
        if self.closed:
            raise WorldNotFound(self.name)
        if len(self.pending) >= self.queue_size:
            raise Exhausted(f"world {self.name!r}: queue full ({self.queue_size} frames/queries waiting)")
        fut = self.loop.create_future()
        self.pending.append(Job(fn, fut, time.perf_counter(), after, failed, published, begun=self.loop.create_future()))
        if self.running is None:
            self._start_next()
        else:
            self._queue_depth()
        return fut

    def begun(self) -> asyncio.Future:
        """Resolved once the most recently submitted job has started in its thread (or will never run)."""
        return self.pending[-1].begun if self.pending else (self.running.begun if self.running else _done_future())

    async def run(self, fn: Callable[[], Any]) -> Any:
        """Run a query job in order with the world's frames and return its result."""
        return await self.submit(fn)

    # ---- frames -----------------------------------------------------------------------------
    def submit_frame(self, frame, received: float) -> asyncio.Future:
        """Decode, queue and (later) apply one frame; the future gets its ``Applied`` (Delta message + bytes).

        frame: a frame_pb2.Frame or a wire.FrameView (bulk fields as memoryviews of the request).
        Raises (synchronously) for malformed bytes and a full queue; engine refusals come through the future.
        """
        try:
            arrays = codec.decode_frame(frame, self.dims)
        except Exception as exc:
            self._rejected(exc)
            raise
        seq, world, validate = frame.seq, self.world, self.validate

        def work() -> Applied:
            # In the worker thread: apply, build and serialize the Delta (off the event loop).
            start = time.perf_counter()
            delta = world.step(**arrays)
            if validate:
                world.validate()
            self.frames += 1          # only this world's worker runs work(), one at a time
            msg = codec.delta_message(delta, seq, self.name, self.frames)
            occupancy = None
            now = time.perf_counter()
            if now - self._last_occupancy >= OCCUPANCY_PERIOD_S:
                self._last_occupancy = now
                occupancy = np.asarray(world.cell_occupancy())
            msg.stats.queue_seconds = start - enqueued
            msg.stats.server_seconds = time.perf_counter() - received
            return Applied(msg, msg.SerializeToString(), occupancy)

        def after(result: Applied, start: float) -> Applied:
            stats = result.delta.stats
            self.objects, self.pairs, self.last_stats = stats.objects, stats.pairs, stats
            return result

        enqueued = time.perf_counter()
        try:
            return self.submit(work, after, self._rejected, self._published)
        except Exception as exc:
            self._rejected(exc)
            raise

    def _published(self, result: Applied) -> None:
        if not self.deleted:
            self.metrics.frame_applied(self.name, result.delta.stats)
            if result.occupancy is not None:
                self.metrics.set_occupancy(self.name, result.occupancy)
        for sub in list(self.subscribers):
            sub.offer(result.raw)

    def _rejected(self, exc: BaseException) -> None:
        self.rejected += 1
        self.metrics.frame_rejected(None if self.deleted else self.name, outcome(exc))

    # ---- subscribers, stats, lifecycle ------------------------------------------------------
    def subscribe(self) -> Subscriber:
        if self.closed:
            raise WorldNotFound(self.name)
        sub = Subscriber(self.subscriber_limit)
        self.subscribers.add(sub)
        self.metrics.set_subscribers(self.name, len(self.subscribers))
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.deleted:
            self.metrics.set_subscribers(self.name, len(self.subscribers))

    def info(self) -> world_pb2.WorldInfo:
        stats = world_pb2.WorldStats(objects=self.objects, pairs=self.pairs, frames=self.frames,
                                     frames_rejected=self.rejected, queue_depth=len(self.pending),
                                     subscribers=len(self.subscribers))
        if self.last_stats is not None:
            stats.last_frame.CopyFrom(self.last_stats)
        return world_pb2.WorldInfo(name=self.name, config=codec.config_message(self.config, self.expected_objects),
                                   stats=stats)

    def close(self) -> None:
        """Deleted: queued jobs fail with NOT_FOUND, subscribers' streams end (a running job finishes)."""
        self.closed = self.deleted = True
        while self.pending:
            job = self.pending.popleft()
            _resolve(job.begun)
            if not job.future.done():
                job.future.set_exception(WorldNotFound(self.name))
        for sub in list(self.subscribers):
            sub.offer(_END)

    async def drain(self) -> None:
        """Shutdown: answer every queued job, then stop taking new ones."""
        self.closed = True
        while self.running is not None or self.pending:
            await self.idle.wait()
        for sub in list(self.subscribers):
            sub.offer(_END)


class Registry:
    """The server's worlds by name."""

    def __init__(self, pool: Executor, metrics: Metrics, *, queue_size: int = 64, subscriber_limit: int = 1024,
                 max_worlds: int = 256, engine_threads: int = 0, validate: bool = False,
                 world_factory: Callable[[Any], Any] | None = None, engine_lock: str = "auto"):
        self.pool = pool
        self.metrics = metrics
        self.queue_size = queue_size
        self.subscriber_limit = subscriber_limit
        self.max_worlds = max_worlds
        self.engine_threads = engine_threads
        self.validate = validate
        self.world_factory = world_factory
        self.engine_lock = make_engine_lock(engine_lock)
        self.worlds: dict[str, WorldRunner] = {}
        self._pending: set[str] = set()
        self.closing = False

    def get(self, name: str) -> WorldRunner:
        runner = self.worlds.get(name)
        if runner is None:
            raise WorldNotFound(name)
        return runner

    def list(self) -> list[WorldRunner]:
        return [self.worlds[n] for n in sorted(self.worlds)]

    async def create(self, name: str, config_msg: world_pb2.WorldConfig, if_not_exists: bool = False) -> WorldRunner:
        if self.closing:
            raise ShuttingDown("server is shutting down")
        if not NAME_RE.match(name):
            raise InvalidInput(f"name: {name!r} is not 1-64 characters of [A-Za-z0-9_.-]", "name")
        if name in self.worlds or name in self._pending:
            existing = self.worlds.get(name)
            if if_not_exists and existing is not None and existing.dims == config_msg.dims:
                return existing
            raise WorldExists(f"world {name!r} already exists", "name")
        if len(self.worlds) + len(self._pending) >= self.max_worlds:
            raise Exhausted(f"too many worlds (at most {self.max_worlds})", "name")
        config = codec.world_config(config_msg, self.engine_threads)
        factory = self.world_factory
        if factory is None:
            from sapcore import World as factory
        self._pending.add(name)
        try:
            world = await asyncio.get_running_loop().run_in_executor(
                self.pool, _guarded, self.engine_lock, functools.partial(factory, config))
        finally:
            self._pending.discard(name)
        runner = WorldRunner(name, world, config, int(config_msg.expected_objects), self.pool, self.metrics,
                             self.queue_size, self.subscriber_limit, self.validate, self.engine_lock)
        self.worlds[name] = runner
        self.metrics.world_created(name, len(self.worlds))
        log.info("world %r created: dims=%d cells=%s", name, config.dims, config.cells)
        return runner

    def delete(self, name: str) -> None:
        runner = self.worlds.pop(name, None)
        if runner is None:
            raise WorldNotFound(name)
        runner.close()
        self.metrics.world_deleted(name, len(self.worlds))
        log.info("world %r deleted", name)

    async def close(self) -> None:
        """Graceful shutdown: every world answers its queued jobs, then stops."""
        self.closing = True
        await asyncio.gather(*(r.drain() for r in self.worlds.values()), return_exceptions=True)
