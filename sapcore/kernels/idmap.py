"""Id map kernels: client ids (uint64) -> object handles (int32), open addressing with linear probing.

    keys[cap] uint64, vals[cap] int32 (-1 = empty slot), cap a power of two, load factor <= 1/2.
"""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, njit
from .hashing import hash_u64


@njit(**NJIT_INLINE)
def idmap_find(keys, vals, key):
    mask = keys.shape[0] - 1
    i = np.int64(hash_u64(key) & np.uint64(mask))
    while True:
        v = vals[i]
        if v < 0:
            return -1
        if keys[i] == key:
            return v
        i = (i + 1) & mask


@njit(**NJIT_INLINE)
def idmap_insert(keys, vals, key, value):
    """Insert ``key`` (known to be absent)."""
    mask = keys.shape[0] - 1
    i = np.int64(hash_u64(key) & np.uint64(mask))
    while vals[i] >= 0:
        i = (i + 1) & mask
    keys[i] = key
    vals[i] = value


@njit(**NJIT)
def idmap_remove(keys, vals, key):
    """Remove ``key`` (known to be present) with backward shift."""
    mask = keys.shape[0] - 1
    i = np.int64(hash_u64(key) & np.uint64(mask))
    while keys[i] != key or vals[i] < 0:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        if vals[j] < 0:
            break
        home = np.int64(hash_u64(keys[j]) & np.uint64(mask))
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            keys[i] = keys[j]
            vals[i] = vals[j]
            i = j
    vals[i] = -1


@njit(**NJIT)
def idmap_find_many(keys, vals, ids, out):
    """out[i] = handle of ids[i] or -1; returns the index of the first unknown id, or -1."""
    first = -1
    for i in range(ids.shape[0]):
        h = idmap_find(keys, vals, ids[i])
        out[i] = h
        if h < 0 and first < 0:
            first = i
    return first


@njit(**NJIT)
def idmap_insert_many(keys, vals, ids, handles):
    for i in range(ids.shape[0]):
        idmap_insert(keys, vals, ids[i], handles[i])


@njit(**NJIT)
def idmap_remove_many(keys, vals, ids):
    for i in range(ids.shape[0]):
        idmap_remove(keys, vals, ids[i])


@njit(**NJIT)
def idmap_rebuild(old_keys, old_vals, keys, vals):
    vals[:] = -1
    for i in range(old_keys.shape[0]):
        if old_vals[i] >= 0:
            idmap_insert(keys, vals, old_keys[i], old_vals[i])
