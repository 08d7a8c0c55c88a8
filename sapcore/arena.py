"""One generic arena: a region of shared arrays per grid cell, used by the cells' SAPs (box units) and
by their pair sets (hash slots).

A cell's region is ``cap`` units at ``base`` (plus ``pad`` units of its own, e.g. a sentinel); ``n`` of
them are in use. A region that must grow moves to the top of the arena (``place``), leaving garbage
behind; the arena is compacted (every region laid out again, densely, in fresh arrays) when the garbage
exceeds a quarter of what is live and ``COMPACT_MIN_UNITS``, and its arrays grow by 25% when the top
reaches their end. Moving a region is the owner's kernel (``move``), which also updates base and cap.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .kernels import arena as karena

COMPACT_MIN_UNITS = 1 << 16


@dataclass(frozen=True)
class Field:
    """One array of an arena: shape ``lead + (units * per_unit,) + trail``, filled with ``fill``."""

    dtype: type
    fill: int = 0
    lead: tuple = ()
    per_unit: float = 1        # entries per unit along the unit axis (2: two per unit, 0.5: one per two)
    trail: tuple = ()

    def length(self, units: int) -> int:
        return int(units * self.per_unit)

    def alloc(self, units: int) -> np.ndarray:
        shape = self.lead + (self.length(units),) + self.trail
        # zeros come from calloc (pages mapped on first use): much cheaper than writing a fill value
        return np.zeros(shape, self.dtype) if self.fill == 0 else np.full(shape, self.fill, self.dtype)

    def copy_prefix(self, dst: np.ndarray, src: np.ndarray, units: int) -> None:
        where = (slice(None),) * len(self.lead) + (slice(0, self.length(units)),)
        dst[where] = src[where]


class Arena:
    """Regions of ``fields``' arrays, one per cell; see the module docstring.

    move(arena, cells, new_base, new_cap, src_arrays, dst_arrays): the kernel that copies the given cells'
    regions to their new place (src and dst may be the same arrays) and records it in the arena's base and
    cap. A function of the arena, not a method of its owner: a bound method would hold the owner and its
    arena in a cycle, which only a pass of the garbage collector frees (a world's memory long after it is
    dropped, or never once the server has frozen its start's objects).
    """

    def __init__(self, n_cells: int, fields: tuple[Field, ...], units: int, *, first: int, pad: int,
                 cap_dtype, move: Callable):
        self.fields = fields
        self.first, self.pad, self._move = first, pad, move
        self.n = np.zeros(n_cells, np.int32)            # units in use per cell
        self.base = np.zeros(n_cells, np.int64)         # first unit of each cell's region
        self.cap = np.zeros(n_cells, cap_dtype)         # units of each cell's region (0: none yet)
        self.top = first                                # the first unit after every region
        self.garbage = 0                                # units of regions left behind by moves
        self.arrays = self._alloc(units)

    def _alloc(self, units: int) -> tuple:
        self.units = units
        return tuple(f.alloc(units) for f in self.fields)

    def place(self, cells: np.ndarray, new_cap: np.ndarray) -> None:
        """Give ``cells`` new regions of ``new_cap`` units at the top, their contents moved there."""
        # the sizes by one kernel: a few numpy calls on small arrays between a frame's kernels cost ~10 us
        # each (their code no longer in the caches)
        new_base, total, left = karena.place_plan(cells, new_cap, self.pad, self.cap, self.top)
        if self.garbage > max((self.top - self.garbage) // 4, COMPACT_MIN_UNITS):
            top = self.top
            self.compact(extra=total)           # keeps every cell's capacity: only the top moves
            new_base += self.top - top
        if self.top + total > self.units:
            self.grow(int((self.top + total) * 1.25) + 1024)
        self.garbage += left
        self._move(self, cells, new_base, new_cap, self.arrays, self.arrays)
        self.top += total

    def grow(self, units: int) -> None:
        """Larger arrays with the same contents."""
        old, k = self.arrays, self.units
        self.arrays = self._alloc(units)
        for f, dst, src in zip(self.fields, self.arrays, old):
            f.copy_prefix(dst, src, k)

    def compact(self, extra: int = 0) -> None:
        """Lay every cell's region out again, densely, in fresh arrays (with room for ``extra`` units)."""
        cells = np.flatnonzero(self.cap > 0).astype(np.int32)
        caps = self.cap[cells]
        size = caps.astype(np.int64) + self.pad
        old = self.arrays
        self.arrays = self._alloc(max(1024, int(1.25 * (size.sum() + extra)) + 2))
        new_base = self.first + np.cumsum(size) - size
        self._move(self, cells, new_base, caps, old, self.arrays)
        self.top = self.first + int(size.sum())
        self.garbage = 0

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.n, self.base, self.cap, *self.arrays))

    def check(self) -> None:
        """Regions hold their units, lie inside the arena, and never overlap."""
        assert np.all(self.n <= self.cap), "a region holds more units than its capacity"
        used = np.flatnonzero(self.cap > 0)
        start = self.base[used]
        end = start + self.cap[used].astype(np.int64) + self.pad
        order = np.argsort(start)
        assert np.all(start >= self.first) and np.all(end <= self.top) and self.top <= self.units, "region bounds"
        assert np.all(end[order][:-1] <= start[order][1:]), "regions overlap"
        assert 0 <= self.garbage <= self.top, "garbage count"
