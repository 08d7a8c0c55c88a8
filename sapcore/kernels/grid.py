"""Grid kernels: rasterize a frame's boxes into wrapped grid cells and build per-cell op lists.

The grid always has three axes internally (a 2D world has one cell on the third axis). An object's
cells are stored as a wrapped range per axis, ``crange[h] = (lo0, lo1, lo2, span0, span1, span2)``:
its cells on axis a are ``(lo_a + i) mod C_a`` for ``i`` in ``0..span_a``. ``span_a <= C_a - 1``, so
a box wider than the whole grid lists every cell of that axis once (001 II §3c: an object is in every
cell its box touches; its handle remembers them).
"""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, njit

FLAG_NONE = 0
FLAG_MOVED = 1
FLAG_REMOVED = 2
FLAG_ADDED = 3
FLAG_MOVED_CELLS = 4     # moved, and its cell range changed (it may leave cells)

_CLAMP = 4.0e18


@njit(**NJIT_INLINE)
def grid_range(boxes, i, dims, bmin, inv, C, out, j):
    """Wrapped cell range of box row ``boxes[i]`` (float32 [2*dims]) into row ``out[j]`` (int32 [6])."""
    for a in range(3):
        if a < dims:
            qlo = (np.float64(boxes[i, a]) - bmin[a]) * inv[a]
            qhi = (np.float64(boxes[i, dims + a]) - bmin[a]) * inv[a]
            qlo = min(max(qlo, -_CLAMP), _CLAMP)
            qhi = min(max(qhi, -_CLAMP), _CLAMP)
            lo = np.int64(np.floor(qlo))
            hi = np.int64(np.floor(qhi))
            span = hi - lo
            if span > C[a] - 1:
                span = C[a] - 1
            out[j, a] = np.int32(lo % C[a])
            out[j, 3 + a] = np.int32(span)
        else:
            out[j, a] = 0
            out[j, 3 + a] = 0


@njit(**NJIT_INLINE)
def grid_in_range(cr, h, x, y, z, C):
    """Is wrapped cell (x, y, z) inside the range row ``cr[h]``?"""
    return (((x - cr[h, 0]) % C[0] <= cr[h, 3]) and ((y - cr[h, 1]) % C[1] <= cr[h, 4])
            and ((z - cr[h, 2]) % C[2] <= cr[h, 5]))


@njit(**NJIT_INLINE)
def grid_same_range(r, i, s, j):
    for a in range(6):
        if r[i, a] != s[j, a]:
            return False
    return True


@njit(**NJIT_INLINE)
def grid_range_cells(r, i):
    return np.int64(r[i, 3] + 1) * np.int64(r[i, 4] + 1) * np.int64(r[i, 5] + 1)


@njit(**NJIT_INLINE)
def _visit(r, ri, C, h, old, oi, has_old, cell_stamp, cell_tidx, frame, touched, nt,
           ent_c, ent_h, ne, entries):
    """Touch every cell of range row r[ri]; if ``entries``, list (cell, h) for cells not in old[oi]."""
    for i in range(r[ri, 3] + 1):
        x = r[ri, 0] + i
        if x >= C[0]:
            x -= C[0]
        for j in range(r[ri, 4] + 1):
            y = r[ri, 1] + j
            if y >= C[1]:
                y -= C[1]
            for k in range(r[ri, 5] + 1):
                z = r[ri, 2] + k
                if z >= C[2]:
                    z -= C[2]
                c = (x * C[1] + y) * C[2] + z
                if cell_stamp[c] != frame:
                    cell_stamp[c] = frame
                    cell_tidx[c] = nt
                    touched[nt] = c
                    nt += 1
                if entries and not (has_old and grid_in_range(old, oi, x, y, z, C)):
                    ent_c[ne] = c
                    ent_h[ne] = h
                    ne += 1
    return nt, ne


@njit(**NJIT)
def grid_rasterize(dims, bmin, inv, C, boxes, crange, flag,
                   rem_h, upd_h, upd_boxes, add_h, add_boxes,
                   cell_stamp, cell_tidx, frame):
    """Apply a validated frame to the object table and list the per-cell work (serial).

    Writes the new boxes, cell ranges and per-frame flags of the frame's objects, then returns
    ``(touched, ent_off, ent_h)``: the touched cells (int32 [T], in first-touch order), and for
    touched cell t the handles entering it, ``ent_h[ent_off[t]:ent_off[t + 1]]`` (int32), in frame order.
    A cell is touched when a member is removed or moved, or an object enters it.
    """
    nr = rem_h.shape[0]
    nu = upd_h.shape[0]
    na = add_h.shape[0]
    newr = np.empty((nu + na, 6), np.int32)
    bound_t = 0
    bound_e = 0
    for i in range(nr):
        bound_t += grid_range_cells(crange, rem_h[i])
    for i in range(nu):
        grid_range(upd_boxes, i, dims, bmin, inv, C, newr, i)
        h = upd_h[i]
        bound_t += grid_range_cells(crange, h)
        if not grid_same_range(newr, i, crange, h):
            k = grid_range_cells(newr, i)
            bound_t += k
            bound_e += k
    for i in range(na):
        grid_range(add_boxes, i, dims, bmin, inv, C, newr, nu + i)
        k = grid_range_cells(newr, nu + i)
        bound_t += k
        bound_e += k
    ncell = cell_stamp.shape[0]
    touched = np.empty(min(bound_t, ncell), np.int32)
    ent_c = np.empty(bound_e, np.int32)
    ent_hh = np.empty(bound_e, np.int32)
    nt = 0
    ne = 0
    for i in range(nr):
        h = rem_h[i]
        flag[h] = FLAG_REMOVED
        nt, ne = _visit(crange, h, C, h, crange, h, False, cell_stamp, cell_tidx, frame,
                        touched, nt, ent_c, ent_hh, ne, False)
    for i in range(nu):
        h = upd_h[i]
        flag[h] = FLAG_MOVED
        nt, ne = _visit(crange, h, C, h, crange, h, False, cell_stamp, cell_tidx, frame,
                        touched, nt, ent_c, ent_hh, ne, False)
        if not grid_same_range(newr, i, crange, h):
            nt, ne = _visit(newr, i, C, h, crange, h, True, cell_stamp, cell_tidx, frame,
                            touched, nt, ent_c, ent_hh, ne, True)
            for a in range(6):
                crange[h, a] = newr[i, a]
            flag[h] = FLAG_MOVED_CELLS
        for a in range(2 * dims):
            boxes[h, a] = upd_boxes[i, a]
    for i in range(na):
        h = add_h[i]
        flag[h] = FLAG_ADDED
        for a in range(6):
            crange[h, a] = newr[nu + i, a]
        nt, ne = _visit(crange, h, C, h, crange, h, False, cell_stamp, cell_tidx, frame,
                        touched, nt, ent_c, ent_hh, ne, True)
        for a in range(2 * dims):
            boxes[h, a] = add_boxes[i, a]
    # counting sort of the entries by touched index (stable: frame order inside a cell)
    ent_off = np.zeros(nt + 1, np.int64)
    for e in range(ne):
        ent_off[cell_tidx[ent_c[e]] + 1] += 1
    for t in range(nt):
        ent_off[t + 1] += ent_off[t]
    fill = ent_off[:nt].copy()
    ent_h = np.empty(ne, np.int32)
    for e in range(ne):
        t = cell_tidx[ent_c[e]]
        ent_h[fill[t]] = ent_hh[e]
        fill[t] += 1
    return touched[:nt], ent_off, ent_h
