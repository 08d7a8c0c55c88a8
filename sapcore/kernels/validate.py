"""Box validation kernels: find the first bad box of a frame without changing anything, and mark the
updates whose box is unchanged."""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, NJIT_SERIAL, njit, prange

# reasons for a bad box (returned as codes, turned into messages by the World)
BOX_OK = 0
BOX_NAN = 1
BOX_INF = 2
BOX_MIN_GT_MAX = 3
BOX_OUT_OF_RANGE = 4


@njit(**NJIT_INLINE)
def _box_code(boxes, i, dims, limit):
    """0 if row i of ``boxes`` is a valid box, else ``reason * 4 + axis``."""
    for a in range(dims):
        lo = boxes[i, a]
        hi = boxes[i, dims + a]
        c = BOX_OK
        if np.isnan(lo) or np.isnan(hi):
            c = BOX_NAN
        elif np.isinf(lo) or np.isinf(hi):
            c = BOX_INF
        elif lo > hi:
            c = BOX_MIN_GT_MAX
        elif abs(lo) > limit or abs(hi) > limit:
            c = BOX_OUT_OF_RANGE
        if c != BOX_OK:
            return c * 4 + a
    return 0


@njit(**NJIT_INLINE)
def _same_box(boxes, i, stored, h, dims):
    """Is row i of ``boxes`` equal to the stored box of handle h (no branches: mostly unpredictable)?"""
    eq = True
    for a in range(2 * dims):
        eq &= boxes[i, a] == stored[h, a]
    return eq


@njit(**NJIT_INLINE)
def _stored_row(i, handles, row_of, by_row):
    """Where the stored box of update row i is: (in ``rows``?, index); see ``boxes_check``."""
    if by_row:
        return True, np.int64(i)
    if row_of.shape[0] > 0 and row_of[i] >= 0:
        return True, np.int64(row_of[i])
    return False, np.int64(handles[i])


@njit(**NJIT_INLINE)
def _unchanged(boxes, i, stored, handles, rows, row_of, by_row, dims):
    in_rows, k = _stored_row(i, handles, row_of, by_row)
    if in_rows:
        return _same_box(boxes, i, rows, k, dims)
    return _same_box(boxes, i, stored, k, dims)


@njit(**NJIT)
def _first_bad(boxes, dims, limit, stored, handles, rows, row_of, by_row):
    """(row, code, axis) of the lowest bad row (serial: only called when there is one)."""
    known = handles.shape[0] == boxes.shape[0]
    for i in range(boxes.shape[0]):
        if known and _unchanged(boxes, i, stored, handles, rows, row_of, by_row, dims):
            continue
        c = _box_code(boxes, i, dims, limit)
        if c != 0:
            return i, c // 4, c % 4
    return -1, BOX_OK, 0


# what ``_check_row`` found
_ROW_OK, _ROW_UNCHANGED, _ROW_BAD = 0, 1, 2


@njit(**NJIT_INLINE)
def _check_row(boxes, i, dims, limit, stored, handles, same, rows, row_of, by_row, known):
    """Row i of ``boxes_check`` (its parallel and serial loops): unchanged (``same[i] = 2``), bad or ok."""
    if known:
        eq = _unchanged(boxes, i, stored, handles, rows, row_of, by_row, dims)
        same[i] = 2 if eq else 0
        if eq:
            return _ROW_UNCHANGED
    return _ROW_BAD if _box_code(boxes, i, dims, limit) != 0 else _ROW_OK


@njit(**NJIT_INLINE)
def _check_answer(bad, unchanged, boxes, dims, limit, stored, handles, rows, row_of, by_row, known):
    """``boxes_check``'s answer once its rows are counted: the lowest bad row when there is one."""
    if bad:
        row, code, axis = _first_bad(boxes, dims, limit, stored, handles if known else handles[:0], rows, row_of,
                                     by_row)
        return row, code, axis, unchanged
    return -1, BOX_OK, 0, unchanged


@njit(**NJIT_PARALLEL)
def boxes_check(boxes, dims, limit, stored, handles, same, rows, row_of, by_row):
    """First bad row of float32 boxes [K, 2*dims]: returns (row, code, axis, unchanged), row -1 (code 0,
    axis 0) when every box is fine; unchanged: the rows marked ``same[i] = 2``.

    Rows are checked in parallel; the answer is the lowest bad row whatever the thread count. With
    ``handles`` (int32 [K], updates of known objects; empty otherwise), a row equal to the object's
    stored box is valid already: ``same[i] = 2`` and it is not checked again (else ``same[i] = 0``).
    The stored box of row i is ``stored[handles[i]]``, or a row of ``rows`` (the boxes of the last
    frame's list, read in about their order instead of scattered over the per-object array):
    ``rows[i]`` with ``by_row`` (this frame lists the same objects in the same order), else
    ``rows[row_of[i]]`` where ``row_of`` (int64 [K], or empty) gives one (>= 0).
    """
    n = boxes.shape[0]
    known = handles.shape[0] == n and n > 0
    bad = 0
    unchanged = 0
    for i in prange(n):
        r = _check_row(boxes, i, dims, limit, stored, handles, same, rows, row_of, by_row, known)
        if r == _ROW_UNCHANGED:
            unchanged += 1
        elif r == _ROW_BAD:
            bad += 1
    return _check_answer(bad, unchanged, boxes, dims, limit, stored, handles, rows, row_of, by_row, known)


@njit(**NJIT_SERIAL)
def boxes_check_serial(boxes, dims, limit, stored, handles, same, rows, row_of, by_row):
    """``boxes_check`` on the calling thread alone (no parallel launch); the same results."""
    n = boxes.shape[0]
    known = handles.shape[0] == n and n > 0
    bad = 0
    unchanged = 0
    for i in range(n):
        r = _check_row(boxes, i, dims, limit, stored, handles, same, rows, row_of, by_row, known)
        if r == _ROW_UNCHANGED:
            unchanged += 1
        elif r == _ROW_BAD:
            bad += 1
    return _check_answer(bad, unchanged, boxes, dims, limit, stored, handles, rows, row_of, by_row, known)
