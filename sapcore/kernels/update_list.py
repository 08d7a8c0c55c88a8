"""Kernels of the update-list cache (``sapcore.update_list.UpdateList``): the last frame's update list
guides the next frame's handle lookups and box checks (clients usually send their objects in the same
order every frame)."""
import numpy as np

from .._numba import NJIT, njit
from .idmap import idmap_find

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
