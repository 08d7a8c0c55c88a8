"""Pair manager kernels: an open-addressing hash whose entries index one contiguous pair array.

Layout of one pair set (it may live inside a larger arena, hence the base offsets):

    slots[sb : sb + cap]      int32   index into the pair array, -1 = empty slot; cap is a power of two
    keys[pb : pb + cap // 2]  uint64  pair keys (min handle << 32 | max handle), densely packed [0, n)
    pay[pb : pb + cap // 2]   any     one payload per pair (per-cell flags, or the world's cell count)

Linear probing after a Murmur finalizer; removal uses backward shift (no tombstones) and moves the
last pair into the hole, so the active pairs always form one contiguous array (Terdiman 001 §6,
Box2D ``b2RemoveKey``). The owner keeps the load factor at or below 1/2 (``cap >= 2 * n``).

Indices into the arrays are cast to unsigned: numba checks every signed index for a negative value (and
wraps it around), which in these probe loops costs about as much as the probe.
"""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, njit
from .hashing import hash_u64


@njit(**NJIT_INLINE)
def pair_set_find_slot(slots, keys, sb, cap, pb, key):
    """Slot position (0..cap-1) holding ``key``, or -1."""
    mask = cap - 1
    i = np.int64(hash_u64(key) & np.uint64(mask))
    while True:
        p = slots[np.uint64(sb + i)]
        if p < 0:
            return -1
        if keys[np.uint64(pb + p)] == key:
            return i
        i = (i + 1) & mask


@njit(**NJIT_INLINE)
def pair_set_find(slots, keys, sb, cap, pb, key):
    """Index of ``key`` in the pair array, or -1."""
    if cap == 0:
        return -1
    i = pair_set_find_slot(slots, keys, sb, cap, pb, key)
    if i < 0:
        return -1
    return slots[np.uint64(sb + i)]


@njit(**NJIT_INLINE)
def pair_set_probe(slots, keys, sb, cap, pb, key):
    """Slot position (0..cap-1) holding ``key``, or else the empty one where it would go (``slots`` there
    < 0; ``pair_set_insert_at`` puts it there): a find and an insert of an absent key in one probe."""
    mask = cap - 1
    i = np.int64(hash_u64(key) & np.uint64(mask))
    while True:
        p = slots[np.uint64(sb + i)]
        if p < 0 or keys[np.uint64(pb + p)] == key:
            return i
        i = (i + 1) & mask


@njit(**NJIT_INLINE)
def pair_set_insert_at(slots, keys, pay, sb, pb, n, i, key, value):
    """Append ``key`` with payload ``value`` at the empty slot position ``i`` of ``pair_set_probe``;
    returns the new count n + 1."""
    slots[np.uint64(sb + i)] = n
    keys[np.uint64(pb + n)] = key
    pay[np.uint64(pb + n)] = value
    return n + 1


@njit(**NJIT_INLINE)
def pair_set_insert(slots, keys, pay, sb, cap, pb, n, key, value):
    """Append ``key`` (known to be absent) with payload ``value``; returns the new count n + 1."""
    mask = cap - 1
    i = np.int64(hash_u64(key) & np.uint64(mask))
    while slots[np.uint64(sb + i)] >= 0:
        i = (i + 1) & mask
    slots[np.uint64(sb + i)] = n
    keys[np.uint64(pb + n)] = key
    pay[np.uint64(pb + n)] = value
    return n + 1


@njit(**NJIT_INLINE)
def pair_set_remove_slot(slots, keys, pay, sb, cap, pb, n, i):
    """Remove the pair held by slot position ``i``; returns the new count n - 1."""
    mask = cap - 1
    p = slots[np.uint64(sb + i)]
    # backward-shift deletion: pull later entries of the probe run into the hole
    j = i
    while True:
        j = (j + 1) & mask
        q = slots[np.uint64(sb + j)]
        if q < 0:
            break
        home = np.int64(hash_u64(keys[np.uint64(pb + q)]) & np.uint64(mask))
        # move q back to i unless its home lies cyclically in (i, j]
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            slots[np.uint64(sb + i)] = q
            i = j
    slots[np.uint64(sb + i)] = -1
    # keep the pair array dense: move the last pair into the hole
    last = n - 1
    if p != last:
        lk = keys[np.uint64(pb + last)]
        s = pair_set_find_slot(slots, keys, sb, cap, pb, lk)
        slots[np.uint64(sb + s)] = p
        keys[np.uint64(pb + p)] = lk
        pay[np.uint64(pb + p)] = pay[np.uint64(pb + last)]
    return last


@njit(**NJIT)
def pair_set_rehash(slots, keys, sb, cap, pb, n):
    """Rebuild the slot table of a pair set from its dense pair array."""
    for i in range(cap):
        slots[np.uint64(sb + i)] = -1
    mask = cap - 1
    for p in range(n):
        i = np.int64(hash_u64(keys[np.uint64(pb + p)]) & np.uint64(mask))
        while slots[np.uint64(sb + i)] >= 0:
            i = (i + 1) & mask
        slots[np.uint64(sb + i)] = p
