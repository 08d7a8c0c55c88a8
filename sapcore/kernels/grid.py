"""Grid kernels: rasterize a frame's boxes into wrapped grid cells and build per-cell op lists.

The grid always has three axes internally (a 2D world has one cell on the third axis). An object's
cells are stored as a wrapped range per axis, ``crange[h] = (lo0, lo1, lo2, span0, span1, span2)``:
its cells on axis a are ``(lo_a + i) mod C_a`` for ``i`` in ``0..span_a``. ``span_a <= C_a - 1``, so
a box wider than the whole grid lists every cell of that axis once (001 II §3c: an object is in every
cell its box touches; its handle remembers them).
"""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, NJIT_SERIAL, inlined, njit, prange
from .prefetch import prefetch_flat, prefetch_row

#: rows ahead that grid_ranges prefetches (its updates come in the client's order, the object rows they
#: read and write are in handle order)
_AHEAD = 16

FLAG_NONE = 0
FLAG_MOVED = 1
FLAG_REMOVED = 2
FLAG_ADDED = 3
FLAG_MOVED_CELLS = 4     # moved, and its cell range changed (it may leave cells)

_CLAMP = 4.0e18


@njit(**NJIT_INLINE)
def in_crange(crange, h, x, y, z, C):
    """Is cell (x, y, z) one of the cells of object h's range ``crange[h]`` (wrapped)? Both the cell and
    the range's first cell are in [0, C) on each axis, so their wrapped distance needs one addition of
    C at most, not a division."""
    dx = x - crange[h, 0]
    dy = y - crange[h, 1]
    dz = z - crange[h, 2]
    if dx < 0:
        dx += C[0]
    if dy < 0:
        dy += C[1]
    if dz < 0:
        dz += C[2]
    return dx <= crange[h, 3] and dy <= crange[h, 4] and dz <= crange[h, 5]


@njit(**NJIT_INLINE)
def _cell_index(v, a, bmin, inv):
    """Unwrapped cell index of coordinate v on axis a (clamped far outside, so it fits in int64)."""
    return np.int64(np.floor(min(max((np.float64(v) - bmin[a]) * inv[a], -_CLAMP), _CLAMP)))


@njit(**NJIT_INLINE)
def _cell_span(vlo, vhi, a, bmin, inv, C):
    """(first cell, wrapped into [0, C[a]); number of further cells, at most C[a] - 1) of [vlo, vhi]."""
    lo = _cell_index(vlo, a, bmin, inv)
    span = min(_cell_index(vhi, a, bmin, inv) - lo, C[a] - 1)
    if lo < 0 or lo >= C[a]:    # outside the bounds: wrap (a division, so only here)
        lo = lo % C[a]
    return lo, span


@njit(**NJIT_INLINE)
def _row_range(src, k, dims, bmin, inv, C, newr, i):
    """Cell range of box row ``src[k]`` into ``newr[i]`` (lo0, lo1, lo2, span0, span1, span2)."""
    for a in range(3):
        lo = 0
        span = 0
        if a < dims:
            lo, span = _cell_span(src[k, np.uint64(a)], src[k, np.uint64(dims + a)], a, bmin, inv, C)
        newr[i, np.uint64(a)] = lo
        newr[i, np.uint64(3 + a)] = span


@njit(**NJIT_INLINE)
def _update_range(i, dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, newr, same, rows, row_mode,
                  lastpos, by_row, fill, mark, old_rows, row_of, by_old):
    """Update row i of ``grid_ranges``. ``by_old``: the old cell range of an update on the last list is
    computed from its box there, ``old_rows[row_of[i]]`` (read nearly in order: the new list mostly
    follows the last one), instead of read from ``crange`` by handle (a line of memory a row, scattered)."""
    p = np.int64(-1)
    if by_old:
        p = row_of[i]
    if i + _AHEAD < upd_h.shape[0]:
        ha = upd_h[i + _AHEAD]
        prefetch_row(boxes, ha)
        if not by_old or row_of[i + _AHEAD] < 0:
            prefetch_row(crange, ha)
        if mark:
            prefetch_flat(flag, ha)
        if row_mode == 2:
            prefetch_flat(lastpos, ha)
    h = np.uint64(upd_h[i])     # unsigned indices: numba checks a signed one for a negative value
    ui = np.uint64(i)
    if row_mode == 2:
        lastpos[h] = i
        if fill:
            for a in range(2 * dims):
                rows[ui, np.uint64(a)] = upd_boxes[ui, np.uint64(a)]
    if same[ui] == 2:       # the update keeps its box: nothing else to do for it
        return
    _row_range(upd_boxes, ui, dims, bmin, inv, C, newr, ui)
    eq = True
    if p >= 0:      # an object's range is its box's (the axes past dims are 0 in both)
        up = np.uint64(p)
        for a in range(dims):
            olo, ospan = _cell_span(old_rows[up, np.uint64(a)], old_rows[up, np.uint64(dims + a)], a, bmin, inv, C)
            eq = eq & (olo == newr[ui, np.uint64(a)]) & (ospan == newr[ui, np.uint64(3 + a)])
    else:
        for a in range(6):
            eq = eq & (crange[h, np.uint64(a)] == newr[ui, np.uint64(a)])
    same[ui] = 1 if eq else 0
    if not eq:
        flag[h] = FLAG_MOVED_CELLS
    elif mark:
        flag[h] = FLAG_MOVED
    for a in range(2 * dims):
        boxes[h, np.uint64(a)] = upd_boxes[ui, np.uint64(a)]
    if by_row:
        for a in range(2 * dims):
            rows[ui, np.uint64(a)] = upd_boxes[ui, np.uint64(a)]


@njit(**NJIT_INLINE)
def _add_range(k, nu, dims, bmin, inv, C, boxes, crange, flag, add_h, add_boxes, newr, rows, row_mode, lastpos,
               fill):
    """Add row k of ``grid_ranges``."""
    h = add_h[k]
    _row_range(add_boxes, k, dims, bmin, inv, C, newr, nu + k)
    for a in range(6):
        crange[h, a] = newr[nu + k, a]
    flag[h] = FLAG_ADDED
    for a in range(2 * dims):
        boxes[h, a] = add_boxes[k, a]
    if row_mode == 2:
        lastpos[h] = nu + k
        if fill:
            for a in range(2 * dims):
                rows[nu + k, a] = add_boxes[k, a]


@njit(**NJIT_PARALLEL)
def grid_ranges(dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, add_h, add_boxes, newr, same,
                rows, row_mode, lastpos, mark, old_rows, row_of, parts):
    """First rasterize pass, in parallel over the frame's updates (in ``parts`` parts of consecutive
    updates, one a thread), then its adds.

    New cell ranges go to ``newr`` (rows [0, nu) updates, [nu, nu + na) adds). ``same[i]`` is 2 on entry
    when update i keeps its box (set by the box check; it is left alone), else it becomes 1 when the
    update keeps its cells, 0 when not. Writes the new boxes and the per-frame flags (without ``mark``, the
    cells taking every staying box as moved, only those of the updates that change cells), and the cell
    ranges of added objects (a moved object's range changes in the serial pass, which still needs the
    old one).

    The list that guides the next frame (the updates, then the adds; see ``World._remember_order``),
    written here while the rows are at hand: ``row_mode`` 1, the same list as the last frame's: a moved
    update's row of ``rows`` (its boxes by list position) gets its new box; 2, a new list: every row of
    ``rows`` (if it has any) and the list position of every object (``lastpos[h]``); 0: nothing. With a new
    list, ``old_rows`` (the last list's boxes by row, or none) and ``row_of`` (each update's position on the
    last list, -1 off it) give the old cell ranges of the updates on the last list (see ``_update_range``).
    """
    nu = upd_h.shape[0]
    na = add_boxes.shape[0]
    by_row = row_mode == 1 and rows.shape[0] == nu
    fill = row_mode == 2 and rows.shape[0] == nu + na
    by_old = row_mode == 2 and old_rows.shape[0] > 0 and row_of.shape[0] == nu
    # a plain loop over each part's updates: ~0.6 ms less of a churn2d-100k tick (its adds make a new list
    # every frame) than ``prange`` over the updates (both kernels loaded from the cache, replays in turn)
    for p in prange(parts):
        lo = nu * p // parts
        hi = nu * (p + 1) // parts
        if dims == 2:
            for i in range(lo, hi):
                _update_range(i, 2, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, newr, same, rows,
                              row_mode, lastpos, by_row, fill, mark, old_rows, row_of, by_old)
        else:
            for i in range(lo, hi):
                _update_range(i, 3, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, newr, same, rows,
                              row_mode, lastpos, by_row, fill, mark, old_rows, row_of, by_old)
    if na > 0:
        for k in prange(na):
            _add_range(k, nu, dims, bmin, inv, C, boxes, crange, flag, add_h, add_boxes, newr, rows, row_mode,
                       lastpos, fill)


@njit(**NJIT_SERIAL)
def grid_ranges_serial(dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, add_h, add_boxes, newr, same,
                       rows, row_mode, lastpos):
    """``grid_ranges`` on the calling thread alone (no parallel launch); the same results."""
    nu = upd_h.shape[0]
    na = add_boxes.shape[0]
    by_row = row_mode == 1 and rows.shape[0] == nu
    fill = row_mode == 2 and rows.shape[0] == nu + na
    for i in range(nu):
        # (the old ranges from ``crange``: ``rows`` and ``lastpos`` stand for the unread old rows and positions)
        _update_range(i, dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, newr, same, rows, row_mode,
                      lastpos, by_row, fill, True, rows, lastpos, False)
    for k in range(na):
        _add_range(k, nu, dims, bmin, inv, C, boxes, crange, flag, add_h, add_boxes, newr, rows, row_mode,
                   lastpos, fill)


@njit(**NJIT_INLINE)
def _ranges_listed(dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, newr, same, rows, big, mark):
    """``grid_ranges_serial`` of a frame of the list's updates alone (``dims`` a constant; no adds, the
    list unchanged), which also writes the moved rows' boxes into ``rows``: the same cell ranges,
    ``same``, flags and boxes, ~20-30% faster (the axes of the world only). ``big`` (a constant), for a
    big frame, whose object rows are scattered over memory the frame's other phases evict (a small
    frame's are at hand): the old cell ranges are computed from the old boxes in ``rows`` (read in
    order) instead of read from ``crange`` (an object's range is its box's), and the object rows
    ``_AHEAD`` updates ahead are requested from memory. Without ``mark`` (the cells take every staying box
    as moved), only the flags of the updates that change cells are written."""
    n = upd_h.shape[0]
    for i_ in range(n):
        i = np.uint64(i_)       # unsigned indices: numba checks a signed one for a negative value
        if big and i_ + _AHEAD < n:
            ha = upd_h[i_ + _AHEAD]
            prefetch_row(boxes, ha)
            if mark:
                prefetch_flat(flag, ha)
        if same[i] == 2:        # the update keeps its box
            continue
        h = np.uint64(upd_h[i])
        eq = True
        for a_ in range(dims):
            a = np.uint64(a_)
            # ``_cell_span`` written out: calling it here made the small one-call frame 5-13% slower (100 to
            # 10,000 objects, interleaved), though it is inlined too; the old range (``big``) calls it
            c = C[a]
            lo = np.int64(np.floor(min(max((np.float64(upd_boxes[i, a]) - bmin[a]) * inv[a], -_CLAMP), _CLAMP)))
            hi = np.int64(np.floor(min(max((np.float64(upd_boxes[i, np.uint64(dims) + a]) - bmin[a]) * inv[a],
                                           -_CLAMP), _CLAMP)))
            span = min(hi - lo, c - 1)
            if lo < 0 or lo >= c:       # outside the bounds: wrap
                lo = lo % c
            newr[i, a] = lo
            newr[i, np.uint64(3) + a] = span
            if big:
                olo, ospan = _cell_span(rows[i, a], rows[i, np.uint64(dims) + a], a_, bmin, inv, C)
                eq &= (olo == lo) & (ospan == span)
            else:
                eq &= (crange[h, a] == lo) & (crange[h, np.uint64(3) + a] == span)
        for a_ in range(dims, 3):
            a = np.uint64(a_)
            newr[i, a] = 0
            newr[i, np.uint64(3) + a] = 0
            if not big:
                eq &= (crange[h, a] == 0) & (crange[h, np.uint64(3) + a] == 0)
        same[i] = 1 if eq else 0
        if not eq:
            flag[h] = FLAG_MOVED_CELLS
        elif mark:
            flag[h] = FLAG_MOVED
        for a_ in range(2 * dims):
            a = np.uint64(a_)
            boxes[h, a] = upd_boxes[i, a]
            rows[i, a] = upd_boxes[i, a]


@njit(**NJIT_PARALLEL)
def grid_ranges_listed(dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, newr, same, rows, parts, mark):
    """``grid_ranges`` of a frame of the list's updates alone (``row_mode`` 1 with a row of ``rows`` per
    update, no adds), by ``_ranges_listed`` in ``parts`` parts of consecutive updates (one a thread): the
    same results (``mark`` as there)."""
    n = upd_h.shape[0]
    for p in prange(parts):
        lo = n * p // parts
        hi = n * (p + 1) // parts
        if dims == 2:
            _ranges_listed(2, bmin, inv, C, boxes, crange, flag, upd_h[lo:hi], upd_boxes[lo:hi], newr[lo:hi],
                           same[lo:hi], rows[lo:hi], True, mark)
        else:
            _ranges_listed(3, bmin, inv, C, boxes, crange, flag, upd_h[lo:hi], upd_boxes[lo:hi], newr[lo:hi],
                           same[lo:hi], rows[lo:hi], True, mark)


@njit(**NJIT)
def spatial_order(dims, bmin, inv, C, boxes, handles, crange, fresh):
    """Reorder ``handles`` (int32 [K], one per row of ``boxes``) in place so that they ascend in the
    grid order of the rows' min corners: row i gets the i-th smallest handle of its cell-major rank.

    Objects that share cells then have nearby handles, so a cell's members read nearby rows of the
    per-object arrays (boxes, flags, cell ranges) instead of rows scattered over the whole world.
    Handles below ``fresh`` are reused (freed by removed objects, scattered over the handle range): they
    are handed out in the grid order of the cells their last objects were in (``crange``), so a new
    object gets the handle of a removed object from about the same place, whose handle neighbours are
    still its neighbours in space; fresh handles follow in ascending order.
    Stable (frame order within a cell): a counting sort over the cells when they are fewer than 8 per
    row, else a merge sort of the keys.
    """
    k = boxes.shape[0]
    ncell = C[0] * C[1] * C[2]
    key = np.empty(k, np.int64)
    for i in range(k):
        c = np.int64(0)
        for a in range(3):
            q = np.int64(0)
            if a < dims:
                q = _cell_index(boxes[i, a], a, bmin, inv) % C[a]
            c = c * C[a] + q
        key[i] = c
    # the handles in the order they are handed out: reused ones by their last object's cell, then fresh
    # (only fresh ones, ascending, as ``ObjectStore.reserve`` gives them to a batch insert: already in order)
    pool = np.empty(k, handles.dtype)
    ordered = True
    for i in range(k):
        if handles[i] < fresh or (i and handles[i] <= handles[i - 1]):
            ordered = False
            break
    if ordered:
        pool[:] = handles
    else:
        pk = np.empty(k, np.int64)
        for i in range(k):
            h = handles[i]
            if h < fresh:
                pk[i] = ((np.int64(crange[h, 0]) * C[1] + crange[h, 1]) * C[2] + crange[h, 2]) * (np.int64(1) << 32) + h
            else:
                pk[i] = ncell * (np.int64(1) << 32) + h
        pk.sort()
        for i in range(k):
            pool[i] = pk[i] & ((np.int64(1) << 32) - 1)
    if ncell > 8 * k:
        order = np.argsort(key, kind="mergesort")
        for r in range(k):
            handles[order[r]] = pool[r]
        return
    count = np.zeros(ncell + 1, np.int64)
    for i in range(k):
        count[key[i] + 1] += 1
    for c in range(ncell):
        count[c + 1] += count[c]
    for i in range(k):
        c = key[i]
        handles[i] = pool[count[c]]
        count[c] += 1


@njit(**NJIT)
def grid_rasterize(C, crange, flag, cell_n, rem_h, upd_h, add_h, newr, same, dense,
                   cell_stamp, cell_tidx, frame):
    """Second rasterize pass (serial): the touched cells and the objects entering each.

    Returns ``(touched, ent_off, ent_h)``: the touched cells (int32 [T], in first-touch order), and for
    touched cell t the handles entering it, ``ent_h[ent_off[t]:ent_off[t + 1]]`` (int32), in frame order.
    A cell is touched when a member is removed or moved, or an object enters it; with ``dense`` (most
    objects move) every occupied cell is touched up front instead of cell by cell. Updates the cell
    ranges of moved objects that changed cells.

    NOTE: only inlined helpers (``NJIT_INLINE``): a real call with array arguments costs atomic
    reference-count updates per array, more than the per-object work here. This kernel is longer than
    the others on purpose: cut into inlined steps (output bounds, the walk over a cell range, the
    counting sort) it measured twice as slow (sparse3d-100k: rasterize 0.9 -> 1.8 ms a tick, batch
    insert 50-68 -> 87-91 ms), and even with only the bounds and the sort cut out, batch insert was 87 ms.
    """
    nr = rem_h.shape[0]
    nu = upd_h.shape[0]
    na = add_h.shape[0]
    ncell = cell_stamp.shape[0]
    # bounds of the outputs, and the updates to visit below: with ``dense``, only those that change
    # cells (the cells they are in are touched already); else every update that moved
    bound_t = 0
    bound_e = 0
    for i in range(nr):
        h = rem_h[i]
        bound_t += np.int64(crange[h, 3] + 1) * np.int64(crange[h, 4] + 1) * np.int64(crange[h, 5] + 1)
    visit = np.empty(nu, np.int64)
    nv = 0
    i0 = 0
    if dense:
        # most updates keep their cells (same 1): whole words of them are skipped (8 bytes compared at once)
        sw = same[:nu - nu % 8].view(np.uint64)
        ones = np.uint64(0x0101010101010101)
        for q in range(sw.shape[0]):
            if sw[q] == ones:
                continue
            for i in range(8 * q, 8 * q + 8):
                if same[i] == 0:
                    visit[nv] = i
                    nv += 1
                    k = np.int64(newr[i, 3] + 1) * np.int64(newr[i, 4] + 1) * np.int64(newr[i, 5] + 1)
                    bound_t += k
                    bound_e += k
        i0 = 8 * sw.shape[0]
    for i in range(i0, nu + na):
        if i < nu:
            sm = same[i]
            if sm == 2:         # its row of newr was never written
                continue
            if not dense:
                h = upd_h[i]
                bound_t += np.int64(crange[h, 3] + 1) * np.int64(crange[h, 4] + 1) * np.int64(crange[h, 5] + 1)
            if sm == 1:
                if not dense:
                    visit[nv] = i
                    nv += 1
                continue
            visit[nv] = i
            nv += 1
        k = np.int64(newr[i, 3] + 1) * np.int64(newr[i, 4] + 1) * np.int64(newr[i, 5] + 1)
        bound_t += k
        bound_e += k
    touched = np.empty(ncell if dense else min(bound_t, ncell), np.int32)
    ent_c = np.empty(bound_e, np.int32)
    ent_hh = np.empty(bound_e, np.int32)
    nt = 0
    ne = 0
    if dense:
        for c in range(ncell):
            if cell_n[c] > 0:
                cell_stamp[c] = frame
                cell_tidx[c] = nt
                touched[nt] = c
                nt += 1
    for q in range(nr + nv + na):
        # the cell ranges of the update _AHEAD visits ahead are requested from memory (its object's row
        # is anywhere in the object arrays)
        if nr <= q + _AHEAD < nr + nv:
            ia = visit[q + _AHEAD - nr]
            prefetch_row(crange, upd_h[ia])
            prefetch_row(newr, ia)
        # phase 0: the cells the object is in now (removed or moved); phase 1: the cells it enters
        if q < nr:
            i = q
        elif q < nr + nv:
            i = nr + visit[q - nr]
        else:
            i = q - nv + nu
        if i < nr:
            h = rem_h[i]
            flag[h] = FLAG_REMOVED
            first, last = 0, 0
        elif i < nr + nu:
            if same[i - nr] == 2:
                continue
            h = upd_h[i - nr]
            first, last = 0, (0 if same[i - nr] == 1 else 1)
        else:
            h = add_h[i - nr - nu]
            first, last = 1, 1
        if dense and first == 0:
            first = 1
        for phase in range(first, last + 1):
            j = i - nr
            if phase == 0:
                r0, r1, r2 = crange[h, 0], crange[h, 1], crange[h, 2]
                s0, s1, s2 = crange[h, 3], crange[h, 4], crange[h, 5]
            else:
                r0, r1, r2 = newr[j, 0], newr[j, 1], newr[j, 2]
                s0, s1, s2 = newr[j, 3], newr[j, 4], newr[j, 5]
            for ii in range(s0 + 1):
                x = r0 + ii
                if x >= C[0]:
                    x -= C[0]
                for jj in range(s1 + 1):
                    y = r1 + jj
                    if y >= C[1]:
                        y -= C[1]
                    for kk in range(s2 + 1):
                        z = r2 + kk
                        if z >= C[2]:
                            z -= C[2]
                        c = (x * C[1] + y) * C[2] + z
                        if cell_stamp[c] != frame:
                            cell_stamp[c] = frame
                            cell_tidx[c] = nt
                            touched[nt] = c
                            nt += 1
                        if phase == 1 and (i >= nr + nu or not in_crange(crange, h, x, y, z, C)):
                            ent_c[ne] = c
                            ent_hh[ne] = h
                            ne += 1
        if nr <= i < nr + nu and same[i - nr] == 0:
            for a in range(6):
                crange[h, a] = newr[i - nr, a]
    # counting sort of the entries by touched index (stable: frame order inside a cell)
    ent_off = np.empty(nt + 1, np.int64)     # (zeroed by a loop, here and below: see ``rasterize_inlined``)
    for t in range(nt + 1):
        ent_off[t] = 0
    for e in range(ne):
        ent_off[cell_tidx[ent_c[e]] + 1] += 1
    for t in range(nt):
        ent_off[t + 1] += ent_off[t]
    fill = np.empty(nt, np.int64)
    for t in range(nt):
        fill[t] = ent_off[t]
    ent_h = np.empty(ne, np.int32)
    for e in range(ne):
        t = cell_tidx[ent_c[e]]
        ent_h[fill[t]] = ent_hh[e]
        fill[t] += 1
    return touched[:nt], ent_off, ent_h


#: ``grid_rasterize`` inlined (``kernels.frame._frame_listed``: no call, whose 13 array arguments would each
#: cost two atomic reference-count updates). Written with loops, no array expression: a kernel of the serial
#: pipeline (``NJIT_SERIAL``) would turn ``np.zeros`` or ``.copy()`` into a parallel loop.
rasterize_inlined = inlined(grid_rasterize)
