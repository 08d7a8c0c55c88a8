"""Heavy frames at a lower CPU priority, so a small world's frame is not held up by a heavy world's.

A frame of a world holding at least ``--heavy-frame-objects`` objects (its live objects plus the frame's
adds), while a smaller world has had a frame within the last ``SMALL_ACTIVE_S``, is applied on one of the
server's heavy-frame threads instead of its call's own thread; the call thread
keeps the world's turn and waits for the result (frames stay atomic and in order, a refusal is raised
in the call as before). Each such thread lowers its own scheduling priority once, at its start, by
``--heavy-frame-nice`` (Linux: the nice value is per thread, ``setpriority(PRIO_PROCESS, tid)``), before
its first frame; the engine's parallel workers that this thread's frames start (numba's OpenMP team,
one per thread that launches a parallel region) are created by it and inherit its nice value. Only
big frames run there, so the small frames' call threads keep the default priority and the kernel's
scheduler (CFS: a nice-10 thread weighs ~1/10 of a nice-0 one) runs a small frame as soon as it
arrives, taking the core from a heavy frame's kernels instead of waiting for a time slice.

An unprivileged process cannot raise a thread's priority again once lowered, hence dedicated threads
that never run anything else. Where the priority cannot be lowered (not Linux, or refused), heavy
frames still run on those threads, at the process's priority, and the server logs it.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("sapgrid.server")

#: seconds after a small world's last frame during which heavy worlds' frames still run on the niced threads
SMALL_ACTIVE_S = 1.0


class HeavyFrames:
    """The heavy-frame threads: ``takes(objects)`` says whether a world of that many objects is heavy,
    ``run(fn, *args)`` calls ``fn(*args)`` on one of them and returns its result (or raises its error).

    One thread per core at most (``threads``, default the machine's cores), started as frames need them:
    heavy frames of different worlds run side by side as they did on their calls' threads (one world's
    frames stay in turn: its caller holds the world's turn while it waits)."""

    def __init__(self, min_objects: int, nice: int, threads: int | None = None):
        if min_objects < 1 or not 0 <= nice <= 19:
            raise ValueError(f"heavy frames: min_objects {min_objects} must be >= 1 and nice {nice} in [0, 19]")
        self.min_objects = min_objects
        self.nice = nice
        self.thread_nice: int | None = None        # the threads' nice value once one has started
        self.native_ids: set[int] = set()           # the threads started so far
        self._small_at = -SMALL_ACTIVE_S - 1.0      # monotonic time of the last small world's frame
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="sapgrid-heavy", initializer=self._lower)

    def _lower(self) -> None:
        """At the thread's start: its nice value up by ``nice`` (at most 19), once."""
        tid = threading.get_native_id()
        self.native_ids.add(tid)
        if not sys.platform.startswith("linux"):      # elsewhere PRIO_PROCESS of a thread id is not the thread
            log.warning("heavy frames run at the server's priority: lowering one thread's is Linux only")
            return
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + self.nice))
            self.thread_nice = os.getpriority(os.PRIO_PROCESS, tid)
        except OSError as exc:
            log.warning("heavy frames run at the server's priority: lowering their thread's failed (%s)", exc)

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
        return self._pool.submit(fn, *args).result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)
