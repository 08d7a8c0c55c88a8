"""Cell SAP kernels: one persistent array sweep-and-prune per grid cell, all cells in shared arenas.

Arena layout (cell c owns a region of ``cell_cap[c] + 1`` box units starting at ``cell_base[c]``):

    bx_h[base + s]                int32   object handle of local box slot s, s in [0, n)
    bx_pos[base + s, 2*a + m]     int32   position of the min (m=0) / max (m=1) endpoint on axis a
    ep_key[a, 2*base + e]         uint64  endpoint e in [0, 2n] of axis a, packed (001 "float-to-int
                                          encoding"): encode(value) << 32 | is_max << 31 | local slot;
                                          e = 0 is the sentinel, key 0, below every endpoint

Workspace, one block per worker thread: ``scratch[thread, 3, cap]`` int32 (slot renumbering, the moved
and the leaving boxes' slots, active lists of the sweep) and ``kscratch[thread, 2 * cap]`` uint64 (the
leaving endpoints' positions, the positions of the endpoints a re-sort moves, new endpoints), with cap
the largest capacity of a touched cell.

Endpoints on an axis are sorted by ``key >> 31``, that is by (value, is_max): at equal values a min
comes first, which makes touching boxes overlap (inclusive rule); one integer comparison decides. Overlap on the other axes is decided by endpoint positions
(001 §4): positions describe the current sorted order, which is what the incremental updates need.

One frame of one cell (the body of ``cells_apply``), in order:
  1. batch remove: boxes removed from the world or leaving the cell lose their pairs (a few leaving boxes'
     among many moved ones found by endpoint positions, else in the cell's pair set) and their endpoints
     leave every axis. With few moved boxes and a few leaving ones, by one pass per axis from the leaving
     boxes' first endpoint on, the staying boxes of the cell's last slots taking the leaving boxes' slots
     (every other box keeps its own); with many leaving ones, by one pass over each whole axis that
     renumbers the slots densely; with many moved boxes, by step 2's pass over each axis;
  2. update: with many moved boxes, one pass per axis gives every endpoint its box's current value
     and insertion-sorts it into place; with few (under a quarter of the cell), one box at a time gets its values and
     its endpoints move left or right to their places (Terdiman's per-object update). Every swap of a
     min and a max is one of the four rules (a min passing a max leftwards, or a max passing a min
     rightwards: overlap may start; the other two: overlap may end), decided by the positions on the
     other axes;
  3. batch insert: new endpoints are sorted and merged into each axis from the back (one pass), then
     box pruning by one sweep over axis 0 finds the new pairs (complete among the new boxes,
     bipartite new-vs-old); with only a few new boxes, each is tested directly against every box
     before it (by endpoint positions on every axis), which is cheaper than sweeping the axis.
Pair changes are written as events (pair key, bit 63 set for "removed") into the cell's slice of the
event buffer. A slice that overflows keeps counting; its cell is recomputed afterwards, never dropped.
"""
import numba
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, njit, prange
from .grid import FLAG_MOVED, FLAG_MOVED_CELLS, FLAG_REMOVED, in_crange
from .hashing import EVENT_REMOVED, pair_key
from .prefetch import prefetch_flat, prefetch_row_read


#: Endpoint keys: ``encode(value) << 32 | is_max << 31 | slot``. Ordering keys by ``key >> 31`` orders
#: endpoints by value, a min before a max at equal values (touching boxes overlap). Key 0 is the
#: sentinel at position 0 of every axis: below every encoded value.
SLOT_MASK = np.uint64(0x7FFFFFFF)
LOW32 = np.uint64(0xFFFFFFFF)
HIGH32 = np.uint64(0xFFFFFFFF00000000)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_S6 = np.uint64(6)       # a cache line is 64 bytes
_ONE = np.uint64(1)


@njit(**NJIT_INLINE)
def encode(bits):
    """Order-preserving uint32 of a finite float32 given by its bits (001 "float-to-int encoding"):
    positive values get the sign bit set, negative ones are inverted; -0.0 encodes as +0.0. Without
    branches: the sign bit, spread over the word, picks the xor mask; -0.0 (0x80000000) inverts to
    0x7FFFFFFF, one below +0.0's code, and is lifted by one."""
    u = np.uint32(bits)
    mask = np.uint32(np.int32(u) >> np.int32(31)) | np.uint32(0x80000000)
    return np.uint64((u ^ mask) + np.uint32(u == np.uint32(0x80000000)))


#: Up to this many boxes leaving a cell among few moved ones leave by a pass over each axis from their
#: first endpoint on (their endpoints' positions sorted by insertion), the cell's last boxes taking their
#: slots; more by a pass over each whole axis that renumbers every slot.
_LEAVING_FEW = 8
#: Up to this many boxes leaving a cell of many moved boxes find their pairs by positions, more (or among few
#: moved boxes) by a pass over the cell's pair set.
_LEAVING_BY_POSITION = 4

#: A world whose boxes take up to this many bytes (half of a core's L2 cache on the reference machine)
#: has them mostly at hand: its cells' apply does not ask for the moved boxes' rows ahead (``_list_boxes``;
#: in the same loop, the requests' code cost 100- and 1,000-object frames 1-2%).
_ROWS_AT_HAND = np.uint64(1 << 18)

#: Up to this many boxes entering a cell in one frame are paired by direct tests against every box of
#: the cell (kn * n tests); more use the sweep over axis 0 (2n endpoints, with active lists).
_DIRECT_MAX = 3


@njit(**NJIT_INLINE)
def pair_allowed(cat, msk, static, a, b):
    """Category/mask filter both ways, and never a static-static pair. Empty filter arrays: the world has
    no object with a category, mask or static flag of its own (``ObjectStore.filtered``), every pair is
    allowed, and no object's filters are read (up to six scattered reads of three per-object arrays a pair
    test: 7% of a big frame's cells at teleport2d-100k)."""
    if cat.shape[0] == 0:
        return True
    return (cat[a] & msk[b]) != 0 and (cat[b] & msk[a]) != 0 and not (static[a] != 0 and static[b] != 0)


@njit(**NJIT_INLINE)
def leaves_with_flag(f, crange, h, cx, cy, cz, C):
    """``leaves_cell`` for object h (unsigned) whose frame flag ``f`` the caller has read already."""
    return f == FLAG_REMOVED or (f == FLAG_MOVED_CELLS and not in_crange(crange, h, cx, cy, cz, C))


@njit(**NJIT_INLINE)
def leaves_cell(flag, crange, h, cx, cy, cz, C):
    """Does object h leave cell (cx, cy, cz) in this frame (removed, or moved to cells without it)?"""
    uh = np.uint64(h)           # unsigned indices: see ``_sort_axis_fresh``
    return leaves_with_flag(flag[uh], crange, uh, cx, cy, cz, C)


@njit(**NJIT_INLINE)
def _overlap_others(bx_pos, base, s, t, dims, skip):
    """Do local boxes s and t overlap on every axis but ``skip`` (-1: every axis), by endpoint
    positions? (Inlined: no call, no reference counting of the arrays; unsigned indices, see
    ``_sort_axis_fresh``.)"""
    qs = np.uint64(base + s)
    qt = np.uint64(base + t)
    for b in range(dims):
        if b == skip:
            continue
        c0 = np.uint64(2 * b)
        if not (bx_pos[qs, c0] < bx_pos[qt, c0 + _ONE] and bx_pos[qt, c0] < bx_pos[qs, c0 + _ONE]):
            return False
    return True


@njit(**NJIT_INLINE)
def _emit(ev_key, eo, cap, cnt, key):
    if cnt < cap:
        ev_key[eo + cnt] = key
    return cnt + 1


@njit(**NJIT_INLINE)
def _insertion_sort(kscratch, tid, m):
    """``kscratch[tid, :m]`` sorted in place by insertion (a few keys or positions)."""
    for i in range(1, m):
        x = kscratch[tid, i]
        j = i - 1
        while j >= 0 and kscratch[tid, j] > x:
            kscratch[tid, j + 1] = kscratch[tid, j]
            j -= 1
        kscratch[tid, j + 1] = x


@njit(**NJIT_INLINE)
def _list_boxes(ub, n, bx_h, flag, crange, cx, cy, cz, C, boxes_u, scratch, tid, all_moved, ask):
    """Step 1's listing of cell c's boxes: ``scratch[tid, 0]`` each slot's new slot (-1: leaving), ``[tid,
    2]`` the leaving slots, ``[tid, 1]`` the moved staying ones; returns (leaving, moved).

    With ``ask`` (a literal at both call sites: the loop is compiled with and without it), the moved boxes'
    rows of ``boxes_u`` (step 2 reads their new values) are requested from memory as they are listed, one
    request per cache line, for reading only: an object keeps its handle wherever it goes, so a cell's rows
    are scattered over the objects' arrays, and step 2's pass that reads them waited on them
    (teleport2d-100k, one thread: that pass a third of the cells' work at the trace's start, half as much
    again at its end, with the same counts, as the teleported objects' rows spread). Requested in a pass
    of their own before this one instead: 1.0-1.6% slower a tick (teleport2d-, crowd2d-, churn2d-100k)."""
    k = 0
    moved = 0
    row_bytes = np.uint64(boxes_u.shape[1] * 4)
    line = np.uint64(0xFFFFFFFFFFFFFFFF)    # the cache line of the last row requested
    for s in range(n):
        us = np.uint64(s)
        h = np.uint64(bx_h[ub + us])
        f = flag[h]             # read once: for the leaving rule and for the moved boxes
        if leaves_with_flag(f, crange, h, cx, cy, cz, C):
            scratch[tid, 0, us] = -1
            scratch[tid, 2, np.uint64(k)] = s           # the leaving boxes' slots, in order
            k += 1
        else:
            scratch[tid, 0, us] = s - k
            if all_moved or f == FLAG_MOVED or f == FLAG_MOVED_CELLS:
                scratch[tid, 1, np.uint64(moved)] = s
                moved += 1
                if ask:
                    hl = (h * row_bytes) >> _S6
                    if hl != line:
                        prefetch_row_read(boxes_u, h)
                        line = hl
    return k, moved


@njit(**NJIT_INLINE)
def _remove_leaving(c, base, eb, n, dims, C, flag, crange, bx_h, bx_pos, ep_key, boxes_u, cat, msk, static, scratch,
                    kscratch, tid, cell_pm_base, cell_pm_n, pm_keys, ev_key, eo, cap, cnt, all_moved):
    """Step 1, batch remove: boxes removed from the world or leaving cell c lose their pairs (among many
    moved boxes, up to ``_LEAVING_BY_POSITION`` leaving ones: the boxes each overlaps by positions; else the
    pairs of the cell's pair set that involve one) and their endpoints leave every axis. With few moved boxes and up to
    ``_LEAVING_FEW`` leaving ones (k), by one pass per axis from the leaving boxes' first endpoint on, the
    staying boxes of the last k slots taking the leaving boxes' slots below them (every other box keeps its
    slot); with more leaving ones, by one pass over each whole axis that renumbers every slot densely. The
    moved boxes' slots, as they are after, are listed in ``scratch[tid, 1]``. With many moved boxes, the
    axes are left to the update's one pass per axis, which compacts them: returns (boxes left, moved boxes,
    event count, whether the axes still hold the leaving boxes' endpoints, renumbered by
    ``scratch[tid, 0]``).

    The boxes are listed by ``_list_boxes``, which requests the moved ones' rows from memory but in a world
    whose boxes are mostly at hand (``_ROWS_AT_HAND``)."""
    cz = c % C[2]
    cy = (c // C[2]) % C[1]
    cx = c // (C[1] * C[2])
    ub = np.uint64(base)
    if np.uint64(boxes_u.shape[0] * boxes_u.shape[1] * 4) > _ROWS_AT_HAND:
        k, moved = _list_boxes(ub, n, bx_h, flag, crange, cx, cy, cz, C, boxes_u, scratch, tid, all_moved, True)
    else:
        k, moved = _list_boxes(ub, n, bx_h, flag, crange, cx, cy, cz, C, boxes_u, scratch, tid, all_moved, False)
    if k == 0:
        return n, moved, cnt, False
    # the cell's pairs that involve a leaving box are removed
    many = moved > 0 and 4 * moved >= n - k
    if many and k <= _LEAVING_BY_POSITION:
        # a leaving box's pairs are the boxes it overlaps by positions on every axis, which still hold the
        # last frame's order (that of the cell's pair set): found in the cell's region, which step 2 reads
        # all of with many moved boxes, instead of a pass over all the pair set's keys, mostly away in
        # memory (with few moved boxes, reading the whole region for them cost more: sparse3d-100k); a pair
        # of two leaving boxes once, from the first of them
        for j in range(k):
            cnt = _pairs_by_positions(np.int64(scratch[tid, 2, j]), n, True, base, dims, bx_h, bx_pos, cat, msk,
                                      static, scratch, tid, ev_key, eo, cap, cnt)
    else:
        pb = cell_pm_base[c] // 2
        for p in range(cell_pm_n[c]):
            key = pm_keys[np.uint64(pb + p)]
            if (leaves_cell(flag, crange, key >> _S32, cx, cy, cz, C)
                    or leaves_cell(flag, crange, key & LOW32, cx, cy, cz, C)):
                cnt = _emit(ev_key, eo, cap, cnt, key | EVENT_REMOVED)
    if many:
        # many moved boxes: the axes are compacted by the pass that sorts them (``_sort_axis_fresh``); here
        # only the boxes' rows move to their new slots (their positions keep the old, uncompacted numbers,
        # which order the remaining endpoints as before: all the swap rules compare)
        for s in range(n):
            ns = scratch[tid, 0, np.uint64(s)]
            if ns >= 0 and ns != s:
                qn = ub + np.uint64(ns)
                qs = ub + np.uint64(s)
                bx_h[qn] = bx_h[qs]
                for j in range(2 * dims):
                    bx_pos[qn, np.uint64(j)] = bx_pos[qs, np.uint64(j)]
        return n - k, moved, cnt, True
    if k > _LEAVING_FEW:
        # many leaving boxes: every axis compacted in one pass, slots renumbered densely
        for a in range(dims):
            w = 0
            for e in range(1, 2 * n + 1):
                kk = ep_key[a, eb + e]
                ns = scratch[tid, 0, np.int64(kk & SLOT_MASK)]
                if ns < 0:
                    continue
                w += 1
                ep_key[a, eb + w] = (kk & ~SLOT_MASK) | np.uint64(ns)
                bx_pos[base + ns, 2 * a + np.int64((kk >> _S31) & _ONE)] = w
        for s in range(n):
            ns = scratch[tid, 0, s]
            if ns >= 0:
                bx_h[base + ns] = bx_h[base + s]
        for i in range(moved):
            scratch[tid, 1, i] = scratch[tid, 0, scratch[tid, 1, i]]
        return n - k, moved, cnt, False
    # a few leaving boxes: on each axis, the endpoints after the leaving boxes' first one close up over
    # theirs (the endpoints before it stay where they are), the leaving ones known by their positions,
    # sorted (in the workspace of the entering boxes' keys, free until step 3)
    m2 = 2 * k
    for a in range(dims):
        if k == 1:          # the commonest: its two positions as they are
            ls = base + scratch[tid, 2, 0]
            p0 = np.int64(bx_pos[ls, 2 * a])
            skip = np.int64(bx_pos[ls, 2 * a + 1])
        else:
            for j in range(k):
                ls = base + scratch[tid, 2, j]
                kscratch[tid, 2 * j] = np.uint64(bx_pos[ls, 2 * a])
                kscratch[tid, 2 * j + 1] = np.uint64(bx_pos[ls, 2 * a + 1])
            _insertion_sort(kscratch, tid, m2)
            p0 = np.int64(kscratch[tid, 0])
            skip = np.int64(kscratch[tid, 1])
        w = p0
        nxt = 1
        for e in range(p0 + 1, 2 * n + 1):
            if e == skip:
                nxt += 1
                skip = np.int64(kscratch[tid, nxt]) if nxt < m2 else np.int64(-1)
                continue
            kk = ep_key[a, eb + e]
            ep_key[a, eb + w] = kk
            bx_pos[base + np.int64(kk & SLOT_MASK), 2 * a + np.int64((kk >> _S31) & _ONE)] = w
            w += 1
    # the staying boxes of the last k slots take the leaving boxes' slots below n - k, in order (those are
    # the first of the leaving slots, as many as there are staying boxes there); every other box keeps its
    # slot
    m = n - k
    j = 0
    for s in range(m, n):
        if scratch[tid, 0, s] < 0:
            continue
        hole = scratch[tid, 2, j]
        j += 1
        bx_h[base + hole] = bx_h[base + s]
        for q in range(2 * dims):
            e = np.int64(bx_pos[base + s, q])
            bx_pos[base + hole, q] = e
            ep_key[q // 2, eb + e] = (ep_key[q // 2, eb + e] & ~SLOT_MASK) | np.uint64(hole)
        scratch[tid, 0, s] = hole
    for i in range(moved):
        ms = scratch[tid, 1, i]
        if ms >= m:
            scratch[tid, 1, i] = scratch[tid, 0, ms]
    return m, moved, cnt, False


@njit(**NJIT_INLINE)
def _write_values(es, a, base, eb, dims, bx_h, bx_pos, ep_key, boxes_u):
    """The current box of slot es, on axis a, into its two endpoint keys (positions unchanged); returns
    the two new keys (min, max), which the caller uses as they are: reading a key back right after
    writing it waits for the write to reach the cache (the store cannot be forwarded to the load)."""
    h = bx_h[base + es]
    p0 = eb + bx_pos[base + es, 2 * a]
    p1 = eb + bx_pos[base + es, 2 * a + 1]
    k0 = (encode(boxes_u[h, a]) << _S32) | (ep_key[a, p0] & LOW32)
    k1 = (encode(boxes_u[h, dims + a]) << _S32) | (ep_key[a, p1] & LOW32)
    ep_key[a, p0] = k0
    ep_key[a, p1] = k1
    return k0, k1


@njit(**NJIT_INLINE)
def _swap_event(es, ps, em, step, base, dims, a, bx_h, bx_pos, cat, msk, static, ev_key, eo, cap, cnt):
    """A min and a max of slots es and ps swap on axis a (the four rules): only such a swap changes an
    overlap on this axis; the other axes are tested by positions (their current order), without branches
    (the outcome is unpredictable). A min passing a max leftwards (or a max passing a min rightwards)
    starts an overlap on this axis; the two other cases end one."""
    b1 = np.uint64(2) if a == 0 else np.uint64(0)    # the other axes' first columns (dims is 2 or 3)
    b2 = np.uint64(2) if a == 2 else np.uint64(4)
    qe = np.uint64(base + es)
    qp = np.uint64(base + ps)
    ok = (bx_pos[qe, b1] < bx_pos[qp, b1 + _ONE]) & (bx_pos[qp, b1] < bx_pos[qe, b1 + _ONE])
    if dims == 3:
        ok = ok & ((bx_pos[qe, b2] < bx_pos[qp, b2 + _ONE]) & (bx_pos[qp, b2] < bx_pos[qe, b2 + _ONE]))
    if ok:
        ha = bx_h[qe]
        hb = bx_h[qp]
        if pair_allowed(cat, msk, static, ha, hb):
            key = pair_key(ha, hb)
            if (em == 0) != (step < 0):
                key |= EVENT_REMOVED
            cnt = _emit(ev_key, eo, cap, cnt, key)
    return cnt


@njit(**NJIT_INLINE)
def _move_endpoint(i, kv, few, n, a, base, eb, dims, bx_h, bx_pos, row, cat, msk, static, ev_key, eo, cap,
                   cnt, sw):
    """Move the endpoint at position i of axis a (its endpoints: ``row``, the caller's ``ep_key[a]``), whose
    key is kv, left (or, with ``few``, right) to its place, applying the rules at every min/max swap.
    Returns (event count, swaps). (Unsigned indices: see ``_sort_axis_fresh``.) The row comes from the
    caller, made once an axis: a view made here, at every moved endpoint, took and dropped a reference
    to ``ep_key`` (two atomic updates of a count that the threads share)."""
    hv = kv >> _S31
    em = np.int64(hv & _ONE)
    es = np.int64(kv & SLOT_MASK)
    ueb = np.uint64(eb)
    ub = np.uint64(base)
    a2 = np.uint64(2 * a)
    pk = row[ueb + np.uint64(i - 1)]
    if (pk >> _S31) > hv:
        step = -1
    elif few and i < 2 * n and (row[ueb + np.uint64(i + 1)] >> _S31) < hv:
        step = 1
        pk = row[ueb + np.uint64(i + 1)]
    else:
        return cnt, sw
    j = i + step
    while True:
        ps = np.int64(pk & SLOT_MASK)
        pm = (pk >> _S31) & _ONE
        if pm != np.uint64(em):
            cnt = _swap_event(es, ps, em, step, base, dims, a, bx_h, bx_pos, cat, msk, static, ev_key, eo, cap,
                              cnt)
        row[ueb + np.uint64(j - step)] = pk
        bx_pos[ub + np.uint64(ps), a2 + pm] = j - step
        sw += 1
        j += step
        if step < 0:
            pk = row[ueb + np.uint64(j)]
            if not ((pk >> _S31) > hv):
                break
        else:
            if j > 2 * n:
                break
            pk = row[ueb + np.uint64(j)]
            if not ((pk >> _S31) < hv):
                break
    row[ueb + np.uint64(j - step)] = kv
    bx_pos[ub + np.uint64(es), a2 + np.uint64(em)] = j - step
    return cnt, sw


@njit(**NJIT_INLINE)
def _sort_axis_fresh(a, n_ep, compact, base, eb, dims, bx_h, bx_pos, ep_key, boxes_u, cat, msk, static, scratch,
                     kscratch, tid, ev_key, eo, cap, cnt, sw):
    """Step 2 with many moved boxes, axis a: its ``n_ep`` endpoints take their boxes' current values (a box
    that did not move keeps its key) and are insertion-sorted, the rules at every min/max swap. Two passes:
    the first writes every endpoint's new key (independent loads, no branch; with ``compact``, the
    endpoints of leaving boxes, new slot -1 in ``scratch[tid, 0]``, are dropped and the others get their
    new slots and positions), the second moves each endpoint below its left neighbour left into place.
    The same order, swaps and events as one pass that does both, endpoint by endpoint: a move only
    touches the positions left of it, and the key it leaves on its right is the sorted prefix's largest.
    The second pass first lists the endpoints to move, without a branch (an endpoint moves when its key is
    below the largest key before it in the first pass's order, which the moves leave as it is; in
    ``kscratch[tid]``), then moves them in order: a branch per endpoint on whether it moves, which no
    predictor foresees (a sixth of them do, at random), cost as much as the moves' own work.
    Indices are unsigned in the first pass (numba checks a signed index for a negative value, which here
    costs as much as the rest of the work). Returns (event count, swaps)."""
    row = ep_key[a]
    ub = np.uint64(base)
    ua = np.uint64(a)
    ud = np.uint64(dims)
    w = np.uint64(eb)
    if compact:
        for i in range(eb + 1, eb + n_ep + 1):
            kk = row[np.uint64(i)]
            ns = scratch[tid, 0, kk & SLOT_MASK]
            if ns < 0:
                continue
            w += _ONE
            m = (kk >> _S31) & _ONE
            h = bx_h[ub + np.uint64(ns)]
            row[w] = (encode(boxes_u[np.uint64(h), ua + m * ud]) << _S32) | (kk & (_ONE << _S31)) | np.uint64(ns)
            bx_pos[ub + np.uint64(ns), np.uint64(2) * ua + m] = w - np.uint64(eb)
    else:
        for i in range(eb + 1, eb + n_ep + 1):
            kk = row[np.uint64(i)]
            h = bx_h[ub + (kk & SLOT_MASK)]
            row[np.uint64(i)] = (encode(boxes_u[np.uint64(h), ua + ((kk >> _S31) & _ONE) * ud]) << _S32) | (kk & LOW32)
        w += np.uint64(n_ep)
    n_w = np.int64(w) - eb
    if n_w < 2:
        return cnt, sw
    lh = row[eb + 1] >> _S31      # (value, is_max) of the largest key so far
    m = np.uint64(0)
    for i in range(2, n_w + 1):
        hv = row[np.uint64(eb + i)] >> _S31
        kscratch[tid, m] = i
        m += np.uint64(lh > hv)
        lh = max(lh, hv)
    for q in range(m):
        i = np.int64(kscratch[tid, q])
        cnt, sw = _move_endpoint(i, row[eb + i], False, 0, a, base, eb, dims, bx_h, bx_pos, row, cat, msk, static,
                                 ev_key, eo, cap, cnt, sw)
    return cnt, sw


@njit(**NJIT_INLINE)
def _update_moved(moved, n, n_old, compact, base, eb, dims, bx_h, bx_pos, ep_key, boxes_u, cat, msk, static,
                  scratch, kscratch, tid, ev_key, eo, cap, cnt):
    """Step 2: write the moved boxes' values, re-sort each axis. Many moved boxes: one pass per axis that
    writes every endpoint's value and insertion-sorts it (``_sort_axis_fresh``; with ``compact``, the
    axes still hold ``n_old`` boxes' endpoints, the leaving ones dropped by that pass). Few: each endpoint of a moved box moves
    left or right to its place (the max first when it goes right, so a box never passes its own
    endpoints). Returns (event count, swaps)."""
    sw = 0
    few = 4 * moved < n
    if not few:
        for a in range(dims):
            cnt, sw = _sort_axis_fresh(a, 2 * n_old, compact, base, eb, dims, bx_h, bx_pos, ep_key, boxes_u, cat,
                                       msk, static, scratch, kscratch, tid, ev_key, eo, cap, cnt, sw)
        return cnt, sw
    for a in range(dims):
        row = ep_key[a]
        first_max = False
        k0 = _ONE
        k1 = _ONE
        for it in range(2 * moved):
            es = scratch[tid, 1, it >> 1]
            if (it & 1) == 0:
                # one box at a time: its new values go in just before its endpoints move, so the rest of
                # the axis is sorted while they do
                k0, k1 = _write_values(es, a, base, eb, dims, bx_h, bx_pos, ep_key, boxes_u)
                pmx = bx_pos[base + es, 2 * a + 1]
                first_max = pmx < 2 * n and (k1 >> _S31) > (ep_key[a, eb + pmx + 1] >> _S31)
            em = 1 if first_max == ((it & 1) == 0) else 0
            i = bx_pos[base + es, 2 * a + em]
            kv = k1 if em == 1 else k0
            cnt, sw = _move_endpoint(i, kv, True, n, a, base, eb, dims, bx_h, bx_pos, row, cat, msk, static,
                                     ev_key, eo, cap, cnt, sw)
    return cnt, sw


@njit(**NJIT_INLINE)
def _merge_entering(kn, e0, n, base, eb, dims, ent_h, bx_h, bx_pos, ep_key, boxes_u, kscratch, tid):
    """Step 3a: the entering boxes take slots n.., their endpoints sorted and merged into each axis from
    the back (one pass). Unsigned indices (see ``_sort_axis_fresh``)."""
    ub = np.uint64(base)
    un = np.uint64(n)
    ud = np.uint64(dims)
    for i in range(kn):
        bx_h[ub + un + np.uint64(i)] = ent_h[np.uint64(e0 + i)]
    m2 = 2 * kn
    ks = kscratch[tid]
    for a in range(dims):
        ua = np.uint64(a)
        a2 = np.uint64(2 * a)
        # the new endpoints' keys, sorted, in this thread's workspace
        for i in range(kn):
            h = np.uint64(ent_h[np.uint64(e0 + i)])
            slot = un + np.uint64(i)
            ks[np.uint64(i)] = (encode(boxes_u[h, ua]) << _S32) | slot
            ks[np.uint64(kn + i)] = (encode(boxes_u[h, ud + ua]) << _S32) | (_ONE << _S31) | slot
        if m2 <= 64:
            _insertion_sort(kscratch, tid, m2)
        else:
            kscratch[tid, :m2].sort()
        # reverse merge into the axis: walk both sorted lists from their ends
        row = ep_key[a]
        io = 2 * n
        w = 2 * (n + kn)
        for r in range(m2 - 1, -1, -1):
            xk = ks[np.uint64(r)]
            xh = xk >> _S31
            while True:
                ok_ = row[np.uint64(eb + io)]
                if io > 0 and (ok_ >> _S31) > xh:
                    row[np.uint64(eb + w)] = ok_
                    bx_pos[ub + (ok_ & SLOT_MASK), a2 + ((ok_ >> _S31) & _ONE)] = w
                    io -= 1
                    w -= 1
                else:
                    break
            row[np.uint64(eb + w)] = xk
            bx_pos[ub + (xk & SLOT_MASK), a2 + ((xk >> _S31) & _ONE)] = w
            w -= 1


@njit(**NJIT_INLINE)
def _pairs_by_positions(s, m, leaving, base, dims, bx_h, bx_pos, cat, msk, static, scratch, tid, ev_key, eo, cap,
                        cnt):
    """The pair events of box slot s with every box of slots [0, m) it overlaps by positions on every axis
    (and may pair with): with ``leaving`` (a literal), removals, the leaving boxes (new slot -1 in
    ``scratch[tid, 0]``) skipped below s and s itself (a pair of two leaving boxes once, from the first);
    else creations. Every axis is tested, then one branch taken on the outcome: a branch per axis (as
    ``_overlap_others``) is taken at random (a box overlaps a cell's other boxes on one axis often, on all
    of them rarely). Unsigned indices (see ``_sort_axis_fresh``)."""
    ub = np.uint64(base)
    qs = ub + np.uint64(s)
    hs = bx_h[qs]
    x0 = bx_pos[qs, 0]
    x1 = bx_pos[qs, 1]
    y0 = bx_pos[qs, 2]
    y1 = bx_pos[qs, 3]
    z0 = bx_pos[qs, 4] if dims == 3 else 0
    z1 = bx_pos[qs, 5] if dims == 3 else 0
    for tt in range(m):
        qt = ub + np.uint64(tt)
        ok = (bx_pos[qt, 0] < x1) & (x0 < bx_pos[qt, 1]) & (bx_pos[qt, 2] < y1) & (y0 < bx_pos[qt, 3])
        if dims == 3:
            ok = ok & (bx_pos[qt, 4] < z1) & (z0 < bx_pos[qt, 5])
        if leaving:
            ok = ok & ((scratch[tid, 0, np.uint64(tt)] >= 0) | (tt > s))
        if ok:
            ht = bx_h[qt]
            if pair_allowed(cat, msk, static, hs, ht):
                key = pair_key(hs, ht)
                if leaving:
                    key |= EVENT_REMOVED
                cnt = _emit(ev_key, eo, cap, cnt, key)
    return cnt


@njit(**NJIT_INLINE)
def _pairs_of_many_entering(n_old, n, base, eb, dims, bx_h, bx_pos, ep_key, cat, msk, static, scratch, tid,
                            ev_key, eo, cap, cnt):
    """Step 3b, many entering boxes: box pruning by one sweep over axis 0 with two active lists,
    complete among the new boxes and bipartite new-vs-old. scratch rows: 0 old boxes, 1 new boxes,
    2 index in its list."""
    no = 0
    nn = 0
    for e in range(1, 2 * n + 1):
        d = ep_key[0, eb + e]
        s = np.int64(d & SLOT_MASK)
        is_new = s >= n_old
        if ((d >> _S31) & _ONE) == 0:
            hs = bx_h[base + s]
            for side in range(2):
                if side == 0:
                    m = nn
                elif is_new:
                    m = no
                else:
                    m = 0
                for i in range(m):
                    tt = scratch[tid, 1 - side, i]
                    if _overlap_others(bx_pos, base, s, tt, dims, 0) and pair_allowed(
                            cat, msk, static, hs, bx_h[base + tt]):
                        cnt = _emit(ev_key, eo, cap, cnt, pair_key(hs, bx_h[base + tt]))
            if is_new:
                scratch[tid, 2, s] = nn
                scratch[tid, 1, nn] = s
                nn += 1
            else:
                scratch[tid, 2, s] = no
                scratch[tid, 0, no] = s
                no += 1
        else:
            i = scratch[tid, 2, s]
            if is_new:
                nn -= 1
                last = scratch[tid, 1, nn]
                scratch[tid, 1, i] = last
            else:
                no -= 1
                last = scratch[tid, 0, no]
                scratch[tid, 0, i] = last
            scratch[tid, 2, last] = i
    return cnt


@njit(**NJIT_INLINE)
def _prefetch_cell(c, dims, cell_n, cell_base, bx_h, bx_pos, ep_key):
    """Request cell c's SAP (its slots, positions and every axis's endpoints) from memory, a cache line
    at a time: the cell a worker applies next, while it applies the current one. A cell's work is a
    chain of dependent reads at scattered places of its region (a moved box's endpoints, its
    neighbours'), each a cache miss when the region is not at hand (sparse3d-100k: most of the apply)."""
    base = np.int64(cell_base[c])
    n = np.int64(cell_n[c])
    for i in range(base, base + n, 16):
        prefetch_flat(bx_h, i)
    w = 2 * dims
    for i in range(base * w, (base + n) * w, 16):
        prefetch_flat(bx_pos, i)
    row = ep_key.shape[1]
    for a in range(dims):
        for i in range(a * row + 2 * base, a * row + 2 * (base + n) + 1, 8):
            prefetch_flat(ep_key, i)


@njit(**NJIT_INLINE)
def _apply_cell(t, touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static,
                cell_n, cell_base, bx_h, bx_pos, ep_key, scratch, kscratch,
                cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off, ev_n, ev_plus, swaps, tid, all_moved):
    """Touched cell t of a frame (steps 1-3 of the module docstring), on worker ``tid``'s workspace.
    ``all_moved``: every staying box is taken as moved (most of the world's boxes moved; the flags of the
    ones that kept their cells were not written): step 2 re-sorts every axis in one pass, which gives a box
    that did not move its own values again."""
    c = touched[t]
    if t + 1 < touched.shape[0]:
        _prefetch_cell(touched[t + 1], dims, cell_n, cell_base, bx_h, bx_pos, ep_key)
    eo = ev_off[t]
    cap = ev_off[t + 1] - eo
    base = cell_base[c]
    eb = 2 * base
    n_old = np.int64(cell_n[c])
    n, moved, cnt, compact = _remove_leaving(c, base, eb, n_old, dims, C, flag, crange, bx_h, bx_pos, ep_key,
                                             boxes_u, cat, msk, static, scratch, kscratch, tid, cell_pm_base,
                                             cell_pm_n, pm_keys, ev_key, eo, cap, 0, all_moved)
    sw = 0
    if moved > 0:
        cnt, sw = _update_moved(moved, n, n_old, compact, base, eb, dims, bx_h, bx_pos, ep_key, boxes_u, cat, msk,
                                static, scratch, kscratch, tid, ev_key, eo, cap, cnt)
    e0 = ent_off[t]
    kn = ent_off[t + 1] - e0
    if kn > 0:
        _merge_entering(kn, e0, n, base, eb, dims, ent_h, bx_h, bx_pos, ep_key, boxes_u, kscratch, tid)
        if kn <= _DIRECT_MAX:
            # step 3b, a few entering boxes: each tested against every box before it, by positions on every
            # axis (no sweep over the whole axis)
            for s in range(n, n + kn):
                cnt = _pairs_by_positions(s, s, False, base, dims, bx_h, bx_pos, cat, msk, static, scratch, tid,
                                          ev_key, eo, cap, cnt)
        else:
            cnt = _pairs_of_many_entering(n, n + kn, base, eb, dims, bx_h, bx_pos, ep_key, cat, msk, static,
                                          scratch, tid, ev_key, eo, cap, cnt)
        n += kn
    cell_n[c] = n
    ev_n[t] = cnt
    swaps[t] = sw
    plus = cnt
    if cnt <= cap:
        plus = 0
        for r in range(cnt):
            if (ev_key[eo + r] & EVENT_REMOVED) == 0:
                plus += 1
    ev_plus[t] = plus


@njit(**NJIT_PARALLEL)
def cells_apply(touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static,
                cell_n, cell_base, bx_h, bx_pos, ep_key, scratch, kscratch,
                cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off, ev_n, ev_plus, swaps, all_moved):
    """Apply every touched cell in parallel (steps 1-3 of the module docstring); ``all_moved``: see
    ``_apply_cell``.

    Outputs are indexed by touched cell, never by thread: ``ev_n[t]`` events (``ev_plus[t]`` of them
    "pair added") in ``ev_key[ev_off[t]:ev_off[t + 1]]``, ``swaps[t]`` endpoint swaps.

    NOTE: the steps and helpers it calls are inlined (``NJIT_INLINE``): a real call to a helper that
    takes arrays would cost two atomic reference-count updates per array, more than the work itself.
    """
    for t in prange(touched.shape[0]):
        _apply_cell(t, touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static, cell_n,
                    cell_base, bx_h, bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_n, pm_keys, ev_key,
                    ev_off, ev_n, ev_plus, swaps, numba.get_thread_id(), all_moved)


@njit(**NJIT)
def cell_all_pairs(c, dims, cat, msk, static, cell_n, cell_base, bx_h, bx_pos, ep_key, out, cnt):
    """Every pair of cell c from scratch (sweep over axis 0), written to ``out``; returns the count.

    Writes only while there is room (``out`` may be too small: the caller sizes it from the count).
    """
    base = cell_base[c]
    n = cell_n[c]
    eb = 2 * base
    cap = out.shape[0]
    for e in range(1, 2 * n + 1):
        d = ep_key[0, eb + e]
        if ((d >> _S31) & _ONE) != 0:
            continue
        s = np.int64(d & SLOT_MASK)
        hs = bx_h[base + s]
        end = bx_pos[base + s, 1]
        for f in range(e + 1, end):
            d2 = ep_key[0, eb + f]
            if ((d2 >> _S31) & _ONE) != 0:
                continue
            t = np.int64(d2 & SLOT_MASK)
            if _overlap_others(bx_pos, base, s, t, dims, 0):
                ht = bx_h[base + t]
                if pair_allowed(cat, msk, static, hs, ht):
                    cnt = _emit(out, 0, cap, cnt, pair_key(hs, ht))
    return cnt
