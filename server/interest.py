"""Region-filtered subscriptions (interest management), as pure numpy functions.

A subscriber with a region sees the active pairs that have at least one object whose box
intersects the region (inclusive test, the same as QueryRegion). Per frame, the view's change is
computed from the frame's delta and the objects that moved into or out of the region:

    candidates = (view_before - deleted) | created | pairs touching objects whose status changed
    view_after = candidates filtered by the objects inside the region after the frame

Every pair of the world after the frame that touches the region is a candidate: it was created
this frame, or it existed before and touched the region before (so it is in view_before) or
touches an object that just entered. Every candidate is a pair of the world after the frame.
So entering = view_after - view_before and leaving = view_before - view_after, with no pass over
the world's pairs. Pairs are (n, 2) uint64 arrays with a < b in each row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAIR_DTYPE = np.dtype([("a", "<u8"), ("b", "<u8")])
_EMPTY_IDS = np.zeros(0, dtype=np.uint64)


def _rows(pairs) -> np.ndarray:
    """(n, 2) uint64 pairs as a 1-D structured array (one element per pair) for set operations."""
    p = np.ascontiguousarray(np.asarray(pairs, dtype=np.uint64).reshape(-1, 2))
    return p.view(PAIR_DTYPE).reshape(-1)


def _pairs(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows).view(np.uint64).reshape(-1, 2)


def validate_region(region, dims: int) -> np.ndarray:
    """The region as float64 [mins..., maxs...]; ValueError if its shape or values are wrong."""
    r = np.asarray(region, dtype=np.float64).reshape(-1)
    if r.size != 2 * dims:
        raise ValueError(f"region needs 2*dims = {2 * dims} values (mins then maxs), got {r.size}")
    if not np.all(np.isfinite(r)):
        raise ValueError("region values must be finite")
    if np.any(r[:dims] > r[dims:]):
        raise ValueError("region mins must not exceed its maxs")
    return r


def ids_in_region(ids, boxes, region) -> np.ndarray:
    """Sorted ids whose box (n, 2*dims: mins then maxs) intersects the region (inclusive)."""
    ids = np.asarray(ids, dtype=np.uint64).reshape(-1)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(ids.size, -1)
    dims = boxes.shape[1] // 2
    r = np.asarray(region, dtype=np.float64)
    hit = np.all(boxes[:, :dims] <= r[dims:], axis=1) & np.all(boxes[:, dims:] >= r[:dims], axis=1)
    return np.sort(ids[hit])


def filter_pairs(pairs, inside) -> np.ndarray:
    """The pairs with at least one id in the sorted array `inside`."""
    p = np.asarray(pairs, dtype=np.uint64).reshape(-1, 2)
    if p.size == 0 or len(inside) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    keep = np.isin(p[:, 0], inside, assume_unique=False) | np.isin(p[:, 1], inside)
    return p[keep]


def changed_ids(inside_before, inside_after) -> np.ndarray:
    """Ids that entered or left the region (symmetric difference of two sorted id arrays)."""
    return np.setxor1d(np.asarray(inside_before, dtype=np.uint64), np.asarray(inside_after, dtype=np.uint64))


@dataclass
class ViewDelta:
    entering: np.ndarray  # (n, 2) uint64 pairs that entered the view, sorted
    leaving: np.ndarray   # (m, 2) uint64 pairs that left the view, sorted
    view: np.ndarray      # (k, 2) uint64 the view after the frame, sorted


def _codec(*pairs_arrays):
    """Row keys for set operations on pairs: one uint64 (high << 32 | low) when every id fits in 32
    bits (sorts as fast as integers), else a structured row (any uint64 ids)."""
    top = max((int(p.max()) for p in pairs_arrays if p.size), default=0)
    if top < 1 << 32:
        def enc(p):
            return (p[:, 0] << np.uint64(32)) | p[:, 1]

        def dec(k):
            return np.stack([k >> np.uint64(32), k & np.uint64(0xFFFFFFFF)], axis=1)
        return enc, dec
    return _rows, _pairs


def view_step(view_before, inside_after, created, deleted, touching_changed) -> ViewDelta:
    """One frame of a region view.

    view_before: the view's pairs before the frame. inside_after: sorted ids inside the region
    after the frame. created/deleted: the frame's delta. touching_changed: the world's pairs after
    the frame that involve an id which entered or left the region this frame (a superset is fine
    as long as each row is a pair of the world after the frame).
    """
    arrays = [np.asarray(p, dtype=np.uint64).reshape(-1, 2) for p in (view_before, created, deleted, touching_changed)]
    enc, dec = _codec(*arrays)
    before_p, created_p, deleted_p, touching_p = arrays
    before = np.unique(enc(before_p))
    dead = enc(deleted_p)
    kept = before[~np.isin(before, dead)] if dead.size else before
    cand = np.unique(np.concatenate([kept, enc(created_p), enc(touching_p)]))
    cand_p = dec(cand)
    keep = np.isin(cand_p[:, 0], inside_after) | np.isin(cand_p[:, 1], inside_after)
    after = cand[keep]  # still sorted and unique
    entering = after[~np.isin(after, before, assume_unique=True)]
    leaving = before[~np.isin(before, after, assume_unique=True)]
    return ViewDelta(dec(entering).reshape(-1, 2), dec(leaving).reshape(-1, 2), dec(after).reshape(-1, 2))


@dataclass
class RegionDelta:
    """A region subscriber's delta, shaped like the engine's Delta: created = entering the view,
    deleted = leaving it; stats are the frame's (the whole world's)."""

    created: np.ndarray
    deleted: np.ndarray
    stats: object


class RegionView:
    """One subscriber's view: the ids inside its region and the view's pairs, stepped per frame."""

    def __init__(self, region, dims: int):
        self.dims = dims
        self.region = validate_region(region, dims)
        self.inside = _EMPTY_IDS
        self.view = np.zeros((0, 2), dtype=np.uint64)
        self.started = False

    def start(self, ids, boxes, pairs) -> np.ndarray:
        """Initial state from the world's objects and pairs; returns the view (all entering)."""
        self.inside = ids_in_region(ids, boxes, self.region)
        self.view = _pairs(np.unique(_rows(filter_pairs(pairs, self.inside))))
        return self.view

    def step(self, inside_after, created, deleted, pairs_of) -> ViewDelta:
        """Advance one frame. pairs_of(ids) returns the world's pairs (after the frame) touching ids."""
        inside_after = np.sort(np.asarray(inside_after, dtype=np.uint64))
        moved = changed_ids(self.inside, inside_after)
        touching = pairs_of(moved) if moved.size else np.zeros((0, 2), dtype=np.uint64)
        d = view_step(self.view, inside_after, created, deleted, touching)
        self.inside, self.view = inside_after, d.view
        return d

    def frame(self, inside_after, created, deleted, world_pairs) -> tuple[np.ndarray, np.ndarray]:
        """(entering, leaving) pairs of one frame, in the world's turn right after it was applied.

        world_pairs() returns all the world's pairs; it is called only on the first frame (the whole
        view enters) and when some object entered or left the region.
        """
        inside_after = np.sort(np.asarray(inside_after, dtype=np.uint64))
        if not self.started:
            self.started = True
            self.inside = inside_after
            self.view = _pairs(np.unique(_rows(filter_pairs(world_pairs(), inside_after))))
            return self.view, np.zeros((0, 2), dtype=np.uint64)
        d = self.step(inside_after, created, deleted, lambda moved: filter_pairs(world_pairs(), moved))
        return d.entering, d.leaving
