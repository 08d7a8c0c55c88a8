"""How the engine's parallel kernels use the cores.

A parallel kernel with little work runs on the calling thread alone: waking the sleeping workers
(50-100 us on a VM) would cost more. A launch with more than one thread already uses every core, so
such launches of different worlds take turns (one process-wide lock) instead of oversubscribing the
cores. A launch on the calling thread alone takes no lock, so a world with ``threads=1`` (or a small
frame) never waits for another world, as long as numba's threading layer is thread safe (omp, tbb);
with the workqueue layer, which does not support concurrent launches, every launch takes the lock.

Work that would run on the calling thread alone goes to the kernel's serial twin instead (``*_serial``:
the same loop body in a plain ``range`` loop, see ``_numba.NJIT_SERIAL``; ``serial`` decides): even
with one thread, a parallel launch costs a few microseconds (numba's scheduler, the OpenMP region),
most of a small frame's kernel time, and a twin never enters the threading layer.
"""
from __future__ import annotations

import contextlib
import threading

import numba

#: Objects, cell members or pair events below which a kernel runs on the calling thread.
MIN_OPS = 32768
#: The same for the kernels that handle pair events (about 100 ns each).
MIN_EVENTS = 8192
#: The same for the cells' SAPs (``cells_apply``), in cell members and entering boxes of the touched
#: cells: a member costs about as much as the wake-up per thousand (sparse3d-10k, 17k members: the
#: apply 0.34 -> 0.26 ms a tick with 2 threads).
MIN_CELL_WORK = 4096
#: Updates below which a one-call frame (``kernels.frame.frame_listed_held``) keeps the GIL: its kernel
#: (~50 ns an object) is shorter than what releasing the GIL costs where other threads wait for it (each
#: release hands the GIL over, and taking it back means waiting behind them: two thread switches).
#: Measured in process, 16 threads each stepping a world of its own on 2 cores: CPU per frame 67 -> 23-32
#: us at 100 objects, 90-104 -> 55-58 us at 300; from ~600 objects the frames of two worlds running on
#: both cores at once are worth more (wall time per frame about even at 600, 125 against 153 us at 1,000).
HOLD_GIL_BELOW = 512

_LOCK = threading.Lock()
_SET = threading.local()          # the thread count last set on this thread (numba's setting is per thread)
_THREAD_SAFE_LAYERS = ("omp", "tbb")
_layer_safe = False               # known once a first parallel launch has chosen numba's threading layer


def _concurrent_launches_safe() -> bool:
    global _layer_safe
    if not _layer_safe:
        try:
            _layer_safe = numba.threading_layer() in _THREAD_SAFE_LAYERS
        except ValueError:        # no parallel launch yet: the layer is not chosen
            return False
    return _layer_safe


_UNLOCKED = contextlib.nullcontext()


def serial(max_threads: int, work: int, threshold: int = MIN_OPS) -> bool:
    """Does ``work`` run on the calling thread alone (then call the kernel's serial twin, no region)?"""
    return max_threads == 1 or work < threshold


def region(max_threads: int, work: int, threshold: int = MIN_OPS):
    """``with region(max_threads, work, threshold):`` around parallel kernel launches: ``max_threads``
    threads for ``work`` at or above ``threshold``, else 1 (see the module docstring for the lock).
    Returns the process-wide lock itself or a shared no-op context: it is entered several times per
    frame, and a function returning an existing context costs less than making one."""
    n = max_threads if work >= threshold else 1
    if getattr(_SET, "n", 0) != n:       # numba.set_num_threads costs microseconds: only on a change
        numba.set_num_threads(n)
        _SET.n = n
    return _LOCK if n > 1 or not _concurrent_launches_safe() else _UNLOCKED
