"""A small frame's serial phases in two calls (``World`` calls them when the whole frame runs on the
calling thread): between its phases a frame of a hundred objects spent more time in Python (kernel
dispatch, small numpy operations, the arrays each phase returns) than in its kernels.

- ``frame_cells``: phases 2 and 3's kernels in one call (grid ranges, the touched cells and their
  entries, the touched cells' sizes);
- ``frame_pairs``: phases 4 to 7 and the flags of phase 8: every touched cell's SAP, then, unless some
  event slice overflowed or some pair set needs room (the caller then goes on the general way from the
  phase it names), the netting, the merge of few events and the delta's id pairs;
- ``pairs_parallel``: phases 4 to 7 of a big frame, whose kernels run in parallel, in one call: the
  parallel kernels launched one after another from compiled code. Between a big frame's kernels, each
  small numpy operation cost ~10 us (its code and data evicted from the caches by the kernel before);
  the general phases go on from the phase it names when it must stop, as after ``frame_pairs``;
- ``frame_listed``: the whole of the commonest frame in one call: the updates of the last frame's list,
  in its order, and nothing else (a game server sending its objects every tick). Phase 0 (the list
  repeats, the boxes), then ``frame_cells``' and ``frame_pairs``' steps; it stops where Python must act
  (a bad box, a cell without room, a frame to run in parallel) and returns what the general phases go
  on from. The world's arrays reach it as one record (``ListedState``), not 40 arguments.

Each calls the same kernels and inlined steps as the general path, or variants of them with the same
results (``_ranges_listed``, ``_merge_ids``: fewer passes or fewer allocations), so the results are the
same.
"""
import types

import numpy as np
from numba.core import types as nbtypes
from numba.experimental import structref

from .._numba import NJIT, NJIT_HELD, NJIT_INLINE, NJIT_SERIAL, njit
from .arena import frame_room, frame_room_inlined
from .borrow import borrowed
from .grid import _ranges_listed, grid_rasterize, grid_ranges_serial, rasterize_inlined
from .hashing import KEY_MASK
from .merge import (cells_net, cells_net_serial, gather_runs, keys_to_ids, merge_events, pair_set_short, table_short,
                    world_bucket_parts, world_merge, world_merge_small, world_shard)
from .sap_cell import _apply_cell, cells_apply
from .validate import _rows_check, boxes_check_serial

#: ``frame_pairs`` statuses: what is left to the caller
PAIRS_DONE = 0          # every phase done, the delta's id pairs returned
PAIRS_OVERFLOW = 1      # cells applied, some event slice overflowed: recompute them, net, merge
PAIRS_NET = 2           # cells applied, some pair set needs room: grow them, net, merge
PAIRS_MERGE = 3         # cells applied and netted, the world's pair table needs room: merge
#: ``frame_listed``'s own statuses (besides the four above, once it has called ``frame_pairs``)
LISTED_OTHER = 10       # not the last list's ids in its order (or no rows kept): nothing done
LISTED_BAD = 11         # a bad box (row, code, axis returned): nothing done
LISTED_STILL = 12       # every box unchanged: nothing done (the frame is counted by the caller)
LISTED_ROOM = 13        # phases 2-3's kernels done (frame counted); the caller makes room and goes on
_S32 = np.uint64(32)
_LO32 = np.uint64(0xFFFFFFFF)
_SMALL_SORT = 16        # _ids_sorted sorts up to this many pairs by insertion


@njit(**NJIT)
def frame_cells(dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, add_h, add_boxes, same, rows, row_mode,
                lastpos, cell_n, rem_h, dense_moving, live, cell_stamp, cell_tidx, frame, cell_cap, cell_pm_n):
    """``grid_ranges``, ``grid_rasterize`` and ``frame_room`` in one serial call; returns
    ``(touched, ent_off, ent_h, need, grow, ev_off, ev_cap, max_cap, work)``. ``dense_moving``: the
    updates whose box changes (``World``'s rule for a dense frame reads it with the removes)."""
    nu = upd_h.shape[0]
    newr = np.empty((nu + add_h.shape[0], 6), np.int32)
    grid_ranges_serial(dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, add_h, add_boxes, newr, same,
                       rows, row_mode, lastpos)
    dense = 2 * (dense_moving + rem_h.shape[0]) >= live
    touched, ent_off, ent_h = grid_rasterize(C, crange, flag, cell_n, rem_h, upd_h, add_h, newr, same, dense,
                                             cell_stamp, cell_tidx, frame)
    need, grow, ev_off, ev_cap, max_cap, work = frame_room(touched, ent_off, cell_n, cell_cap, cell_pm_n)
    return touched, ent_off, ent_h, need, grow, ev_off, ev_cap, max_cap, work


@njit(**NJIT_INLINE)
def _ids_sorted(keys, obj_id, out, packed):
    """Handle-pair keys -> sorted uint64 rows (low id, high id) in ``out`` (uint64 [K, 2], K = ``keys``'
    length; ``World._keys_to_id_pairs``), with ``packed`` (uint64, >= K) as its workspace."""
    k = keys.shape[0]
    if not keys_to_ids(keys, obj_id, out[:, 0], out[:, 1], False):    # an id beyond 32 bits: sorted the long way
        lo = out[:, 0].copy()
        hi = out[:, 1].copy()
        order = np.argsort(hi, kind="mergesort")
        order = order[np.argsort(lo[order], kind="mergesort")]
        for i in range(k):
            out[i, 0] = lo[order[i]]
            out[i, 1] = hi[order[i]]
        return
    for i in range(k):
        packed[i] = (out[i, 0] << _S32) | out[i, 1]
    if k > _SMALL_SORT:
        packed[:k].sort()
    else:
        for i in range(1, k):
            x = packed[i]
            j = i - 1
            while j >= 0 and packed[j] > x:
                packed[j + 1] = packed[j]
                j -= 1
            packed[j + 1] = x
    for i in range(k):
        out[i, 0] = packed[i] >> _S32
        out[i, 1] = packed[i] & _LO32


@njit(**NJIT_INLINE)
def _merge_ids(ev_key, ev_off, out_n, shards, g_slots, g_keys, g_cnt, cap, g_n, obj_id):
    """``world_merge_small`` and the id pairs of its created and deleted keys (``_ids_sorted``), with two
    workspace arrays instead of ~40 small ones (a shard's three, its bucket's, the gathering's, the
    sort's): the same pair table after, shard after shard, each shard's events in the touched cells'
    order. Returns (done, created, deleted, pairs) as ``world_merge_small`` (created / deleted the
    delta's sorted id rows)."""
    nt = out_n.shape[0]
    total = 0
    for t in range(nt):
        total += out_n[t]
    # int64: each event's shard | its original count | its pair | shard offsets (shards + 1) | fill (shards)
    ib = np.empty(3 * total + 2 * shards + 1, np.int64)
    # uint64: events by shard | created keys | deleted keys | a shard's changed keys
    ub = np.empty(4 * total, np.uint64)
    o = 3 * total
    for s in range(shards + 1):
        ib[o + s] = 0
    r = 0
    for t in range(nt):
        eo = ev_off[t]
        for i in range(out_n[t]):
            sh = world_shard(ev_key[eo + i] & KEY_MASK, shards)
            ib[r] = sh
            ib[o + sh + 1] += 1
            r += 1
    for s in range(shards):
        ib[o + s + 1] += ib[o + s]
        if 2 * (g_n[s] + ib[o + s + 1] - ib[o + s]) >= cap:
            none = np.empty((0, 2), np.uint64)
            return False, none, none, 0
    fo = o + shards + 1
    for s in range(shards):
        ib[fo + s] = ib[o + s]
    r = 0
    for t in range(nt):
        eo = ev_off[t]
        for i in range(out_n[t]):
            sh = ib[r]
            ub[ib[fo + sh]] = ev_key[eo + i]
            ib[fo + sh] += 1
            r += 1
    ncr = 0
    nde = 0
    pairs = 0
    half = cap // 2
    ch_key, ch_orig, ch_p = ub[3 * total:], ib[total:2 * total], ib[2 * total:3 * total]
    for s in range(shards):         # ``_merge_shard`` with the workspace's rows
        lo = ib[o + s]
        c, d, gn = merge_events(ub, lo, ib[o + s + 1] - lo, g_slots, g_keys, g_cnt, s * cap, cap, s * half, g_n[s],
                                ch_key, ch_orig, ch_p, ub, total + ncr, ub, 2 * total + nde, False)
        ncr += c
        nde += d
        g_n[s] = gn
        pairs += gn
    created = np.empty((ncr, 2), np.uint64)
    deleted = np.empty((nde, 2), np.uint64)
    _ids_sorted(ub[total:total + ncr], obj_id, created, ub)
    _ids_sorted(ub[2 * total:2 * total + nde], obj_id, deleted, ub[3 * total:])
    return True, created, deleted, pairs


_GO_ON = -1     # ``_after_apply``: net and merge


@njit(**NJIT_INLINE)
def _after_apply(touched, counts, ev_cap, cell_pm_n, cell_pm_cap):
    """After the cells' SAPs: ``(status, events, swaps)``, status PAIRS_OVERFLOW (some event slice
    overflowed), PAIRS_DONE (no event: every out_n 0), PAIRS_NET (some pair set needs room) or _GO_ON."""
    ev_n = counts[0]
    ev_plus = counts[1]
    nt = touched.shape[0]
    events = 0
    sw = 0
    over = False
    for t in range(nt):
        events += ev_n[t]
        sw += counts[2, t]
        over |= ev_n[t] > ev_cap[t]
    if over:
        return PAIRS_OVERFLOW, events, sw
    if events == 0:
        for t in range(nt):
            counts[3, t] = 0
        return PAIRS_DONE, 0, sw
    for t in range(nt):
        if pair_set_short(touched[t], ev_plus[t], cell_pm_n, cell_pm_cap):
            return PAIRS_NET, events, sw
    return _GO_ON, events, sw


@njit(**NJIT_SERIAL)
def frame_pairs(touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static, cell_n, cell_base, bx_h,
                bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag,
                ev_key, ev_off, ev_cap, counts, shards, g_slots, g_keys, g_cnt, g_cap, g_n, obj_id, rem_h, upd_h,
                add_h):
    """Phases 4 to 7 of a serial frame and the clearing of its flags; ``counts`` rows: ev_n, ev_plus, swaps,
    out_n by touched cell (written as by the general path). Returns ``(status, events, swaps, created,
    deleted, pairs)``: created / deleted the delta's rows when status is PAIRS_DONE (else empty), pairs
    the world's pair count then. ``_cells_serial`` and ``_net_merge_serial``, which ``frame_listed`` inlines
    too."""
    _cells_serial(touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static, cell_n, cell_base, bx_h,
                  bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off, counts, rem_h,
                  upd_h, add_h)
    return _net_merge_serial(touched, counts, ev_cap, ev_key, ev_off, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots,
                             pm_keys, pm_flag, shards, g_slots, g_keys, g_cnt, g_cap, g_n, obj_id)


@njit(**NJIT_INLINE)
def _cells_serial(touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static, cell_n, cell_base, bx_h,
                  bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off, counts, rem_h,
                  upd_h, add_h):
    """Phase 4 of a serial frame: every touched cell's SAP on the calling thread (``cells_apply``' body, cell
    after cell), then the clearing of the frame's flags. Inlined, in a kernel of the serial pipeline
    (``NJIT_SERIAL``) only: there the inlined helpers' array arguments are copies it propagates away; the
    plain pipeline keeps them, two atomic reference-count updates per array and call of ``_apply_cell``
    (a 100-object frame measured 40% slower)."""
    for t in range(touched.shape[0]):
        _apply_cell(t, touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static, cell_n, cell_base,
                    bx_h, bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off,
                    counts[0], counts[1], counts[2], 0, False)
    # the flags are read by the cells' SAPs alone; every other flag is zero: with many objects in the
    # frame, one sequential pass clears them all for less than their scattered writes (a loop: the serial
    # pipeline would make ``flag[:] = 0`` a parallel loop)
    if 8 * (rem_h.shape[0] + upd_h.shape[0] + add_h.shape[0]) > flag.shape[0]:
        for i in range(flag.shape[0]):
            flag[i] = 0
    else:
        for i in range(rem_h.shape[0]):
            flag[rem_h[i]] = 0
        for i in range(upd_h.shape[0]):
            flag[upd_h[i]] = 0
        for i in range(add_h.shape[0]):
            flag[add_h[i]] = 0


@njit(**NJIT_INLINE)
def _net_merge_serial(touched, counts, ev_cap, ev_key, ev_off, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys,
                      pm_flag, shards, g_slots, g_keys, g_cnt, g_cap, g_n, obj_id):
    """Phases 5 to 7 of a serial frame after its cells (``_cells_serial``): ``frame_pairs``' results."""
    ev_n = counts[0]
    out_n = counts[3]
    status, events, sw = _after_apply(touched, counts, ev_cap, cell_pm_n, cell_pm_cap)
    none = np.empty((0, 2), np.uint64)
    if status != _GO_ON:
        return status, events, sw, none, none, -1 if status == PAIRS_DONE else 0
    cells_net_serial(touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag,
                     out_n)
    done, created, deleted, pairs = _merge_ids(ev_key, ev_off, out_n, shards, g_slots, g_keys, g_cnt, g_cap, g_n,
                                               obj_id)
    if not done:
        return PAIRS_MERGE, events, sw, none, none, 0
    return PAIRS_DONE, events, sw, created, deleted, pairs


@njit(**NJIT_INLINE)
def _short_of_room(grow, ev_off, nt, ev_key, scratch, max_cap, work, serial_work):
    """Must a one-call frame stop after phases 2-3 (LISTED_ROOM)? When a touched cell lacks room (``grow``),
    the event buffer is too small (or far too big: the caller shrinks it), the workspace is too small for
    the biggest cell, or the cells' work is for the parallel phases (``work`` >= ``serial_work``)."""
    return (grow or ev_off[nt] > ev_key.shape[0] or ev_key.shape[0] > 8 * max(ev_off[nt], 1 << 16)
            or scratch.shape[2] < max_cap + 1 or work >= serial_work)


@njit(**NJIT)
def frame_cells_pairs(upd_h, upd_boxes, add_h, add_boxes, same, rows, row_mode, rem_h, dense_moving, live, frame,
                      serial_work, st):
    """Phases 2-7 of a frame whose phase 2 runs on the calling thread (a small frame that removes or adds
    objects), in one call: ``frame_cells``, then ``frame_pairs`` when every touched cell, the event buffer
    and the workspace have room and the cells' work is under ``serial_work`` (as ``frame_listed`` decides;
    one call and none of Python's work between the two: a small frame's kernels each cost more than their
    work, their code and data out of the nearer caches by then).

    The world's arrays come from ``st``, the world's ``ListedState``, read without references of their own
    (``borrow``: the record holds them through the call, which returns fresh arrays only); its update list
    (``list_ids``, ``list_h``, ``rows``) is not read, so a record made before this frame's new list serves.
    One record for the 34 arrays the call took one by one: a 100-object frame that removes one object and
    adds one 24.2-24.5 -> 22.2-23.0 us (numba unboxed each array of the 47 arguments: 2.4 us for an empty
    kernel of the same arguments).

    Returns ``(status, events, swaps, pairs, nt, max_cap, work, ibuf, lbuf, created, deleted)``: LISTED_ROOM
    with phases 2-3 done (``ibuf`` / ``lbuf`` as ``frame_listed``'s: the caller makes room and goes on);
    else ``frame_pairs``' status, with its created and deleted rows (None when empty) for PAIRS_DONE, and
    ``ibuf`` / ``lbuf`` for the phases any other status leaves to the caller."""
    dims, shards, g_cap = st.dims, st.shards, st.g_cap
    bmin = borrowed(st, "bmin")
    inv = borrowed(st, "inv")
    C = borrowed(st, "C")
    boxes = borrowed(st, "boxes")
    crange = borrowed(st, "crange")
    flag = borrowed(st, "flag")
    cat = borrowed(st, "cat")
    msk = borrowed(st, "msk")
    static = borrowed(st, "static")
    obj_id = borrowed(st, "obj_id")
    lastpos = borrowed(st, "lastpos")
    cell_n = borrowed(st, "cell_n")
    cell_base = borrowed(st, "cell_base")
    cell_cap = borrowed(st, "cell_cap")
    bx_h = borrowed(st, "bx_h")
    bx_pos = borrowed(st, "bx_pos")
    ep_key = borrowed(st, "ep_key")
    scratch = borrowed(st, "scratch")
    kscratch = borrowed(st, "kscratch")
    ev_key = borrowed(st, "ev_key")
    cell_stamp = borrowed(st, "cell_stamp")
    cell_tidx = borrowed(st, "cell_tidx")
    cell_pm_base = borrowed(st, "cell_pm_base")
    cell_pm_cap = borrowed(st, "cell_pm_cap")
    cell_pm_n = borrowed(st, "cell_pm_n")
    pm_slots = borrowed(st, "pm_slots")
    pm_keys = borrowed(st, "pm_keys")
    pm_flag = borrowed(st, "pm_flag")
    g_slots = borrowed(st, "g_slots")
    g_keys = borrowed(st, "g_keys")
    g_cnt = borrowed(st, "g_cnt")
    g_n = borrowed(st, "g_n")
    touched, ent_off, ent_h, need, grow, ev_off, ev_cap, max_cap, work = frame_cells(
        dims, bmin, inv, C, boxes, crange, flag, upd_h, upd_boxes, add_h, add_boxes, same, rows, row_mode, lastpos,
        cell_n, rem_h, dense_moving, live, cell_stamp, cell_tidx, frame, cell_cap, cell_pm_n)
    nt = touched.shape[0]
    counts = np.empty((4, nt), np.int64)
    if _short_of_room(grow, ev_off, nt, ev_key, scratch, max_cap, work, serial_work):
        ibuf, lbuf = _room_arrays(touched, ent_h, ent_off, need, ev_off, ev_cap, counts)
        return LISTED_ROOM, 0, 0, 0, nt, max_cap, work, ibuf, lbuf, None, None
    status, events, sw, created, deleted, pairs = frame_pairs(
        touched, ent_off, ent_h, dims, C, flag, crange, boxes.view(np.uint32), cat, msk, static, cell_n, cell_base,
        bx_h, bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag,
        ev_key, ev_off, ev_cap, counts, shards, g_slots, g_keys, g_cnt, g_cap, g_n, obj_id, rem_h, upd_h, add_h)
    if status == PAIRS_DONE:        # (an empty side as None, as ``frame_listed`` returns it)
        cr = created if created.shape[0] > 0 else None
        de = deleted if deleted.shape[0] > 0 else None
        return status, events, sw, pairs, nt, max_cap, work, None, None, cr, de
    ibuf, lbuf = _room_arrays(touched, ent_h, ent_off, need, ev_off, ev_cap, counts)
    return status, events, sw, pairs, nt, max_cap, work, ibuf, lbuf, None, None


@njit(**NJIT)
def pairs_parallel(touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static, cell_n, cell_base,
                   bx_h, bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys,
                   pm_flag, ev_key, ev_off, ev_cap, counts, all_moved, min_events, parts, shards, g_slots, g_keys,
                   g_cnt, g_cap, g_n):
    """Phases 4 to 7 of a frame whose cells' SAPs run in parallel (on the thread count set by the caller),
    up to the keys of the pairs created and deleted: ``cells_apply``, then ``net_merge``. ``counts`` rows:
    ev_n, ev_plus, swaps, out_n by touched cell. Returns ``(status, events, swaps, created, deleted,
    pairs)`` as ``frame_pairs``, but keys (status PAIRS_DONE) and the flags left set; after PAIRS_NET the
    caller grows the pair sets and calls ``net_merge``."""
    ev_n = counts[0]
    ev_plus = counts[1]
    swaps = counts[2]
    out_n = counts[3]
    cells_apply(touched, ent_off, ent_h, dims, C, flag, crange, boxes_u, cat, msk, static, cell_n, cell_base, bx_h,
                bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off, ev_n, ev_plus,
                swaps, all_moved)
    status, events, sw = _after_apply(touched, counts, ev_cap, cell_pm_n, cell_pm_cap)
    if status != _GO_ON:
        none = np.empty(0, np.uint64)
        return status, events, sw, none, none, -1 if status == PAIRS_DONE else 0
    status, created, deleted, pairs = net_merge(touched, ev_key, ev_off, ev_n, out_n, events, cell_pm_base,
                                                cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag, min_events, parts,
                                                shards, g_slots, g_keys, g_cnt, g_cap, g_n)
    return status, events, sw, created, deleted, pairs


@njit(**NJIT)
def net_merge(touched, ev_key, ev_off, ev_n, out_n, events, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys,
              pm_flag, min_events, parts, shards, g_slots, g_keys, g_cnt, g_cap, g_n):
    """Phases 6 and 7 of a frame, every pair set with room for its events, up to the keys of the pairs
    created and deleted: the general phases' kernels (``cells_net``, ``world_bucket_parts``, ``world_merge``,
    parallel from ``min_events`` events; below, ``world_merge_small``), called from here. Returns
    ``(status, created, deleted, pairs)``: PAIRS_DONE, or PAIRS_MERGE (netted; the world's pair table needs
    room: the caller merges)."""
    none = np.empty(0, np.uint64)
    if events < min_events:
        cells_net_serial(touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys,
                         pm_flag, out_n)
        done, created, deleted, pairs = world_merge_small(ev_key, ev_off, out_n, shards, g_slots, g_keys, g_cnt,
                                                          g_cap, g_n)
        if not done:
            return PAIRS_MERGE, none, none, 0
        return PAIRS_DONE, created, deleted, pairs
    cells_net(touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag, out_n)
    ev, off = world_bucket_parts(ev_key, ev_off, out_n, shards, parts)
    if table_short(g_n, off, g_cap, shards):     # the caller merges (``WorldPairs.reserve`` grows the table)
        return PAIRS_MERGE, none, none, 0
    created = np.empty(ev.shape[0], np.uint64)
    deleted = np.empty(ev.shape[0], np.uint64)
    n_cr = np.zeros(shards, np.int64)
    n_de = np.zeros(shards, np.int64)
    world_merge(ev, off, g_slots, g_keys, g_cnt, g_cap, g_n, created, deleted, n_cr, n_de)
    pairs = 0
    for s in range(shards):
        pairs += g_n[s]
    return PAIRS_DONE, gather_runs(created, off, n_cr), gather_runs(deleted, off, n_de), pairs


@njit(**NJIT)
def _room_arrays(touched, ent_h, ent_off, need, ev_off, ev_cap, counts):
    """A frame's phase 2-3 arrays packed for the caller in two: int32 ``touched | ent_h`` and int64
    ``ent_off (T+1) | ev_off (T+1) | ev_cap (T) | need (T) | counts (4T)`` (fewer arrays to return)."""
    nt = touched.shape[0]
    ibuf = np.empty(nt + ent_h.shape[0], np.int32)
    ibuf[:nt] = touched
    ibuf[nt:] = ent_h
    lbuf = np.empty(8 * nt + 2, np.int64)
    lbuf[:nt + 1] = ent_off
    lbuf[nt + 1:2 * nt + 2] = ev_off
    lbuf[2 * nt + 2:3 * nt + 2] = ev_cap
    lbuf[3 * nt + 2:4 * nt + 2] = need
    lbuf[4 * nt + 2:] = counts.reshape(-1)
    return ibuf, lbuf


def unpack_room(ibuf, lbuf, nt):
    """``_room_arrays``' two arrays -> (touched, ent_h, ent_off, ev_off, ev_cap, need, counts) views."""
    return (ibuf[:nt], ibuf[nt:], lbuf[:nt + 1], lbuf[nt + 1:2 * nt + 2], lbuf[2 * nt + 2:3 * nt + 2],
            lbuf[3 * nt + 2:4 * nt + 2], lbuf[4 * nt + 2:].reshape(4, nt))


@njit(**NJIT_INLINE)
def _same_ids(ids, last_ids):
    """Are ``ids`` (uint64) the ``last_ids`` (uint32 or uint64) of the same length, in order? (No exit in
    the loop: it vectorises.)"""
    d = np.uint64(0)
    for i in range(ids.shape[0]):
        d |= ids[i] ^ np.uint64(last_ids[i])
    return d == 0


#: The arrays and constants ``frame_listed`` reads besides the frame's, in this order (``World``'s, kept
#: between frames in one ``ListedState``)
LISTED_FIELDS = ("list_ids", "list_h", "rows", "dims", "limit", "limit_bits", "bmin", "inv", "C", "boxes", "crange",
                 "flag", "cat", "msk", "static", "obj_id", "lastpos", "cell_n", "cell_base", "cell_cap", "bx_h",
                 "bx_pos", "ep_key", "scratch", "kscratch", "cell_pm_base", "cell_pm_cap", "cell_pm_n", "pm_slots",
                 "pm_keys", "pm_flag", "ev_key", "shards", "g_slots", "g_keys", "g_cnt", "g_cap", "g_n", "cell_stamp",
                 "cell_tidx", "serial_work")


@structref.register
class ListedStateType(nbtypes.StructRef):
    """numba's type of a ``ListedState``: its fields' types, literals widened (one compiled
    ``frame_listed`` per kind of world, not per value)."""

    def preprocess_fields(self, fields):
        return tuple((name, nbtypes.unliteral(typ)) for name, typ in fields)


class ListedState(structref.StructRefProxy):
    """``LISTED_FIELDS`` in one record passed to ``frame_listed`` as one argument: a small frame's call
    unboxed 40 arrays and constants every frame, ~3 us of a 15 us step (one record: ~0.5 us). It only
    holds references to the world's arrays (their owners still own them, grow and replace them);
    ``World`` makes a new one (``listed_state``) when any of them is replaced. ``frame_listed`` reads its
    arrays without references of their own (``borrow.borrowed``)."""


structref.define_proxy(ListedState, ListedStateType, list(LISTED_FIELDS))


@njit(**NJIT)
def listed_state(list_ids, list_h, rows, dims, limit, limit_bits, bmin, inv, C, boxes, crange, flag, cat, msk, static,
                 obj_id, lastpos, cell_n, cell_base, cell_cap, bx_h, bx_pos, ep_key, scratch, kscratch, cell_pm_base,
                 cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag, ev_key, shards, g_slots, g_keys, g_cnt, g_cap,
                 g_n, cell_stamp, cell_tidx, serial_work):
    """A ``ListedState`` of ``LISTED_FIELDS`` (compiled and cached: ``ListedState(...)`` called from Python
    would compile its constructor in every process)."""
    return ListedState(list_ids, list_h, rows, dims, limit, limit_bits, bmin, inv, C, boxes, crange, flag, cat, msk,
                       static, obj_id, lastpos, cell_n, cell_base, cell_cap, bx_h, bx_pos, ep_key, scratch, kscratch,
                       cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag, ev_key, shards, g_slots,
                       g_keys, g_cnt, g_cap, g_n, cell_stamp, cell_tidx, serial_work)


def listed_state_py(*values):
    """``listed_state`` with the kernels run as Python (``NUMBA_DISABLE_JIT``): a plain record of the same
    fields."""
    return types.SimpleNamespace(**dict(zip(LISTED_FIELDS, values)))


@njit(**NJIT)
def frame_listed(upd, upd_boxes, live, frame, st):
    """A frame of updates only, the last frame's list (``st``: a ``ListedState``; ``list_ids``, handles
    ``list_h``, boxes by row ``rows``) in its order, in one call: what ``World.step`` does for it with
    ``frame`` its number: the box check (``_rows_check``; ``boxes_check_serial`` names a bad box), the
    steps of ``frame_cells`` (its grid ranges by ``_ranges_listed``) and ``frame_pairs``. Nothing changes
    before every box is found valid.

    Returns ``(status, row, code, axis, events, swaps, pairs, nt, max_cap, work, ibuf, lbuf, created,
    deleted)`` (arrays None where the status has none: fewer arrays to return): LISTED_OTHER or
    LISTED_STILL, nothing else; LISTED_BAD, the bad box's row, code and axis;
    LISTED_ROOM when a touched cell lacks room, the event buffer or the workspace is too small, or the
    work (``work`` >= ``serial_work``) is for the parallel phases: ``ibuf`` / ``lbuf`` hold phase 2-3's
    arrays (``unpack_room``), nothing after phase 2-3's kernels is done; else ``frame_pairs``' status,
    events, swaps, created, deleted (None when empty) and pairs, with ``ibuf`` / ``lbuf`` as for LISTED_ROOM
    when that status leaves phases to the caller."""
    (status, row, code, axis, events, sw, pairs, nt, max_cap, work, ibuf, lbuf, created,
     deleted) = _frame_listed(upd, upd_boxes, live, frame, st)
    if status == PAIRS_DONE:
        # an empty side is None: returning an array costs ~1 us (numba boxes it into a new numpy array
        # object), several times the caller's own empty one; a small frame's sides are mostly empty
        cr = created if created.shape[0] > 0 else None
        de = deleted if deleted.shape[0] > 0 else None
        return status, row, code, axis, events, sw, pairs, nt, max_cap, work, None, None, cr, de
    if status == LISTED_OTHER or status == LISTED_BAD or status == LISTED_STILL:
        return status, row, code, axis, events, sw, pairs, nt, max_cap, work, None, None, None, None
    return status, row, code, axis, events, sw, pairs, nt, max_cap, work, ibuf, lbuf, None, None


@njit(**NJIT_SERIAL)
def _frame_listed(upd, upd_boxes, live, frame, st):
    """``frame_listed``'s work, compiled in the serial pipeline (``NJIT_SERIAL``: ``_cells_serial``,
    ``_net_merge_serial``, ``grid.rasterize_inlined`` and ``arena.frame_room_inlined`` inlined without
    reference-count updates of their array arguments, see ``_cells_serial``). Its arrays are never None
    (that pipeline cannot join an array and None): empty views where ``frame_listed`` returns None."""
    # the arrays without references of their own (``borrow``): the record holds them through the call, which
    # returns none of them nor a view of them
    dims, limit, limit_bits, shards, g_cap = st.dims, st.limit, st.limit_bits, st.shards, st.g_cap
    serial_work = st.serial_work
    list_ids = borrowed(st, "list_ids")
    list_h = borrowed(st, "list_h")
    rows = borrowed(st, "rows")
    bmin = borrowed(st, "bmin")
    inv = borrowed(st, "inv")
    C = borrowed(st, "C")
    boxes = borrowed(st, "boxes")
    crange = borrowed(st, "crange")
    flag = borrowed(st, "flag")
    cat = borrowed(st, "cat")
    msk = borrowed(st, "msk")
    static = borrowed(st, "static")
    obj_id = borrowed(st, "obj_id")
    cell_n = borrowed(st, "cell_n")
    cell_base = borrowed(st, "cell_base")
    cell_cap = borrowed(st, "cell_cap")
    bx_h = borrowed(st, "bx_h")
    bx_pos = borrowed(st, "bx_pos")
    ep_key = borrowed(st, "ep_key")
    scratch = borrowed(st, "scratch")
    kscratch = borrowed(st, "kscratch")
    ev_key = borrowed(st, "ev_key")
    cell_stamp = borrowed(st, "cell_stamp")
    cell_tidx = borrowed(st, "cell_tidx")
    cell_pm_base = borrowed(st, "cell_pm_base")
    cell_pm_cap = borrowed(st, "cell_pm_cap")
    cell_pm_n = borrowed(st, "cell_pm_n")
    pm_slots = borrowed(st, "pm_slots")
    pm_keys = borrowed(st, "pm_keys")
    pm_flag = borrowed(st, "pm_flag")
    g_slots = borrowed(st, "g_slots")
    g_keys = borrowed(st, "g_keys")
    g_cnt = borrowed(st, "g_cnt")
    g_n = borrowed(st, "g_n")
    noi = list_h[:0]        # (a view: no allocation)
    no_pairs = kscratch[:0, :2]     # (the same)
    nu = upd.shape[0]
    if nu == 0 or nu != list_ids.shape[0] or rows.shape[0] != nu:
        return LISTED_OTHER, -1, 0, 0, 0, 0, 0, 0, 0, 0, noi, cell_base[:0], no_pairs, no_pairs
    if not _same_ids(upd, list_ids):
        return LISTED_OTHER, -1, 0, 0, 0, 0, 0, 0, 0, 0, noi, cell_base[:0], no_pairs, no_pairs
    same = np.empty(nu, np.uint8)
    bu = upd_boxes.reshape(-1).view(np.uint64)
    ru = rows.reshape(-1).view(np.uint64)
    if dims == 2:
        unchanged, ok = _rows_check(bu, ru, upd_boxes, same, nu, limit_bits, 2)
    else:
        unchanged, ok = _rows_check(bu, ru, upd_boxes, same, nu, limit_bits, 3)
    if not ok:          # some box is bad: which one, as the general box check names it
        row, code, axis, unchanged = boxes_check_serial(upd_boxes, dims, limit, boxes, list_h, same, rows,
                                                         cell_base[:0], True)
        return LISTED_BAD, row, code, axis, 0, 0, 0, 0, 0, 0, noi, cell_base[:0], no_pairs, no_pairs
    if unchanged == nu:
        return LISTED_STILL, -1, 0, 0, 0, 0, 0, 0, 0, 0, noi, cell_base[:0], no_pairs, no_pairs
    # phases 2-3's kernels (phase 1 has nothing to do: no adds, and the list stays): ``frame_cells``, its
    # grid ranges by ``_ranges_listed``, which writes the moved rows' boxes too
    newr = np.empty((nu, 6), np.int32)
    if dims == 2:
        _ranges_listed(2, bmin, inv, C, boxes, crange, flag, list_h, upd_boxes, newr, same, rows, False, True)
    else:
        _ranges_listed(3, bmin, inv, C, boxes, crange, flag, list_h, upd_boxes, newr, same, rows, False, True)
    dense = 2 * (nu - unchanged) >= live
    touched, ent_off, ent_h = rasterize_inlined(C, crange, flag, cell_n, noi, list_h, noi, newr, same, dense,
                                                cell_stamp, cell_tidx, frame)
    need, grow, ev_off, ev_cap, max_cap, work = frame_room_inlined(touched, ent_off, cell_n, cell_cap, cell_pm_n)
    nt = touched.shape[0]
    counts = np.empty((4, nt), np.int64)
    if _short_of_room(grow, ev_off, nt, ev_key, scratch, max_cap, work, serial_work):
        ibuf, lbuf = _room_arrays(touched, ent_h, ent_off, need, ev_off, ev_cap, counts)
        return LISTED_ROOM, -1, 0, 0, 0, 0, 0, nt, max_cap, work, ibuf, lbuf, no_pairs, no_pairs
    _cells_serial(touched, ent_off, ent_h, dims, C, flag, crange, boxes.view(np.uint32), cat, msk, static, cell_n,
                  cell_base, bx_h, bx_pos, ep_key, scratch, kscratch, cell_pm_base, cell_pm_n, pm_keys, ev_key, ev_off,
                  counts, noi, list_h, noi)
    status, events, sw, created, deleted, pairs = _net_merge_serial(
        touched, counts, ev_cap, ev_key, ev_off, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag,
        shards, g_slots, g_keys, g_cnt, g_cap, g_n, obj_id)
    if status == PAIRS_DONE:
        return status, -1, 0, 0, events, sw, pairs, nt, max_cap, work, noi, cell_base[:0], created, deleted
    ibuf, lbuf = _room_arrays(touched, ent_h, ent_off, need, ev_off, ev_cap, counts)
    return status, -1, 0, 0, events, sw, pairs, nt, max_cap, work, ibuf, lbuf, created, deleted


@njit(**NJIT_HELD)
def frame_listed_held(upd, upd_boxes, live, frame, st):
    """``frame_listed`` that keeps the GIL (``_numba.NJIT_HELD``), for the frames of fewer than
    ``parallel.HOLD_GIL_BELOW`` updates: a few microseconds of work, less than the GIL's hand-over to another
    thread and back would cost. The same machine code (a native call of ``frame_listed``)."""
    return frame_listed(upd, upd_boxes, live, frame, st)
