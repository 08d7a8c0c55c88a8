"""The OS thread ids of a parallel launch's team (for ``sapcore.parallel``'s pinning)."""
import numba
from numba import types

from .._numba import NJIT_PARALLEL, njit, prange

#: glibc's gettid(2), resolved by name when the kernel is linked (so the kernel can be cached)
_gettid = types.ExternalFunction("gettid", types.int32())


@njit(**NJIT_PARALLEL)
def team_tids(out):
    """``out[t]``: the OS thread id of the team's thread t (0: the calling thread), for every thread that
    ran an iteration; ``out`` has many more entries than the team has threads, so that each gets some."""
    for i in prange(out.shape[0]):
        out[numba.get_thread_id()] = _gettid()
