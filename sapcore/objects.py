"""The object store: every object's id, box, filters and grid state by handle, and the id map.

Handles are dense int32 indices; a removed object's handle is reused by a later frame (never by the
frame that freed it). The id map (kernels/idmap.py) takes a client id to its handle.
"""
from __future__ import annotations

import numpy as np

from .errors import FrameError
from .frame_input import as_ids
from .kernels import arena as karena
from .kernels import idmap as kid
from .kernels.hashing import capacity_for

_NO_HANDLES = np.zeros(0, np.int32)     # shared: nothing can be written into it
_NO_FILTERS = (np.zeros(0, np.uint32), np.zeros(0, np.uint32), np.zeros(0, np.uint8))   # (see ``pair_filters``)


class ObjectStore:
    """Objects by handle (see the module docstring). Arrays, all indexed by handle:

    id uint64, box float32 [2*dims] (mins then maxs), cat / mask uint32, static / alive uint8,
    flag uint8 (what the current frame does to it; zero between frames), crange int16 [6] (its cell
    range: first cell and extent per axis), lastpos int32 (its position on the update list).

    ``filtered``: some object ever admitted had a category or mask other than all bits, or was static
    (never unset: until then every live object has the default filters, and every pair is allowed).
    """

    def __init__(self, dims: int, capacity: int = 64):
        self.dims = dims
        self.filtered = False
        self.next_handle = 0                      # handles [0, next_handle) were ever used
        self.free = np.zeros(0, np.int32)         # released handles, oldest first
        self._alloc(capacity)
        self.idk = np.zeros(16, np.uint64)        # id map: keys
        self.idv = np.full(16, -1, np.int32)      # id map: handles (-1: empty slot)

    def _alloc(self, cap: int) -> None:
        d2 = 2 * self.dims
        new = dict(id=np.zeros(cap, np.uint64), box=np.zeros((cap, d2), np.float32),
                   cat=np.full(cap, 0xFFFFFFFF, np.uint32), mask=np.full(cap, 0xFFFFFFFF, np.uint32),
                   static=np.zeros(cap, np.uint8), alive=np.zeros(cap, np.uint8), flag=np.zeros(cap, np.uint8),
                   crange=np.zeros((cap, 6), np.int16), lastpos=np.zeros(cap, np.int32))
        for name, a in new.items():
            old = getattr(self, name, None)
            if old is not None:
                a[:old.shape[0]] = old
            setattr(self, name, a)

    @property
    def count(self) -> int:
        return self.next_handle - self.free.shape[0]

    def reserve(self, k: int) -> np.ndarray:
        """Handles for k new objects: reuse free slots (oldest first), then fresh ones."""
        if k == 0:
            return _NO_HANDLES
        take = min(k, self.free.shape[0])
        h = np.empty(k, np.int32)
        h[:take] = self.free[:take]
        self.free = self.free[take:]
        fresh = k - take
        if fresh:
            start = self.next_handle
            if start + fresh > self.id.shape[0]:
                self._alloc(max(2 * self.id.shape[0], start + fresh))
            h[take:] = np.arange(start, start + fresh, dtype=np.int32)
            self.next_handle += fresh
        return h

    def admit(self, ids, handles, cat, mask, static) -> None:
        """New objects at ``handles`` (reserved: counted already; their boxes and cell ranges are written
        by the rasterize pass)."""
        cap = capacity_for(self.count)
        if cap > self.idk.shape[0]:
            keys, vals = np.zeros(cap, np.uint64), np.full(cap, -1, np.int32)
            kid.idmap_rebuild(self.idk, self.idv, keys, vals)
            self.idk, self.idv = keys, vals
        if kid.objects_admit(self.idk, self.idv, ids, handles, cat, mask, static, self.id, self.cat, self.mask,
                             self.static, self.alive):
            self.filtered = True

    def pair_filters(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cat, mask, static) for the kernels' pair filter (``kernels.sap_cell.pair_allowed``): the arrays,
        or three empty ones while no object has filters of its own (every pair allowed, nothing read)."""
        if self.filtered:
            return self.cat, self.mask, self.static
        return _NO_FILTERS

    def release(self, ids, handles) -> None:
        """Removed objects: out of the id map, their handles free for later frames."""
        if handles.shape[0]:
            kid.objects_release(self.idk, self.idv, ids, handles, self.alive)
            self.free = np.concatenate([self.free, handles])

    def clear_flags(self, *handle_lists) -> None:
        """Zero the frame flags of the frame's objects (all at once when they are many)."""
        if 8 * sum(h.shape[0] for h in handle_lists) > self.next_handle:
            self.flag[:self.next_handle] = 0
        else:
            for h in handle_lists:
                self.flag[h] = 0

    # ---- reads -----------------------------------------------------------------------------------
    def handles(self, ids) -> np.ndarray:
        """Handles of live ids (FrameError naming the first unknown one)."""
        ids = as_ids(ids, "ids")
        h = np.empty(ids.shape[0], np.int32)
        first = kid.idmap_find_many(self.idk, self.idv, ids, h)
        if first >= 0:
            raise FrameError("ids", int(first), f"unknown id {ids[first]}")
        return h

    def live_ids(self) -> np.ndarray:
        n = self.next_handle
        return np.sort(self.id[:n][self.alive[:n] != 0])

    def query(self, region32: np.ndarray) -> np.ndarray:
        """Sorted ids of the live boxes intersecting a float32 region (inclusive)."""
        out = np.empty(self.next_handle, np.int32)
        k = karena.objects_query(self.box, self.alive[:self.next_handle], self.dims, region32, out)
        return np.sort(self.id[out[:k]])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in vars(self).values() if isinstance(a, np.ndarray))

    def check(self) -> None:
        """Live count, no flag left set, the id map takes every live id to its handle."""
        hmax = self.next_handle
        alive = np.flatnonzero(self.alive[:hmax])
        assert alive.shape[0] == self.count, "object count"
        assert not self.flag[:hmax].any(), "frame flags left set"
        assert np.unique(self.free).shape[0] == self.free.shape[0] and not self.alive[self.free].any(), "free list"
        for h in alive:
            assert kid.idmap_find(self.idk, self.idv, self.id[h]) == h, f"id map of handle {h}"
