"""Id map kernels: client ids (uint64) -> object handles (int32), open addressing with linear probing.

    keys[cap] uint64, vals[cap] int32 (-1 = empty slot), cap a power of two, load factor <= 1/2.
"""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, njit, prange
from .hashing import hash_u64
from .prefetch import prefetch_flat

#: Ids ahead of the one looked up (inserted, removed) whose home slots are requested from memory: the map
#: of a big world is far bigger than a cache, and each id's slot is anywhere in it.
_AHEAD = 8
_ALL_BITS = np.uint32(0xFFFFFFFF)     # the default category and mask: every bit


@njit(**NJIT_INLINE)
def _ask_ahead(keys, vals, ids, i):
    """Request the home slot (key and value) of ``ids[i + _AHEAD]``, if any, from memory."""
    if i + _AHEAD < ids.shape[0]:
        j = np.int64(hash_u64(ids[i + _AHEAD]) & np.uint64(keys.shape[0] - 1))
        prefetch_flat(keys, j)
        prefetch_flat(vals, j)


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
        _ask_ahead(keys, vals, ids, i)
        h = idmap_find(keys, vals, ids[i])
        out[i] = h
        if h < 0 and first < 0:
            first = i
    return first


@njit(**NJIT)
def idmap_insert_many(keys, vals, ids, handles):
    for i in range(ids.shape[0]):
        _ask_ahead(keys, vals, ids, i)
        idmap_insert(keys, vals, ids[i], handles[i])


@njit(**NJIT)
def objects_admit(keys, vals, ids, handles, cat, msk, static, obj_id, obj_cat, obj_mask, obj_static, alive):
    """New objects: their ids into the id map and their columns at their handles (five numpy scatters of a
    100k-object batch insert took ~2.3 ms, one kernel pass ~0.8 ms). Returns whether some new object has
    filters of its own (a category or mask other than all bits, or static): found in the same pass, where
    three numpy tests of the columns cost a small frame ~3 us."""
    idmap_insert_many(keys, vals, ids, handles)
    own = False
    for i in range(ids.shape[0]):
        h = handles[i]
        obj_id[h] = ids[i]
        obj_cat[h] = cat[i]
        obj_mask[h] = msk[i]
        obj_static[h] = static[i]
        alive[h] = 1
        own |= (cat[i] != _ALL_BITS) | (msk[i] != _ALL_BITS) | (static[i] != 0)
    return own


@njit(**NJIT)
def idmap_remove_many(keys, vals, ids):
    for i in range(ids.shape[0]):
        _ask_ahead(keys, vals, ids, i)
        idmap_remove(keys, vals, ids[i])


@njit(**NJIT)
def objects_release(keys, vals, ids, handles, alive):
    """Removed objects (``ids`` at ``handles``): out of the id map, no longer alive (one call where a
    numpy scatter of the flags cost a small frame as much again)."""
    idmap_remove_many(keys, vals, ids)
    for i in range(handles.shape[0]):
        alive[handles[i]] = 0


@njit(**NJIT)
def idmap_rebuild(old_keys, old_vals, keys, vals):
    vals[:] = -1
    for i in range(old_keys.shape[0]):
        if old_vals[i] >= 0:
            idmap_insert(keys, vals, old_keys[i], old_vals[i])


@njit(**NJIT_PARALLEL)
def idmap_lookup(keys, vals, ids, out):
    """out[i] = handle of ids[i], or -1 (parallel; the id map is only read)."""
    for i in prange(ids.shape[0]):
        _ask_ahead(keys, vals, ids, i)
        out[i] = idmap_find(keys, vals, ids[i])


@njit(**NJIT)
def frame_check_ids(keys, vals, rem_ids, upd_ids, add_ids, rem_h, upd_h, mark, known):
    """Check every id rule of a frame, given the handles of its removes and updates (-1: unknown).

    ``mark`` is a per-handle uint8 scratch array, all zero on entry and on return. ``known`` 1: the
    update handles are known to be valid and distinct (``idmap_resolve_seq`` found them all in order):
    only the removes are marked, and the updates are checked against them; 2: removes and updates are
    known to be fine (``ids_distinct_listed``): only the adds are checked; 0: everything.
    Returns (code, which, index): code 0 ok, 1 unknown id, 2 duplicate id, 3 live id re-added;
    which 0 = remove_ids, 1 = update_ids, 2 = add_ids; index = row at fault.
    """
    code, which, index = 0, 0, -1
    nr = rem_ids.shape[0]
    nu = upd_ids.shape[0]
    done = 0
    for i in range(nr + nu if known != 2 else 0):
        h = rem_h[i] if i < nr else upd_h[i - nr]
        if h < 0 or mark[h] != 0:
            code = 1 if h < 0 else 2
            which = 0 if i < nr else 1
            index = i if i < nr else i - nr
            break
        if i < nr or known == 0:
            mark[h] = 1
            done = i + 1
        elif nr == 0:
            break           # distinct valid updates and no removes: nothing to check
    # the scratch marks must come back all zero
    for i in range(done):
        mark[rem_h[i] if i < nr else upd_h[i - nr]] = 0
    if code != 0:
        return code, which, index
    # adds: not live, and no duplicate among themselves (a small scratch hash set)
    na = add_ids.shape[0]
    if na == 0:
        return 0, 0, -1
    cap = 16
    while cap < 2 * na + 1:
        cap *= 2
    seen = np.empty(cap, np.uint64)
    used = np.zeros(cap, np.uint8)
    mask = cap - 1
    for i in range(na):
        _ask_ahead(keys, vals, add_ids, i)
        k = add_ids[i]
        if idmap_find(keys, vals, k) >= 0:
            return 3, 2, i
        j = np.int64(hash_u64(k) & np.uint64(mask))
        while used[j] != 0:
            if seen[j] == k:
                return 2, 2, i
            j = (j + 1) & mask
        used[j] = 1
        seen[j] = k
    return 0, 0, -1
