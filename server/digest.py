"""The world's pair digest kept per frame (``sapgrid.layout.digest_step``), in one compiled pass.

``sapgrid.layout.pairs_digest`` defines the digest with numpy: about a dozen array operations per
call, each with its own fixed cost, which for the few pairs of a frame is most of its ~25 us (twice
a frame). The kernel here computes the same sum mod 2^64 of splitmix64(lo ^ splitmix64(hi)) over the
created pairs minus the deleted ones, in one loop of uint64 arithmetic (wrapping, as numpy's), and
is checked against ``layout.pairs_digest`` by the tests. The kernel keeps the GIL: releasing it for a
few microseconds would cost a hand-over to another thread and back when the server is busy; a delta of
``NOGIL_PAIRS`` pairs or more takes its twin that releases it.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_U64 = np.dtype(np.uint64)
_INT64_MAX, _WRAP, _MASK = (1 << 63) - 1, 1 << 64, (1 << 64) - 1


@njit(cache=True, inline="always")
def _mix(x):
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    return x ^ (x >> _S31)


@njit(cache=True)          # holds the GIL: a few microseconds, less than handing the GIL over and back
def _step(digest, created, deleted):
    """The digest's bits in and out as an int64 (``digest_step``: a Python int is passed as one without a
    numpy scalar, 0.16 us); the sum is uint64's, wrapping."""
    d = np.uint64(digest)
    for i in range(created.shape[0]):
        d += _mix(created[i, 0] ^ _mix(created[i, 1]))
    for i in range(deleted.shape[0]):
        d -= _mix(deleted[i, 0] ^ _mix(deleted[i, 1]))
    return np.int64(d)


# The same loop without the GIL, for a large delta (a heavy world's frame: 170k pairs, ~0.4 ms): other calls'
# frames run meanwhile instead of waiting for the GIL.
@njit(cache=True, nogil=True)
def _step_nogil(digest, created, deleted):
    return _step(digest, created, deleted)

#: Pairs (created + deleted) from which the digest is computed without the GIL.
NOGIL_PAIRS = 4096


def _pairs(p) -> np.ndarray:
    """``p`` as uint64 (K, 2) pairs: a Delta's own arrays as they are (no call of numpy's)."""
    a = p if type(p) is np.ndarray else np.asarray(p)
    if a.dtype is not _U64 or a.ndim != 2 or a.shape[1] != 2:
        a = np.asarray(a, np.uint64).reshape(-1, 2)
    return a


def digest_step(digest: int, created, deleted) -> int:
    """``sapgrid.layout.digest_step(digest, created, deleted)``: the same value."""
    if not len(created) and not len(deleted):        # most frames of a moving world: no pair starts or ends
        return int(digest)
    created, deleted = _pairs(created), _pairs(deleted)
    step = _step_nogil if len(created) + len(deleted) >= NOGIL_PAIRS else _step
    d = int(digest)
    return step(d - _WRAP if d > _INT64_MAX else d, created, deleted) & _MASK
