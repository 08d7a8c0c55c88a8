"""World registry: named worlds, each taking its work (frames, queries, pair lists) one job at a time.

A stream's small frame is received, applied and answered in the server's loop (aio.py); every other
job runs in the thread of the call pool that serves its call, which does the engine work itself: no
hand-off to another thread and back for a frame (each hand-off is a thread wake-up, tens to hundreds
of microseconds on a loaded machine: more than the rest of the service's own cost per frame).

A world runs one job at a time, in the order the jobs arrived: a caller first takes a turn in the
world's line (``WorldRunner.turn``), which is immediate when the world is idle. At most
``queue_size`` jobs wait; one more is answered RESOURCE_EXHAUSTED. Each world has a line of its own;
the engine releases the GIL, and how parallel kernels of different worlds share the cores is said in
sapcore/API.md.

This module speaks numpy arrays and engine types only: requests are decoded and answers encoded by
``protocol`` (the one protobuf boundary).

Deadlines and cancellation: a caller that goes away leaves the line at once (``Caller.cancel``, a
gRPC termination callback); a job whose caller is gone when its turn comes is skipped (a frame is
then never applied). A job already running finishes (frames are atomic), and its delta still goes
to subscribers and metrics. Deleting a world answers its waiting jobs NOT_FOUND; a graceful shutdown
answers them (``Registry.close``) before the server stops.
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sapgrid.layout import pairs_digest

from .interest import RegionDelta, RegionView
from . import kernels, protocol, tracing
from .digest import digest_step
from .errors import (Cancelled, Exhausted, InvalidInput, ShuttingDown, Unavailable, WorldExists, WorldNotFound,
                     outcome)
from .metrics import Metrics
from .snapshot import State
from .writers import Writers

log = logging.getLogger("sapgrid.server")

NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
OCCUPANCY_PERIOD_S = 1.0
_END = object()

# states of a Turn
WAITING, GRANTED, CANCELLED, REFUSED = range(4)


class Turn:
    """One job's place in a world's line."""

    __slots__ = ("event", "state", "error")

    def __init__(self):
        self.event = threading.Event()
        self.state = WAITING
        self.error: BaseException | None = None


class Caller:
    """The call a job is for: ``active()`` while its client waits; ``cancel`` (the call's termination
    callback) takes its waiting turn, if any, out of the line.

    One per call, registered once (``context.add_callback``), so a long stream does not add a callback
    per frame. context None: a caller that never goes away (in-process use, tests). identity: the call's
    authenticated identity (``auth.identity``, read once a call: None without auth, whose lookup on the
    server's call context is a miss that raises and catches an AttributeError, ~1 us of every frame).
    """

    __slots__ = ("context", "runner", "turn", "gone", "identity")

    def __init__(self, context=None, identity=None):
        self.context = context
        self.identity = identity
        self.runner: WorldRunner | None = None
        self.turn: Turn | None = None
        self.gone = False
        if context is not None and not context.add_callback(self.cancel):
            self.gone = True                          # already terminated

    def active(self) -> bool:
        return not self.gone and (self.context is None or self.context.is_active())

    def cancel(self) -> None:
        self.gone = True
        runner, turn = self.runner, self.turn
        if runner is not None and turn is not None:
            runner._cancel(turn)


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


@dataclass(slots=True)
class Applied:
    """An applied frame: the engine's Delta, where it stands in the world, the service's seconds.

    encoded: the serialized Delta, made once by ``protocol.delta_bytes`` for the caller and every
    subscriber. occupancy: a cell occupancy sample (about once a second) or None.
    """

    world: str
    seq: int
    frame: int                        # frames the world has applied, this one included
    delta: Any                        # sapcore.Delta
    queue_s: float = 0.0
    server_s: float = 0.0
    occupancy: Any = None
    encoded: bytes | None = None
    digest: int = 0                   # the world's pair digest after the frame
    duplicate: bool = False           # a writer's frame applied before: ``encoded`` is its first answer
    sync: Any = None                  # (log, position) the answer waits for under --fsync always


class MemoryBudget:
    """Estimated memory per world and for the whole server, checked before it is taken: at CreateWorld
    (the grid's cells) and for every frame that adds objects. A world's figure is its arrays' bytes
    (``World.memory_bytes``) after its last frame that added objects; a frame's adds are counted at
    ``PER_OBJECT`` bytes each (the engine's budget of 300 B an object, with room for its pairs).
    0 turns a limit off."""

    PER_CELL = 64            # bytes a grid cell holds before any object (its SAP and pair-set bookkeeping)
    PER_OBJECT = 400

    def __init__(self, world_bytes: int = 0, server_bytes: int = 0):
        self.world_bytes, self.server_bytes = world_bytes, server_bytes
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def _check(self, name: str, want: int, what: str) -> None:
        """Under the lock: refuse ``want`` bytes for world ``name`` beyond either limit."""
        if self.world_bytes and want > self.world_bytes:
            raise Exhausted(f"world {name!r}: {what} would take ~{want >> 20} MiB, more than the per-world memory "
                            f"budget of {self.world_bytes >> 20} MiB (--max-world-bytes)", "world")
        total = sum(self._held.values()) - self._held.get(name, 0) + want
        if self.server_bytes and total > self.server_bytes:
            raise Exhausted(f"world {name!r}: {what} would bring the server to ~{total >> 20} MiB, more than its "
                            f"memory budget of {self.server_bytes >> 20} MiB (--max-server-bytes)", "world")

    def open_world(self, name: str, cells: int) -> None:
        with self._lock:
            want = cells * self.PER_CELL + (1 << 20)
            self._check(name, want, f"a grid of {cells} cells")
            self._held[name] = want

    def check_adds(self, name: str, n_add: int) -> None:
        with self._lock:
            self._check(name, self._held.get(name, 0) + n_add * self.PER_OBJECT, f"{n_add} more objects")

    def held(self, name: str, nbytes: int) -> None:
        with self._lock:
            if name in self._held:
                self._held[name] = nbytes

    def close_world(self, name: str) -> None:
        with self._lock:
            self._held.pop(name, None)


def _bytes_of(applied) -> int:
    """What an applied frame holds in a subscriber's buffer: its pair arrays and a message's overhead."""
    return applied.delta.created.nbytes + applied.delta.deleted.nbytes + 256


class Subscriber:
    """A Subscribe stream's buffer: applied frames, then the end; ``dropped`` when it fell too far behind:
    more than ``limit`` frames, or more than ``byte_limit`` bytes of them, waiting.

    ``offer`` never blocks (the world never waits for a subscriber); ``next`` blocks its own thread.
    """

    def __init__(self, limit: int, view=None, byte_limit: int = 64 << 20):
        self.limit = limit
        self.byte_limit = byte_limit
        self.view = view                  # interest.RegionView of a region subscription, else None
        self.dropped = False
        self._items: deque = deque()
        self._bytes = 0
        self._ended = False
        self._ready = threading.Condition(threading.Lock())

    def offer(self, item) -> None:
        with self._ready:
            if self._ended:
                return
            if item is not _END:
                size = _bytes_of(item)
                if len(self._items) >= self.limit or self._bytes + size > self.byte_limit:
                    self.dropped = True
                    item = _END
                else:
                    self._bytes += size
            if item is _END:
                self._ended = True
            self._items.append(item)
            self._ready.notify()

    def end(self) -> None:
        self.offer(_END)

    def next(self, timeout: float | None = None):
        """The next Applied frame, or None at the end of the stream (or after ``timeout`` seconds)."""
        with self._ready:
            if not self._items and not self._ready.wait_for(lambda: self._items, timeout):
                return None
            item = self._items.popleft()
            if item is not _END:
                self._bytes -= _bytes_of(item)
        return None if item is _END else item


@dataclass
class WorldRunner:
    """One world: the engine object, its line of jobs, subscribers and live counters."""

    name: str
    world: Any
    config: Any                       # sapcore.WorldConfig
    expected_objects: int
    metrics: Metrics
    queue_size: int
    subscriber_limit: int
    subscriber_bytes: int
    budget: MemoryBudget
    generation: int = 0               # see WorldInfo.generation in the contract
    validate: bool = False
    frames: int = 0
    rejected: int = 0
    objects: int = 0
    pairs: int = 0
    last: Applied | None = None       # the last applied frame
    digest: int = 0                   # pair digest of the active pairs (sapgrid.layout.pairs_digest)
    frozen: bool = False              # frames refused UNAVAILABLE "moving" (FreezeWorld)
    writers: Writers = field(default_factory=Writers)
    log: Any = None                   # storage.WorldLog of a server with a data directory, else None
    heavy: Any = None                 # heavy.HeavyFrames: the lower-priority thread of big frames, or None
    closed: bool = False              # no new jobs (deleted, or the server is shutting down)
    deleted: bool = False             # deleted: its metric series are gone

    def __post_init__(self):
        self._mutex = threading.Lock()           # guards the line, busy, subscribers, closed/deleted
        self._line: deque[Turn] = deque()        # waiting jobs, oldest first
        self._busy = False
        self._depth_shown = -1                   # the queue depth last set on its gauge (-1: none yet)
        self._idle = threading.Condition(self._mutex)
        self._idle_waiters = 0                   # threads in ``_wait_idle``: ``_next`` notifies only them
        self._subscribers: set[Subscriber] = set()
        self._last_occupancy = -1e9
        self._series = None                      # its metrics.FrameSeries record (``published``)
        self.dims = self.config.dims             # (its config never changes; read by every frame)

    @property
    def pending(self) -> list[Turn]:
        """The jobs waiting for their turn (a snapshot)."""
        with self._mutex:
            return list(self._line)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def queue_depth(self) -> int:
        return len(self._line)

    # ---- the line ---------------------------------------------------------------------------
    def _refusal(self) -> BaseException:
        return WorldNotFound(self.name) if self.deleted else ShuttingDown("server is shutting down")

    @contextlib.contextmanager
    def turn(self, caller: Caller):
        """Hold the world for one job (waiting in line if it is busy); yields the seconds waited."""
        waited = self._take_turn(caller)
        try:
            yield waited
        finally:
            self._next()

    def _take_turn(self, caller: Caller, now: bool = False) -> float | None:
        """The world for one job (waiting in line if it is busy): the seconds waited (0.0 when it was free).
        The caller hands it on with ``_next`` when the job is done (``turn``; a frame's ``apply`` calls both
        itself: a context manager's generator costs a few microseconds of every frame).
        now: only if the world is free (and nobody waits): None, and nothing taken, if it is not."""
        with self._mutex:
            if self.closed:
                raise self._refusal()
            if not self._busy:
                self._busy = True
                turn = None
            elif now:
                return None
            else:
                if len(self._line) >= self.queue_size:
                    raise Exhausted(f"world {self.name!r}: queue full ({self.queue_size} frames/queries waiting)")
                turn = Turn()
                self._line.append(turn)
                caller.runner, caller.turn = self, turn
                self._queue_depth()
        if turn is None:                      # the world was free: no wait (the call's termination callback
            if not caller.gone:               # sets ``gone``; no question to gRPC's call state here)
                return 0.0
        else:
            t0 = time.perf_counter()
            if caller.gone:                   # went away while we queued it
                self._cancel(turn)
            turn.event.wait()
            caller.runner = caller.turn = None
            if turn.state == REFUSED:
                raise turn.error
            if turn.state == CANCELLED:
                raise Cancelled("the caller went away before the job started")
            if caller.active():
                return time.perf_counter() - t0
        self._next()                          # gone before the job started (or since its hand-over): never run
        raise Cancelled("the caller went away before the job started")

    def _next(self) -> None:
        """The running job is done: hand the world to the oldest waiting job, or go idle."""
        with self._mutex:
            if self._line:
                turn = self._line.popleft()
                turn.state = GRANTED
                turn.event.set()
            else:
                self._busy = False
                if self._idle_waiters:           # (a notification of nobody costs ~0.15 us of a frame)
                    self._idle.notify_all()
            if len(self._line) != self._depth_shown:     # (``_queue_depth``'s test, without its call)
                self._queue_depth()

    def _cancel(self, turn: Turn) -> None:
        with self._mutex:
            if turn.state != WAITING:
                return
            turn.state = CANCELLED
            self._line.remove(turn)
            turn.event.set()
            self._queue_depth()

    def _queue_depth(self) -> None:
        """Under the mutex. A deleted world's series are gone; never re-create them. The gauge is set when
        the depth changes (a world whose frames never wait: once, at 0), not at every frame's end."""
        depth = len(self._line)
        if not self.deleted and depth != self._depth_shown:
            self._depth_shown = depth
            self.metrics.set_queue_depth(self.name, depth)

    def run(self, fn: Callable[[], Any], caller: Caller) -> Any:
        """Run a query job in order with the world's frames and return its result."""
        with self.turn(caller):
            return fn()

    # ---- frames -----------------------------------------------------------------------------
    def apply(self, arrays: dict, seq: int, received: float, caller: Caller, writer: str = "",
              raw: bytes | None = None, now: bool = False) -> Applied | None:
        """Apply one frame (``World.step`` keyword arrays) in the world's turn; return it as Applied.

        writer: the frame's writer ("" none; checked by ``writers.check_writer``): a frame it already
        applied is answered with its first answer (``Applied.duplicate``), never applied again.
        raw: the request as received, appended to the world's log (with a data directory) before the frame
        is applied. Every refusal (full line, writer's seq, log write, engine validation) raises, is
        counted, and changes nothing. Call ``published`` with the result once the caller has its answer.
        A frame of a world of ``heavy.min_objects`` objects or more runs on a heavy-frame thread (at a
        lower priority, see heavy.py) while this thread holds the world's turn and waits for it.
        now: only if nothing would wait (the server's loop applies small frames itself, see aio.py): None,
        and nothing done, if the world is busy, the frame is a heavy one, it is validated (--validate), its
        answer waits for a disk sync or the engine's kernels are still being loaded (``kernels``).
        """
        heavy = self.heavy
        adds = arrays.get("add_ids")
        n_add = 0 if adds is None else len(adds)
        if now and ((heavy is not None and heavy.takes(self.objects + n_add)) or self.validate
                    or (self.log is not None and self.log.sync_always) or not kernels.ready(self.dims)):
            return None
        try:
            waited = self._take_turn(caller, now)
            if waited is None:
                return None
            try:
                if heavy is not None and heavy.takes(self.objects + n_add):     # (in the turn: as it stands now)
                    applied = heavy.run(self._frame, arrays, seq, writer, raw, waited, received)
                else:
                    applied = self._frame(arrays, seq, writer, raw, waited, received)
            finally:
                self._next()
            if applied.sync is not None:         # --fsync always: answered once its record is on disk
                log, position = applied.sync
                log.wait_synced(position)
            return applied
        except Exception as exc:
            self.count_refusal(exc)
            raise

    def _frame(self, arrays: dict, seq: int, writer: str, raw, waited: float, received: float,
               replay: bool = False) -> Applied:
        """In the world's turn: writer check, log append, engine step, digest, writer's answer, subscribers.
        replay: recovery from the log (nothing appended, nobody to answer or notify)."""
        if writer:
            answer = self.writers.answer(writer, seq)
            if answer is not None:
                sync = None if self.log is None or replay else self.log.sync_point()
                return Applied(self.name, seq, 0, None, encoded=answer, duplicate=True, sync=sync)
        if self.frozen and not replay:
            raise Unavailable(f"world {self.name!r} is moving (frozen): its frames are refused until it is "
                              f"unfrozen or served by its new replica", "world")
        start = time.perf_counter()
        adds = arrays.get("add_ids")
        if adds is not None:
            self.budget.check_adds(self.name, len(adds))
        mark = None
        if self.log is not None and not replay:
            mark = self.log.append(raw, self.frames + 1, seq, writer)    # Unavailable if it cannot be written
        try:
            delta = self.world.step(**arrays)
        except BaseException:
            if mark is not None:
                self.log.rollback(mark)                       # the refused frame leaves the log
            raise
        if adds is not None:
            self.budget.held(self.name, self.world.memory_bytes())
        if self.validate:
            self.world.validate()
        self.frames += 1
        if len(delta.created) or len(delta.deleted):     # (most frames of a moving world: the digest stays)
            self.digest = digest_step(self.digest, delta.created, delta.deleted)
        stats = delta.stats
        self.objects, self.pairs = stats.objects, stats.pairs
        occupancy = None
        if not replay and start - self._last_occupancy >= OCCUPANCY_PERIOD_S:
            self._last_occupancy = start
            occupancy = np.asarray(self.world.cell_occupancy())
        applied = Applied(self.name, seq, self.frames, delta, waited, time.perf_counter() - received,
                          occupancy, digest=self.digest)
        if writer:
            answer = protocol.delta_bytes(applied)
            self.writers.record(writer, seq, answer)
            if mark is not None:
                self.log.append_answer(answer, self.frames, seq, writer)
        self.last = applied
        if mark is not None:
            self.log.applied(self)                            # may cut the log and start a snapshot
            if self.log.sync_always:
                applied.sync = self.log.sync_point()
        if self._subscribers and not replay:      # in frame order: still holding the world
            with self._mutex:
                subs = list(self._subscribers)
            for sub in subs:              # a region view's work is done outside the mutex
                sub.offer(applied if sub.view is None else self._region_frame(sub.view, applied))
        return applied

    def set_frozen(self, frozen: bool) -> None:
        """FreezeWorld, in the world's turn (between two frames). With a data directory the flag is on disk
        first (a restart keeps it); Unavailable, and nothing changed, if it cannot be written."""
        if self.log is not None:
            self.log.set_frozen(frozen)
        self.frozen = frozen

    def replay(self, arrays: dict, seq: int, writer: str) -> Applied:
        """Recovery: apply a frame of the log as it was applied before (no log append, no answer)."""
        return self._frame(arrays, seq, writer, None, 0.0, time.perf_counter(), replay=True)

    def state(self) -> State:
        """A copy of everything the world is made of, for a snapshot. Call it in the world's turn."""
        c = self.config
        ids, boxes, category, mask, static = self.world.export()
        return State(self.name, c.dims, tuple(c.bounds), tuple(c.cells), int(c.threads or 0), int(c.max_objects),
                     float(c.coord_limit), self.expected_objects, self.frames, self.rejected, self.digest,
                     self.writers.copy_state(), ids, boxes, category, mask, static)

    def _region_frame(self, view, applied: Applied) -> Applied:
        """A region subscriber's Applied: the pairs entering and leaving its view (interest.py)."""
        world = self.world
        inside = world.query(view.region)
        entering, leaving = view.frame(inside, applied.delta.created, applied.delta.deleted, world.pairs)
        return replace(applied, delta=RegionDelta(entering, leaving, applied.delta.stats), encoded=None)

    def published(self, applied: Applied) -> None:
        """Metrics (and trace spans, when tracing is on) of an applied frame, after its answer is on its
        way: off the round trip. A duplicate's answer is not an applied frame: nothing to count."""
        if applied.duplicate:
            return
        tracing.frame(applied)
        series = self._series
        if series is None:                # the world's record of frames, taken once (never after its deletion)
            with self._mutex:
                if self.deleted:
                    return
                series = self._series = self.metrics.frame_series.world(self.name)
        # a frame published after the world's deletion counts in a record no longer exported: no lock needed
        series.applied(applied.delta.stats, applied.queue_s, applied.server_s)
        if applied.occupancy is not None:
            with self._mutex:
                if not self.deleted:
                    self.metrics.set_occupancy(self.name, applied.occupancy)

    def count_refusal(self, exc: BaseException) -> None:
        """A frame of this world was refused (here, or while it was decoded)."""
        with self._mutex:
            self.rejected += 1
            self.metrics.frame_rejected(None if self.deleted else self.name, outcome(exc))

    # ---- subscribers, stats, lifecycle ------------------------------------------------------
    def subscribe(self, region=None) -> Subscriber:
        """A subscriber of every delta, or with a region (validated values) of its view's changes."""
        try:
            view = None if region is None else RegionView(region, self.dims)
        except ValueError as exc:
            raise InvalidInput(f"region: {exc}", "region") from None
        with self._mutex:
            if self.closed:
                raise self._refusal()
            sub = Subscriber(self.subscriber_limit, view, self.subscriber_bytes)
            self._subscribers.add(sub)
            self.metrics.set_subscribers(self.name, len(self._subscribers))
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._mutex:
            self._subscribers.discard(sub)
            if sub.dropped and not self.deleted:
                self.metrics.subscriber_dropped(self.name)
            if not self.deleted:
                self.metrics.set_subscribers(self.name, len(self._subscribers))

    def _refuse_waiting(self) -> None:
        """Under the mutex: every waiting job is answered with the world's refusal; subscribers end."""
        while self._line:
            turn = self._line.popleft()
            turn.state, turn.error = REFUSED, self._refusal()
            turn.event.set()
        for sub in self._subscribers:
            sub.end()

    def delete(self, on_deleted: Callable[[], None]) -> None:
        """Deleted: waiting jobs fail with NOT_FOUND, subscribers' streams end (a running job finishes).
        ``on_deleted`` runs under the world's mutex, so no metric of this world is set after it."""
        with self._mutex:
            self.closed = self.deleted = True
            self._refuse_waiting()
            on_deleted()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no job holds the world (after ``delete``: its running job is done)."""
        with self._mutex:
            return self._wait_idle(lambda: not self._busy, timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Shutdown: take no new jobs, let the running and waiting ones finish, then end subscribers.
        False if jobs were still running or waiting after ``timeout`` seconds (the waiting ones are refused)."""
        with self._mutex:
            self.closed = True
            done = self._wait_idle(lambda: not self._busy and not self._line, timeout)
            self._refuse_waiting()
        return done

    def _wait_idle(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Under the mutex: wait on ``_idle`` until ``done()`` (counted in ``_idle_waiters`` meanwhile)."""
        self._idle_waiters += 1
        try:
            return self._idle.wait_for(done, timeout)
        finally:
            self._idle_waiters -= 1


class Registry:
    """The server's worlds by name."""

    def __init__(self, metrics: Metrics, *, queue_size: int = 64, subscriber_limit: int = 1024,
                 subscriber_bytes: int = 64 << 20, budget: MemoryBudget | None = None,
                 max_worlds: int = 256, engine_threads: int = 0, validate: bool = False,
                 world_factory: Callable[[Any], Any] | None = None, heavy=None):
        self.metrics = metrics
        self.queue_size = queue_size
        self.subscriber_limit = subscriber_limit
        self.subscriber_bytes = subscriber_bytes
        self.budget = budget or MemoryBudget()
        self._generation = 0
        self.max_worlds = max_worlds
        self.engine_threads = engine_threads
        self.validate = validate
        self.world_factory = world_factory
        self.heavy = heavy                # heavy.HeavyFrames, or None: every frame on its call's thread
        self.worlds: dict[str, WorldRunner] = {}
        self.storage = None               # storage.Storage of a server with a data directory
        self.recovering = False           # calls are refused UNAVAILABLE until the data directory is recovered
        self._pending: set[str] = set()
        self._mutex = threading.Lock()
        self._calls_done = threading.Condition(self._mutex)
        self._frame_calls = 0
        self.closing = False

    def get(self, name: str) -> WorldRunner:
        if self.recovering:
            raise Unavailable("the server is recovering its worlds from its data directory; try again soon")
        runner = self.worlds.get(name)
        if runner is None:
            raise WorldNotFound(name)
        return runner

    def list(self) -> list[WorldRunner]:
        worlds = dict(self.worlds)
        return [worlds[n] for n in sorted(worlds)]

    def create(self, name: str, config, expected_objects: int = 0, if_not_exists: bool = False,
               state: State | None = None, recovered: bool = False) -> WorldRunner:
        """A new world of ``config`` (a sapcore.WorldConfig) named ``name``; with ``state`` (a snapshot's),
        holding the snapshot's objects, counters and writers. With a data directory its files are made
        (``recovered``: they exist already) before it is served."""
        if self.recovering and not recovered:
            raise Unavailable("the server is recovering its worlds from its data directory; try again soon")
        if not NAME_RE.match(name):
            raise InvalidInput(f"name: {name[:80]!r} is not 1-64 characters of [A-Za-z0-9_.-]", "name")
        with self._mutex:
            if self.closing:
                raise ShuttingDown("server is shutting down")
            existing = self.worlds.get(name)
            if existing is not None or name in self._pending:
                if if_not_exists and existing is not None and existing.dims == config.dims:
                    return existing
                raise WorldExists(f"world {name!r} already exists", "name")
            if len(self.worlds) + len(self._pending) >= self.max_worlds:
                raise Exhausted(f"too many worlds (at most {self.max_worlds})", "name")
            self.budget.open_world(name, int(np.prod(config.cells)))
            self._pending.add(name)
        created = False
        try:
            factory = self.world_factory
            if factory is None:
                from sapcore import World as factory
            world = factory(config)
            with self._mutex:
                self._generation += 1
                generation = self._generation
            runner = WorldRunner(name, world, config, int(expected_objects), self.metrics,
                                 self.queue_size, self.subscriber_limit, self.subscriber_bytes, self.budget,
                                 generation, self.validate, heavy=self.heavy)
            if state is not None:
                self._fill(runner, state)
            if self.storage is not None and not recovered:
                runner.log = self.storage.open_world(runner)      # its first snapshot, durable
            with self._mutex:
                self.worlds[name] = runner
                self.metrics.world_created(name, len(self.worlds))
            created = True
        finally:
            with self._mutex:
                self._pending.discard(name)
            if not created:
                self.budget.close_world(name)
        log.info("world %r created: dims=%d cells=%s", name, config.dims, config.cells)
        return runner

    def _fill(self, runner: WorldRunner, state: State) -> None:
        """A new world gets a snapshot's objects in one batch insert, its counters and writers; the pairs
        must give the snapshot's digest (else INVALID_ARGUMENT: the data does not make that world)."""
        from sapcore.errors import SapcoreError

        n = len(state.ids)
        if n:
            self.budget.check_adds(runner.name, n)
            # read-only views, as the arrays of a frame from the wire are: the kernels of those (loaded as
            # the server starts, see kernels.py) serve a restore too, none compiled for writable arrays
            ids, boxes, category, mask, static = (_read_only(a) for a in (state.ids, state.boxes, state.category,
                                                                           state.mask, state.static))
            try:
                delta = runner.world.step(add_ids=ids, add_boxes=boxes, add_category=category, add_mask=mask,
                                          add_static=static)
            except SapcoreError as exc:
                raise InvalidInput(f"snapshot: its objects are not a valid world ({exc})", "chunk") from None
            self.budget.held(runner.name, runner.world.memory_bytes())
            digest = pairs_digest(delta.created)
        else:
            digest = 0
        if digest != state.digest:
            raise InvalidInput(f"snapshot: its objects give pair digest {digest:#018x}, the snapshot says "
                               f"{state.digest:#018x} (damaged or not made by this engine)", "chunk")
        runner.frames, runner.rejected, runner.digest = state.frames, state.rejected, state.digest
        runner.objects, runner.pairs = runner.world.object_count, runner.world.pair_count
        runner.writers = Writers.from_state(state.writers)

    def restore(self, name: str, state: State) -> WorldRunner:
        """A world made from a snapshot's state, named ``name`` (or the snapshot's own name when empty)."""
        from sapcore import WorldConfig
        from sapcore.errors import ConfigError

        name = name or state.name
        try:
            config = WorldConfig(dims=state.dims, bounds=state.bounds, cells=state.cells,
                                 threads=state.threads or self.engine_threads or None,
                                 max_objects=state.max_objects, coord_limit=state.coord_limit)
        except ConfigError as exc:
            raise InvalidInput(f"snapshot: its configuration is not valid ({exc})", "chunk") from None
        return self.create(name, config, state.expected_objects, state=state)

    def delete(self, name: str, recovered: bool = False) -> None:
        """Delete a world and its files. Refused UNAVAILABLE while the data directory is recovered (a world
        deleted mid-recovery would keep its files and come back at the next start); ``recovered``: the
        recovery's own undoing of a world it could not finish."""
        if self.recovering and not recovered:
            raise Unavailable("the server is recovering its worlds from its data directory; try again soon")
        with self._mutex:
            runner = self.worlds.pop(name, None)
            if runner is None:
                raise WorldNotFound(name)
            count = len(self.worlds)
        runner.delete(lambda: self.metrics.world_deleted(name, count))
        if runner.log is not None:
            runner.wait_idle()            # its running job (a frame writing its log) finishes first
            runner.log.delete()           # then its files go
        self.budget.close_world(name)
        log.info("world %r deleted", name)

    @contextlib.contextmanager
    def frame_call(self):
        """Held by every call that carries frames (ApplyFrame, StreamFrames) while it is open."""
        with self._mutex:
            self._frame_calls += 1
        try:
            yield
        finally:
            with self._mutex:
                self._frame_calls -= 1
                if not self._frame_calls:
                    self._calls_done.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Graceful shutdown (the server takes no new calls): no new worlds; the open frame calls go on
        until their clients end them (the server cancels them when its grace period ends); then every
        world finishes its running and waiting jobs, and its subscribers' streams end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._mutex:
            self.closing = True
            if not self._calls_done.wait_for(lambda: not self._frame_calls, timeout):
                log.warning("frame calls still open at the end of the shutdown grace period")
            runners = list(self.worlds.values())
        for r in runners:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not r.drain(left):
                log.warning("world %r: jobs still running at the end of the shutdown grace period", r.name)
