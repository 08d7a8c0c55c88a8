"""The update-list cache: the last frame's update list guides the next frame.

Clients usually send their updates in the same order every frame (an array of objects, new ones
appended): the next frame's update handles then follow this list, with a hash lookup only for the ids
off it, and the boxes they are compared with are read in the list's order (``rows``: the list's boxes
by row, kept while the list mostly repeats). A frame that sends every object again with its current
box is found still by one pass over its ids and boxes. Kernels: kernels/update_list.py.
"""
from __future__ import annotations

import numpy as np

from .kernels import update_list as kul

_NO_IDS = np.zeros(0, np.uint64)
_NO_HANDLES = np.zeros(0, np.int32)
NO_ROWS = np.zeros((0, 6), np.float32)
NO_ROW_OF = np.zeros(0, np.int64)


def _list_ids(a, b):
    """The ids of an update list, ``a`` then ``b``: uint32 when they all fit (a repeated list is compared
    with it every frame, a memory-bound pass: 4 bytes an id fewer to read), else uint64."""
    out = np.empty(a.shape[0] + b.shape[0], np.uint32)
    if kul.narrow_ids(a, b, out):
        return out
    return np.concatenate([a, b]).astype(np.uint64, copy=False)


class Resolved:
    """A frame's update handles found along the list.

    handles: int32 [U] (-1 unknown); listed: the ids are the list's, in order (handles are the list's,
    shared and read only); still: listed, and every box equal to its row; lookups: ids that needed a
    hash lookup; row_of: each update's position on the list (-1 off it; empty when listed); known: 1 the
    updates are valid and distinct, 2 the removes too, 0 nothing known (``frame_check_ids``)."""

    __slots__ = ("handles", "listed", "still", "lookups", "row_of", "known")

    def __init__(self, handles, listed=False, still=False, lookups=0, row_of=NO_ROW_OF, known=1):
        self.handles, self.listed, self.still = handles, listed, still
        self.lookups, self.row_of, self.known = lookups, row_of, known


class UpdateList:
    """ids (uint32 while they fit, else uint64) and handles of the list; rows: its boxes by row, or None."""

    def __init__(self):
        self.ids, self.handles = _NO_IDS, _NO_HANDLES
        self.rows = None

    def resolve(self, upd, upd_boxes, rem_h, objects) -> Resolved:
        """The update handles of a frame (``objects.lastpos[h]``: h's position on the list)."""
        nu = upd.shape[0]
        if not nu:
            return Resolved(_NO_HANDLES)
        if nu == self.ids.shape[0]:
            if self.rows is not None:        # ids and boxes by row in one pass; still: every box equal
                r = kul.list_repeats(upd, self.ids, upd_boxes.reshape(-1), self.rows.reshape(-1))
                if r != kul.LIST_OTHER:
                    return Resolved(self.handles, listed=True, still=r == kul.LIST_STILL)
            elif np.array_equal(upd, self.ids):
                return Resolved(self.handles, listed=True)
        upd_h = np.empty(nu, np.int32)
        hit = np.zeros(self.ids.shape[0], np.uint8)
        looked = np.empty(nu, np.int64)
        row_of = np.empty(nu, np.int64)
        lookups = kul.idmap_resolve_seq(objects.idk, objects.idv, upd, self.ids, self.handles, objects.lastpos,
                                        upd_h, hit, looked, row_of)
        # the updates taken along the list are distinct: only the removes and the ids off the list need
        # the duplicate check (else the full check names the offending entry)
        known = 2 if kul.ids_distinct_listed(rem_h, upd_h, looked, lookups, hit, self.handles, objects.lastpos,
                                             objects.flag) else 0
        return Resolved(upd_h, lookups=lookups, row_of=row_of, known=known)

    def remember(self, upd, upd_h, upd_boxes, lookups, nr, add, add_h, add_boxes, deferred, objects):
        """Once a frame is valid and its handles are known: its updates in their order, then its new
        objects (clients usually append them to their arrays), guide the next frame. Without updates, the
        list stays unless this frame removed objects (they may be on it); a frame of adds only appends
        them. Every id on the list is live after this frame; ``objects.lastpos[h]`` is h's position on it.

        ``rows`` is kept for a list that mostly follows the last one (else the copy would cost more than
        it saves), and from the second frame of a list that repeats.

        deferred: grid_ranges runs in this frame; the new list's positions and box rows are left to it,
        returned as ``(rows, row_mode)`` (see ``kernels.grid.grid_ranges``)."""
        n_upd, n_add = upd.shape[0], add.shape[0]
        if n_upd:
            if not (lookups or n_upd != self.ids.shape[0] or n_add):
                if self.rows is None:                 # the same list as the last frame's
                    self.rows = np.array(upd_boxes, np.float32)
                    return NO_ROWS, 0
                return self.rows, 1
            keep_rows = 4 * lookups <= n_upd
            self.ids = _list_ids(upd, add)            # a copy: the caller's arrays are not kept
            self.handles = np.concatenate([upd_h, add_h])
            if deferred:
                self.rows = np.empty((n_upd + n_add, upd_boxes.shape[1]), np.float32) if keep_rows else None
                return (NO_ROWS if self.rows is None else self.rows), 2
            self.rows = np.concatenate([upd_boxes, add_boxes]) if keep_rows else None
            kul.set_positions(self.handles, objects.lastpos)
        elif nr:
            self.ids, self.handles, self.rows = _NO_IDS, _NO_HANDLES, None
        elif n_add:
            old = self.ids.shape[0]
            self.ids = _list_ids(self.ids, add)
            self.handles = np.concatenate([self.handles, add_h])
            if self.rows is not None:
                self.rows = np.concatenate([self.rows, add_boxes])
            objects.lastpos[add_h] = np.arange(old, old + n_add, dtype=objects.lastpos.dtype)
        return NO_ROWS, 0

    def nbytes(self) -> int:
        return self.ids.nbytes + self.handles.nbytes + (0 if self.rows is None else self.rows.nbytes)

    def check(self, objects) -> None:
        """Every object on the list is live, at its position, with its current box in ``rows``."""
        h = self.handles
        assert h.shape == self.ids.shape, "update list: ids and handles"
        assert np.all(objects.alive[h] == 1), "update list: an object no longer live"
        assert np.array_equal(objects.id[h], self.ids), "update list: ids of its handles"
        assert np.array_equal(objects.lastpos[h], np.arange(h.shape[0])), "update list: positions"
        if self.rows is not None:
            assert np.array_equal(self.rows, objects.box[h]), "update list: boxes by row"
