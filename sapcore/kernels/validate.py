"""Frame validation kernels: find the first bad entry of a frame without changing anything."""
import numpy as np

from .._numba import NJIT, NJIT_PARALLEL, njit, prange
from .hashing import hash_u64
from .idmap import idmap_find

# reasons for a bad box (returned as codes, turned into messages by the World)
BOX_OK = 0
BOX_NAN = 1
BOX_INF = 2
BOX_MIN_GT_MAX = 3
BOX_OUT_OF_RANGE = 4


@njit(**NJIT_PARALLEL)
def boxes_check(boxes, dims, limit, stored, handles, same):
    """First bad row of float32 boxes [K, 2*dims]: returns (row, code, axis) or (-1, 0, 0).

    Rows are checked in parallel; the answer is the lowest bad row whatever the thread count. With
    ``handles`` (int32 [K], updates of known objects; empty otherwise), a row equal to the object's
    ``stored`` box is valid already: ``same[i] = 2`` and it is not checked again (else ``same[i] = 0``).
    """
    n = boxes.shape[0]
    known = handles.shape[0] == n and n > 0
    code = np.zeros(n, np.int8)
    for i in prange(n):
        if known:
            h = handles[i]
            eq = True
            for a in range(2 * dims):
                if boxes[i, a] != stored[h, a]:
                    eq = False
            same[i] = 2 if eq else 0
            if eq:
                continue
        for a in range(dims):
            lo = boxes[i, a]
            hi = boxes[i, dims + a]
            c = BOX_OK
            if np.isnan(lo) or np.isnan(hi):
                c = BOX_NAN
            elif np.isinf(lo) or np.isinf(hi):
                c = BOX_INF
            elif lo > hi:
                c = BOX_MIN_GT_MAX
            elif abs(lo) > limit or abs(hi) > limit:
                c = BOX_OUT_OF_RANGE
            if c != BOX_OK:
                code[i] = c * 4 + a
                break
    for i in range(n):
        if code[i] != 0:
            return i, code[i] // 4, code[i] % 4
    return -1, BOX_OK, 0


@njit(**NJIT_PARALLEL)
def idmap_lookup(keys, vals, ids, out):
    """out[i] = handle of ids[i], or -1 (parallel; the id map is only read)."""
    mask = keys.shape[0] - 1
    for i in prange(ids.shape[0]):
        key = ids[i]
        j = np.int64(hash_u64(key) & np.uint64(mask))
        while vals[j] >= 0 and keys[j] != key:
            j = (j + 1) & mask
        out[i] = vals[j]


@njit(**NJIT)
def frame_check_ids(keys, vals, rem_ids, upd_ids, add_ids, rem_h, upd_h, mark):
    """Check every id rule of a frame, given the handles of its removes and updates (-1: unknown).

    ``mark`` is a per-handle uint8 scratch array, all zero on entry and on return.
    Returns (code, which, index): code 0 ok, 1 unknown id, 2 duplicate id, 3 live id re-added;
    which 0 = remove_ids, 1 = update_ids, 2 = add_ids; index = row at fault.
    """
    code, which, index = 0, 0, -1
    nr = rem_ids.shape[0]
    nu = upd_ids.shape[0]
    done = 0
    for i in range(nr + nu):
        h = rem_h[i] if i < nr else upd_h[i - nr]
        if h < 0 or mark[h] != 0:
            code = 1 if h < 0 else 2
            which = 0 if i < nr else 1
            index = i if i < nr else i - nr
            break
        mark[h] = 1
        done = i + 1
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
