"""A world: one multi-SAP grid (001 II §3c-d) behind a frame-at-a-time API.

Structure: a grid of ``cells`` per axis over ``bounds``, wrapping outside them; an object is in every
cell its box touches; each cell has its own array SAP and pair set (kernels/sap_cell.py, merge.py),
all cells' arrays live in shared arenas owned by this class. The world keeps per pair the number of
cells holding it and reports only the 0 -> 1 and 1 -> 0 transitions, netted over a frame.

``World.step`` applies one frame, in numbered phases:
  0. validate the whole frame (ids, then boxes, limits); nothing changes before this passes. Update
     handles follow the previous frame's update list (a hash lookup only for ids off that list)
  1. handles of new objects, in grid order so that neighbours in space are neighbours in the object
     arrays (free slots are reused, but never within the frame that freed them)
  2. rasterize: new boxes, cell ranges and flags (parallel); the touched cells and their entering
     objects (serial; when most objects move, every occupied cell)
  3. reserve room: cell regions, event slices (vectorised over the touched cells only)
  4. apply every touched cell's SAP in parallel, GIL released: remove, update, insert -> pair events
  5. cells whose event slice overflowed are recomputed exactly (never dropped)
  6. net the events in each cell's pair set, in parallel
  7. merge the cells' netted pairs into the world's pair counts (grouped by shard of the world's pair
     table, shards in parallel; deterministic)
  8. finish: ids of the delta, free removed handles, clear the frame's flags
"""
from __future__ import annotations

import math
import threading
import time

import numba
import numpy as np

from .errors import CapacityError, FrameError
from .kernels import arena as karena
from .kernels import grid as kgrid
from .kernels import idmap as kid
from .kernels import merge as kmerge
from .kernels import sap_cell as ksap
from .kernels import validate as kval
from .kernels.hashing import capacity_for
from .invariants import check_world
from .types import Delta, FrameStats, WorldConfig

_BOX_REASON = {
    kval.BOX_NAN: "NaN coordinate on axis {axis}",
    kval.BOX_INF: "infinite coordinate on axis {axis}",
    kval.BOX_MIN_GT_MAX: "min > max on axis {axis}",
    kval.BOX_OUT_OF_RANGE: "|coordinate| on axis {axis} exceeds the supported range {limit:g}",
}
_EMPTY_PAIRS = np.zeros((0, 2), np.uint64)
_NO_HANDLES = np.zeros(0, np.int32)
_NO_SAME = np.zeros(0, np.uint8)
_NO_IDS = np.zeros(0, np.uint64)
_NO_ROWS = np.zeros((0, 6), np.float32)
_NO_ROW_OF = np.zeros(0, np.int64)
_EMPTY_COLUMN = {np.uint32: np.zeros(0, np.uint32), np.uint8: np.zeros(0, np.uint8)}
#: Parallel kernels of different worlds never run at the same time: numba's default threading layer
#: (workqueue) does not support concurrent launches, and each launch already uses every core.
_PARALLEL_LOCK = threading.Lock()
#: A parallel kernel with less work than this (objects, cell members or pair events it handles) runs
#: on the calling thread alone: waking the sleeping workers (50-100 us on a VM) would cost more.
_PARALLEL_MIN_OPS = 32768
#: The same for the kernels that handle pair events (about 100 ns each).
_PARALLEL_MIN_EVENTS = 8192
#: Arenas are compacted when their garbage (regions left behind by cells that grew) exceeds a quarter
#: of what is live, and this many units.
_COMPACT_MIN_UNITS = 1 << 16
#: The world's pair table is split in this many shards, merged in parallel (a constant, so that the
#: result never depends on the thread count).
_WORLD_SHARDS = 8
_LO32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def auto_cells(dims: int, bounds, n_objects: int, per_cell: float = 32.0) -> tuple:
    """Cells per axis for ``n_objects`` spread over ``bounds``: about ``per_cell`` objects a cell,
    cells as cubic as the bounds allow (a flat axis gets one cell)."""
    b = np.asarray(bounds, np.float64)
    ext = np.maximum(b[dims:] - b[:dims], 1e-12)
    target = max(1.0, n_objects / per_cell)
    lo, hi = float(ext.max()) / target ** (1.0 / dims) / 64, float(ext.max())
    for _ in range(100):  # cell side s such that prod(max(1, ext/s)) ~ target
        s = math.sqrt(lo * hi)
        if np.prod(np.maximum(1.0, ext / s)) > target:
            lo = s
        else:
            hi = s
    cells = np.maximum(1, np.round(ext / hi)).astype(np.int64)
    while np.prod(cells) > (1 << 22):
        cells = np.maximum(1, cells // 2)
    return tuple(int(c) for c in cells)


def _as_ids(x, field):
    if x is None:
        return np.zeros(0, np.uint64)
    a = np.asarray(x)
    if a.ndim != 1:
        raise FrameError(field, -1, f"must be a 1-D array of ids, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, np.uint64)
    if a.dtype.kind == "i":
        if (a < 0).any():
            raise FrameError(field, int(np.flatnonzero(a < 0)[0]), "ids must be non-negative")
    elif a.dtype.kind != "u":
        raise FrameError(field, -1, f"ids must be integers, got dtype {a.dtype}")
    return np.ascontiguousarray(a, np.uint64)


def _list_ids(a, b):
    """The ids of an update list, ``a`` then ``b``: uint32 when they all fit (a repeated list is compared
    with it every frame, a memory-bound pass: 4 bytes an id fewer to read), else uint64."""
    out = np.empty(a.shape[0] + b.shape[0], np.uint32)
    if kval.narrow_ids(a, b, out):
        return out
    return np.concatenate([a, b]).astype(np.uint64, copy=False)


class World:
    """One named world of the service: a multi-SAP grid. See the module docstring."""

    def __init__(self, config: WorldConfig):
        self.config = config
        d = self.dims = config.dims
        C = np.ones(3, np.int64)
        C[:d] = config.cells
        self._C = C
        b = np.asarray(config.bounds, np.float64)
        self._bmin = np.zeros(3)
        self._bmin[:d] = b[:d]
        self._inv = np.ones(3)
        self._inv[:d] = C[:d] / (b[d:] - b[:d])
        self._max_threads = min(config.threads or numba.config.NUMBA_NUM_THREADS, numba.config.NUMBA_NUM_THREADS)
        # |coordinate| <= coord_limit, checked on the caller's values; float32 values are checked against
        # the limit rounded up to float32, so a value at the limit passes in either precision
        self._coord_limit = float(config.coord_limit)
        lim32 = np.float32(min(self._coord_limit, 3.0e38))
        if float(lim32) < self._coord_limit:
            lim32 = np.nextafter(lim32, np.float32(np.inf))
        self._coord_limit32 = lim32
        self.n_cells = int(np.prod(C))
        self.frames = 0
        # objects, by handle
        self._next_handle = 0
        self._free = np.zeros(0, np.int32)
        self._alloc_objects(64)
        self._idk = np.zeros(16, np.uint64)
        self._idv = np.full(16, -1, np.int32)
        # cells
        nc = self.n_cells
        self._cell_n = np.zeros(nc, np.int32)
        self._cell_cap = np.zeros(nc, np.int32)
        self._cell_base = np.zeros(nc, np.int64)
        self._cell_stamp = np.zeros(nc, np.int64)
        self._cell_tidx = np.zeros(nc, np.int32)
        self._cell_pm_base = np.zeros(nc, np.int64)
        self._cell_pm_cap = np.zeros(nc, np.int64)
        self._cell_pm_n = np.zeros(nc, np.int32)
        # SAP arena (box units; the endpoint arrays have two entries per unit)
        self._top = 1
        self._garbage = 0
        self._alloc_sap_arena(1024)
        # pair-set arena (slot units)
        self._pm_top = 0
        self._pm_garbage = 0
        self._alloc_pm_arena(1024)
        # world pair counts: _WORLD_SHARDS shards of _g_cap slots each (kernels/merge.py)
        self._g_cap = 16
        self._g_slots = np.full(_WORLD_SHARDS * 16, -1, np.int32)
        self._g_keys = np.zeros(_WORLD_SHARDS * 8, np.uint64)
        self._g_cnt = np.zeros(_WORLD_SHARDS * 8, np.int32)
        self._g_n = np.zeros(_WORLD_SHARDS, np.int64)
        self._gn = 0
        # Workspace: event buffer, reused between frames; ids (uint32 when they fit, see _list_ids) and
        # handles of the last frame's updates (see _remember_order) and, while frames keep listing the
        # same objects, their boxes by row
        self._last_ids, self._last_h = _NO_IDS, _NO_HANDLES
        self._last_boxes = None
        self._scratch_ev = np.empty(1024, np.uint64)

    # ------------------------------------------------------------------ storage
    def _alloc_objects(self, cap):
        old = getattr(self, "_obj_id", None)
        d2 = 2 * self.dims
        ids = np.zeros(cap, np.uint64)
        boxes = np.zeros((cap, d2), np.float32)
        cat = np.full(cap, 0xFFFFFFFF, np.uint32)
        msk = np.full(cap, 0xFFFFFFFF, np.uint32)
        static = np.zeros(cap, np.uint8)
        alive = np.zeros(cap, np.uint8)
        flag = np.zeros(cap, np.uint8)
        crange = np.zeros((cap, 6), np.int16)
        lastpos = np.zeros(cap, np.int32)
        if old is not None:
            k = old.shape[0]
            ids[:k] = self._obj_id
            boxes[:k] = self._obj_box
            cat[:k] = self._obj_cat
            msk[:k] = self._obj_mask
            static[:k] = self._obj_static
            alive[:k] = self._obj_alive
            flag[:k] = self._obj_flag
            crange[:k] = self._obj_crange
            lastpos[:k] = self._obj_lastpos
        self._obj_id, self._obj_box, self._obj_cat, self._obj_mask = ids, boxes, cat, msk
        self._obj_static, self._obj_alive, self._obj_flag, self._obj_crange = static, alive, flag, crange
        self._obj_lastpos = lastpos

    def _alloc_sap_arena(self, units):
        d = self.dims
        self._bx_h = np.zeros(units, np.int32)
        self._bx_pos = np.zeros((units, 2 * d), np.int32)
        self._ep_key = np.zeros((d, 2 * units), np.uint64)

    def _alloc_pm_arena(self, slots):
        self._pm_slots = np.full(slots, -1, np.int32)
        self._pm_keys = np.zeros(slots // 2, np.uint64)
        self._pm_flag = np.zeros(slots // 2, np.uint8)

    def _reserve_objects(self, k):
        """Handles for k new objects: reuse free slots (oldest first), then fresh ones."""
        take = min(k, self._free.shape[0])
        h = np.empty(k, np.int32)
        h[:take] = self._free[:take]
        self._free = self._free[take:]
        fresh = k - take
        if fresh:
            start = self._next_handle
            if start + fresh > self._obj_id.shape[0]:
                self._alloc_objects(max(2 * self._obj_id.shape[0], start + fresh))
            h[take:] = np.arange(start, start + fresh, dtype=np.int32)
            self._next_handle += fresh
        return h

    def _grow_idmap(self, count):
        cap = capacity_for(count)
        if cap > self._idk.shape[0]:
            keys = np.zeros(cap, np.uint64)
            vals = np.full(cap, -1, np.int32)
            kid.idmap_rebuild(self._idk, self._idv, keys, vals)
            self._idk, self._idv = keys, vals

    def _reserve_cells(self, touched, need):
        """Give every touched cell room for ``need`` boxes (moving grown regions to the arena top)."""
        cap = self._cell_cap[touched]
        grow = need > cap
        if not grow.any():
            return
        cells = touched[grow]
        # 25% headroom: cells breathe as objects cross their borders, without a move every frame
        new_cap = (need[grow] + need[grow] // 4 + 2).astype(np.int32)
        size = new_cap.astype(np.int64) + 1
        total = int(size.sum())
        live = int(self._top - self._garbage)
        if self._garbage > max(live // 4, _COMPACT_MIN_UNITS):
            self._compact_sap(extra=total)
        units = self._bx_h.shape[0]
        if self._top + total > units:
            self._grow_sap_arena(int((self._top + total) * 1.25) + 1024)
        new_base = self._top + np.cumsum(size) - size
        self._garbage += int((self._cell_cap[cells].astype(np.int64) + (self._cell_cap[cells] > 0)).sum())
        karena.cells_move(cells, new_base, new_cap, self.dims, self._cell_n, self._cell_base, self._cell_cap,
                          self._bx_h, self._bx_pos, self._ep_key,
                          self._bx_h, self._bx_pos, self._ep_key)
        self._top += total

    def _grow_sap_arena(self, units):
        old = (self._bx_h, self._bx_pos, self._ep_key)
        k = old[0].shape[0]
        self._alloc_sap_arena(units)
        self._bx_h[:k] = old[0]
        self._bx_pos[:k] = old[1]
        self._ep_key[:, :2 * k] = old[2]

    def _compact_sap(self, extra=0):
        """Lay every occupied cell out again, densely, in fresh arrays."""
        cells = np.flatnonzero(self._cell_cap > 0).astype(np.int32)
        caps = self._cell_cap[cells]
        size = caps.astype(np.int64) + 1
        units = max(1024, int(1.25 * (size.sum() + extra)) + 2)
        old = (self._bx_h, self._bx_pos, self._ep_key)
        self._alloc_sap_arena(units)
        new_base = 1 + np.cumsum(size) - size
        karena.cells_move(cells, new_base, caps, self.dims, self._cell_n, self._cell_base, self._cell_cap,
                          *old, self._bx_h, self._bx_pos, self._ep_key)
        self._top = 1 + int(size.sum())
        self._garbage = 0

    def _reserve_pair_sets(self, touched, ev_plus):
        """Give every touched cell's pair set room for its new pairs (load factor <= 1/2)."""
        need = self._cell_pm_n[touched].astype(np.int64) + ev_plus
        cap = self._cell_pm_cap[touched]
        grow = (2 * need > cap) & (ev_plus > 0)
        if not grow.any():
            return
        cells = touched[grow]
        new_cap = np.maximum(16, 2 ** np.ceil(np.log2(2 * need[grow] + 1))).astype(np.int64)
        total = int(new_cap.sum())
        if self._pm_garbage > max((self._pm_top - self._pm_garbage) // 4, _COMPACT_MIN_UNITS):
            self._compact_pm(extra=total)
        slots = self._pm_slots.shape[0]
        if self._pm_top + total > slots:
            self._grow_pm_arena(int((self._pm_top + total) * 1.25) + 1024)
        new_base = self._pm_top + np.cumsum(new_cap) - new_cap
        self._pm_garbage += int(self._cell_pm_cap[cells].sum())
        kmerge.pair_sets_move(cells, new_base, new_cap, self._cell_pm_base, self._cell_pm_cap, self._cell_pm_n,
                              self._pm_slots, self._pm_keys, self._pm_flag,
                              self._pm_slots, self._pm_keys, self._pm_flag)
        self._pm_top += total

    def _grow_pm_arena(self, slots):
        old = (self._pm_slots, self._pm_keys, self._pm_flag)
        k = old[0].shape[0]
        self._alloc_pm_arena(slots)
        self._pm_slots[:k] = old[0]
        self._pm_keys[:k // 2] = old[1]
        self._pm_flag[:k // 2] = old[2]

    def _compact_pm(self, extra=0):
        cells = np.flatnonzero(self._cell_pm_cap > 0).astype(np.int32)
        caps = self._cell_pm_cap[cells]
        slots = max(1024, int(1.25 * (caps.sum() + extra)) + 2)
        old = (self._pm_slots, self._pm_keys, self._pm_flag)
        self._alloc_pm_arena(slots)
        new_base = np.cumsum(caps) - caps
        kmerge.pair_sets_move(cells, new_base, caps, self._cell_pm_base, self._cell_pm_cap, self._cell_pm_n,
                              *old, self._pm_slots, self._pm_keys, self._pm_flag)
        self._pm_top = int(caps.sum())
        self._pm_garbage = 0

    def _reserve_world_pairs(self, extra):
        """Room in every shard of the world's pair table for ``extra[s]`` more pairs (load <= 1/2)."""
        need = int((self._g_n + extra).max())
        if 2 * need < self._g_cap:
            return
        cap = capacity_for(need)
        half, old_half = cap // 2, self._g_cap // 2
        keys = np.zeros(_WORLD_SHARDS * half, np.uint64)
        cnt = np.zeros(_WORLD_SHARDS * half, np.int32)
        slots = np.empty(_WORLD_SHARDS * cap, np.int32)
        for s in range(_WORLD_SHARDS):
            n = int(self._g_n[s])
            keys[s * half:s * half + n] = self._g_keys[s * old_half:s * old_half + n]
            cnt[s * half:s * half + n] = self._g_cnt[s * old_half:s * old_half + n]
            kmerge.pair_set_rehash(slots, keys, s * cap, cap, s * half, n)
        self._g_cap, self._g_slots, self._g_keys, self._g_cnt = cap, slots, keys, cnt

    def _world_pair_keys(self):
        """Every active pair's key (handle space), shard after shard."""
        return kmerge.gather_runs(self._g_keys, np.arange(_WORLD_SHARDS, dtype=np.int64) * (self._g_cap // 2),
                                  self._g_n)

    # ------------------------------------------------------------------ frame
    def _as_boxes(self, boxes, n, field):
        """float32 [n, 2*dims] boxes, C order (shape and dtype checked; values by ``_raise_bad_box``)."""
        d2 = 2 * self.dims
        if boxes is None:
            if n:
                raise FrameError(field, -1, f"missing: {n} ids need {n} boxes")
            return np.zeros((0, d2), np.float32)
        b = np.asarray(boxes)
        if b.dtype.kind not in "fiu":
            raise FrameError(field, -1, f"boxes must be numbers, got dtype {b.dtype}")
        if b.ndim == 1 and b.size == 0:
            b = b.reshape(0, d2)
        if b.ndim != 2 or b.shape[1] != d2:
            raise FrameError(field, -1, f"must have shape [{n}, {d2}] (mins then maxs), got {b.shape}")
        if b.shape[0] != n:
            raise FrameError(field, -1, f"has {b.shape[0]} rows for {n} ids")
        if b.dtype != np.float32 and b.size:
            # values that overflow float32 are reported as out of range, not silently made infinite
            with np.errstate(invalid="ignore", over="ignore"):
                b64 = b.astype(np.float64)
                bad = np.isfinite(b64) & (np.abs(b64) > self._coord_limit)
            if bad.any():
                r, col = np.argwhere(bad)[0]
                raise FrameError(field, int(r), _BOX_REASON[kval.BOX_OUT_OF_RANGE].format(
                    axis=int(col) % self.dims, limit=self._coord_limit))
            with np.errstate(invalid="ignore", over="ignore"):
                b = b.astype(np.float32)
        return np.ascontiguousarray(b, np.float32)

    def _raise_bad_box(self, field, row, code, axis):
        if row >= 0:
            raise FrameError(field, int(row), _BOX_REASON[code].format(axis=axis, limit=self._coord_limit))

    @staticmethod
    def _check_column(x, n, field, dtype, default):
        if x is None:
            return np.full(n, default, dtype) if n else _EMPTY_COLUMN[dtype]
        a = np.asarray(x)
        if a.ndim != 1 or a.shape[0] != n:
            raise FrameError(field, -1, f"must be a 1-D array of {n} values, got shape {a.shape}")
        if dtype is np.uint8:
            return np.ascontiguousarray(a.astype(bool), np.uint8)
        if a.size and a.dtype.kind == "i" and ((a < 0) | (a > 0xFFFFFFFF)).any():
            raise FrameError(field, int(np.flatnonzero((a < 0) | (a > 0xFFFFFFFF))[0]), "must fit in uint32")
        if a.size and a.dtype.kind not in "iub":
            raise FrameError(field, -1, f"must be integers, got dtype {a.dtype}")
        return np.ascontiguousarray(a, dtype)

    def step(self, remove_ids=None, add_ids=None, add_boxes=None, add_category=None, add_mask=None,
             add_static=None, update_ids=None, update_boxes=None) -> Delta:
        """Apply one frame (removes, then updates, then adds) atomically; return its delta.

        ids: uint64 [K]; boxes: float32 [K, 2*dims] (mins then maxs); category/mask: uint32 [A];
        static: bool [A]. Raises FrameError / CapacityError and changes nothing if the frame is invalid.
        """
        t0 = time.perf_counter()
        # phase 0: validate everything before anything changes
        rem = _as_ids(remove_ids, "remove_ids")
        upd = _as_ids(update_ids, "update_ids")
        add = _as_ids(add_ids, "add_ids")
        nr, nu, na = rem.shape[0], upd.shape[0], add.shape[0]
        upd_boxes = self._as_boxes(update_boxes, nu, "update_boxes")
        add_boxes = self._as_boxes(add_boxes, na, "add_boxes")
        rem_h = np.empty(nr, np.int32)
        if nr:
            self._threads(nr)
            with _PARALLEL_LOCK:
                kval.idmap_lookup(self._idk, self._idv, rem, rem_h)
        # updates usually come in the order of the last frame's: their handles follow that list (the
        # same list again, a client that sends every object every frame, costs one comparison)
        lookups, known, row_of = 0, 1, _NO_ROW_OF
        listed = still = False
        if nu and nu == self._last_ids.shape[0]:
            if self._last_boxes is not None:    # ids and boxes by row in one pass; still: every box equal
                r = kval.list_repeats(upd, self._last_ids, upd_boxes.reshape(-1), self._last_boxes.reshape(-1))
                listed, still = r != kval.LIST_OTHER, r == kval.LIST_STILL
            else:
                listed = np.array_equal(upd, self._last_ids)
        if listed:
            upd_h = self._last_h        # shared, read only: a new list replaces it, never writes into it
        elif nu:
            upd_h = np.empty(nu, np.int32)
            hit = np.zeros(self._last_ids.shape[0], np.uint8)
            looked = np.empty(nu, np.int64)
            row_of = np.empty(nu, np.int64)
            lookups = kval.idmap_resolve_seq(self._idk, self._idv, upd, self._last_ids, self._last_h,
                                             self._obj_lastpos, upd_h, hit, looked, row_of)
            # the updates taken along the list are distinct: only the removes and the ids off the list
            # need the duplicate check (else the full check names the offending entry)
            known = 2 if kval.ids_distinct_listed(rem_h, upd_h, looked, lookups, hit, self._last_h,
                                                  self._obj_lastpos, self._obj_flag) else 0
        else:
            upd_h = _NO_HANDLES
        # (known == 1 without removes or adds: the updates are the last list's live, distinct objects, or
        # none; there is nothing to check)
        code = which = index = 0
        if nr or na or known != 1:
            code, which, index = kval.frame_check_ids(self._idk, self._idv, rem, upd, add, rem_h, upd_h,
                                                      self._obj_flag, known)
        if code:
            field = ("remove_ids", "update_ids", "add_ids")[which]
            idv = (rem, upd, add)[which][index]
            reason = {1: f"unknown id {idv}",
                      2: f"id {idv} appears more than once in the frame",
                      3: f"id {idv} is already live (an id appears at most once in a frame)"}[code]
            raise FrameError(field, index, reason)
        # every update's handle is known: a box equal to the stored one is marked (same = 2) and needs
        # no check. The stored boxes are read from the last list's rows where it has them (the same
        # list: row by row; else at the positions found along it), else from the per-object array
        # (every object of the last list sent again with its box, ``still``: no box to check, and the
        # marks are read only by the phases after the early return below, reached with removes or adds)
        rows = _NO_ROWS if self._last_boxes is None else self._last_boxes
        row_boxes = self._last_boxes if listed else None
        moving = 0                  # updates whose box changes
        if still:
            same = np.full(nu, 2, np.uint8) if nr or na else _NO_SAME
        else:
            same = np.empty(nu, np.uint8)
        with _PARALLEL_LOCK:
            if nu and not still:
                self._threads(nu)
                self._raise_bad_box("update_boxes", *kval.boxes_check(
                    upd_boxes, self.dims, self._coord_limit32, self._obj_box, upd_h, same, rows,
                    row_of if rows.shape[0] else _NO_ROW_OF, row_boxes is not None))
                moving = nu - int(np.count_nonzero(same == 2))
            if na:
                self._threads(na)
                self._raise_bad_box("add_boxes", *kval.boxes_check(
                    add_boxes, self.dims, self._coord_limit32, self._obj_box, _NO_HANDLES, _NO_SAME, _NO_ROWS,
                    _NO_ROW_OF, False))
        add_cat = self._check_column(add_category, na, "add_category", np.uint32, 0xFFFFFFFF)
        add_msk = self._check_column(add_mask, na, "add_mask", np.uint32, 0xFFFFFFFF)
        add_static = self._check_column(add_static, na, "add_static", np.uint8, 0)
        live = self.object_count
        if moving == 0 and nr == 0 and na == 0:
            # nothing in the frame, or only updates that keep their boxes (and nothing invalid):
            # nothing can change
            self.frames += 1
            self._remember_order(upd, upd_h, upd_boxes, lookups, nr, add, _NO_HANDLES, add_boxes, False)
            t1 = time.perf_counter()
            return Delta(_EMPTY_PAIRS.copy(), _EMPTY_PAIRS.copy(),
                         FrameStats(objects=live, pairs=self._gn, validate_s=t1 - t0, total_s=t1 - t0))
        if live - rem.shape[0] + na > self.config.max_objects:
            raise CapacityError("add_ids", f"the world would hold {live - rem.shape[0] + na} objects, "
                                           f"more than its limit of {self.config.max_objects}")
        t1 = time.perf_counter()
        stats = FrameStats(validate_s=t1 - t0)
        self.frames += 1
        frame = self.frames
        # phase 1: handles of the new objects (handles freed by this frame are released in phase 8)
        fresh = self._next_handle
        add_h = self._reserve_objects(na)
        if na > 1:      # neighbours in space get neighbouring handles (see kgrid.spatial_order)
            kgrid.spatial_order(self.dims, self._bmin, self._inv, self._C, add_boxes, add_h, self._obj_crange,
                                fresh)
        if na:
            self._grow_idmap(live + na)
            kid.idmap_insert_many(self._idk, self._idv, add, add_h)
            self._obj_id[add_h] = add
            self._obj_cat[add_h] = add_cat
            self._obj_mask[add_h] = add_msk
            self._obj_static[add_h] = add_static
            self._obj_alive[add_h] = 1
        list_rows, row_mode = self._remember_order(upd, upd_h, upd_boxes, lookups, nr, add, add_h, add_boxes,
                                                   True)

        # phase 2: rasterize: cell ranges, boxes and flags (parallel), touched cells and entries (serial)
        newr = np.empty((upd_h.shape[0] + na, 6), np.int32)
        self._threads(moving + na)
        with _PARALLEL_LOCK:
            kgrid.grid_ranges(self.dims, self._bmin, self._inv, self._C, self._obj_box, self._obj_crange,
                              self._obj_flag, upd_h, upd_boxes, add_h, add_boxes, newr, same,
                              list_rows, row_mode, self._obj_lastpos)
        # when most objects move, every occupied cell is touched: cheaper than touching cell by cell
        dense = 2 * (moving + rem.shape[0]) >= live
        touched, ent_off, ent_h = kgrid.grid_rasterize(
            self._C, self._obj_crange, self._obj_flag, self._cell_n, rem_h, upd_h, add_h, newr, same, dense,
            self._cell_stamp, self._cell_tidx, frame)
        t2 = time.perf_counter()
        stats.rasterize_s = t2 - t1

        # phase 3: room for the touched cells and their events
        nt = touched.shape[0]
        room, grow, ev_off, ev_cap, max_cap, work = karena.frame_room(touched, ent_off, self._cell_n, self._cell_cap,
                                                                     self._cell_pm_n)
        if grow:
            self._reserve_cells(touched, room)
            max_cap = int(self._cell_cap[touched].max())
        need = int(ev_off[-1])
        if need > self._scratch_ev.shape[0] or self._scratch_ev.shape[0] > 8 * max(need, 1 << 16):
            # grow, or give back a buffer left far too big by a burst (e.g. the initial batch insert)
            self._scratch_ev = np.empty(need + need // 2, np.uint64)
        ev_key = self._scratch_ev
        ev_n = np.zeros(nt, np.int64)
        ev_plus = np.zeros(nt, np.int64)
        swaps = np.zeros(nt, np.int64)
        nth = numba.config.NUMBA_NUM_THREADS
        scratch = np.empty((nth, 3, max_cap + 1), np.int32)
        kscratch = np.empty((nth, 2 * max_cap + 2), np.uint64)

        # phase 4: every touched cell's SAP, in parallel
        self._threads(work)
        with _PARALLEL_LOCK:
            ksap.cells_apply(touched, ent_off, ent_h, self.dims, self._C, self._obj_flag, self._obj_crange,
                             self._obj_box.view(np.uint32), self._obj_cat, self._obj_mask, self._obj_static,
                             self._cell_n, self._cell_base, self._bx_h, self._bx_pos, self._ep_key,
                             scratch, kscratch, self._cell_pm_base, self._cell_pm_n, self._pm_keys,
                             ev_key, ev_off, ev_n, ev_plus, swaps)
        # phase 5: overflowed event slices are recomputed exactly
        over = ev_n > ev_cap
        if over.any():
            stats.cell_overflows = int(over.sum())
            ev_key, ev_off, ev_n = karena.cells_recompute_events(
                touched, over, self.dims, self._obj_cat, self._obj_mask, self._obj_static, self._cell_n,
                self._cell_base, self._bx_h, self._bx_pos, self._ep_key, self._cell_pm_base, self._cell_pm_cap,
                self._cell_pm_n, self._pm_slots, self._pm_keys, ev_key, ev_off, ev_n)
            ev_plus = ev_n

        # phase 6: net the events in each cell's pair set, in parallel
        self._reserve_pair_sets(touched, ev_plus)
        out_n = np.zeros(nt, np.int64)
        self._threads(int(ev_n.sum()), _PARALLEL_MIN_EVENTS)
        with _PARALLEL_LOCK:
            kmerge.cells_net(touched, ev_key, ev_off, ev_n, self._cell_pm_base, self._cell_pm_cap,
                             self._cell_pm_n, self._pm_slots, self._pm_keys, self._pm_flag, out_n)
        t4 = time.perf_counter()
        stats.apply_s = t4 - t2

        # phase 7: merge into the world's pair counts (the events grouped by shard, shards in parallel)
        events, boff = kmerge.world_bucket(ev_key, ev_off, out_n, _WORLD_SHARDS)
        self._reserve_world_pairs(np.diff(boff))
        created = np.empty(events.shape[0], np.uint64)
        deleted = np.empty(events.shape[0], np.uint64)
        n_cr = np.zeros(_WORLD_SHARDS, np.int64)
        n_de = np.zeros(_WORLD_SHARDS, np.int64)
        self._threads(events.shape[0], _PARALLEL_MIN_EVENTS)
        with _PARALLEL_LOCK:
            kmerge.world_merge(events, boff, self._g_slots, self._g_keys, self._g_cnt, self._g_cap, self._g_n,
                               created, deleted, n_cr, n_de)
        self._gn = int(self._g_n.sum())
        created = self._keys_to_id_pairs(kmerge.gather_runs(created, boff, n_cr))
        deleted = self._keys_to_id_pairs(kmerge.gather_runs(deleted, boff, n_de))

        # phase 8: release removed objects, clear the frame's flags
        if rem_h.shape[0]:
            kid.idmap_remove_many(self._idk, self._idv, rem)
            self._obj_alive[rem_h] = 0
            self._free = np.concatenate([self._free, rem_h])
        if 8 * (rem_h.shape[0] + upd_h.shape[0] + na) > self._next_handle:
            self._obj_flag[:self._next_handle] = 0
        else:
            self._obj_flag[rem_h] = 0
            self._obj_flag[upd_h] = 0
            self._obj_flag[add_h] = 0
        t5 = time.perf_counter()
        stats.merge_s = t5 - t4
        stats.total_s = t5 - t0
        stats.objects = self.object_count
        stats.pairs = self._gn
        stats.created = created.shape[0]
        stats.deleted = deleted.shape[0]
        stats.swaps = int(swaps.sum())
        stats.cells_touched = nt
        return Delta(created, deleted, stats)

    def _threads(self, work, threshold=_PARALLEL_MIN_OPS):
        """Threads for the next parallel kernels: all of this world's, or 1 for little work."""
        numba.set_num_threads(self._max_threads if work >= threshold else 1)

    def _remember_order(self, upd, upd_h, upd_boxes, lookups, nr, add, add_h, add_boxes, deferred):
        """Once a frame is valid and its handles are known: its updates in their order, then its new
        objects (clients usually append them to their arrays), guide the next frame's handle lookups
        (idmap_resolve_seq). Without updates, the last list stays unless this frame removed objects
        (they may be on it); a frame of adds only appends them. Every id on the list is live after this
        frame; ``_obj_lastpos[h]`` is h's position on it.

        ``_last_boxes[j]`` is the box of the list's j-th object, or None: the next frame's box check
        reads the stored boxes from it in about the list's order. It is kept for a list that mostly
        follows the last one (else the copy would cost more than it saves), and from the second frame
        of a list that repeats.

        deferred: grid_ranges runs in this frame; the new list's positions and box rows are left to it,
        returned as ``(rows, row_mode)`` (see ``kgrid.grid_ranges``)."""
        n_upd, n_add = upd.shape[0], add.shape[0]
        if n_upd:
            if not (lookups or n_upd != self._last_ids.shape[0] or n_add):
                if self._last_boxes is None:        # the same list as the last frame's
                    self._last_boxes = np.array(upd_boxes, np.float32)
                    return _NO_ROWS, 0
                return self._last_boxes, 1
            keep_rows = 4 * lookups <= n_upd
            self._last_ids = _list_ids(upd, add)            # a copy: the caller's arrays are not kept
            self._last_h = np.concatenate([upd_h, add_h])
            if deferred:
                self._last_boxes = np.empty((n_upd + n_add, 2 * self.dims), np.float32) if keep_rows else None
                return (_NO_ROWS if self._last_boxes is None else self._last_boxes), 2
            self._last_boxes = np.concatenate([upd_boxes, add_boxes]) if keep_rows else None
            kval.set_positions(self._last_h, self._obj_lastpos)
        elif nr:
            self._last_ids, self._last_h, self._last_boxes = _NO_IDS, _NO_HANDLES, None
        elif n_add:
            old = self._last_ids.shape[0]
            self._last_ids = _list_ids(self._last_ids, add)
            self._last_h = np.concatenate([self._last_h, add_h])
            if self._last_boxes is not None:
                self._last_boxes = np.concatenate([self._last_boxes, add_boxes])
            self._obj_lastpos[add_h] = np.arange(old, old + n_add, dtype=self._obj_lastpos.dtype)
        return _NO_ROWS, 0

    def _keys_to_id_pairs(self, keys):
        """Handle-pair keys -> sorted uint64 [K, 2] rows of (low id, high id)."""
        k = keys.shape[0]
        if k == 0:
            return _EMPTY_PAIRS.copy()
        lo = np.empty(k, np.uint64)
        hi = np.empty(k, np.uint64)
        if kmerge.keys_to_ids(keys, self._obj_id, lo, hi):
            packed = np.sort((lo << _S32) | hi)
            out = np.empty((k, 2), np.uint64)
            np.right_shift(packed, _S32, out=out[:, 0])
            np.bitwise_and(packed, _LO32, out=out[:, 1])
            return out
        order = np.lexsort((hi, lo))
        return np.stack([lo[order], hi[order]], axis=1)

    # ------------------------------------------------------------------ queries
    @property
    def object_count(self) -> int:
        return self._next_handle - self._free.shape[0]

    @property
    def pair_count(self) -> int:
        return self._gn

    def pairs(self) -> np.ndarray:
        """All active pairs: uint64 [P, 2] rows (low id, high id), sorted."""
        return self._keys_to_id_pairs(self._world_pair_keys())

    def query(self, region) -> np.ndarray:
        """Sorted ids (uint64) of the live boxes intersecting ``region`` (2*dims floats, inclusive)."""
        r = np.asarray(region, np.float64).reshape(-1)
        if r.shape[0] != 2 * self.dims or not np.isfinite(r).all() or (r[:self.dims] > r[self.dims:]).any():
            raise FrameError("region", -1, f"must be {2 * self.dims} finite values, mins <= maxs")
        out = np.empty(self._next_handle, np.int32)
        k = karena.objects_query(self._obj_box, self._obj_alive[:self._next_handle], self.dims,
                                 r.astype(np.float32), out)
        return np.sort(self._obj_id[out[:k]])

    def ids(self) -> np.ndarray:
        return np.sort(self._obj_id[:self._next_handle][self._obj_alive[:self._next_handle] != 0])

    def boxes(self, ids) -> np.ndarray:
        ids = _as_ids(ids, "ids")
        h = np.empty(ids.shape[0], np.int32)
        first = kid.idmap_find_many(self._idk, self._idv, ids, h)
        if first >= 0:
            raise FrameError("ids", int(first), f"unknown id {ids[first]}")
        return self._obj_box[h].copy()

    def cell_occupancy(self) -> np.ndarray:
        return self._cell_n.astype(np.int64)

    def memory_bytes(self) -> int:
        """Bytes held by the world's arrays (objects, id map, arenas, pair sets, workspaces)."""
        return int(sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray)))

    # ------------------------------------------------------------------ invariants
    def validate(self) -> None:
        """Check every internal invariant; raise AssertionError on the first one broken (tests only).
        See ``sapcore.invariants.check_world``."""
        check_world(self)
