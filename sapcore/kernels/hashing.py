"""Hash helpers shared by the id map and the pair managers."""
import numpy as np

from .._numba import NJIT_INLINE, njit

_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_LO32 = np.uint64(0xFFFFFFFF)
#: Bit 63 of an event key marks a "pair removed" event (handles are < 2**30, so it is free).
EVENT_REMOVED = np.uint64(1) << np.uint64(63)
KEY_MASK = ~EVENT_REMOVED


@njit(**NJIT_INLINE)
def hash_u64(k):
    """Murmur3 64-bit finalizer: a well-mixed hash of a uint64 key."""
    k = np.uint64(k)
    k ^= k >> _S33
    k *= _C1
    k ^= k >> _S33
    k *= _C2
    k ^= k >> _S33
    return k


@njit(**NJIT_INLINE)
def pair_key(a, b):
    """uint64 key of the unordered handle pair (a, b): ``min << 32 | max``."""
    if a > b:
        a, b = b, a
    return (np.uint64(a) << _S32) | np.uint64(b)


def capacity_for(count, minimum=16):
    """Power-of-two table size (``minimum`` a power of two) that keeps the load factor below 1/2: the least
    power of two above 2 * count (7 -> 16, 15 -> 32, 16 -> 64)."""
    return max(minimum, 1 << (2 * int(count)).bit_length())
