"""A world: one multi-SAP grid (001 II §3c-d) behind a frame-at-a-time API.

Structure: a grid of ``cells`` per axis over ``bounds``, wrapping outside them; an object is in every
cell its box touches; each cell has its own array SAP and pair set (kernels/sap_cell.py, merge.py).
The world is made of owners, each with its own invariants (``validate`` calls each one's check):

- ``objects`` (objects.py): every object's id, box, filters and grid state by handle, and the id map;
- ``sap`` and ``pair_sets`` (arena.py): the cells' SAP arrays and pair sets, regions of two arenas;
- ``world_pairs`` (world_pairs.py): per active pair, the number of cells holding it; the world reports
  only the 0 -> 1 and 1 -> 0 transitions, netted over a frame;
- ``update_list`` (update_list.py): the last frame's update list, which guides the next frame.

``World.step`` applies one frame, in numbered phases:
  0. validate the whole frame (ids, then boxes, limits); nothing changes before this passes
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

A frame whose work runs on the calling thread (``threads=1``, or a small frame; ``parallel.serial``)
calls each parallel kernel's serial twin, and makes one kernel call for phases 2-7 (``_serial_frame``,
``kernels.frame.frame_cells_pairs``; phases 4-7 alone after a stop for room): between the phases of a
small frame, Python and the calls cost more than the kernels' work. A
frame whose cells run in parallel makes one call for phases 4-7 too (``kframe.pairs_parallel``: the
parallel kernels launched from compiled code), which leaves the delta's id pairs to Python: after a big
kernel, each small numpy operation cost ~10 us.
The commonest small frame, the updates of the last frame's list in its order and nothing else, runs
phases 0-8 in a single call (``step`` itself, ``kernels.frame.frame_listed``), its world arrays kept in
one record (``kframe.ListedState``) between frames; the general phases go on from wherever that call has
to stop.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
import time

import numba
import numpy as np

from . import parallel
from ._numba import entry_point
from .arena import Arena, Field
from .errors import CapacityError, FrameError
from .frame_input import _F32, _U64, as_boxes, as_ids, check_column, raise_bad_box, raise_bad_id
from .invariants import check_world
from .kernels import arena as karena
from .kernels import frame as kframe
from .kernels import grid as kgrid
from .kernels import idmap as kid
from .kernels import merge as kmerge
from .kernels import validate as kval
from .objects import ObjectStore
from .types import Delta, FrameStats, WorldConfig
from .update_list import NO_ROW_OF, NO_ROWS, UpdateList
from .world_pairs import SHARDS, WorldPairs

#: A frame's empty side of its delta is a view of this: a zero-length view cannot change it (no elements; its
#: shape and flags are its own), and costs 0.07 us against 0.26 us for a copy (two a frame: ~5% of a
#: 100-object step).
_EMPTY_PAIRS = np.zeros((0, 2), np.uint64)
# the order of FrameStats' fields, which a whole frame in one call fills positionally (a keyword call costs
# twice as much): a change of the dataclass fails here, at import
_STATS_ORDER = ("objects", "pairs", "created", "deleted", "swaps", "cells_touched", "cell_overflows", "validate_s",
                "rasterize_s", "apply_s", "merge_s", "total_s")
assert tuple(f.name for f in dataclasses.fields(FrameStats)) == _STATS_ORDER, "FrameStats fields"
_NO_HANDLES = np.zeros(0, np.int32)
_NO_SAME = np.zeros(0, np.uint8)
_PAIRS_DONE = kframe.PAIRS_DONE
_NO_LISTED_CALL = (None, 0, 0)
_NDARRAY = np.ndarray
_C_CONTIGUOUS = 1                     # numpy's NPY_ARRAY_C_CONTIGUOUS, the bit of ``ndarray.flags.num``
_perf_counter = time.perf_counter
_LO32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
RADIX_SORT_MIN = 1 << 11         # a delta of this many pairs or more: kmerge.id_pairs_sorted (a radix sort)


def auto_cells(dims: int, bounds, n_objects: int, per_cell: float = 64.0) -> tuple:
    """Cells per axis for ``n_objects`` spread over ``bounds``: about ``per_cell`` objects a cell,
    cells as cubic as the bounds allow (a flat axis gets one cell).

    64 a cell rather than 32: fewer boxes in two cells at once and fewer cells to visit outweigh the
    longer sweeps (a third more endpoint swaps): as fast or faster at every size measured, uniform or
    clustered (README, "Where the rest of a big frame goes")."""
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


def _move_saps(dims, sap, cells, new_base, new_cap, src, dst):
    """The cells' SAP arena's ``move`` (``Arena``: a function of the arena, the world's dims bound)."""
    karena.cells_move(cells, new_base, new_cap, dims, sap.n, sap.base, sap.cap, *src, *dst)


def _move_pair_sets(ps, cells, new_base, new_cap, src, dst):
    """The cells' pair-set arena's ``move``."""
    kmerge.pair_sets_move(cells, new_base, new_cap, ps.base, ps.cap, ps.n, *src, *dst)


class _Frame:
    """What one frame carries from phase to phase."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.stats = FrameStats()
        self.room = None                # phase 3's sizes when phase 2 computed them
        self.flags_cleared = False      # the frame's flags were cleared with its pairs (``_pairs_serial``)
        self.swaps_total = None
        self.nt = None                  # touched cells, where ``touched`` is not kept (``_serial_frame``)
        self.all_moved = False          # the cells take every staying box as moved (``_rasterize``)


class World:
    """One named world of the service: a multi-SAP grid. See the module docstring."""

    def __init__(self, config: WorldConfig):
        self.config = config
        d = self.dims = config.dims
        self._d2 = 2 * d                # a box's floats
        C = np.ones(3, np.int64)
        C[:d] = config.cells
        self._C = C
        b = np.asarray(config.bounds, np.float64)
        self._bmin = np.zeros(3)
        self._bmin[:d] = b[:d]
        self._inv = np.ones(3)
        self._inv[:d] = C[:d] / (b[d:] - b[:d])
        self._max_threads = min(config.threads or numba.config.NUMBA_NUM_THREADS, numba.config.NUMBA_NUM_THREADS)
        # work from which a frame's cells are applied by the parallel phases (``parallel.serial``)
        self._serial_work = (1 << 62) if self._max_threads == 1 else parallel.MIN_OPS
        # the same for phases 4-7 of a frame whose phase 2 runs on the calling thread (``_cells_serial``)
        self._serial_cell_work = (1 << 62) if self._max_threads == 1 else parallel.MIN_CELL_WORK
        # |coordinate| <= coord_limit, checked on the caller's values; float32 values are checked against
        # the limit rounded up to float32, so a value at the limit passes in either precision
        self._coord_limit = float(config.coord_limit)
        lim32 = np.float32(min(self._coord_limit, 3.0e38))
        if float(lim32) < self._coord_limit:
            lim32 = np.nextafter(lim32, np.float32(np.inf))
        self._coord_limit32 = lim32
        self._coord_limit_bits = np.uint64(lim32.view(np.uint32))     # its bits (``kval.rows_check``)
        self.n_cells = nc = int(np.prod(C))
        self.frames = 0
        self.objects = ObjectStore(d)
        # the cells' SAPs: box units (handle, endpoint positions), two endpoint keys per unit and axis;
        # each region has a sentinel unit of its own
        self.sap = Arena(nc, (Field(np.int32), Field(np.int32, trail=(2 * d,)), Field(np.uint64, lead=(d,), per_unit=2)),
                         1024, first=1, pad=1, cap_dtype=np.int32, move=functools.partial(_move_saps, d))
        # the cells' pair sets: hash slots, and one key and flag per two slots (load factor <= 1/2)
        self.pair_sets = Arena(nc, (Field(np.int32, fill=-1), Field(np.uint64, per_unit=0.5),
                                    Field(np.uint8, per_unit=0.5)),
                               1024, first=0, pad=0, cap_dtype=np.int64, move=_move_pair_sets)
        self.world_pairs = WorldPairs()
        self.update_list = UpdateList()
        self._cell_stamp = np.zeros(nc, np.int64)      # the last frame that touched each cell
        self._cell_tidx = np.zeros(nc, np.int32)       # its index among that frame's touched cells
        self._scratch_ev = np.empty(1024, np.uint64)   # the event buffer, reused between frames
        self._scratch = np.empty((numba.config.NUMBA_NUM_THREADS, 3, 0), np.int32)
        self._kscratch = np.empty((numba.config.NUMBA_NUM_THREADS, 0), np.uint64)
        self._listed_key = (None,) * 9        # see _listed_state
        self._listed = None
        self._listed_calls = {}               # see _listed_call
        self._listed_last = _NO_LISTED_CALL   # the last held one and its arrays' flags (``step``)

    # ------------------------------------------------------------------ frame
    def step(self, remove_ids=None, add_ids=None, add_boxes=None, add_category=None, add_mask=None,
             add_static=None, update_ids=None, update_boxes=None) -> Delta:
        """Apply one frame (removes, then updates, then adds) atomically; return its delta.

        ids: uint64 [K]; boxes: float32 [K, 2*dims] (mins then maxs); category/mask: uint32 [A];
        static: bool [A]. Raises FrameError / CapacityError and changes nothing if the frame is invalid.
        """
        t0 = _perf_counter()
        ul = self.update_list
        if (update_ids is not None and remove_ids is None and add_ids is None and add_boxes is None
                and add_category is None and add_mask is None and add_static is None and ul.rows is not None):
            # the last frame's list again, updates only: a small frame (under ``parallel.MIN_OPS`` updates) of
            # the list's ids in its order is the whole frame in one call when it needs no room and no parallel
            # phase (``kernels.frame.frame_listed``; its engine time is then all in apply_s). The engine's own
            # arrays (a game server's every frame) are taken as they are, as ``as_ids`` and ``as_boxes`` would
            # take them; anything else goes through them. This path is written out here, without a call of
            # its own, each array's flags read once (bit 1: C-contiguous), the call's other outcomes in
            # ``_listed_rest``: its Python was 1.7 us of a 5.8 us 100-object step, 0.28 us less this way
            upd, boxes = update_ids, update_boxes
            if not (type(upd) is _NDARRAY and upd.dtype is _U64 and upd.ndim == 1
                    and (uflags := upd.flags.num) & _C_CONTIGUOUS and upd.shape[0]):
                upd = as_ids(upd, "update_ids")
                uflags = upd.flags.num
            nu = upd.shape[0]
            if not (type(boxes) is _NDARRAY and boxes.dtype is _F32 and boxes.shape == (nu, self._d2)
                    and (bflags := boxes.flags.num) & _C_CONTIGUOUS):
                boxes = as_boxes(boxes, nu, "update_boxes", self.dims, self._coord_limit)
                bflags = boxes.flags.num
            if nu == ul.ids.shape[0] and nu < parallel.MIN_OPS:
                objects, wp = self.objects, self.world_pairs
                k = self._listed_key              # (``_world_arrays_key`` written out past k[1])
                if not (k[0] is ul.rows and k[1] is ul.ids and k[2] is objects.box and k[3] is self.sap.arrays
                        and k[4] is self.pair_sets.arrays and k[5] is wp.slots and k[6] is self._scratch
                        and k[7] is self._scratch_ev and k[8] is objects.filtered):
                    self._listed_state()
                live = objects.next_handle - objects.free.shape[0]          # (``objects.count``)
                held = nu < parallel.HOLD_GIL_BELOW
                call, uf, bf = self._listed_last
                if call is not None and held and uflags == uf and bflags == bf:
                    out = call(upd, boxes, live, self.frames + 1, self._listed)  # (``_listed_call``'s last callable)
                else:
                    out = self._listed_call(held, upd, boxes, live)
                if out[0] == _PAIRS_DONE:
                    (_, _, _, _, _, swaps, pairs, nt, _, _, _, _, created, deleted) = out
                    self.frames += 1
                    if pairs >= 0:
                        wp.count = pairs
                    else:
                        pairs = wp.count
                    if created is None:         # (an empty side comes back as None: see frame_listed)
                        created, nc = _EMPTY_PAIRS.view(), 0
                    else:
                        nc = created.shape[0]
                    if deleted is None:
                        deleted, nd = _EMPTY_PAIRS.view(), 0
                    else:
                        nd = deleted.shape[0]
                    dt = _perf_counter() - t0
                    # positional (see _STATS_ORDER): objects, pairs, created, deleted, swaps, cells_touched,
                    # cell_overflows, validate_s, rasterize_s, apply_s, merge_s, total_s
                    return Delta(created, deleted, FrameStats(live, pairs, nc, nd, swaps, nt, 0, 0.0, 0.0, dt, 0.0, dt))
                delta = self._listed_rest(t0, upd, boxes, live, out)
                if delta is not None:
                    return delta
            update_ids, update_boxes = upd, boxes
        f = _Frame(t0)
        with parallel.frame(self._max_threads):     # its parallel launches keep one pin (``parallel.frame``)
            self._validate_ids(f, remove_ids, update_ids, update_boxes, add_ids, add_boxes)      # phase 0
            self._validate_boxes(f, add_category, add_mask, add_static)
            if f.moving == 0 and f.nr == 0 and f.na == 0:
                return self._unchanged(f)
            self._admit(f)                  # phase 1
            if parallel.serial(self._max_threads, f.moving + f.na):
                return self._serial_frame(f)    # phases 2-8, 2-7 in one call where it can
            self._rasterize(f)              # phase 2
            return self._from_room(f)

    def _from_room(self, f) -> Delta:
        """Phases 3 to 8 of a frame whose phase 2 is done."""
        self._make_room(f)              # phase 3
        if self._cells_serial(f):
            created, deleted = self._pairs_serial(f)    # phases 4-7 in one call (falls back when it must)
        else:
            created, deleted = self._pairs_parallel(f)  # the same, the kernels in parallel
        return self._delta(f, created, deleted)

    def _cells_serial(self, f) -> bool:
        """Do the cells' SAPs run on the calling thread (phases 4-7 in one call, or the serial cell apply)?
        Never with ``f.all_moved``: the serial paths read every staying box's flag, which it leaves unwritten.
        (``parallel.serial(self._max_threads, f.work, parallel.MIN_CELL_WORK)``, kept in ``_serial_cell_work``
        for the one-call frames too.)"""
        return f.work < self._serial_cell_work and not f.all_moved

    def _delta(self, f, created, deleted) -> Delta:
        self._finish(f)                 # phase 8
        f.stats.created, f.stats.deleted = created.shape[0], deleted.shape[0]
        return Delta(created.view() if created is _EMPTY_PAIRS else created,
                     deleted.view() if deleted is _EMPTY_PAIRS else deleted, f.stats)

    def _world_arrays_key(self) -> tuple:
        """``_listed_key`` past its update list (``[2:]``): the arrays of the record whose replacement (the
        object arrays, an arena, the pair table or a workspace grew) replaces any of the world's arrays it
        holds, and whether the objects have filters (``ObjectStore.pair_filters``: the filter arrays or
        empty ones). ``step``'s small frames compare them written out."""
        objects = self.objects
        return (objects.box, self.sap.arrays, self.pair_sets.arrays, self.world_pairs.slots, self._scratch,
                self._scratch_ev, objects.filtered)

    def _listed_state(self) -> None:
        """The arrays and constants ``frame_listed`` reads besides the frame's, kept between frames in one
        ``kframe.ListedState`` (``_listed``), with ``_listed_key``: the arrays whose replacement (the update
        list changed, the object arrays, an arena, the pair table or a workspace grew) replaces any of them,
        and whether the objects have filters (``ObjectStore.pair_filters``: the filter arrays or empty ones);
        ``step`` compares them by identity every frame and calls this on a difference."""
        ul, objects, sap, ps, wp = self.update_list, self.objects, self.sap, self.pair_sets, self.world_pairs
        self._listed_key = (ul.rows, ul.ids, *self._world_arrays_key())
        rows = NO_ROWS if ul.rows is None else ul.rows      # (a list without rows: ``_serial_frame``'s record)
        self._listed_calls = {}
        self._listed_last = _NO_LISTED_CALL
        make = kframe.listed_state_py if numba.config.DISABLE_JIT else kframe.listed_state
        self._listed = make(
            ul.ids, ul.handles, rows, self.dims, self._coord_limit32,
            self._coord_limit_bits, self._bmin, self._inv, self._C,
            objects.box, objects.crange, objects.flag, *objects.pair_filters(), objects.id,
            objects.lastpos, sap.n, sap.base, sap.cap, *sap.arrays, self._scratch, self._kscratch, ps.base, ps.cap,
            ps.n, *ps.arrays, self._scratch_ev, SHARDS, wp.slots, wp.keys, wp.cnt, wp.cap, wp.n, self._cell_stamp,
            self._cell_tidx, self._serial_work)

    def _listed_rest(self, t0, upd, boxes, live: int, out) -> Delta | None:
        """A small frame of updates only whose one call (``kernels.frame.frame_listed``, made by ``step``) did
        not end it (``out``, its results: any status but PAIRS_DONE): the bad box's error, the still frame's
        delta, or the general phases from where the call stopped, with its arrays; None when the ids are not
        the list's (nothing done)."""
        (status, row, code, axis, events, swaps, pairs, nt, max_cap, work, ibuf, lbuf, created, deleted) = out
        if status == kframe.LISTED_OTHER:
            return None
        if status == kframe.LISTED_BAD:
            raise_bad_box("update_boxes", self._coord_limit, row, code, axis)
        self.frames += 1
        if status == kframe.LISTED_STILL:
            t1 = time.perf_counter()
            return Delta(_EMPTY_PAIRS.view(), _EMPTY_PAIRS.view(),
                         FrameStats(objects=live, pairs=self.world_pairs.count, validate_s=t1 - t0, total_s=t1 - t0))
        # the general phases go on from where the call stopped, with its arrays
        f = _Frame(t0)
        f.t1 = f.t2 = time.perf_counter()
        f.stats.rasterize_s = f.t2 - t0
        f.rem, f.rem_h, f.upd, f.upd_h, f.add_h = upd[:0], _NO_HANDLES, upd, self.update_list.handles, _NO_HANDLES
        f.nr, f.nu, f.na, f.live = 0, upd.shape[0], 0, live
        with parallel.frame(self._max_threads):     # its parallel launches keep one pin (``parallel.frame``)
            return self._go_on(f, status, events, swaps, pairs, nt, max_cap, work, ibuf, lbuf, created, deleted)

    def _go_on(self, f, status, events, swaps, pairs, nt, max_cap, work, ibuf, lbuf, created, deleted) -> Delta:
        """After a one-call frame stopped (``frame_listed``, ``frame_cells_pairs``; their results): the general
        phases go on from its arrays, room first when it stopped after phase 3 (LISTED_ROOM), else what
        ``frame_pairs``' status leaves."""
        f.touched, f.ent_h, f.ent_off, f.ev_off, f.ev_cap, need, counts = kframe.unpack_room(ibuf, lbuf, nt)
        f.work = work
        if status == kframe.LISTED_ROOM:
            f.room = (need, bool((need > self.sap.cap[f.touched]).any()), max_cap)
            return self._from_room(f)
        f.counts = counts
        f.ev_n, f.ev_plus, f.swaps, f.out_n = counts
        f.ev_key = self._scratch_ev
        f.ev_total, f.swaps_total = events, swaps
        return self._delta(f, *self._pairs_after(f, status, created, deleted, pairs))

    def _listed_call(self, held, upd, boxes, live):
        """``frame_listed`` (``frame_listed_held`` when ``held``) on this frame, through the compiled
        specialization for its arguments' types (``_numba.entry_point``: without the dispatcher's typing of
        the ``ListedState``, ~1.5 us of a 15 us frame). ``upd`` and ``boxes`` come from ``as_ids`` and
        ``as_boxes`` (uint64 [K] and float32 [K, 2*dims], C order), so their flags (read-only, aligned) and
        ``held`` decide the types with the state's: the callables are kept by those, and forgotten with the
        state (``_listed_state``); the first frame of each goes through the dispatcher. The last held one is
        kept with its arrays' flags (``_listed_last``): ``step`` calls it without this call and its
        key's tuple and lookup (~0.15 us of a 5 us frame)."""
        key = (held, upd.flags.num, boxes.flags.num)
        call = self._listed_calls.get(key)
        if call is None:
            fn = kframe.frame_listed_held if held else kframe.frame_listed
            args = (upd, boxes, live, self.frames + 1, self._listed)
            out = fn(*args)
            call = self._listed_calls[key] = entry_point(fn, args) or fn
        else:
            out = call(upd, boxes, live, self.frames + 1, self._listed)
        if held:
            self._listed_last = (call, key[1], key[2])
        return out

    def _validate_ids(self, f, remove_ids, update_ids, update_boxes, add_ids, add_boxes) -> None:
        """Phase 0, ids: every id rule, and the handles of the removes and updates."""
        f.rem = rem = as_ids(remove_ids, "remove_ids")
        f.upd = upd = as_ids(update_ids, "update_ids")
        f.add = add = as_ids(add_ids, "add_ids")
        f.nr, f.nu, f.na = rem.shape[0], upd.shape[0], add.shape[0]
        f.upd_boxes = as_boxes(update_boxes, f.nu, "update_boxes", self.dims, self._coord_limit)
        f.add_boxes = as_boxes(add_boxes, f.na, "add_boxes", self.dims, self._coord_limit)
        objects = self.objects
        f.rem_h = np.empty(f.nr, np.int32) if f.nr else _NO_HANDLES
        if f.nr:
            if parallel.serial(self._max_threads, f.nr):      # a parallel kernel's launch costs a few us
                kid.idmap_find_many(objects.idk, objects.idv, rem, f.rem_h)
            else:
                with parallel.region(self._max_threads, f.nr):
                    kid.idmap_lookup(objects.idk, objects.idv, rem, f.rem_h)
        f.resolved = r = self.update_list.resolve(upd, f.upd_boxes, f.rem_h, objects)
        f.upd_h = r.handles
        # (known == 1 without removes or adds: the updates are the last list's live, distinct objects, or
        # none; there is nothing to check)
        if f.nr or f.na or r.known != 1:
            raise_bad_id(*kid.frame_check_ids(objects.idk, objects.idv, rem, upd, add, f.rem_h, f.upd_h,
                                              objects.flag, r.known), (rem, upd, add))

    def _validate_boxes(self, f, add_category, add_mask, add_static) -> None:
        """Phase 0, boxes and columns. Every update's handle is known: a box equal to the stored one is
        marked (same = 2) and needs no check. The stored boxes are read from the update list's rows where
        it has them (the same list: row by row; else at the positions found along it), else from the
        objects' boxes (every object of the list sent again with its box, ``still``: no box to check, and
        the marks are read only by the phases after the early return of an unchanged frame). A big frame
        compared by rows is compared only when a sample of its rows finds an unchanged box
        (``kval.SAMPLE_ROWS``): else every update is taken as moved and its box is checked."""
        r, rows = f.resolved, self.update_list.rows
        rows = NO_ROWS if rows is None else rows
        f.moving = 0                  # updates whose box changes
        if r.still:
            f.same = np.full(f.nu, 2, np.uint8) if f.nr or f.na else _NO_SAME
        else:
            f.same = np.empty(f.nu, np.uint8)
        if f.nu and not r.still:
            by_row = r.listed and self.update_list.rows is not None
            args = (f.upd_boxes, self.dims, self._coord_limit32, self.objects.box, f.upd_h, f.same, rows,
                    r.row_of if rows.shape[0] else NO_ROW_OF, by_row)
            serial = parallel.serial(self._max_threads, f.nu)
            # the boxes compared with the list's rows and checked by whole words where the rows are at hand:
            # (unchanged, every box valid); the general check names the first bad box, if any
            words = None
            if by_row and rows.shape[0] == f.nu:
                # the same list as the last frame's (``kval.rows_check``)
                rargs = (f.upd_boxes, rows, f.same, self._coord_limit_bits, self.dims)
                if serial:
                    words = kval.rows_check_serial(*rargs)
                else:
                    with parallel.region(self._max_threads, f.nu):
                        words = kval.rows_check(*rargs, self._max_threads)
            elif rows.shape[0] and r.row_of.shape[0] and not serial:
                # at other positions of the last list (``kval.rows_of_check``)
                with parallel.region(self._max_threads, f.nu):
                    words = kval.rows_of_check(f.upd_boxes, rows, r.row_of, self.objects.box, f.upd_h, f.same,
                                               self._coord_limit_bits, self.dims, self._max_threads)
            if words is not None:
                (unchanged, ok), row, code, axis = words, -1, 0, 0
                if not ok:
                    row, code, axis, unchanged = kval.boxes_check_serial(*args)
            elif serial:
                row, code, axis, unchanged = kval.boxes_check_serial(*args)
            else:
                with parallel.region(self._max_threads, f.nu):
                    row, code, axis, unchanged = kval.boxes_check(*args)
            raise_bad_box("update_boxes", self._coord_limit, row, code, axis)
            f.moving = f.nu - unchanged
        if f.na:
            args = (f.add_boxes, self.dims, self._coord_limit32, self.objects.box, _NO_HANDLES, _NO_SAME, NO_ROWS,
                    NO_ROW_OF, False)
            if parallel.serial(self._max_threads, f.na):
                row, code, axis, _ = kval.boxes_check_serial(*args)
            else:
                with parallel.region(self._max_threads, f.na):
                    row, code, axis, _ = kval.boxes_check(*args)
            raise_bad_box("add_boxes", self._coord_limit, row, code, axis)
        f.add_cat = check_column(add_category, f.na, "add_category", np.uint32, 0xFFFFFFFF)
        f.add_msk = check_column(add_mask, f.na, "add_mask", np.uint32, 0xFFFFFFFF)
        f.add_static = check_column(add_static, f.na, "add_static", np.uint8, 0)
        f.live = live = self.objects.count
        if live - f.nr + f.na > self.config.max_objects:
            raise CapacityError("add_ids", f"the world would hold {live - f.nr + f.na} objects, "
                                           f"more than its limit of {self.config.max_objects}")

    def _unchanged(self, f) -> Delta:
        """Nothing in the frame, or only updates that keep their boxes (and nothing invalid)."""
        self.frames += 1
        self.update_list.remember(f.upd, f.upd_h, f.upd_boxes, f.resolved.lookups, f.nr, f.add, _NO_HANDLES,
                                  f.add_boxes, False, self.objects)
        t1 = time.perf_counter()
        return Delta(_EMPTY_PAIRS.view(), _EMPTY_PAIRS.view(),
                     FrameStats(objects=f.live, pairs=self.world_pairs.count, validate_s=t1 - f.t0, total_s=t1 - f.t0))

    def _admit(self, f) -> None:
        """Phase 1: handles of the new objects (handles freed by this frame are released in phase 8)."""
        f.t1 = time.perf_counter()
        f.stats.validate_s = f.t1 - f.t0
        self.frames += 1
        objects = self.objects
        fresh = objects.next_handle
        f.add_h = objects.reserve(f.na)
        if f.na > 1:      # neighbours in space get neighbouring handles (see kgrid.spatial_order)
            kgrid.spatial_order(self.dims, self._bmin, self._inv, self._C, f.add_boxes, f.add_h, objects.crange,
                                fresh)
        if f.na:
            objects.admit(f.add, f.add_h, f.add_cat, f.add_msk, f.add_static)
        f.old_rows = self.update_list.rows          # the last list's boxes by row (``_rasterize``), or None
        f.list_rows, f.row_mode = self.update_list.remember(f.upd, f.upd_h, f.upd_boxes, f.resolved.lookups, f.nr,
                                                            f.add, f.add_h, f.add_boxes, True, objects)

    def _serial_frame(self, f) -> Delta:
        """Phases 2-8 of a frame whose phase 2 runs on the calling thread: phases 2-7 in one call
        (``kernels.frame.frame_cells_pairs``: ranges, touched cells and their sizes, then the cells' SAPs,
        netting, merge and the delta's id pairs), all of it in ``apply_s``; where the call stops (a cell,
        the event buffer or the workspace without room, work for the parallel phases, an overflowed event
        slice, a pair set or the pair table without room) the general phases go on from its arrays."""
        # the world's arrays in its record (its update list is not read here)
        if not all(map(operator.is_, self._listed_key[2:], self._world_arrays_key())):
            self._listed_state()
        wp = self.world_pairs
        (status, events, swaps, pairs, nt, max_cap, work, ibuf, lbuf, created,
         deleted) = kframe.frame_cells_pairs(
            f.upd_h, f.upd_boxes, f.add_h, f.add_boxes, f.same, f.list_rows, f.row_mode, f.rem_h, f.moving, f.live,
            self.frames, self._serial_cell_work, self._listed)
        f.t2 = time.perf_counter()
        if status == kframe.PAIRS_DONE:
            if pairs >= 0:
                wp.count = pairs
            f.flags_cleared = True
            f.nt, f.swaps_total = nt, swaps
            f.t4 = f.t2
            f.stats.apply_s = f.t2 - f.t1
            return self._delta(f, _EMPTY_PAIRS if created is None else created,
                               _EMPTY_PAIRS if deleted is None else deleted)
        if status == kframe.LISTED_ROOM:
            f.stats.rasterize_s = f.t2 - f.t1       # phases 2-3
        else:
            f.t2 = f.t1                             # phases 2-7's time is the apply's
        return self._go_on(f, status, events, swaps, pairs, nt, max_cap, work, ibuf, lbuf, created, deleted)

    def _rasterize(self, f) -> None:
        """Phase 2 of a frame whose ranges run in parallel: cell ranges, boxes and flags (parallel); the
        touched cells and their entries (serial)."""
        objects = self.objects
        newr = np.empty((f.upd_h.shape[0] + f.na, 6), np.int32)
        # most of the world's boxes move: the cells take every staying box as moved (a box that did not move
        # gets its own values again), so the flags of the ones that keep their cells are not written
        f.all_moved = f.moving > 0 and 8 * f.moving >= 7 * f.live
        mark = not f.all_moved
        with parallel.region(self._max_threads, f.moving + f.na):
            if f.row_mode == 1 and f.na == 0 and f.list_rows.shape[0] == f.upd_h.shape[0]:
                kgrid.grid_ranges_listed(self.dims, self._bmin, self._inv, self._C, objects.box, objects.crange,
                                         objects.flag, f.upd_h, f.upd_boxes, newr, f.same, f.list_rows,
                                         self._max_threads, mark)
            else:
                old_rows = NO_ROWS if f.old_rows is None else f.old_rows
                kgrid.grid_ranges(self.dims, self._bmin, self._inv, self._C, objects.box, objects.crange,
                                  objects.flag, f.upd_h, f.upd_boxes, f.add_h, f.add_boxes, newr, f.same, f.list_rows,
                                  f.row_mode, objects.lastpos, mark, old_rows, f.resolved.row_of, self._max_threads)
        # when most objects move, every occupied cell is touched: cheaper than touching cell by cell
        dense = 2 * (f.moving + f.nr) >= f.live
        f.touched, f.ent_off, f.ent_h = kgrid.grid_rasterize(
            self._C, objects.crange, objects.flag, self.sap.n, f.rem_h, f.upd_h, f.add_h, newr, f.same, dense,
            self._cell_stamp, self._cell_tidx, self.frames)
        f.t2 = time.perf_counter()
        f.stats.rasterize_s = f.t2 - f.t1

    def _make_room(self, f) -> None:
        """Phase 3: room in the SAP arena for the touched cells, and event slices for their pair events."""
        sap, touched = self.sap, f.touched
        if f.room is None:
            room, grow, f.ev_off, f.ev_cap, max_cap, f.work = karena.frame_room(touched, f.ent_off, sap.n, sap.cap,
                                                                                self.pair_sets.n)
        else:
            room, grow, max_cap = f.room
        if grow:
            cells, caps, max_cap = karena.cells_growth(touched, room, sap.cap)
            sap.place(cells, caps)
        need = int(f.ev_off[-1])
        if need > self._scratch_ev.shape[0] or self._scratch_ev.shape[0] > 8 * max(need, 1 << 16):
            # grow, or give back a buffer left far too big by a burst (e.g. the initial batch insert)
            self._scratch_ev = np.empty(need + need // 2, np.uint64)
        # per touched cell, written by cells_apply for every cell: events, "pair added" events, swaps; and
        # the netted events (cells_net)
        f.counts = np.empty((4, touched.shape[0]), np.int64)
        f.ev_n, f.ev_plus, f.swaps, f.out_n = f.counts
        if self._scratch.shape[2] < max_cap + 1:     # per-thread workspace of cells_apply, kept between frames
            nth = numba.config.NUMBA_NUM_THREADS
            self._scratch = np.empty((nth, 3, max_cap + 1 + max_cap // 4), np.int32)
            self._kscratch = np.empty((nth, self._scratch.shape[2] * 2), np.uint64)

    def _recompute_overflows(self, f) -> None:
        """Phase 5: the cells whose event slice overflowed get their events recomputed exactly."""
        over = f.ev_n > f.ev_cap
        if over.any():
            objects, sap, ps = self.objects, self.sap, self.pair_sets
            bx_h, bx_pos, ep_key = sap.arrays
            f.stats.cell_overflows = int(over.sum())
            f.ev_key, f.ev_off, f.ev_n = karena.cells_recompute_events(
                f.touched, over, self.dims, *objects.pair_filters(), sap.n, sap.base, bx_h, bx_pos,
                ep_key, ps.base, ps.cap, ps.n, *ps.arrays[:2], f.ev_key, f.ev_off, f.ev_n)
            f.ev_plus = f.ev_n

    def _pairs_serial(self, f) -> tuple[np.ndarray, np.ndarray]:
        """Phases 4-7 of a frame that runs on the calling thread, in one call (``kernels.frame``), which
        also clears the frame's flags; the phases it leaves (an overflowed event slice, a pair set or the
        world's pair table without room) are done the general way. Returns the delta's id pairs."""
        objects, sap, ps, wp = self.objects, self.sap, self.pair_sets, self.world_pairs
        f.ev_key = self._scratch_ev
        status, f.ev_total, f.swaps_total, created, deleted, pairs = kframe.frame_pairs(
            f.touched, f.ent_off, f.ent_h, self.dims, self._C, objects.flag, objects.crange,
            objects.box.view(np.uint32), *objects.pair_filters(), sap.n, sap.base, *sap.arrays,
            self._scratch, self._kscratch, ps.base, ps.cap, ps.n, *ps.arrays, f.ev_key, f.ev_off, f.ev_cap, f.counts,
            SHARDS, wp.slots, wp.keys, wp.cnt, wp.cap, wp.n, objects.id, f.rem_h, f.upd_h, f.add_h)
        return self._pairs_after(f, status, created, deleted, pairs)

    def _pairs_parallel(self, f) -> tuple[np.ndarray, np.ndarray]:
        """Phases 4-7 of a frame whose cells' SAPs run in parallel, in one call (``kernels.frame.pairs_parallel``)
        up to the created and deleted pairs' keys; the phases it leaves are done the general way, as after
        ``frame_pairs``. Returns the delta's id pairs."""
        objects, sap, ps, wp = self.objects, self.sap, self.pair_sets, self.world_pairs
        f.ev_key = self._scratch_ev
        with parallel.region(self._max_threads, f.work, parallel.MIN_CELL_WORK):
            status, f.ev_total, f.swaps_total, created, deleted, pairs = kframe.pairs_parallel(
                f.touched, f.ent_off, f.ent_h, self.dims, self._C, objects.flag, objects.crange,
                objects.box.view(np.uint32), *objects.pair_filters(), sap.n, sap.base, *sap.arrays,
                self._scratch, self._kscratch, ps.base, ps.cap, ps.n, *ps.arrays, f.ev_key, f.ev_off, f.ev_cap,
                f.counts, f.all_moved, parallel.MIN_EVENTS, self._max_threads, SHARDS, wp.slots, wp.keys, wp.cnt,
                wp.cap, wp.n)
        if status == kframe.PAIRS_NET:      # pair sets to grow first, then phases 6-7 in one call as well
            self._grow_pair_sets(f)
            with parallel.region(self._max_threads, f.ev_total, parallel.MIN_EVENTS):
                status, created, deleted, pairs = kframe.net_merge(
                    f.touched, f.ev_key, f.ev_off, f.ev_n, f.out_n, f.ev_total, ps.base, ps.cap, ps.n, *ps.arrays,
                    parallel.MIN_EVENTS, self._max_threads, SHARDS, wp.slots, wp.keys, wp.cnt, wp.cap, wp.n)
        return self._pairs_after(f, status, created, deleted, pairs, keys=True)

    def _pairs_after(self, f, status, created, deleted, pairs, keys=False) -> tuple[np.ndarray, np.ndarray]:
        """After ``frame_pairs`` (the frame's flags cleared), or ``pairs_parallel`` (``keys``: created and
        deleted are the pairs' keys, the flags left set): the phases its status leaves, if any."""
        wp = self.world_pairs
        f.flags_cleared = not keys
        if status == kframe.PAIRS_DONE:
            if pairs >= 0:
                wp.count = pairs
            f.t4 = time.perf_counter()
            f.stats.apply_s = f.t4 - f.t2
            return self._id_pairs(created, deleted) if keys else (created, deleted)
        if status == kframe.PAIRS_OVERFLOW:
            self._recompute_overflows(f)
            f.ev_total = int(f.ev_n.sum())
        if status != kframe.PAIRS_MERGE:
            return self._net_and_merge(f)
        f.t4 = time.perf_counter()
        f.stats.apply_s = f.t4 - f.t2
        return self._merge(f)

    def _net_and_merge(self, f) -> tuple[np.ndarray, np.ndarray]:
        """Phases 6 and 7, or nothing when no touched cell has a pair event. Returns the delta's id pairs."""
        if f.ev_total:
            self._net_pair_sets(f)
            return self._merge(f)
        f.t4 = time.perf_counter()
        f.stats.apply_s = f.t4 - f.t2
        return _EMPTY_PAIRS, _EMPTY_PAIRS

    def _net_pair_sets(self, f) -> None:
        """Phase 6: room in the touched cells' pair sets (load factor <= 1/2), then each nets its events."""
        self._grow_pair_sets(f)
        ps, touched = self.pair_sets, f.touched
        args = (touched, f.ev_key, f.ev_off, f.ev_n, ps.base, ps.cap, ps.n, *ps.arrays, f.out_n)
        if parallel.serial(self._max_threads, f.ev_total, parallel.MIN_EVENTS):
            kmerge.cells_net_serial(*args)
        else:
            with parallel.region(self._max_threads, f.ev_total, parallel.MIN_EVENTS):
                kmerge.cells_net(*args)
        f.t4 = time.perf_counter()
        f.stats.apply_s = f.t4 - f.t2

    def _grow_pair_sets(self, f) -> None:
        """Room in the touched cells' pair sets for their "pair added" events (load factor <= 1/2)."""
        cells, caps = kmerge.pair_sets_growth(f.touched, f.ev_plus, self.pair_sets.n, self.pair_sets.cap)
        if cells.shape[0]:
            self.pair_sets.place(cells, caps)

    def _merge(self, f) -> tuple[np.ndarray, np.ndarray]:
        """Phase 7: the cells' netted pairs into the world's pair counts; the delta's id pairs."""
        return self._id_pairs(*self.world_pairs.merge(f.ev_key, f.ev_off, f.out_n, self._max_threads, f.ev_total))

    def _id_pairs(self, created, deleted) -> tuple[np.ndarray, np.ndarray]:
        """The keys of the pairs created and deleted -> the delta's sorted id pairs."""
        kc, kd = created.shape[0], deleted.shape[0]
        if min(kc, kd) >= RADIX_SORT_MIN and not parallel.serial(self._max_threads, kc + kd, parallel.MIN_EVENTS):
            # both large: their id rows are sorted side by side
            out_c, out_d = np.empty((kc, 2), np.uint64), np.empty((kd, 2), np.uint64)
            with parallel.region(self._max_threads, kc + kd, parallel.MIN_EVENTS):
                if kmerge.id_pairs_both(created, deleted, self.objects.id, out_c, out_d):
                    return out_c, out_d
        return self._keys_to_id_pairs(created), self._keys_to_id_pairs(deleted)

    def _finish(self, f) -> None:
        """Phase 8: release removed objects, clear the frame's flags, the frame's figures."""
        self.objects.release(f.rem, f.rem_h)
        if not f.flags_cleared:
            self.objects.clear_flags(f.rem_h, f.upd_h, f.add_h)
        t5 = time.perf_counter()
        s = f.stats
        s.merge_s, s.total_s = t5 - f.t4, t5 - f.t0
        s.objects, s.pairs = self.objects.count, self.world_pairs.count
        s.swaps = int(f.swaps.sum()) if f.swaps_total is None else f.swaps_total
        s.cells_touched = f.touched.shape[0] if f.nt is None else f.nt

    def _keys_to_id_pairs(self, keys):
        """Handle-pair keys -> sorted uint64 [K, 2] rows of (low id, high id)."""
        k = keys.shape[0]
        if k == 0:
            return _EMPTY_PAIRS.copy()
        lo = np.empty(k, np.uint64)
        hi = np.empty(k, np.uint64)
        if kmerge.keys_to_ids(keys, self.objects.id, lo, hi, k >= RADIX_SORT_MIN):
            out = np.empty((k, 2), np.uint64)
            if k >= RADIX_SORT_MIN:
                kmerge.id_pairs_sorted(lo, hi, out)
                return out
            packed = np.sort((lo << _S32) | hi)
            np.right_shift(packed, _S32, out=out[:, 0])
            np.bitwise_and(packed, _LO32, out=out[:, 1])
            return out
        order = np.lexsort((hi, lo))
        return np.stack([lo[order], hi[order]], axis=1)

    # ------------------------------------------------------------------ queries
    @property
    def object_count(self) -> int:
        return self.objects.count

    @property
    def pair_count(self) -> int:
        return self.world_pairs.count

    def pairs(self) -> np.ndarray:
        """All active pairs: uint64 [P, 2] rows (low id, high id), sorted."""
        return self._keys_to_id_pairs(self.world_pairs.all_keys())

    def query(self, region) -> np.ndarray:
        """Sorted ids (uint64) of the live boxes intersecting ``region`` (2*dims floats, inclusive)."""
        r = np.asarray(region, np.float64).reshape(-1)
        if r.shape[0] != 2 * self.dims or not np.isfinite(r).all() or (r[:self.dims] > r[self.dims:]).any():
            raise FrameError("region", -1, f"must be {2 * self.dims} finite values, mins <= maxs")
        return self.objects.query(r.astype(np.float32))

    def ids(self) -> np.ndarray:
        """uint64 live ids, sorted."""
        return self.objects.live_ids()

    def boxes(self, ids) -> np.ndarray:
        """float32 [K, 2*dims] boxes of live ids (FrameError naming the first unknown id)."""
        return self.objects.box[self.objects.handles(ids)].copy()

    def filters(self, ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(category uint32 [K], mask uint32 [K], static bool [K]) of live ids (FrameError naming the first
        unknown id): with ``ids()`` and ``boxes()``, everything needed to build the world again."""
        h = self.objects.handles(ids)
        o = self.objects
        return o.cat[h].copy(), o.mask[h].copy(), o.static[h].astype(bool)

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every live object, in one pass and in the engine's own order (not sorted): copies of (ids uint64 [K],
        boxes float32 [K, 2*dims], category uint32 [K], mask uint32 [K], static bool [K]). What a snapshot
        holds: a world made by adding them in one step has the same pairs."""
        o = self.objects
        live = np.flatnonzero(o.alive[:o.next_handle])
        return o.id[live], o.box[live], o.cat[live], o.mask[live], o.static[live].astype(bool)

    def cell_occupancy(self) -> np.ndarray:
        return self.sap.n.astype(np.int64)

    def memory_bytes(self) -> int:
        """Bytes held by the world's arrays (objects, id map, arenas, pair sets, workspaces)."""
        return (self.objects.nbytes() + self.sap.nbytes() + self.pair_sets.nbytes() + self.world_pairs.nbytes()
                + self.update_list.nbytes() + self._cell_stamp.nbytes + self._cell_tidx.nbytes
                + self._scratch_ev.nbytes + self._scratch.nbytes + self._kscratch.nbytes)

    # ------------------------------------------------------------------ invariants
    def validate(self) -> None:
        """Check every internal invariant; raise AssertionError on the first one broken (tests only).
        See ``sapcore.invariants.check_world``."""
        check_world(self)
