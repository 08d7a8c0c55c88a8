"""Heavy frames at the lowest CPU priority, so a small world's frame is not held up by a heavy world's.

A frame of a world holding at least ``--heavy-frame-objects`` objects (its live objects plus the frame's
adds), while a smaller world has had a frame within the last ``SMALL_ACTIVE_S``, is applied on one of the
server's heavy-frame threads instead of its call's own thread; the call thread
keeps the world's turn and waits for the result (frames stay atomic and in order, a refusal is raised
in the call as before). Each such thread lowers its own scheduling priority once, at its start, before
its first frame (Linux: per thread): its nice value up by ``--heavy-frame-nice``, and with
``--heavy-frame-policy idle`` (the default) the SCHED_IDLE policy, the kernel's class of background work
that any other thread's wake-up preempts. The engine's parallel workers that this thread's frames start
(numba's OpenMP team, one per thread that launches a parallel region) are created by it and inherit both.
Only big frames run there, so the small frames' call threads keep the default priority.

Lowered priority alone still left a small frame waiting up to one scheduler tick (4 ms at HZ=250) at
some of its thread hand-offs: a thread of the small frame's path (gRPC's poller, the call thread, the
client's) woken while not yet *eligible* in the kernel's EEVDF scheduler (it ran a little ahead of its
share) is not picked, the heavy thread goes on, and nothing makes the kernel look again before its next
tick (perf sched traces of `sapgrid bench --server spawn`: 2-4 ms gaps in which a woken server or client
thread waited behind a heavy-frame thread). So while heavy frames run on these threads, one nudge thread
per core (pinned to it, default priority) wakes every ``NUDGE_S``: each wake-up preempts the heavy
thread on that core and makes the kernel pick again, by then the waiting thread is eligible. The
nudges sleep in a compiled loop that holds no GIL (``_ticks``) and stop within ``NUDGE_TICKS``
wake-ups once no heavy frame runs; they cost a few microseconds of CPU per wake-up and core.

An unprivileged process cannot raise a thread's priority again once lowered, hence dedicated threads
that never run anything else. Where the priority cannot be lowered (not Linux, or refused), heavy
frames still run on those threads, at the process's priority (without nudges), and the server logs it.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from numba import njit, types

from .config import HEAVY_FRAME_POLICIES as POLICIES

log = logging.getLogger("sapgrid.server")

#: seconds after a small world's last frame during which heavy worlds' frames still run on the lowered threads
SMALL_ACTIVE_S = 1.0
#: how often a nudge thread wakes while heavy frames run on the heavy-frame threads
NUDGE_S = 0.001
#: wake-ups of a nudge thread between two looks at whether heavy frames still run (it holds no GIL meanwhile)
NUDGE_TICKS = 20

_usleep = types.ExternalFunction("usleep", types.int32(types.uint32))


@njit(cache=True, nogil=True)
def _ticks(us, n):
    """Sleep ``n`` times for ``us`` microseconds, without the GIL: each wake-up makes the kernel's scheduler
    pick again on this thread's core."""
    for _ in range(n):
        _usleep(us)


class HeavyFrames:
    """The heavy-frame threads: ``takes(objects)`` says whether a world of that many objects is heavy,
    ``run(fn, *args)`` calls ``fn(*args)`` on one of them and returns its result (or raises its error).

    One thread per core at most (``threads``, default the machine's cores), started as frames need them:
    heavy frames of different worlds run side by side as they did on their calls' threads (one world's
    frames stay in turn: its caller holds the world's turn while it waits). ``policy``: "idle" (SCHED_IDLE
    and the nice value) or "nice" (the nice value alone)."""

    def __init__(self, min_objects: int, nice: int, threads: int | None = None, policy: str = "idle"):
        if min_objects < 1 or not 0 <= nice <= 19 or policy not in POLICIES:
            raise ValueError(f"heavy frames: min_objects {min_objects} must be >= 1, nice {nice} in [0, 19] and "
                             f"policy {policy!r} one of {', '.join(POLICIES)}")
        self.min_objects = min_objects
        self.nice = nice
        self.policy = policy
        self.thread_nice: int | None = None        # the threads' nice value once one has started
        self.thread_policy: int | None = None      # and their scheduling policy (os.SCHED_IDLE, os.SCHED_OTHER)
        self.lowered = False                        # whether a thread's priority could be lowered
        self.native_ids: set[int] = set()           # the threads started so far
        self.nudge_ids: dict[int, int] = {}         # core -> its nudge thread's native id, once started
        self._small_at = -SMALL_ACTIVE_S - 1.0      # monotonic time of the last small world's frame
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="sapgrid-heavy", initializer=self._lower)
        self._lock = threading.Lock()
        self._busy = 0                              # heavy frames running on the threads now
        self._nudging = threading.Event()           # set while _busy (and the threads are lowered)
        self._closed = False
        self._can_nudge = sys.platform.startswith("linux")
        if self._can_nudge:
            try:
                _ticks(0, 0)                        # compiled (or loaded) now, not at a first heavy frame
            except Exception as exc:  # noqa: BLE001 (the nudges only shorten waits: never a reason not to serve)
                self._can_nudge = False
                log.warning("heavy frames run without nudge threads: their loop could not be compiled (%s)", exc)

    def _lower(self) -> None:
        """At the thread's start: its nice value up by ``nice`` (at most 19) and, with the idle policy,
        SCHED_IDLE; once."""
        tid = threading.get_native_id()
        self.native_ids.add(tid)
        if not sys.platform.startswith("linux"):      # elsewhere PRIO_PROCESS of a thread id is not the thread
            log.warning("heavy frames run at the server's priority: lowering one thread's is Linux only")
            return
        now = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + self.nice))
        except OSError as exc:
            log.warning("heavy frames run at the server's nice value: raising their thread's failed (%s)", exc)
        if self.policy == "idle":
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            except OSError as exc:
                log.warning("heavy frames run without SCHED_IDLE: setting their thread's policy failed (%s)", exc)
        self.thread_nice = os.getpriority(os.PRIO_PROCESS, tid)
        self.thread_policy = os.sched_getscheduler(tid)
        self.lowered = self.thread_nice > now or self.thread_policy == os.SCHED_IDLE

    def takes(self, objects: int) -> bool:
        """Whether a frame of a world of ``objects`` objects goes to the heavy-frame threads: a heavy world's
        while a smaller world has had a frame within ``SMALL_ACTIVE_S``. With no small world streaming there
        is no one to give way to, and a heavy frame runs on its call's thread at the default priority (a
        niced frame also gives way to its own client and the server's other threads: a 100k-object stream
        alone lost ~10% of its frames/s that way). A small frame stamps the time."""
        now = time.monotonic()
        if objects < self.min_objects:
            self._small_at = now
            return False
        return now - self._small_at < SMALL_ACTIVE_S

    def run(self, fn, *args):
        future = self._pool.submit(fn, *args)
        self._running(1)
        try:
            return future.result()
        finally:
            self._running(-1)

    def _running(self, change: int) -> None:
        """A heavy frame started (+1) or ended (-1): the nudges run while any does, on lowered threads."""
        with self._lock:
            self._busy += change
            if not self._busy:
                self._nudging.clear()
            elif self.lowered and self._can_nudge and not self._closed:
                if not self.nudge_ids:
                    self._start_nudges()
                self._nudging.set()

    def _start_nudges(self) -> None:
        cores = sorted(os.sched_getaffinity(os.getpid()))    # the process's cores (a launching thread is pinned)
        started = [threading.Event() for _ in cores]
        for core, ready in zip(cores, started):
            threading.Thread(target=self._nudge, args=(core, ready), name=f"sapgrid-nudge-{core}",
                             daemon=True).start()
        for ready in started:
            ready.wait()
        log.info("heavy frames beside small worlds: %d nudge threads (one per core) wake every %.1f ms while "
                 "heavy frames run", len(cores), NUDGE_S * 1e3)

    def _nudge(self, core: int, ready: threading.Event) -> None:
        """A nudge thread: on its core, ``_ticks`` while heavy frames run, else waiting for one."""
        try:
            os.sched_setaffinity(0, (core,))
        except OSError as exc:            # the core was taken away meanwhile: it nudges wherever it runs
            log.warning("a nudge thread could not be pinned to core %d (%s)", core, exc)
        self.nudge_ids[core] = threading.get_native_id()
        ready.set()
        us = int(NUDGE_S * 1e6)
        while True:
            self._nudging.wait()
            if self._closed:
                return
            _ticks(us, NUDGE_TICKS)

    def shutdown(self) -> None:
        self._closed = True
        self._nudging.set()               # the nudge threads see _closed and end
        self._pool.shutdown(wait=False)
