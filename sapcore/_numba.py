"""numba settings shared by every sapcore kernel (one place, as stumpy's config.py).

Kernels are compiled once and cached on disk (``cache=True``); they release the GIL (``nogil=True``)
so the server's other calls and worlds keep running while a frame is applied. No kernel takes a
callback, so every one of them can be cached.
"""
import os

# Worker threads sleep between parallel regions instead of spinning: sapgrid runs next to a game server
# and other worlds, and a spinning OpenMP worker that holds a core the game needs turns a 2 ms frame
# into 30 ms (measured on the 2-core reference machine under load). Must be set before numba loads
# its OpenMP layer; an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402

NJIT = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")
NJIT_PARALLEL = dict(NJIT, parallel=True)
#: Small helpers that take arrays are inlined into their callers at the numba IR level: a real call
#: would pay two atomic reference-count updates per array argument, which costs more than the helper.
NJIT_INLINE = dict(NJIT, inline="always")

njit = numba.njit
prange = numba.prange
