"""Arena kernels: move cell regions (SAP boxes and endpoints) to new places, and recompute the pair
events of cells whose event slice overflowed."""
import numpy as np

from .._numba import NJIT, inlined, njit
from .hashing import EVENT_REMOVED
from .pair_set import pair_set_find
from .sap_cell import cell_all_pairs


@njit(**NJIT)
def place_plan(cells, new_cap, pad, cell_cap, top):
    """``Arena.place``'s sizes in one pass: the new regions' bases, one after another from ``top``
    (``new_cap[i] + pad`` units each), their total, and the units the cells' current regions leave behind
    (``cell_cap + pad`` each, none for a cell without a region). Returns ``(new_base int64, total,
    left)``."""
    k = cells.shape[0]
    new_base = np.empty(k, np.int64)
    w = np.int64(top)
    left = 0
    for i in range(k):
        new_base[i] = w
        w += np.int64(new_cap[i]) + pad
        old = np.int64(cell_cap[cells[i]])
        if old > 0:
            left += old + pad
    return new_base, w - top, left


@njit(**NJIT)
def cells_growth(touched, need, cell_cap):
    """The touched cells whose SAP region is smaller than its ``need`` (``frame_room``), and the capacity
    each gets: a quarter more than its need, + 2 (cells breathe as objects cross their borders, without
    a move every frame). Returns ``(cells int32, caps int32, max_cap)``, max_cap the largest capacity
    among the touched cells once they have grown."""
    nt = touched.shape[0]
    k = 0
    for t in range(nt):
        if need[t] > cell_cap[touched[t]]:
            k += 1
    cells = np.empty(k, np.int32)
    caps = np.empty(k, np.int32)
    max_cap = 0
    k = 0
    for t in range(nt):
        c = touched[t]
        cap = np.int64(cell_cap[c])
        if need[t] > cap:
            cap = need[t] + need[t] // 4 + 2
            cells[k] = c
            caps[k] = cap
            k += 1
        max_cap = max(max_cap, cap)
    return cells, caps, max_cap


@njit(**NJIT)
def frame_room(touched, ent_off, cell_n, cell_cap, cell_pm_n):
    """Sizes of a frame's touched cells, in one pass: ``(need, grow, ev_off, ev_cap, max_cap, work)``.

    need[t]: boxes cell touched[t] holds after the frame at most (its boxes and those entering it);
    grow: some cell needs more room than it has; ev_cap[t]: its slice of the event buffer (the events
    of a frame are bounded by the cell's pairs, boxes and entries; a slice that overflows is redone
    exactly), at ``ev_off[t]``; max_cap: the largest capacity among them (before any growth); work:
    the boxes and entries to process, which decides the thread count.
    """
    nt = touched.shape[0]
    need = np.empty(nt, np.int64)
    ev_cap = np.empty(nt, np.int64)
    ev_off = np.empty(nt + 1, np.int64)
    ev_off[0] = 0
    grow = False
    max_cap = 0
    work = 0
    for t in range(nt):
        c = touched[t]
        n = np.int64(cell_n[c])
        k = ent_off[t + 1] - ent_off[t]
        need[t] = n + k
        grow |= n + k > cell_cap[c]
        max_cap = max(max_cap, np.int64(cell_cap[c]))
        ev_cap[t] = 8 + np.int64(cell_pm_n[c]) // 2 + n // 2 + 2 * k
        ev_off[t + 1] = ev_off[t] + ev_cap[t]
        work += n + k
    return need, grow, ev_off, ev_cap, max_cap, work


#: ``frame_room`` inlined (``kernels.frame._frame_listed``: no call, no reference-count updates of its arrays).
frame_room_inlined = inlined(frame_room)


@njit(**NJIT)
def cells_move(cells, new_base, new_cap, dims, cell_n, cell_base, cell_cap,
               old_h, old_pos, old_key, bx_h, bx_pos, ep_key):
    """Copy the SAP regions of ``cells`` to ``new_base`` (box units) with capacity ``new_cap``.

    The old and new arrays may be the same objects only when the regions do not overlap.
    """
    for i in range(cells.shape[0]):
        c = cells[i]
        n = cell_n[c]
        ob = cell_base[c]
        nb = new_base[i]
        for s in range(n):
            bx_h[nb + s] = old_h[ob + s]
            for k in range(2 * dims):
                bx_pos[nb + s, k] = old_pos[ob + s, k]
        for a in range(dims):
            ep_key[a, 2 * nb] = 0           # the sentinel
            for e in range(1, 2 * n + 1):
                ep_key[a, 2 * nb + e] = old_key[a, 2 * ob + e]
        cell_base[c] = nb
        cell_cap[c] = new_cap[i]


@njit(**NJIT)
def cells_recompute_events(touched, over, dims, cat, msk, static, cell_n, cell_base, bx_h, bx_pos,
                           ep_key, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys,
                           ev_key, ev_off, ev_n):
    """Rebuild the event buffer with exact events for the cells whose slice overflowed.

    For such a cell the SAP is already up to date; its pairs are recomputed from scratch and the events
    become the difference with its pair set (which still holds the state before the frame).
    Returns (ev_key, ev_off, ev_n), new arrays.
    """
    nt = touched.shape[0]
    empty = np.empty(0, np.uint64)
    # pass 1: size and fill the full pair lists of the overflowed cells
    full_off = np.zeros(nt + 1, np.int64)
    for t in range(nt):
        k = 0
        if over[t]:
            k = cell_all_pairs(touched[t], dims, cat, msk, static, cell_n, cell_base, bx_h, bx_pos,
                               ep_key, empty, 0)
        full_off[t + 1] = full_off[t] + k
    full = np.empty(full_off[nt], np.uint64)
    for t in range(nt):
        if over[t]:
            cell_all_pairs(touched[t], dims, cat, msk, static, cell_n, cell_base, bx_h, bx_pos, ep_key,
                           full[full_off[t]:full_off[t + 1]], 0)
            full[full_off[t]:full_off[t + 1]].sort()
    # pass 2: sizes of the new slices
    new_n = ev_n.copy()
    for t in range(nt):
        if not over[t]:
            continue
        c = touched[t]
        sb = cell_pm_base[c]
        cap = cell_pm_cap[c]
        k = 0
        for i in range(full_off[t], full_off[t + 1]):
            if pair_set_find(pm_slots, pm_keys, sb, cap, sb // 2, full[i]) < 0:
                k += 1
        f = full[full_off[t]:full_off[t + 1]]
        for p in range(cell_pm_n[c]):
            key = pm_keys[sb // 2 + p]
            j = np.searchsorted(f, key)
            if j >= f.shape[0] or f[j] != key:
                k += 1
        new_n[t] = k
    new_off = np.zeros(nt + 1, np.int64)
    for t in range(nt):
        new_off[t + 1] = new_off[t] + new_n[t]
    out = np.empty(new_off[nt], np.uint64)
    for t in range(nt):
        w = new_off[t]
        if not over[t]:
            for r in range(ev_n[t]):
                out[w + r] = ev_key[ev_off[t] + r]
            continue
        c = touched[t]
        sb = cell_pm_base[c]
        cap = cell_pm_cap[c]
        f = full[full_off[t]:full_off[t + 1]]
        for p in range(cell_pm_n[c]):
            key = pm_keys[sb // 2 + p]
            j = np.searchsorted(f, key)
            if j >= f.shape[0] or f[j] != key:
                out[w] = key | EVENT_REMOVED
                w += 1
        for i in range(f.shape[0]):
            if pair_set_find(pm_slots, pm_keys, sb, cap, sb // 2, f[i]) < 0:
                out[w] = f[i]
                w += 1
    return out, new_off, new_n


@njit(**NJIT)
def objects_query(boxes, alive, dims, region, out):
    """Handles of live boxes intersecting ``region`` (inclusive); returns the count written to out."""
    k = 0
    for h in range(alive.shape[0]):
        if alive[h] == 0:
            continue
        ok = True
        for a in range(dims):
            if not (boxes[h, a] <= region[dims + a] and region[a] <= boxes[h, dims + a]):
                ok = False
                break
        if ok:
            out[k] = h
            k += 1
    return k
