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

_S31 = np.uint64(31)
_S32 = np.uint64(32)
_S63 = np.uint64(63)
_ONE = np.uint64(1)
_LO32 = np.uint64(0xFFFFFFFF)
_ABS2 = np.uint64(0x7FFFFFFF7FFFFFFF)    # two float32s' bits without their signs
_LO31 = np.uint64(0x7FFFFFFF)               # the low float32's, the high one's
_HI31 = np.uint64(0x7FFFFFFF00000000)

#: Rows of a big frame compared with their stored boxes before the rest (``_some_unchanged``): when none of
#: them kept its box, the frame's boxes are only checked, not compared (every update taken as moved).
SAMPLE_ROWS = 32
_NO_ROW_OF = np.zeros(0, np.int64)
_NO_HANDLES = np.zeros(0, np.int32)


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


@njit(**NJIT_INLINE)
def _same_words(bu, i, ru, r, dims):
    """1 if box row i of ``bu`` equals row r of ``ru`` as floats, from the bits (``dims`` uint64 words a
    row; -0.0 equals +0.0), else 0; no branches."""
    mag = np.uint64(0)      # bits that differ, signs aside
    zs = np.uint64(0)       # the magnitudes of the values whose signs differ (0 for -0.0 against +0.0)
    for k in range(dims):
        x = bu[dims * i + k]
        d = x ^ ru[dims * r + k]
        mag |= d & _ABS2
        zs |= x & ((((d >> _S31) & _ONE) * _LO31) | (((d >> _S63) & _ONE) * _HI31))
    return np.int64((mag | zs) == 0)


@njit(**NJIT_INLINE)
def _words_valid(bu, b, n, limit_bits, dims):
    """Are the ``n`` boxes ``b`` (``bu``: their bits as uint64, ``dims`` words a row) all valid: no NaN or
    infinity, ``|value| <= limit``, min <= max? ``|value| <= limit`` is read from the bits: ``bits &
    0x7FFFFFFF`` orders non-negative floats as their values, NaN and infinities above every finite one
    (``limit_bits``: the float32 limit's bits). Two passes without branches."""
    worst = np.uint64(0)
    for j in range(dims * n):
        x = bu[j] & _ABS2
        worst = max(worst, max(x & _LO32, x >> _S32))
    bad = 0
    for i in range(n):
        for a in range(dims):
            bad += np.int64(b[i, a] > b[i, dims + a])
    return worst <= limit_bits and bad == 0


@njit(**NJIT_INLINE)
def _rows_check(bu, ru, b, same, n, limit_bits, dims):
    """``boxes_check`` of a frame of the list's rows, in three passes without branches (``dims`` a
    constant): ``same[i] = 2`` for a row equal to the list's (``_same_words``: ``bu`` / ``ru`` the frame's
    boxes and the rows as uint64), else 0; returns (unchanged rows, every box valid). A box equal to its
    row was valid when stored; any other is checked with the same rules (``_words_valid``), here on every
    row. Integer passes over whole words: ~3x faster than float passes by row."""
    unchanged = 0
    for i in range(n):
        e = _same_words(bu, i, ru, i, dims)
        same[i] = np.uint8(e + e)
        unchanged += e
    return unchanged, _words_valid(bu, b, n, limit_bits, dims)


@njit(**NJIT_INLINE)
def _rows_part(boxes, rows, same, limit_bits, dims, p, parts):
    """``_rows_check`` of part p of ``parts`` (consecutive rows) of a frame of the list's rows."""
    n = boxes.shape[0]
    lo = n * p // parts
    hi = n * (p + 1) // parts
    bu = boxes.reshape(-1).view(np.uint64)
    ru = rows.reshape(-1).view(np.uint64)
    if dims == 2:
        return _rows_check(bu[2 * lo:2 * hi], ru[2 * lo:2 * hi], boxes[lo:hi], same[lo:hi], hi - lo, limit_bits, 2)
    return _rows_check(bu[3 * lo:3 * hi], ru[3 * lo:3 * hi], boxes[lo:hi], same[lo:hi], hi - lo, limit_bits, 3)


@njit(**NJIT_INLINE)
def _some_unchanged(boxes, rows, row_of, stored, handles, dims):
    """Does one of ``SAMPLE_ROWS`` rows spread evenly over a big frame (its first among them) keep its stored
    box: ``rows[i]`` (no ``row_of``: the same list), ``rows[row_of[i]]``, or ``stored[handles[i]]`` off the
    last list? When none does, the frame's boxes are checked but not compared (``_valid_part``): a frame
    whose objects all move (the common big frame) reads its stored boxes once, in the grid ranges, and
    an unchanged box the sample missed is taken as moved, its values written again (no pair changes)."""
    n = boxes.shape[0]
    bu = boxes.reshape(-1).view(np.uint64)
    ru = rows.reshape(-1).view(np.uint64)
    su = stored.reshape(-1).view(np.uint64)
    k = min(SAMPLE_ROWS, n)
    e = 0
    for q in range(k):
        i = q * n // k
        if row_of.shape[0] == 0:
            e += _same_words(bu, i, ru, i, dims)
        elif row_of[i] >= 0:
            e += _same_words(bu, i, ru, row_of[i], dims)
        else:
            e += _same_words(bu, i, su, np.int64(handles[i]), dims)
    return e > 0


@njit(**NJIT_INLINE)
def _valid_part(boxes, same, limit_bits, dims, p, parts):
    """Part p of a big frame's boxes checked, not compared: ``same`` 0 (every update taken as moved); returns
    (0 unchanged rows, every box valid) as ``_rows_part``."""
    n = boxes.shape[0]
    lo = n * p // parts
    hi = n * (p + 1) // parts
    for i in range(lo, hi):
        same[i] = 0
    bu = boxes.reshape(-1).view(np.uint64)
    return 0, _words_valid(bu[dims * lo:dims * hi], boxes[lo:hi], hi - lo, limit_bits, dims)


@njit(**NJIT_PARALLEL)
def rows_check(boxes, rows, same, limit_bits, dims, parts):
    """``boxes_check`` of a frame that lists the same objects as the last one in the same order, ``rows``
    their stored boxes row by row (float32 [K, 2*dims], C order, as ``boxes``): ``same[i] = 2`` for an
    unchanged row, else 0; returns (unchanged rows, every box valid), by ``_rows_check`` (integer passes
    over whole words; ``limit_bits``: the float32 coordinate limit's bits), in ``parts`` parts of
    consecutive rows (one a thread). When some box is bad, ``boxes_check`` names the first one. Rows are
    compared only when a sample of them finds an unchanged one (``_some_unchanged``); else ``same`` is 0
    and no row is counted unchanged."""
    unchanged = np.zeros(parts, np.int64)
    ok = np.ones(parts, np.bool_)
    compare = _some_unchanged(boxes, rows, _NO_ROW_OF, rows, _NO_HANDLES, dims)
    for p in prange(parts):
        if compare:
            unchanged[p], ok[p] = _rows_part(boxes, rows, same, limit_bits, dims, p, parts)
        elif dims == 2:
            unchanged[p], ok[p] = _valid_part(boxes, same, limit_bits, 2, p, parts)
        else:
            unchanged[p], ok[p] = _valid_part(boxes, same, limit_bits, 3, p, parts)
    return unchanged.sum(), ok.all()


@njit(**NJIT_SERIAL)
def rows_check_serial(boxes, rows, same, limit_bits, dims):
    """``rows_check`` on the calling thread alone (no parallel launch), every row compared (no sample)."""
    return _rows_part(boxes, rows, same, limit_bits, dims, 0, 1)


@njit(**NJIT_INLINE)
def _rows_of_part(boxes, rows, row_of, stored, handles, same, limit_bits, dims, p, parts):
    """Part p of ``rows_of_check`` (``dims`` a constant). The updates come in runs at consecutive positions
    of the last list (between the objects the frame removed or added): each run is compared with its rows
    in one loop of ``_same_words`` at fixed offsets (vectorised), ~25% faster than update by update."""
    n = boxes.shape[0]
    lo = n * p // parts
    hi = n * (p + 1) // parts
    bu = boxes.reshape(-1).view(np.uint64)
    ru = rows.reshape(-1).view(np.uint64)
    su = stored.reshape(-1).view(np.uint64)
    unchanged = 0
    i = lo
    while i < hi:
        r = row_of[i]
        if r < 0:       # off the last list: its stored box by handle
            e = _same_words(bu, i, su, np.int64(handles[i]), dims)
            same[i] = np.uint8(e + e)
            unchanged += e
            i += 1
            continue
        end = i + 1
        while end < hi and row_of[end] == r + (end - i):
            end += 1
        bs = bu[dims * i:dims * end]
        rs = ru[dims * r:dims * (r + end - i)]
        ss = same[i:end]
        run = 0
        for k in range(end - i):
            e = _same_words(bs, k, rs, k, dims)
            ss[k] = np.uint8(e + e)
            run += e
        unchanged += run
        i = end
    return unchanged, _words_valid(bu[dims * lo:dims * hi], boxes[lo:hi], hi - lo, limit_bits, dims)


@njit(**NJIT_PARALLEL)
def rows_of_check(boxes, rows, row_of, stored, handles, same, limit_bits, dims, parts):
    """``rows_check`` of a frame whose updates sit at other positions of the last list: update i's stored
    box is ``rows[row_of[i]]`` where ``row_of[i] >= 0``, else ``stored[handles[i]]`` (the objects' boxes,
    C order like ``rows``): ``same[i] = 2`` for an unchanged row, else 0; returns (unchanged rows, every
    box valid), in ``parts`` parts of consecutive rows (one a thread). When some box is bad,
    ``boxes_check`` names the first one. Rows are compared only when a sample of them finds an unchanged one,
    as in ``rows_check``."""
    unchanged = np.zeros(parts, np.int64)
    ok = np.ones(parts, np.bool_)
    compare = _some_unchanged(boxes, rows, row_of, stored, handles, dims)
    for p in prange(parts):
        if not compare:
            if dims == 2:
                unchanged[p], ok[p] = _valid_part(boxes, same, limit_bits, 2, p, parts)
            else:
                unchanged[p], ok[p] = _valid_part(boxes, same, limit_bits, 3, p, parts)
        elif dims == 2:
            unchanged[p], ok[p] = _rows_of_part(boxes, rows, row_of, stored, handles, same, limit_bits, 2, p, parts)
        else:
            unchanged[p], ok[p] = _rows_of_part(boxes, rows, row_of, stored, handles, same, limit_bits, 3, p, parts)
    return unchanged.sum(), ok.all()
