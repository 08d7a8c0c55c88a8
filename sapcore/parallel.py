"""How the engine's parallel kernels use the cores.

A parallel kernel with little work runs on the calling thread alone: waking the sleeping workers
(50-100 us on a VM) would cost more. Parallel kernels of different worlds take turns (one process-wide
lock): numba's workqueue threading layer does not support concurrent launches, and each launch with
more than one thread already uses every core.
"""
from __future__ import annotations

import threading

import numba

#: Objects, cell members or pair events below which a kernel runs on the calling thread.
MIN_OPS = 32768
#: The same for the kernels that handle pair events (about 100 ns each).
MIN_EVENTS = 8192

_LOCK = threading.Lock()
_SET = threading.local()          # the thread count last set on this thread (numba's setting is per thread)


class region:
    """``with region(max_threads, work, threshold):`` around parallel kernel launches: ``max_threads``
    threads for ``work`` at or above ``threshold``, else 1; the launches hold the process-wide lock.
    (A class, not a generator: it is entered several times per frame, and this costs a fifth as much.)"""

    __slots__ = ()

    def __init__(self, max_threads: int, work: int, threshold: int = MIN_OPS):
        n = max_threads if work >= threshold else 1
        if getattr(_SET, "n", 0) != n:       # numba.set_num_threads costs microseconds: only on a change
            numba.set_num_threads(n)
            _SET.n = n

    def __enter__(self):
        _LOCK.acquire()

    def __exit__(self, *exc):
        _LOCK.release()
