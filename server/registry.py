"""World registry: named worlds, each with a bounded queue and one worker that applies its work in order.

Every piece of engine work for a world (frames, queries, pair lists, stats) is a job in that world's
queue. The world's worker task (on the event loop) takes one job at a time and runs it in the shared
thread pool (``run_in_executor``), so the loop never blocks, the world sees its jobs strictly in
order, and a heavy world never blocks another (each has its own worker; they share the pool).

Deadlines and cancellation: a caller that goes away cancels its job's future; a job whose future is
cancelled before it starts is skipped (a frame is then never applied). A job already running
finishes (frames are atomic) and its delta still goes to subscribers and metrics.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapgrid.v1 import frame_pb2, world_pb2

from . import codec
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


class Subscriber:
    """A Subscribe stream's buffer: deltas, then _END; ``dropped`` when it fell too far behind."""

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
        """The next delta message, or None at the end of the stream."""
        item = await self.queue.get()
        return None if item is _END else item


@dataclass
class WorldRunner:
    """One world: the engine object, its queue, worker task, subscribers and live counters."""

    name: str
    world: Any
    config: Any                       # sapcore.WorldConfig
    expected_objects: int
    pool: Executor
    metrics: Metrics
    queue_size: int
    subscriber_limit: int
    validate: bool = False
    frames: int = 0
    rejected: int = 0
    objects: int = 0
    pairs: int = 0
    last_stats: world_pb2.FrameStats | None = None
    subscribers: set = field(default_factory=set)
    closed: bool = False

    def __post_init__(self):
        self.queue: asyncio.Queue = asyncio.Queue(self.queue_size)
        self._last_occupancy = -1e9
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"world:{self.name}")

    @property
    def dims(self) -> int:
        return self.config.dims

    # ---- the worker -------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job = await self.queue.get()
            if job is _END:
                return
            if job.future.cancelled():
                continue
            start = time.perf_counter()
            try:
                result = await loop.run_in_executor(self.pool, job.fn)
            except Exception as exc:  # domain errors of a frame or query: the world is unchanged
                if job.failed is not None:
                    job.failed(exc)
                if not job.future.done():
                    job.future.set_exception(exc)
                continue
            if job.after is not None:
                result = job.after(result, start)
            if not job.future.done():
                job.future.set_result(result)
            self.metrics.set_queue_depth(self.name, self.queue.qsize())

    def submit(self, fn: Callable[[], Any], after=None, failed=None) -> asyncio.Future:
        """Queue a job; its future gets fn's result (after ``after``). Full queue: RESOURCE_EXHAUSTED."""
        if self.closed:
            raise WorldNotFound(self.name)
        fut = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(Job(fn, fut, time.perf_counter(), after, failed))
        except asyncio.QueueFull:
            raise Exhausted(f"world {self.name!r}: queue full ({self.queue_size} frames/queries waiting)") from None
        self.metrics.set_queue_depth(self.name, self.queue.qsize())
        return fut

    async def run(self, fn: Callable[[], Any]) -> Any:
        """Run a query job in order with the world's frames and return its result."""
        return await self.submit(fn)

    # ---- frames -----------------------------------------------------------------------------
    def submit_frame(self, frame: frame_pb2.Frame, received: float) -> asyncio.Future:
        """Decode, queue and (later) apply one frame; the future gets its Delta message.

        Raises (synchronously) for malformed bytes and a full queue; engine refusals come through the future.
        """
        try:
            arrays = codec.decode_frame(frame, self.dims)
        except Exception as exc:
            self._rejected(exc)
            raise
        seq, world, validate = frame.seq, self.world, self.validate

        def work():
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
            return msg, occupancy

        def after(result, start: float):
            msg, occupancy = result
            done = time.perf_counter()
            msg.stats.queue_seconds = start - enqueued[0]
            msg.stats.server_seconds = done - received
            self.objects, self.pairs, self.last_stats = msg.stats.objects, msg.stats.pairs, msg.stats
            self.metrics.frame_applied(self.name, msg.stats)
            if occupancy is not None:
                self.metrics.set_occupancy(self.name, occupancy)
            for sub in list(self.subscribers):
                sub.offer(msg)
            return msg

        enqueued = [time.perf_counter()]
        try:
            return self.submit(work, after, self._rejected)
        except Exception as exc:
            self._rejected(exc)
            raise

    def _rejected(self, exc: BaseException) -> None:
        self.rejected += 1
        self.metrics.frame_rejected(self.name, outcome(exc))

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
        if not self.closed:
            self.metrics.set_subscribers(self.name, len(self.subscribers))

    def info(self) -> world_pb2.WorldInfo:
        stats = world_pb2.WorldStats(objects=self.objects, pairs=self.pairs, frames=self.frames,
                                     frames_rejected=self.rejected, queue_depth=self.queue.qsize(),
                                     subscribers=len(self.subscribers))
        if self.last_stats is not None:
            stats.last_frame.CopyFrom(self.last_stats)
        return world_pb2.WorldInfo(name=self.name, config=codec.config_message(self.config, self.expected_objects),
                                   stats=stats)

    def close(self) -> None:
        """Deleted: queued jobs fail with NOT_FOUND, subscribers' streams end, the worker stops."""
        self.closed = True
        while not self.queue.empty():
            job = self.queue.get_nowait()
            if job is not _END and not job.future.done():
                job.future.set_exception(WorldNotFound(self.name))
        self.queue.put_nowait(_END)
        for sub in list(self.subscribers):
            sub.offer(_END)

    async def drain(self) -> None:
        """Shutdown: answer every queued job, then stop the worker."""
        self.closed = True
        await self.queue.put(_END)
        await self.task
        for sub in list(self.subscribers):
            sub.offer(_END)


class Registry:
    """The server's worlds by name."""

    def __init__(self, pool: Executor, metrics: Metrics, *, queue_size: int = 64, subscriber_limit: int = 1024,
                 max_worlds: int = 256, engine_threads: int = 0, validate: bool = False,
                 world_factory: Callable[[Any], Any] | None = None):
        self.pool = pool
        self.metrics = metrics
        self.queue_size = queue_size
        self.subscriber_limit = subscriber_limit
        self.max_worlds = max_worlds
        self.engine_threads = engine_threads
        self.validate = validate
        self.world_factory = world_factory
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
            world = await asyncio.get_running_loop().run_in_executor(self.pool, factory, config)
        finally:
            self._pending.discard(name)
        runner = WorldRunner(name, world, config, int(config_msg.expected_objects), self.pool, self.metrics,
                             self.queue_size, self.subscriber_limit, self.validate)
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
