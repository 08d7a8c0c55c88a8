"""Frame validation kernels: find the first bad entry of a frame without changing anything."""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, njit, prange
from .hashing import hash_u64
from .idmap import idmap_find

# reasons for a bad box (returned as codes, turned into messages by the World)
BOX_OK = 0
BOX_NAN = 1
BOX_INF = 2
BOX_MIN_GT_MAX = 3
BOX_OUT_OF_RANGE = 4


@njit(**NJIT_INLINE)
def _box_code(boxes, i, dims, limit):
    """0 if row i of ``boxes`` is a valid box, else ``reason * 4 + axis``."""
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
            return c * 4 + a
    return 0


@njit(**NJIT_INLINE)
def _same_box(boxes, i, stored, h, dims):
    """Is row i of ``boxes`` equal to the stored box of handle h (no branches: mostly unpredictable)?"""
    eq = True
    for a in range(2 * dims):
        eq &= boxes[i, a] == stored[h, a]
    return eq


@njit(**NJIT_INLINE)
def _stored_row(i, handles, row_of, by_row):
    """Where the stored box of update row i is: (in ``rows``?, index); see ``boxes_check``."""
    if by_row:
        return True, np.int64(i)
    if row_of.shape[0] > 0 and row_of[i] >= 0:
        return True, np.int64(row_of[i])
    return False, np.int64(handles[i])


@njit(**NJIT_INLINE)
def _unchanged(boxes, i, stored, handles, rows, row_of, by_row, dims):
    in_rows, k = _stored_row(i, handles, row_of, by_row)
    if in_rows:
        return _same_box(boxes, i, rows, k, dims)
    return _same_box(boxes, i, stored, k, dims)


@njit(**NJIT)
def _first_bad(boxes, dims, limit, stored, handles, rows, row_of, by_row):
    """(row, code, axis) of the lowest bad row (serial: only called when there is one)."""
    known = handles.shape[0] == boxes.shape[0]
    for i in range(boxes.shape[0]):
        if known and _unchanged(boxes, i, stored, handles, rows, row_of, by_row, dims):
            continue
        c = _box_code(boxes, i, dims, limit)
        if c != 0:
            return i, c // 4, c % 4
    return -1, BOX_OK, 0


@njit(**NJIT_PARALLEL)
def boxes_check(boxes, dims, limit, stored, handles, same, rows, row_of, by_row):
    """First bad row of float32 boxes [K, 2*dims]: returns (row, code, axis) or (-1, 0, 0).

    Rows are checked in parallel; the answer is the lowest bad row whatever the thread count. With
    ``handles`` (int32 [K], updates of known objects; empty otherwise), a row equal to the object's
    stored box is valid already: ``same[i] = 2`` and it is not checked again (else ``same[i] = 0``).
    The stored box of row i is ``stored[handles[i]]``, or a row of ``rows`` (the boxes of the last
    frame's list, read in about their order instead of scattered over the per-object array):
    ``rows[i]`` with ``by_row`` (this frame lists the same objects in the same order), else
    ``rows[row_of[i]]`` where ``row_of`` (int64 [K], or empty) gives one (>= 0).
    """
    n = boxes.shape[0]
    known = handles.shape[0] == n and n > 0
    bad = 0
    for i in prange(n):
        if known:
            eq = _unchanged(boxes, i, stored, handles, rows, row_of, by_row, dims)
            same[i] = 2 if eq else 0
            if eq:
                continue
        if _box_code(boxes, i, dims, limit) != 0:
            bad += 1
    if bad:
        return _first_bad(boxes, dims, limit, stored, handles if known else handles[:0], rows, row_of, by_row)
    return -1, BOX_OK, 0


#: Rows compared per block by ``list_repeats`` (its inner loops have no exit, so they vectorise).
_REPEAT_BLOCK = 1024
LIST_OTHER = 0      # the ids differ from the last list's
LIST_SAME = 1       # the same ids in the same order, some box differs
LIST_STILL = 2      # the same ids in the same order, every box equal


@njit(**NJIT)
def list_repeats(ids, last_ids, boxes, last_boxes):
    """Does a frame's update list repeat the last frame's, and with the same boxes? One pass over the
    four arrays, block by block (serial: at 100k objects a parallel launch costs more than it saves).

    ``ids``: uint64 [K], ``last_ids``: uint64 or uint32 [K]; ``boxes``, ``last_boxes``: float32 [K * 2*dims], the rows of the
    frame's update boxes and of the boxes kept by row for the last list, flat. Boxes are compared as
    floats: -0.0 equals +0.0, and a NaN equals nothing, so a frame found still holds only boxes that
    were valid when stored. Returns LIST_OTHER (stops at the first block whose ids differ), LIST_SAME
    (the boxes stop being compared at the first block that differs) or LIST_STILL.
    """
    n = ids.shape[0]
    w = boxes.shape[0] // n if n else 0
    still = True
    s = 0
    while s < n:
        e = min(s + _REPEAT_BLOCK, n)
        a = ids[s:e]
        b = last_ids[s:e]
        d = np.uint64(0)
        for i in range(a.shape[0]):
            d |= a[i] ^ b[i]
        if d != 0:
            return LIST_OTHER
        if still:
            x = boxes[w * s:w * e]
            y = last_boxes[w * s:w * e]
            c = 0
            for j in range(x.shape[0]):
                c += x[j] != y[j]
            still = c == 0
        s = e
    return LIST_STILL if still else LIST_SAME


@njit(**NJIT_PARALLEL)
def idmap_lookup(keys, vals, ids, out):
    """out[i] = handle of ids[i], or -1 (parallel; the id map is only read)."""
    for i in prange(ids.shape[0]):
        out[i] = idmap_find(keys, vals, ids[i])


@njit(**NJIT)
def idmap_resolve_seq(keys, vals, ids, last_ids, last_h, last_pos, out, hit, looked, row_of):
    """out[i] = handle of ids[i], or -1, guided by the previous frame's update list.

    Clients usually send their updates in the same order every frame, give or take the objects they
    removed or added: ``ids`` is walked alongside ``last_ids`` (whose handles are ``last_h``) and an id
    equal to the next expected one (or one of the four after it: the ones between were left out) takes
    its handle without a hash probe. Any other id is looked up in the id map, and when it sits further
    along the previous list (``last_pos[h]``, the position of handle h in it) the walk resumes after
    it. Returns the number of ids that needed a lookup: with 0, the ids are an in-order subsequence of
    ``last_ids``, hence without duplicates. ``hit[p] = 1`` (uint8, zero on entry) marks the positions
    of the last list taken without a lookup; ``looked[:lookups]`` are the rows that needed one.
    ``row_of[i]`` is the position of ids[i]'s object in the last list, or -1 when it is not on it.
    """
    n_last = last_ids.shape[0]
    j = 0
    lookups = 0
    for i in range(ids.shape[0]):
        key = ids[i]
        if j < n_last and last_ids[j] == key:
            out[i] = last_h[j]
            hit[j] = 1
            row_of[i] = j
            j += 1
            continue
        # the last list's next few ids were removed (or left out): skip them without a lookup
        skip = j + 1
        while skip < n_last and skip <= j + 4 and last_ids[skip] != key:
            skip += 1
        if skip < n_last and skip <= j + 4:
            out[i] = last_h[skip]
            hit[skip] = 1
            row_of[i] = skip
            j = skip + 1
            continue
        looked[lookups] = i
        lookups += 1
        h = idmap_find(keys, vals, key)
        out[i] = h
        row_of[i] = -1
        if h >= 0:
            p = last_pos[h]
            if 0 <= p < n_last and last_h[p] == h:
                row_of[i] = p
                if p >= j:
                    j = p + 1
    return lookups


@njit(**NJIT)
def ids_distinct_listed(rem_h, upd_h, looked, n_looked, hit, last_h, last_pos, mark):
    """After ``idmap_resolve_seq``: are the removes and the looked-up updates all known, distinct, and
    none of them one of the updates taken along the last list (``hit``)? Those are distinct already, so
    this answers for the whole frame while touching only the few entries off the list. False: the
    caller runs ``frame_check_ids`` to name the first offending entry. ``mark`` as there."""
    n_last = last_h.shape[0]
    nr = rem_h.shape[0]
    ok = True
    done = 0
    for i in range(nr + n_looked):
        h = rem_h[i] if i < nr else upd_h[looked[i - nr]]
        if h < 0 or mark[h] != 0:
            ok = False
            break
        p = last_pos[h]
        if 0 <= p < n_last and last_h[p] == h and hit[p] != 0:
            ok = False
            break
        mark[h] = 1
        done = i + 1
    for i in range(done):
        mark[rem_h[i] if i < nr else upd_h[looked[i - nr]]] = 0
    return ok


@njit(**NJIT)
def narrow_ids(a, b, out):
    """out = a then b (uint64 ids, or uint32) as uint32, if every id fits; False at the first that does
    not (``out`` then partly written)."""
    na = a.shape[0]
    big = np.uint64(0)
    for i in range(na):
        big |= np.uint64(a[i])
        out[i] = np.uint32(a[i])
    for i in range(b.shape[0]):
        big |= np.uint64(b[i])
        out[na + i] = np.uint32(b[i])
    return big <= np.uint64(0xFFFFFFFF)


@njit(**NJIT)
def set_positions(handles, pos):
    """pos[handles[i]] = i."""
    for i in range(handles.shape[0]):
        pos[handles[i]] = i


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
