"""Grid kernels: rasterize a frame's boxes into wrapped grid cells and build per-cell op lists.

The grid always has three axes internally (a 2D world has one cell on the third axis). An object's
cells are stored as a wrapped range per axis, ``crange[h] = (lo0, lo1, lo2, span0, span1, span2)``:
its cells on axis a are ``(lo_a + i) mod C_a`` for ``i`` in ``0..span_a``. ``span_a <= C_a - 1``, so
a box wider than the whole grid lists every cell of that axis once (001 II §3c: an object is in every
cell its box touches; its handle remembers them).
"""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, njit, prange

FLAG_NONE = 0
FLAG_MOVED = 1
FLAG_REMOVED = 2
FLAG_ADDED = 3
FLAG_MOVED_CELLS = 4     # moved, and its cell range changed (it may leave cells)

_CLAMP = 4.0e18


@njit(**NJIT_INLINE)
def grid_in_range(cr, h, x, y, z, C):
    """Is wrapped cell (x, y, z) inside the range row ``cr[h]``?"""
    return (((x - cr[h, 0]) % C[0] <= cr[h, 3]) and ((y - cr[h, 1]) % C[1] <= cr[h, 4])
            and ((z - cr[h, 2]) % C[2] <= cr[h, 5]))


@njit(**NJIT_PARALLEL)
def grid_ranges(dims, bmin, inv, C, boxes, crange, upd_h, upd_boxes, add_boxes, newr, same):
    """New cell ranges of the frame's updates (rows [0, nu) of ``newr``) and adds (rows [nu, nu + na)),
    in parallel; ``same[i]`` is 2 when update i keeps its box, 1 when it keeps its cells, else 0."""
    nu = upd_h.shape[0]
    na = add_boxes.shape[0]
    for i in prange(nu + na):
        for a in range(3):
            if a < dims:
                if i < nu:
                    vlo = upd_boxes[i, a]
                    vhi = upd_boxes[i, dims + a]
                else:
                    vlo = add_boxes[i - nu, a]
                    vhi = add_boxes[i - nu, dims + a]
                qlo = min(max((np.float64(vlo) - bmin[a]) * inv[a], -_CLAMP), _CLAMP)
                qhi = min(max((np.float64(vhi) - bmin[a]) * inv[a], -_CLAMP), _CLAMP)
                lo = np.int64(np.floor(qlo))
                span = min(np.int64(np.floor(qhi)) - lo, C[a] - 1)
                newr[i, a] = lo % C[a]
                newr[i, 3 + a] = span
            else:
                newr[i, a] = 0
                newr[i, 3 + a] = 0
        if i < nu:
            h = upd_h[i]
            still = True
            for a in range(2 * dims):
                if upd_boxes[i, a] != boxes[h, a]:
                    still = False
            eq = True
            for a in range(6):
                if newr[i, a] != crange[h, a]:
                    eq = False
            same[i] = 2 if still else (1 if eq else 0)


@njit(**NJIT)
def grid_rasterize(dims, C, boxes, crange, flag, rem_h, upd_h, upd_boxes, add_h, add_boxes, newr, same,
                   cell_stamp, cell_tidx, frame):
    """Apply a validated frame to the object table and list the per-cell work (serial).

    ``newr`` and ``same`` come from ``grid_ranges``. Writes the new boxes, cell ranges and per-frame
    flags of the frame's objects, then returns ``(touched, ent_off, ent_h)``: the touched cells (int32 [T], in first-touch order), and for
    touched cell t the handles entering it, ``ent_h[ent_off[t]:ent_off[t + 1]]`` (int32), in frame order.
    A cell is touched when a member is removed or moved, or an object enters it.

    NOTE: written out without helper calls: a call with array arguments costs atomic reference-count
    updates per array, more than the per-object work here.
    """
    nr = rem_h.shape[0]
    nu = upd_h.shape[0]
    na = add_h.shape[0]
    # pass 1: bounds of the outputs
    bound_t = 0
    bound_e = 0
    for i in range(nr):
        h = rem_h[i]
        bound_t += np.int64(crange[h, 3] + 1) * np.int64(crange[h, 4] + 1) * np.int64(crange[h, 5] + 1)
    for i in range(nu + na):
        k = np.int64(newr[i, 3] + 1) * np.int64(newr[i, 4] + 1) * np.int64(newr[i, 5] + 1)
        if i < nu:
            if same[i] == 2:
                continue
            h = upd_h[i]
            bound_t += np.int64(crange[h, 3] + 1) * np.int64(crange[h, 4] + 1) * np.int64(crange[h, 5] + 1)
            if same[i] == 1:
                continue
        bound_t += k
        bound_e += k
    touched = np.empty(min(bound_t, cell_stamp.shape[0]), np.int32)
    ent_c = np.empty(bound_e, np.int32)
    ent_hh = np.empty(bound_e, np.int32)
    nt = 0
    ne = 0
    # pass 2: flags, touched cells (old cells of removed/moved objects, new cells), entries
    for i in range(nr + nu + na):
        if i < nr:
            h = rem_h[i]
            flag[h] = FLAG_REMOVED
        elif i < nr + nu:
            if same[i - nr] == 2:
                continue
            h = upd_h[i - nr]
            flag[h] = FLAG_MOVED
        else:
            h = add_h[i - nr - nu]
            flag[h] = FLAG_ADDED
        for phase in range(2):
            # phase 0: the cells the object is in now; phase 1: the cells it enters
            if phase == 0:
                if i >= nr + nu:
                    continue
                r0, r1, r2 = crange[h, 0], crange[h, 1], crange[h, 2]
                s0, s1, s2 = crange[h, 3], crange[h, 4], crange[h, 5]
            else:
                if i < nr or (i < nr + nu and same[i - nr] != 0):
                    continue
                j = i - nr
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
                        if phase == 1 and (i >= nr + nu or not (
                                (x - crange[h, 0]) % C[0] <= crange[h, 3]
                                and (y - crange[h, 1]) % C[1] <= crange[h, 4]
                                and (z - crange[h, 2]) % C[2] <= crange[h, 5])):
                            ent_c[ne] = c
                            ent_hh[ne] = h
                            ne += 1
        if i >= nr:
            j = i - nr
            if i >= nr + nu or same[j] == 0:
                for a in range(6):
                    crange[h, a] = newr[j, a]
                if i < nr + nu:
                    flag[h] = FLAG_MOVED_CELLS
            for a in range(2 * dims):
                if i < nr + nu:
                    boxes[h, a] = upd_boxes[j, a]
                else:
                    boxes[h, a] = add_boxes[j - nu, a]
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
