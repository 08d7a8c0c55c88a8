"""Brute-force reference of the sapcore World semantics (DESIGN.md "Semantics"), for tests only.

``NaiveWorld`` keeps ``id -> (box, category, mask, static)`` in plain dicts and recomputes every pair
from scratch with an O(n^2) numpy all-pairs test. It is meant to be obviously correct, not fast:

- boxes are stored as float32 (float64 input is rounded like the engine does) and compared as float32;
- two boxes overlap iff on every axis ``a.min <= b.max and b.min <= a.max`` (touching counts);
- a pair exists iff they overlap, ``a.category & b.mask`` and ``b.category & a.mask`` are both non-zero
  and not both objects are static; a pair is ``(low id, high id)``;
- a frame applies removes, then updates, then adds; its delta is the netted difference
  ``created = after - before``, ``deleted = before - after``, each sorted.

It also validates frames (raising ``sapcore.FrameError`` / ``CapacityError`` before changing anything)
so that it can stand in for ``sapcore.World`` when the test harness itself is being checked.
"""
from __future__ import annotations

import numpy as np

from sapcore import CapacityError, Delta, FrameError, FrameStats

ALL_BITS = 0xFFFFFFFF


def pairs_to_array(pairs) -> np.ndarray:
    """Sorted uint64 [K, 2] array of an iterable of (low, high) int pairs."""
    return np.array(sorted(pairs), dtype=np.uint64).reshape(-1, 2)


def array_to_pairs(arr) -> set:
    """Set of (low, high) Python-int tuples of a [K, 2] array."""
    arr = np.asarray(arr, dtype=np.uint64).reshape(-1, 2)
    return set(zip(arr[:, 0].tolist(), arr[:, 1].tolist()))


def brute_force_pairs(ids, boxes, category, mask, static) -> set:
    """All pairs of the given objects by an all-pairs test.

    ids : uint64 [n]; boxes : float32 [n, 2*dims]; category, mask : uint32 [n]; static : bool [n].
    Returns a set of (low id, high id) Python-int tuples.
    """
    n = len(ids)
    if n < 2:
        return set()
    boxes = np.asarray(boxes, dtype=np.float32)
    dims = boxes.shape[1] // 2
    lo, hi = boxes[:, :dims], boxes[:, dims:]
    hit = np.ones((n, n), dtype=bool)
    for axis in range(dims):
        hit &= lo[:, axis][:, None] <= hi[:, axis][None, :]
        hit &= lo[:, axis][None, :] <= hi[:, axis][:, None]
    category = np.asarray(category, dtype=np.uint32)
    mask = np.asarray(mask, dtype=np.uint32)
    hit &= (category[:, None] & mask[None, :]) != 0
    hit &= (category[None, :] & mask[:, None]) != 0
    static = np.asarray(static, dtype=bool)
    hit &= ~(static[:, None] & static[None, :])
    hit &= np.triu(np.ones((n, n), dtype=bool), k=1)
    ia, ib = np.nonzero(hit)
    a, b = ids[ia], ids[ib]
    return set(zip(np.minimum(a, b).tolist(), np.maximum(a, b).tolist()))


def _ids(x, field):
    if x is None:
        return np.zeros(0, dtype=np.uint64)
    a = np.asarray(x)
    if a.ndim != 1:
        raise FrameError(field, -1, f"must be 1-D, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise FrameError(field, -1, f"must be integers, got {a.dtype}")
    return a.astype(np.uint64)


def _boxes(x, field, dims, count):
    if x is None:
        if count:
            raise FrameError(field, -1, f"missing, {count} rows expected")
        return np.zeros((0, 2 * dims), dtype=np.float64)
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 2 * dims:
        raise FrameError(field, -1, f"must have shape [K, {2 * dims}], got {a.shape}")
    if a.shape[0] != count:
        raise FrameError(field, -1, f"has {a.shape[0]} rows, ids have {count}")
    return a


def _per_add(x, field, count, dtype, default):
    if x is None:
        return np.full(count, default, dtype=dtype)
    a = np.asarray(x)
    if a.ndim != 1 or a.shape[0] != count:
        raise FrameError(field, -1, f"must have shape [{count}], got {a.shape}")
    return a.astype(dtype)


class NaiveWorld:
    """Reference world: same ``step``/``pairs``/``query``/``ids``/``boxes`` as ``sapcore.World``."""

    def __init__(self, dims: int, coord_limit: float = 1.0e15, max_objects: int = 1 << 30):
        self.dims = dims
        self.coord_limit = float(coord_limit)
        self.max_objects = int(max_objects)
        self.objects: dict[int, tuple] = {}  # id -> (float32 box, category, mask, static)
        self.frames = 0
        self._pairs: set = set()  # the pairs of self.objects, recomputed from scratch by every step

    @classmethod
    def from_config(cls, cfg) -> "NaiveWorld":
        return cls(cfg.dims, coord_limit=cfg.coord_limit, max_objects=cfg.max_objects)

    # -- frame validation (whole frame, before anything changes) --------------------------------

    def _check_boxes(self, boxes, field):
        d = self.dims
        for i, row in enumerate(boxes.tolist()):
            for j, v in enumerate(row):
                if v != v:
                    raise FrameError(field, i, f"NaN at column {j}")
                if v in (float("inf"), float("-inf")):
                    raise FrameError(field, i, f"infinite value at column {j}")
                if abs(v) > self.coord_limit:
                    raise FrameError(field, i, f"|coordinate| > {self.coord_limit} at column {j}")
            for axis in range(d):
                if row[axis] > row[d + axis]:
                    raise FrameError(field, i, f"min > max on axis {axis}")

    def _check_frame(self, f):
        seen = {}  # id -> field it appeared in
        for field, live_needed in (("remove_ids", True), ("update_ids", True), ("add_ids", False)):
            for i, x in enumerate(f[field].tolist()):
                if x in seen:
                    raise FrameError(field, i, f"id {x} appears twice in the frame (also in {seen[x]})")
                seen[x] = field
                if live_needed and x not in self.objects:
                    raise FrameError(field, i, f"unknown id {x}")
                if not live_needed and x in self.objects:
                    raise FrameError(field, i, f"id {x} is already live")
        self._check_boxes(f["update_boxes"], "update_boxes")
        self._check_boxes(f["add_boxes"], "add_boxes")
        after = len(self.objects) - len(f["remove_ids"]) + len(f["add_ids"])
        if after > self.max_objects:
            raise CapacityError("add_ids", f"{after} objects would exceed max_objects={self.max_objects}")

    def _normalize(self, remove_ids, add_ids, add_boxes, add_category, add_mask, add_static,
                   update_ids, update_boxes):
        f = {"remove_ids": _ids(remove_ids, "remove_ids"), "add_ids": _ids(add_ids, "add_ids"),
             "update_ids": _ids(update_ids, "update_ids")}
        na, nu = len(f["add_ids"]), len(f["update_ids"])
        f["add_boxes"] = _boxes(add_boxes, "add_boxes", self.dims, na)
        f["update_boxes"] = _boxes(update_boxes, "update_boxes", self.dims, nu)
        f["add_category"] = _per_add(add_category, "add_category", na, np.uint32, ALL_BITS)
        f["add_mask"] = _per_add(add_mask, "add_mask", na, np.uint32, ALL_BITS)
        f["add_static"] = _per_add(add_static, "add_static", na, bool, False)
        return f

    # -- the frame -----------------------------------------------------------------------------

    def step(self, remove_ids=None, add_ids=None, add_boxes=None, add_category=None, add_mask=None,
             add_static=None, update_ids=None, update_boxes=None) -> Delta:
        f = self._normalize(remove_ids, add_ids, add_boxes, add_category, add_mask, add_static,
                            update_ids, update_boxes)
        self._check_frame(f)
        before = self._pairs
        for x in f["remove_ids"].tolist():
            del self.objects[x]
        for x, box in zip(f["update_ids"].tolist(), f["update_boxes"].astype(np.float32)):
            _, c, m, s = self.objects[x]
            self.objects[x] = (box.copy(), c, m, s)
        for i, x in enumerate(f["add_ids"].tolist()):
            self.objects[x] = (f["add_boxes"][i].astype(np.float32), int(f["add_category"][i]),
                               int(f["add_mask"][i]), bool(f["add_static"][i]))
        after = self._pairs = brute_force_pairs(*self._columns())
        self.frames += 1
        created, deleted = pairs_to_array(after - before), pairs_to_array(before - after)
        stats = FrameStats(objects=len(self.objects), pairs=len(after), created=len(created), deleted=len(deleted))
        return Delta(created, deleted, stats)

    # -- reads -----------------------------------------------------------------------------------

    def _columns(self):
        keys = sorted(self.objects)
        ids = np.array(keys, dtype=np.uint64)
        boxes = np.array([self.objects[k][0] for k in keys], dtype=np.float32).reshape(-1, 2 * self.dims)
        cat = np.array([self.objects[k][1] for k in keys], dtype=np.uint32)
        mask = np.array([self.objects[k][2] for k in keys], dtype=np.uint32)
        static = np.array([self.objects[k][3] for k in keys], dtype=bool)
        return ids, boxes, cat, mask, static

    def pair_set(self) -> set:
        return set(self._pairs)

    def pairs(self) -> np.ndarray:
        return pairs_to_array(self.pair_set())

    def query(self, region) -> np.ndarray:
        """Sorted uint64 ids of the boxes intersecting ``region`` (inclusive, compared as float32)."""
        d = self.dims
        r = np.asarray(region, dtype=np.float64).astype(np.float32).reshape(2 * d)
        ids, boxes, *_ = self._columns()
        hit = np.ones(len(ids), dtype=bool)
        for axis in range(d):
            hit &= (boxes[:, axis] <= r[d + axis]) & (r[axis] <= boxes[:, d + axis])
        return ids[hit]

    def ids(self) -> np.ndarray:
        return np.array(sorted(self.objects), dtype=np.uint64)

    def boxes(self, ids) -> np.ndarray:
        return np.array([self.objects[int(x)][0] for x in np.asarray(ids, dtype=np.uint64).tolist()],
                        dtype=np.float32).reshape(-1, 2 * self.dims)

    @property
    def object_count(self) -> int:
        return len(self.objects)

    @property
    def pair_count(self) -> int:
        return len(self._pairs)

    def validate(self) -> None:
        """Nothing to check: the oracle has no derived state."""
