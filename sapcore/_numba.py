"""numba settings shared by every sapcore kernel (one place, as stumpy's config.py).

Kernels are compiled once and cached on disk (``cache=True``, in ``CACHE_DIR``: one directory per version
of sapcore's sources, see ``sources_digest``); they release the GIL (``nogil=True``)
so the server's other calls and worlds keep running while a frame is applied (all but the entry of a small
frame's one call, ``NJIT_HELD``). No kernel takes a callback, so every one of them can be cached.
"""
import os

# Worker threads sleep between parallel regions instead of spinning for milliseconds (libgomp's default):
# sapgrid runs next to a game server and other worlds, and a spinning OpenMP worker that holds a core the
# game needs turns a 2 ms frame into 30 ms (measured on the 2-core reference machine under load). They
# first wait a bounded GOMP_SPINCOUNT (10,000 spins: ~0.3 ms on that machine, ~0.1 ms on a fast one),
# which covers the gaps between one frame's kernels: waking a sleeping worker costs 30-60 us on a VM,
# two wakes a launch (worker, then caller), and a 100k-object frame launches 5-6 kernels. libgomp spins
# not at all, whatever GOMP_SPINCOUNT says, while it runs more threads than there are cores (many worlds
# stepping at once), with OMP_WAIT_POLICY=PASSIVE. Must be set before numba loads its OpenMP layer; a
# wait policy or spin count set by the user wins (a user's OMP_WAIT_POLICY alone: libgomp's spin for it).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

import hashlib  # noqa: E402
import warnings  # noqa: E402

import numba  # noqa: E402
from numba.core.errors import NumbaPerformanceWarning  # noqa: E402


def sources_digest() -> str:
    """A digest of every sapcore source file (names and bytes).

    numba keys a cached kernel by its own file's time stamp and size only: a kernel that inlines a helper of
    another file (``NJIT_INLINE``) keeps its old machine code after that file alone changes. So the cache
    lives in a directory named by this digest: any change of sapcore's sources (an upgrade, a patch) starts
    a fresh cache instead of running stale inlined code."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()[:16]


def _cache_dir() -> str:
    """Where the kernels are cached: ``NUMBA_CACHE_DIR`` (or the user's cache directory,
    ``$XDG_CACHE_HOME/sapgrid/numba``) / ``sapcore-<sources_digest>``."""
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "sapgrid", "numba")
    return os.path.join(base, f"sapcore-{sources_digest()}")


#: A cache directory of another version of sapcore's sources that no process has started from for this long
#: is removed when sapcore is imported (each upgrade or patch leaves one behind: 5-50 MB each).
STALE_CACHE_DAYS = 30


def prune_stale_caches(cache_dir: str, days: float = STALE_CACHE_DAYS, now: float | None = None) -> list[str]:
    """Mark ``cache_dir`` as in use (its time stamp: every start of sapcore touches it) and remove its
    siblings ``sapcore-*`` not touched for ``days``; return the removed paths. Best effort: a directory
    another process removes or uses meanwhile, or one this user may not remove, is left alone (numba
    recompiles a kernel whose cache files went away)."""
    import shutil
    import time

    now = time.time() if now is None else now
    base = os.path.dirname(cache_dir)
    try:
        if os.path.isdir(cache_dir):
            os.utime(cache_dir, (now, now))
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(base, name)
        if not name.startswith("sapcore-") or path == cache_dir:
            continue
        try:
            if not os.path.isdir(path) or now - os.stat(path).st_mtime < days * 86400:
                continue
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            continue
    return removed


# read by numba when each kernel module's decorators run (they import this module first)
numba.config.CACHE_DIR = CACHE_DIR = _cache_dir()
prune_stale_caches(CACHE_DIR)

# a serial twin (NJIT_SERIAL) has no loop to parallelise on purpose: numba's note about it is noise
warnings.filterwarnings("ignore", message=r"(?s).*no transformation for parallel execution was possible",
                        category=NumbaPerformanceWarning)

NJIT = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")
NJIT_PARALLEL = dict(NJIT, parallel=True)
#: The serial twin of a parallel kernel (the same body in a plain ``range`` loop, for work that runs on
#: the calling thread alone): compiled through numba's parallel pipeline all the same, which finds no
#: loop to parallelise but simplifies the inlined helpers' tuples; the plain pipeline compiled the same
#: bodies 3-6x slower (grid ranges of 1,000 boxes: 25 us against 108 us).
NJIT_SERIAL = dict(NJIT, parallel=True)
#: Small helpers that take arrays are inlined into their callers at the numba IR level: a real call
#: would pay two atomic reference-count updates per array argument, which costs more than the helper.
#: Inlined into a kernel of the plain pipeline (``NJIT``), a helper's parameters are still copies of the
#: caller's arrays, each with those two updates per call, so per iteration in a loop; the serial pipeline
#: (``NJIT_SERIAL``) propagates the copies away: a helper called in a loop (``sap_cell._apply_cell``) is
#: inlined into kernels of that pipeline only (``kernels.frame._cells_serial``).
NJIT_INLINE = dict(NJIT, inline="always")
#: A kernel that keeps the GIL: the entry of a kernel for work so short that letting other threads run
#: meanwhile costs more than it gives (``kernels.frame.frame_listed_held``). A function of its own: numba's
#: cache keys a kernel by its function and signature, not by these options.
NJIT_HELD = dict(NJIT, nogil=False)

njit = numba.njit
prange = numba.prange


def inlined(kernel):
    """A copy of ``kernel`` (a compiled function) that is inlined into its callers (``NJIT_INLINE``), for a
    kernel that is also called on its own: one body, two ways to call it. With the kernels run as Python
    (``NUMBA_DISABLE_JIT``) ``kernel`` is a plain function already and is returned as is."""
    return njit(**NJIT_INLINE)(getattr(kernel, "py_func", kernel))


def entry_point(dispatcher, args):
    """The compiled specialization that ``dispatcher`` (a kernel) ran for ``args``, as a callable that
    takes the same arguments without the dispatcher's resolution of their types; None when there is
    none (kernels run as Python, or no specialization of exactly these types).

    The resolution costs ~1.5 us a call for an argument numba cannot fingerprint in C (a ``StructRef``
    such as ``kernels.frame.ListedState`` is typed in Python): a tenth of a small frame. The caller must
    pass arguments of exactly these types afterwards (the specialization unboxes them as such, unchecked):
    it keys the callable by what decides them."""
    if numba.config.DISABLE_JIT:
        return None
    try:
        sig = tuple(dispatcher.typeof_pyval(a) for a in args)
        return dispatcher.overloads[sig].entry_point
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
