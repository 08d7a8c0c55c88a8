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

A launch with more than one thread (OpenMP layer, Linux) pins its team (``_Pinned``): each worker to a
core of its own that is not the one the calling thread is on (a physical core of its own first, then SMT
siblings: ``workers_cores``), and the calling thread to that core until the launch ends (it gets its own
cores back then, so a server's threads still run anywhere between launches). Without it, a frame that
follows an idle gap (a game's 30 Hz tick) ran at the speed of one core: the kernel's scheduler woke the
sleeping worker on the caller's core (where a mostly idle process has the least load), and the two halves
of each kernel took turns there (crowd2d-100k paced at 30 Hz, 2 threads: 12.7-13.9 ms a frame against 7-9
ms back to back; pinned: 8.0 ms).
A frame keeps the pin from its first such launch to its end (``frame``): its launches follow one another
within milliseconds, and pinning and giving back the calling thread's cores cost three system calls each
time (~7 launches a frame at 100k objects).
Pinning is left to OpenMP itself when ``OMP_PROC_BIND``, ``OMP_PLACES`` or ``GOMP_CPU_AFFINITY`` is set
(``OMP_PROC_BIND=false`` turns both off), and skipped when the team has more threads than the cores the
calling thread may use.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
import warnings

import numba
import numpy as np

from .kernels.threads import team_tids

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
_layer = None                     # numba's threading layer, known once a first parallel launch has chosen it


def _threading_layer() -> str | None:
    global _layer
    if _layer is None:
        try:
            _layer = numba.threading_layer()
        except ValueError:        # no parallel launch yet: the layer is not chosen
            return None
    return _layer


def _concurrent_launches_safe() -> bool:
    return _threading_layer() in _THREAD_SAFE_LAYERS


_UNLOCKED = contextlib.nullcontext()


def serial(max_threads: int, work: int, threshold: int = MIN_OPS) -> bool:
    """Does ``work`` run on the calling thread alone (then call the kernel's serial twin, no region)?"""
    return max_threads == 1 or work < threshold


#: OpenMP's own binding of threads to cores, set by the user: then sapcore pins nothing itself
_OMP_BINDING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")


def _libc_getcpu():
    """glibc's sched_getcpu(3) (the core the calling thread runs on), or None where there is none."""
    try:
        f = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_int
    f.argtypes = []
    return f


_getcpu = _libc_getcpu()


@functools.cache
def _physical_cores() -> dict:
    """Each CPU's physical core, as the list of its SMT siblings (Linux's sysfs); {} where unknown. Read at
    the first pinned launch, not at import."""
    base = "/sys/devices/system/cpu"
    out = {}
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        if name.startswith("cpu") and name[3:].isdigit():
            try:
                with open(f"{base}/{name}/topology/thread_siblings_list") as f:
                    out[int(name[3:])] = f.read().strip()
            except OSError:
                continue
    return out


def workers_cores(here: int, cpus, core_of: dict | None = None) -> list[int]:
    """The CPUs for a team's workers when its calling thread runs on ``here``: every CPU of ``cpus`` but
    ``here``, those on a physical core no earlier one shares (nor ``here``) first, in order, then the SMT
    siblings (a worker beside the caller on one core would share its execution units)."""
    core_of = _physical_cores() if core_of is None else core_of
    used = {core_of.get(here, here)}
    first, rest = [], []
    for c in sorted(cpus):
        if c == here:
            continue
        k = core_of.get(c, c)
        if k in used:
            rest.append(c)
        else:
            used.add(k)
            first.append(c)
    return first + rest


@functools.lru_cache(maxsize=256)
def _workers_cores_of(here: int, cpus: frozenset) -> tuple:
    """``workers_cores`` of a launch, remembered: it depends only on the caller's core and cores, which
    rarely change from one launch to the next."""
    return tuple(workers_cores(here, cpus))


#: does sapcore pin the workers of its launches (Linux, glibc, no binding of OpenMP's own asked for)?
_PIN = (_getcpu is not None and hasattr(os, "sched_setaffinity")
        and not any(os.environ.get(k) for k in _OMP_BINDING))


class _Pinned:
    """The context of one thread's launches with more than one thread: the process-wide lock, and for the
    launch the calling thread on the core it is on and each worker of its OpenMP team on a core of its own
    among the others, physical cores of their own first (``workers_cores``; see the module docstring);
    the calling thread gets its own cores back at the end.
    One per thread: OpenMP keeps a pool of workers per thread that launches. Its workers are found once,
    by a launch that reports their OS thread ids; at each launch, those whose core is not the one they
    should have now (the calling thread moved) are pinned again. Pinning only speeds a launch up: an error
    on the way (a core taken away meanwhile) turns it off for the thread, with a warning, and the launch
    goes on unpinned."""

    def __init__(self):
        self.tids: list[int] = []      # the team's workers (OS thread ids)
        self.cores: list[int] = []     # the core each is pinned to (-1: not yet)
        self.ok = True
        self.saved = None              # the calling thread's own cores, given back when the launch ends
        self.held = 0                  # frames open on this thread (``frame``): the pin stays until they end
        self.holding = _Held(self)

    def __enter__(self):
        _LOCK.acquire()
        try:
            if self.ok and _threading_layer() == "omp":
                self._pin()
        except Exception as e:  # noqa: BLE001 (never a reason for a frame to fail)
            self.ok = False
            self._restore_quietly()
            warnings.warn(f"sapcore: threads of parallel kernels no longer pinned to cores on this thread: {e!r}",
                          RuntimeWarning, stacklevel=2)
        except BaseException:
            self._restore_quietly()
            _LOCK.release()
            raise
        return self

    def _pin(self) -> None:
        n = _SET.n
        if self.saved is not None and n - 1 <= len(self.tids):
            return                     # pinned by an earlier launch of the frame (``frame``), workers too
        if n - 1 > len(self.tids):
            tids = np.zeros(64 * n, np.int64)
            team_tids(tids)
            workers = [int(t) for t in tids[1:n] if t != 0]
            if len(set(workers)) != n - 1 or threading.get_native_id() in workers:
                raise RuntimeError(f"a team of {n} threads reported the thread ids {tids[:n].tolist()}")
            self.tids, self.cores = workers, [-1] * len(workers)
        here = _getcpu()
        mine = os.sched_getaffinity(0)
        if here not in mine or n > len(mine):
            return
        others = _workers_cores_of(here, frozenset(mine))
        os.sched_setaffinity(0, (here,))
        self.saved = mine
        for k in range(n - 1):
            if self.cores[k] != others[k]:
                os.sched_setaffinity(self.tids[k], (others[k],))
                self.cores[k] = others[k]

    def _restore(self) -> None:
        if self.saved is not None:
            saved, self.saved = self.saved, None
            os.sched_setaffinity(0, saved)

    def _restore_quietly(self) -> None:
        try:
            self._restore()
        except OSError:
            self.ok = False

    def __exit__(self, *exc):
        try:
            if not self.held:
                self._restore_quietly()
        finally:
            _LOCK.release()
        return False


class _Held:
    """The context of ``frame``: the thread's launches keep their pin until the outermost frame ends."""

    __slots__ = ("pinned",)

    def __init__(self, pinned: _Pinned):
        self.pinned = pinned

    def __enter__(self):
        self.pinned.held += 1
        return self

    def __exit__(self, *exc):
        p = self.pinned
        p.held -= 1
        if not p.held:
            p._restore_quietly()
        return False


def _pinned() -> _Pinned:
    p = getattr(_SET, "pinned", None)
    if p is None:
        p = _SET.pinned = _Pinned()
    return p


def _forget_team() -> None:
    """In a child process: the forking thread's team (and its thread ids) stayed with the parent."""
    _SET.__dict__.pop("pinned", None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_team)


def frame(max_threads: int):
    """``with frame(max_threads):`` around one frame of a world: the calling thread stays pinned from the
    frame's first launch with more than one thread to the frame's end (see the module docstring), its
    workers too; the process-wide lock is still taken by each launch alone, so other worlds' launches
    run between this frame's."""
    if max_threads > 1 and _PIN:
        return _pinned().holding
    return _UNLOCKED


def region(max_threads: int, work: int, threshold: int = MIN_OPS):
    """``with region(max_threads, work, threshold):`` around parallel kernel launches: ``max_threads``
    threads for ``work`` at or above ``threshold``, else 1 (see the module docstring for the lock and
    the pinning). Returns an existing context (the thread's ``_Pinned``, the process-wide lock itself or
    a shared no-op context): it is entered several times per frame, and a function returning an existing
    context costs less than making one."""
    n = max_threads if work >= threshold else 1
    if getattr(_SET, "n", 0) != n:       # numba.set_num_threads costs microseconds: only on a change
        numba.set_num_threads(n)
        _SET.n = n
    if n > 1:
        return _pinned() if _PIN else _LOCK
    return _UNLOCKED if _concurrent_launches_safe() else _LOCK
