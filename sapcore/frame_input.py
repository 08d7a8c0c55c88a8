"""Turning a frame's arguments into the engine's arrays, with the errors that name the entry at fault.

Shapes and dtypes are checked here; box values by ``kernels.validate.boxes_check`` (reported through
``raise_bad_box``), id rules by ``kernels.idmap.frame_check_ids``.
"""
from __future__ import annotations

import numpy as np

from .errors import FrameError
from .kernels import validate as kval

BOX_REASON = {
    kval.BOX_NAN: "NaN coordinate on axis {axis}",
    kval.BOX_INF: "infinite coordinate on axis {axis}",
    kval.BOX_MIN_GT_MAX: "min > max on axis {axis}",
    kval.BOX_OUT_OF_RANGE: "|coordinate| on axis {axis} exceeds the supported range {limit:g}",
}
ID_REASON = {1: "unknown id {id}", 2: "id {id} appears more than once in the frame",
             3: "id {id} is already live (an id appears at most once in a frame)"}
ID_FIELDS = ("remove_ids", "update_ids", "add_ids")
#: A frame's per-add columns left out, up to this many adds (category and mask: every bit; static: 0)
_DEFAULT_COLUMN = {(np.uint32, 0xFFFFFFFF): np.full(1024, 0xFFFFFFFF, np.uint32),
                   (np.uint8, 0): np.zeros(1024, np.uint8)}
# shared empty inputs (nothing can be written into an array without elements)
_NO_IDS = np.zeros(0, np.uint64)
_U64 = np.dtype(np.uint64)
_F32 = np.dtype(np.float32)
_NO_BOXES = {2: np.zeros((0, 4), np.float32), 3: np.zeros((0, 6), np.float32)}


def as_ids(x, field: str) -> np.ndarray:
    """uint64 [K] ids (any non-negative integer dtype is accepted)."""
    if type(x) is np.ndarray and x.dtype is _U64 and x.ndim == 1 and x.flags.c_contiguous:
        return x if x.size else _NO_IDS         # already the engine's array (every frame of a game server)
    if x is None:
        return _NO_IDS
    a = np.asarray(x)
    if a.ndim != 1:
        raise FrameError(field, -1, f"must be a 1-D array of ids, got shape {a.shape}")
    if a.size == 0:
        return _NO_IDS
    if a.dtype.kind == "i":
        if (a < 0).any():
            raise FrameError(field, int(np.flatnonzero(a < 0)[0]), "ids must be non-negative")
    elif a.dtype.kind != "u":
        raise FrameError(field, -1, f"ids must be integers, got dtype {a.dtype}")
    return np.ascontiguousarray(a, np.uint64)


def as_boxes(boxes, n: int, field: str, dims: int, coord_limit: float) -> np.ndarray:
    """float32 [n, 2*dims] boxes, C order (shape and dtype checked; values by ``raise_bad_box``)."""
    d2 = 2 * dims
    if (type(boxes) is np.ndarray and boxes.dtype is _F32 and boxes.shape == (n, d2)
            and boxes.flags.c_contiguous):
        return boxes                            # already the engine's array (values: ``raise_bad_box``)
    if boxes is None:
        if n:
            raise FrameError(field, -1, f"missing: {n} ids need {n} boxes")
        return _NO_BOXES[dims]
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
            bad = np.isfinite(b64) & (np.abs(b64) > coord_limit)
        if bad.any():
            r, col = np.argwhere(bad)[0]
            raise FrameError(field, int(r), BOX_REASON[kval.BOX_OUT_OF_RANGE].format(axis=int(col) % dims,
                                                                                     limit=coord_limit))
        with np.errstate(invalid="ignore", over="ignore"):
            b = b.astype(np.float32)
    return np.ascontiguousarray(b, np.float32)


def raise_bad_box(field: str, coord_limit: float, row: int, code: int, axis: int) -> None:
    """Raise the FrameError of ``boxes_check``'s answer (row -1: every box is fine)."""
    if row >= 0:
        raise FrameError(field, int(row), BOX_REASON[code].format(axis=axis, limit=coord_limit))


def check_column(x, n: int, field: str, dtype, default):
    """A per-add column (category, mask: uint32; static: 0/1 uint8) of ``n`` values, or its default."""
    if x is None:
        # the default column: a slice of a shared one for the usual few adds (``np.full`` cost ~1 us a
        # column); only read (``ObjectStore.admit``), never kept
        col = _DEFAULT_COLUMN.get((dtype, default))
        return col[:n] if col is not None and n <= col.shape[0] else np.full(n, default, dtype)
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


def raise_bad_id(code: int, which: int, index: int, ids: tuple) -> None:
    """Raise the FrameError of ``frame_check_ids``'s answer (code 0: every id is fine)."""
    if code:
        raise FrameError(ID_FIELDS[which], index, ID_REASON[code].format(id=ids[which][index]))
