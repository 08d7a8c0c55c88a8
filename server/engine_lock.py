"""Whether two worlds may run engine work at the same time.

sapcore's parallel kernels run on numba's threading layer. The ``tbb`` and ``omp`` layers accept
parallel regions launched from several threads at once; the ``workqueue`` fallback (used when
neither libtbb nor libgomp is installed, e.g. a minimal Debian without ``libgomp1``) aborts the
process on concurrent use. So the server serializes engine calls across worlds with one lock when
it cannot get a thread-safe layer; each world still runs its jobs in order either way.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import threading

log = logging.getLogger("sapgrid.server")

_SAFE_LAYERS = {"tbb": "numba.np.ufunc.tbbpool", "omp": "numba.np.ufunc.omppool"}


def threadsafe_layer() -> str | None:
    """The thread-safe numba threading layer that will be used, or None (workqueue)."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    wanted = str(numba.config.THREADING_LAYER).lower()
    if wanted == "workqueue":
        return None
    candidates = [wanted] if wanted in _SAFE_LAYERS else ["tbb", "omp"]
    for name in candidates:
        try:
            importlib.import_module(_SAFE_LAYERS[name])
            return name
        except ImportError:
            continue
    return None


def make_engine_lock(mode: str = "auto"):
    """A context manager guarding engine calls: a real lock if needed ("auto"), or always ("on"), never ("off")."""
    if mode == "on":
        need = True
    elif mode == "off":
        need = False
    else:
        layer = threadsafe_layer()
        need = layer is None
        if need:
            log.warning("numba has no thread-safe threading layer (install libgomp1 or tbb): "
                        "engine work of different worlds is serialized")
    return threading.Lock() if need else contextlib.nullcontext()
