"""Value types of the sapcore public API: world configuration, frame result and statistics."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError

#: Largest |coordinate| a box may have. float32 keeps 24 bits of mantissa, so beyond this a box of
#: game size is not representable anyway; the limit also keeps grid coordinates inside int64.
DEFAULT_COORD_LIMIT = 1.0e15


@dataclass(frozen=True)
class WorldConfig:
    """Configuration of one world (one multi-SAP grid).

    dims : 2 or 3.
    bounds : ``2*dims`` floats, all mins then all maxs. The grid covers this box and wraps outside it,
        so objects outside the bounds still work (they alias onto cells inside).
    cells : cells per axis (``dims`` ints, each >= 1).
    threads : worker threads for the parallel cell apply (None: numba's default, the core count).
    max_objects : hard limit of live objects (a frame that would exceed it is refused whole).
    coord_limit : largest accepted |coordinate|.
    """

    dims: int
    bounds: tuple
    cells: tuple
    threads: int | None = None
    max_objects: int = 1 << 24
    coord_limit: float = DEFAULT_COORD_LIMIT

    def __post_init__(self):
        if self.dims not in (2, 3):
            raise ConfigError(f"dims must be 2 or 3, got {self.dims!r}")
        b = tuple(float(x) for x in self.bounds)
        if len(b) != 2 * self.dims:
            raise ConfigError(f"bounds must have {2 * self.dims} values (mins then maxs), got {len(b)}")
        if not all(math.isfinite(x) for x in b):
            raise ConfigError("bounds must be finite")
        for a in range(self.dims):
            if not b[a] < b[self.dims + a]:
                raise ConfigError(f"bounds: min must be < max on axis {a} ({b[a]} >= {b[self.dims + a]})")
        c = tuple(int(x) for x in self.cells)
        if len(c) != self.dims or any(x < 1 for x in c):
            raise ConfigError(f"cells must be {self.dims} integers >= 1, got {self.cells!r}")
        if max(c) > 32767:
            raise ConfigError(f"at most 32767 cells per axis, got {max(c)}")
        if math.prod(c) > 1 << 22:
            raise ConfigError(f"too many cells ({math.prod(c)}; at most {1 << 22})")
        if self.threads is not None and int(self.threads) < 1:
            raise ConfigError("threads must be >= 1")
        if not 1 <= int(self.max_objects) <= (1 << 30):
            raise ConfigError("max_objects must be in [1, 2**30]")
        if not (0 < float(self.coord_limit) <= 1.0e30):
            raise ConfigError("coord_limit must be in (0, 1e30]")
        object.__setattr__(self, "bounds", b)
        object.__setattr__(self, "cells", c)


@dataclass
class FrameStats:
    """Work counters and timings of one frame (seconds). apply_s: the cells' SAPs and pair sets (phases
    4-6), merge_s: the world's merge and the delta (phases 7-8); a frame on the calling thread applies,
    nets and merges in one call, all of it in apply_s."""

    objects: int = 0            # live objects after the frame
    pairs: int = 0              # active pairs after the frame
    created: int = 0            # pairs created by the frame
    deleted: int = 0            # pairs deleted by the frame
    swaps: int = 0              # endpoint swaps done by the insertion sorts
    cells_touched: int = 0      # cells whose SAP was applied
    cell_overflows: int = 0     # cells whose pair-event buffer overflowed (recomputed, never dropped)
    validate_s: float = 0.0
    rasterize_s: float = 0.0
    apply_s: float = 0.0
    merge_s: float = 0.0
    total_s: float = 0.0


@dataclass
class Delta:
    """Result of one frame.

    created, deleted : uint64 [K, 2] arrays of ``(low id, high id)`` rows, sorted lexicographically.
    """

    created: np.ndarray
    deleted: np.ndarray
    stats: FrameStats = field(default_factory=FrameStats)
