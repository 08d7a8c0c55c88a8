"""Cell SAP kernels: one persistent array sweep-and-prune per grid cell, all cells in shared arenas.

Arena layout (cell c owns a region of ``cell_cap[c] + 1`` box units starting at ``cell_base[c]``):

    bx_h[base + s]                int32   object handle of local box slot s, s in [0, n)
    bx_pos[base + s, 2*a + m]     int32   position of the min (m=0) / max (m=1) endpoint on axis a
    ep_val[a, 2*base + e]         float32 endpoint value, e in [0, 2n]; e = 0 is the -inf sentinel
    ep_dat[a, 2*base + e]         int32   packed endpoint: local slot << 1 | is_max

Workspace: ``scratch[thread, 3, max cell capacity]`` int32, one block per worker thread.

Endpoints on an axis are sorted by (value, is_max): at equal values a min comes first, which makes
touching boxes overlap (inclusive rule). Overlap on the other axes is decided by endpoint positions
(001 §4): positions describe the current sorted order, which is what the incremental updates need.

One frame of one cell (``cell_apply``), in order:
  1. batch remove: boxes removed from the world or leaving the cell lose their pairs (found in the
     cell's pair set), then every axis is compacted in one pass and slots are renumbered densely;
  2. update: new values are written in place, then each axis is insertion-sorted; every swap of a min
     and a max is one of the four rules (min passes max leftwards: overlap may start; max passes min
     leftwards: overlap may end), decided by the positions on the other axes;
  3. batch insert: new endpoints are sorted and merged into each axis from the back (one pass), then
     box pruning by one sweep over axis 0 finds the new pairs (complete among the new boxes,
     bipartite new-vs-old).
Pair changes are written as events (pair key, bit 63 set for "removed") into the cell's slice of the
event buffer. A slice that overflows keeps counting; its cell is recomputed afterwards, never dropped.
"""
import numba
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, njit, prange
from .grid import FLAG_MOVED, FLAG_MOVED_CELLS, FLAG_REMOVED, grid_in_range
from .hashing import EVENT_REMOVED, pair_key


@njit(**NJIT_INLINE)
def pair_allowed(cat, msk, static, a, b):
    """Category/mask filter both ways, and never a static-static pair."""
    return (cat[a] & msk[b]) != 0 and (cat[b] & msk[a]) != 0 and not (static[a] != 0 and static[b] != 0)


@njit(**NJIT_INLINE)
def _overlap_others(bx_pos, base, s, t, dims, skip):
    """Do local boxes s and t overlap on every axis but ``skip``, by endpoint positions?"""
    for b in range(dims):
        if b == skip:
            continue
        if not (bx_pos[base + s, 2 * b] < bx_pos[base + t, 2 * b + 1]
                and bx_pos[base + t, 2 * b] < bx_pos[base + s, 2 * b + 1]):
            return False
    return True


@njit(**NJIT_INLINE)
def _leaving(h, flag, crange, x, y, z, C):
    f = flag[h]
    if f == FLAG_REMOVED:
        return True
    if f == FLAG_MOVED_CELLS:
        return not grid_in_range(crange, h, x, y, z, C)
    return False


@njit(**NJIT_INLINE)
def _emit(ev_key, eo, cap, cnt, key):
    if cnt < cap:
        ev_key[eo + cnt] = key
    return cnt + 1


@njit(**NJIT_INLINE)
def cell_remove(c, base, n, dims, C, flag, crange, bx_h, bx_pos, ep_val, ep_dat, scratch,
                pm_keys, pb, pm_n, ev_key, eo, cap, cnt):
    """Step 1: batch remove. Returns (new n, event count)."""
    z = c % C[2]
    y = (c // C[2]) % C[1]
    x = c // (C[1] * C[2])
    k = 0
    for s in range(n):
        if _leaving(bx_h[base + s], flag, crange, x, y, z, C):
            scratch[0, s] = -1
            k += 1
        else:
            scratch[0, s] = s - k
    if k == 0:
        return n, cnt
    # the cell's pairs that involve a leaving box are removed
    for p in range(pm_n):
        key = pm_keys[pb + p]
        a = np.int64(key >> np.uint64(32))
        b = np.int64(key & np.uint64(0xFFFFFFFF))
        if _leaving(a, flag, crange, x, y, z, C) or _leaving(b, flag, crange, x, y, z, C):
            cnt = _emit(ev_key, eo, cap, cnt, key | EVENT_REMOVED)
    # compact every axis in one pass, renumbering slots
    eb = 2 * base
    for a in range(dims):
        w = 0
        for e in range(1, 2 * n + 1):
            d = ep_dat[a, eb + e]
            ns = scratch[0, d >> 1]
            if ns < 0:
                continue
            w += 1
            ep_val[a, eb + w] = ep_val[a, eb + e]
            ep_dat[a, eb + w] = (ns << 1) | (d & 1)
            bx_pos[base + ns, 2 * a + (d & 1)] = w
    for s in range(n):
        ns = scratch[0, s]
        if ns >= 0:
            bx_h[base + ns] = bx_h[base + s]
    return n - k, cnt


@njit(**NJIT_INLINE)
def cell_update(base, n, dims, flag, boxes, cat, msk, static, bx_h, bx_pos, ep_val, ep_dat,
                ev_key, eo, cap, cnt):
    """Step 2: write moved boxes' values, insertion-sort each axis. Returns (event count, swaps)."""
    eb = 2 * base
    moved = 0
    for s in range(n):
        h = bx_h[base + s]
        if flag[h] == FLAG_MOVED or flag[h] == FLAG_MOVED_CELLS:
            moved += 1
            for a in range(dims):
                ep_val[a, eb + bx_pos[base + s, 2 * a]] = boxes[h, a]
                ep_val[a, eb + bx_pos[base + s, 2 * a + 1]] = boxes[h, dims + a]
    swaps = 0
    if moved == 0:
        return cnt, swaps
    for a in range(dims):
        for i in range(2, 2 * n + 1):
            v = ep_val[a, eb + i]
            dd = ep_dat[a, eb + i]
            em = dd & 1
            j = i - 1
            pv = ep_val[a, eb + j]
            pd = ep_dat[a, eb + j]
            if not (pv > v or (pv == v and (pd & 1) > em)):
                continue
            es = dd >> 1
            while True:
                ps = pd >> 1
                pm = pd & 1
                if pm != em:
                    # the four rules: only a min/max swap changes an overlap on this axis
                    if _overlap_others(bx_pos, base, es, ps, dims, a):
                        ha = bx_h[base + es]
                        hb = bx_h[base + ps]
                        if pair_allowed(cat, msk, static, ha, hb):
                            key = pair_key(ha, hb)
                            if em == 0:     # min passes a max leftwards: overlap starts
                                cnt = _emit(ev_key, eo, cap, cnt, key)
                            else:           # max passes a min leftwards: overlap ends
                                cnt = _emit(ev_key, eo, cap, cnt, key | EVENT_REMOVED)
                ep_val[a, eb + j + 1] = pv
                ep_dat[a, eb + j + 1] = pd
                bx_pos[base + ps, 2 * a + pm] = j + 1
                swaps += 1
                j -= 1
                pv = ep_val[a, eb + j]
                pd = ep_dat[a, eb + j]
                if not (pv > v or (pv == v and (pd & 1) > em)):
                    break
            ep_val[a, eb + j + 1] = v
            ep_dat[a, eb + j + 1] = dd
            bx_pos[base + es, 2 * a + em] = j + 1
    return cnt, swaps


@njit(**NJIT_INLINE)
def cell_insert(base, n, dims, ent_h, e0, e1, boxes, cat, msk, static, bx_h, bx_pos, ep_val, ep_dat,
                scratch, ev_key, eo, cap, cnt):
    """Step 3: batch insert of the entering handles ``ent_h[e0:e1]``. Returns (new n, event count)."""
    k = e1 - e0
    if k == 0:
        return n, cnt
    eb = 2 * base
    for i in range(k):
        bx_h[base + n + i] = ent_h[e0 + i]
    vals = np.empty(2 * k, np.float32)
    dats = np.empty(2 * k, np.int32)
    for a in range(dims):
        for i in range(k):
            h = ent_h[e0 + i]
            vals[i] = boxes[h, a]
            dats[i] = (n + i) << 1
            vals[k + i] = boxes[h, dims + a]
            dats[k + i] = ((n + i) << 1) | 1
        # stable sort by value: mins (listed first) stay before maxes at equal values
        order = np.argsort(vals, kind="mergesort")
        # reverse merge into the axis: walk both sorted lists from their ends
        io = 2 * n
        w = 2 * (n + k)
        for r in range(2 * k - 1, -1, -1):
            q = order[r]
            xv = vals[q]
            xd = dats[q]
            while True:
                ov = ep_val[a, eb + io]
                od = ep_dat[a, eb + io]
                if io > 0 and (ov > xv or (ov == xv and (od & 1) > (xd & 1))):
                    ep_val[a, eb + w] = ov
                    ep_dat[a, eb + w] = od
                    bx_pos[base + (od >> 1), 2 * a + (od & 1)] = w
                    io -= 1
                    w -= 1
                else:
                    break
            ep_val[a, eb + w] = xv
            ep_dat[a, eb + w] = xd
            bx_pos[base + (xd >> 1), 2 * a + (xd & 1)] = w
            w -= 1
    n_old = n
    n += k
    # box pruning on axis 0: one sweep, two active lists (old boxes, new boxes)
    no = 0
    nn = 0
    for e in range(1, 2 * n + 1):
        d = ep_dat[0, eb + e]
        s = d >> 1
        is_new = s >= n_old
        if (d & 1) == 0:
            hs = bx_h[base + s]
            for i in range(nn):
                t = scratch[1, i]
                if _overlap_others(bx_pos, base, s, t, dims, 0):
                    ht = bx_h[base + t]
                    if pair_allowed(cat, msk, static, hs, ht):
                        cnt = _emit(ev_key, eo, cap, cnt, pair_key(hs, ht))
            if is_new:
                for i in range(no):
                    t = scratch[0, i]
                    if _overlap_others(bx_pos, base, s, t, dims, 0):
                        ht = bx_h[base + t]
                        if pair_allowed(cat, msk, static, hs, ht):
                            cnt = _emit(ev_key, eo, cap, cnt, pair_key(hs, ht))
                scratch[2, s] = nn
                scratch[1, nn] = s
                nn += 1
            else:
                scratch[2, s] = no
                scratch[0, no] = s
                no += 1
        else:
            i = scratch[2, s]
            if is_new:
                nn -= 1
                t = scratch[1, nn]
                scratch[1, i] = t
                scratch[2, t] = i
            else:
                no -= 1
                t = scratch[0, no]
                scratch[0, i] = t
                scratch[2, t] = i
    return n, cnt


@njit(**NJIT_INLINE)
def cell_apply(c, dims, C, flag, crange, boxes, cat, msk, static, ent_h, e0, e1,
               cell_n, cell_base, bx_h, bx_pos, ep_val, ep_dat, scratch,
               pm_keys, pb, pm_n, ev_key, eo, cap):
    """One frame of one cell (steps 1-3). Returns (event count, swaps)."""
    base = cell_base[c]
    n = cell_n[c]
    cnt = 0
    n, cnt = cell_remove(c, base, n, dims, C, flag, crange, bx_h, bx_pos, ep_val, ep_dat, scratch,
                         pm_keys, pb, pm_n, ev_key, eo, cap, cnt)
    cnt, swaps = cell_update(base, n, dims, flag, boxes, cat, msk, static, bx_h, bx_pos, ep_val, ep_dat,
                             ev_key, eo, cap, cnt)
    n, cnt = cell_insert(base, n, dims, ent_h, e0, e1, boxes, cat, msk, static, bx_h, bx_pos, ep_val,
                         ep_dat, scratch, ev_key, eo, cap, cnt)
    cell_n[c] = n
    return cnt, swaps


@njit(**NJIT_PARALLEL)
def cells_apply(touched, ent_off, ent_h, dims, C, flag, crange, boxes, cat, msk, static,
                cell_n, cell_base, bx_h, bx_pos, ep_val, ep_dat, scratch,
                cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off, ev_n, ev_plus, swaps):
    """Apply every touched cell in parallel. Outputs are indexed by touched cell, never by thread."""
    for t in prange(touched.shape[0]):
        c = touched[t]
        eo = ev_off[t]
        cap = ev_off[t + 1] - eo
        cnt, sw = cell_apply(c, dims, C, flag, crange, boxes, cat, msk, static, ent_h,
                             ent_off[t], ent_off[t + 1], cell_n, cell_base, bx_h, bx_pos, ep_val, ep_dat,
                             scratch[numba.get_thread_id()], pm_keys, cell_pm_base[c] // 2, cell_pm_n[c],
                             ev_key, eo, cap)
        ev_n[t] = cnt
        swaps[t] = sw
        plus = cnt
        if cnt <= cap:
            plus = 0
            for r in range(cnt):
                if (ev_key[eo + r] & EVENT_REMOVED) == 0:
                    plus += 1
        ev_plus[t] = plus


@njit(**NJIT)
def cell_all_pairs(c, dims, cat, msk, static, cell_n, cell_base, bx_h, bx_pos, ep_dat, out, cnt):
    """Every pair of cell c from scratch (sweep over axis 0), written to ``out``; returns the count.

    Writes only while there is room (``out`` may be too small: the caller sizes it from the count).
    """
    base = cell_base[c]
    n = cell_n[c]
    eb = 2 * base
    cap = out.shape[0]
    for e in range(1, 2 * n + 1):
        d = ep_dat[0, eb + e]
        if (d & 1) != 0:
            continue
        s = d >> 1
        hs = bx_h[base + s]
        end = bx_pos[base + s, 1]
        for f in range(e + 1, end):
            d2 = ep_dat[0, eb + f]
            if (d2 & 1) != 0:
                continue
            t = d2 >> 1
            if _overlap_others(bx_pos, base, s, t, dims, 0):
                ht = bx_h[base + t]
                if pair_allowed(cat, msk, static, hs, ht):
                    cnt = _emit(out, 0, cap, cnt, pair_key(hs, ht))
    return cnt
