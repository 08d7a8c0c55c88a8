"""The listed frame's own variants of general kernels against those kernels or a numpy reference: the box
check against the list's rows from the bits (``kernels.validate._rows_check``; by runs of the last list's
positions, ``rows_of_check``, against row by row), the grid ranges of a listed frame
(``kernels.grid._ranges_listed``; both also run in parts side by side for a big frame, see
test_core_big_frames.py) and the one-call frame's merge into the world's pair table with the delta's
sorted id pairs (``kernels.frame._merge_ids``)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_harness import compile_one_call_frames
from sapcore.kernels import frame as kframe
from sapcore.kernels import grid as kgrid
from sapcore.kernels import merge as kmerge
from sapcore.kernels import validate as kval
from sapcore.kernels.hashing import EVENT_REMOVED
from sapcore.world_pairs import SHARDS


def _limit32(limit: float) -> np.float32:
    """The float32 limit as ``World`` makes it (rounded up, so that a value at the limit passes)."""
    lim = np.float32(limit)
    return np.nextafter(lim, np.float32(np.inf)) if float(lim) < limit else lim


@pytest.mark.parametrize("dims", [2, 3])
def test_rows_check_from_the_bits_equals_the_float_rules(dims):
    """Equality as floats (-0.0 equals +0.0, a value and its negation differ by one bit and are not equal,
    a NaN never equal), ``|value| <= limit`` (at the limit, one float32 step above, infinities, NaN, both
    signs) and min <= max, row by row, in the first, a middle
    and the last row, against numpy."""
    rng = np.random.default_rng(3)
    limit = 1000.0
    lim = _limit32(limit)
    n = 64
    c = rng.uniform(-900, 900, (n, dims)).astype(np.float32)
    rows = np.concatenate([c - 1, c + 1], 1).astype(np.float32)
    rows[7, :] = 0.0
    specials = [np.float32(-0.0), np.float32(0.0), lim, -lim, np.nextafter(lim, np.float32(np.inf)),
                -np.nextafter(lim, np.float32(np.inf)), np.float32(np.inf), np.float32(-np.inf),
                np.float32(np.nan), np.float32(1e-40), np.float32(-1e-40)]
    cases = 0
    for row in (0, 7, n // 2, n - 1):
        for col in range(2 * dims):
            for v in specials + ["negated"]:
                if isinstance(v, str):          # the stored value with its sign flipped (one bit apart)
                    v = -rows[row, col] if rows[row, col] != 0 else np.float32(-1.0)
                b = rows.copy()
                b[rng.random((n, 2 * dims)) < 0.3] += np.float32(0.5)          # some rows moved
                b[7] = np.where(rng.random(2 * dims) < 0.5, np.float32(-0.0), np.float32(0.0))
                b[row, col] = v
                same = np.full(n, 9, np.uint8)
                unchanged, ok = kval._rows_check(b.reshape(-1).view(np.uint64), rows.reshape(-1).view(np.uint64),
                                                   b, same, n, np.uint64(lim.view(np.uint32)), dims)
                eq = (b == rows).all(1)
                valid = (np.isfinite(b).all() and (np.abs(b) <= lim).all()
                         and (b[:, :dims] <= b[:, dims:]).all())
                assert (same == 2 * eq).all(), (row, col, v)
                assert unchanged == eq.sum() and ok == valid, (row, col, v)
                cases += 1
    assert cases == 4 * 2 * dims * (len(specials) + 1)


@settings(max_examples=80, deadline=None)
@given(dims=st.sampled_from([2, 3]), parts=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       runs=st.lists(st.tuples(st.integers(-1, 40), st.integers(1, 12)), min_size=1, max_size=12),
       moved=st.sampled_from([0.0, 0.4, 1.0]), sample_moved=st.booleans())
def test_rows_of_check_by_runs_equals_row_by_row(dims, parts, seed, runs, moved, sample_moved):
    """``rows_of_check`` compares runs of updates at consecutive positions of the last list in one loop: the
    same ``same`` marks, unchanged count and validity as row by row, for any positions (runs, single rows
    off the list (-1) read by handle, jumps back and forth, a run cut by the parts' border), boxes equal
    to their stored rows, moved, or equal but for the sign of a zero. Rows are compared only when one of
    the sampled rows (``SAMPLE_ROWS``, spread evenly) is unchanged; else no row is marked or counted
    unchanged. ``rows_check`` (the rows in order) likewise."""
    rng = np.random.default_rng(seed)
    n_last = 64
    c = rng.uniform(-50, 50, (n_last, dims)).astype(np.float32)
    rows = np.concatenate([c - 1, c + 1], 1).astype(np.float32)
    rows[5, :] = 0.0
    row_of = np.concatenate([np.full(k, -1) if start < 0 else (start + np.arange(k)) % n_last
                             for start, k in runs]).astype(np.int64)
    n = row_of.shape[0]
    handles = rng.permutation(200)[:n].astype(np.int32)
    stored = rng.uniform(-50, 50, (200, 2 * dims)).astype(np.float32)
    stored[:, dims:] = stored[:, :dims] + 1
    lim = _limit32(1000.0)
    sampled = np.arange(min(kval.SAMPLE_ROWS, n)) * n // min(kval.SAMPLE_ROWS, n)
    for by_row in (False, True):
        want_rows = (rows[np.arange(n) % n_last] if by_row else
                     np.where((row_of >= 0)[:, None], rows[np.maximum(row_of, 0)], stored[handles]))
        boxes = want_rows.copy()
        move = rng.random(n) < moved
        if sample_moved:
            move[sampled] = True
        boxes[move] += np.float32(0.25)
        zeros = (want_rows == 0).all(1)
        boxes[zeros & (rng.random(n) < 0.5)] = np.float32(-0.0)
        same = np.full(n, 9, np.uint8)
        if by_row:
            unchanged, ok = kval.rows_check(boxes, np.ascontiguousarray(want_rows), same,
                                            np.uint64(lim.view(np.uint32)), dims, parts)
        else:
            unchanged, ok = kval.rows_of_check(boxes, rows, row_of, stored, handles, same,
                                               np.uint64(lim.view(np.uint32)), dims, parts)
        eq = (boxes == want_rows).all(1)
        assert ok
        if eq[sampled].any():
            assert (same == 2 * eq).all() and unchanged == eq.sum()
        else:
            assert (same == 0).all() and unchanged == 0


@pytest.mark.parametrize("big,mark", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("dims", [2, 3])
def test_ranges_listed_equals_grid_ranges_serial(dims, big, mark):
    """Cell ranges, ``same``, flags and boxes as ``grid_ranges_serial`` writes them (row mode 1: the same
    list), boxes inside, outside (wrapped) and wider than the bounds, some rows unchanged; the moved rows'
    boxes written into the rows. The objects' old boxes are the list's rows and their cell ranges the old
    boxes' (which the big frame's pass computes from the rows instead of reading them). Without ``mark`` (the
    cells take every box as moved), only the flags of the boxes that change cells are written."""
    rng = np.random.default_rng(4)
    C = np.ones(3, np.int64)
    C[:dims] = rng.integers(1, 7, dims)
    bmin = np.zeros(3)
    bmin[:dims] = -10.0
    inv = np.ones(3)
    inv[:dims] = C[:dims] / 20.0
    n_obj = 300

    def some_boxes(n):
        lo = rng.uniform(-40, 40, (n, dims))
        ext = np.where(rng.random((n, dims)) < 0.1, rng.uniform(20, 60, (n, dims)), rng.uniform(0, 3, (n, dims)))
        return np.concatenate([lo, lo + ext], 1).astype(np.float32)

    for _ in range(20):
        boxes = np.zeros((n_obj, 2 * dims), np.float32)
        crange = rng.integers(0, 3, (n_obj, 6)).astype(np.int16)
        flag = np.zeros(n_obj, np.uint8)
        n = 200
        upd_h = rng.choice(n_obj, n, replace=False).astype(np.int32)
        upd = some_boxes(n)
        # the old boxes: half of them a little off the new ones (most stay in their cells), half anywhere
        old = some_boxes(n)
        near = rng.random(n) < 0.5
        old[near] = upd[near] + rng.uniform(-0.5, 0.5, (n, 1)).astype(np.float32)[near]
        same0 = np.where(rng.random(n) < 0.2, 2, 0).astype(np.uint8)
        upd[same0 == 2] = old[same0 == 2]
        pre = np.zeros((n, 6), np.int32)
        kgrid.grid_ranges_serial(dims, bmin, inv, C, boxes.copy(), crange.copy(), flag.copy(), upd_h, old, upd_h[:0],
                                 old[:0], pre, np.zeros(n, np.uint8), old.copy(), 0, np.zeros(n_obj, np.int32))
        crange[upd_h] = pre
        boxes[upd_h] = old
        rows = old.copy()
        ref = [boxes.copy(), crange.copy(), flag.copy(), np.zeros((n, 6), np.int32), same0.copy(), rows.copy()]
        kgrid.grid_ranges_serial(dims, bmin, inv, C, ref[0], ref[1], ref[2], upd_h, upd, upd_h[:0], upd[:0], ref[3],
                                 ref[4], ref[5], 1, np.zeros(n_obj, np.int32))
        got = [boxes.copy(), crange.copy(), flag.copy(), np.zeros((n, 6), np.int32), same0.copy(), rows.copy()]
        kgrid._ranges_listed(dims, bmin, inv, C, got[0], got[1], got[2], upd_h, upd, got[3], got[4], got[5], big,
                             mark)
        moved = same0 != 2
        if not mark:        # only the flags of the boxes that change cells
            ref[2][ref[2] == kgrid.FLAG_MOVED] = 0
            assert (ref[2] == kgrid.FLAG_MOVED_CELLS).any()
        assert (got[0] == ref[0]).all() and (got[2] == ref[2]).all() and (got[4] == ref[4]).all()
        assert (got[3][moved] == ref[3][moved]).all()
        assert (got[5][moved] == upd[moved]).all() and (got[5][~moved] == old[~moved]).all()
        assert (got[4][moved] < 2).all() and (got[4][moved] == 1).any() and (got[4][moved] == 0).any()


def _table(cap):
    slots = np.full(SHARDS * cap, -1, np.int32)
    keys = np.zeros(SHARDS * cap // 2, np.uint64)
    cnt = np.zeros(SHARDS * cap // 2, np.int32)
    n = np.zeros(SHARDS, np.int64)
    return slots, keys, cnt, n


@pytest.mark.parametrize("big_ids", [False, True])
def test_merge_ids_equals_world_merge_small_and_the_sorted_id_pairs(big_ids):
    """Frame after frame of random netted events by touched cell (pairs made, pairs gone, a pair in two
    cells): the same pair table (slots, keys, counts, sizes), the same created / deleted pairs, sorted
    by (low id, high id) as ``World._keys_to_id_pairs`` sorts them; ids beyond 32 bits too. A shard
    without room: False, nothing changed."""
    rng = np.random.default_rng(5)
    cap = 256
    ref = _table(cap)
    got = tuple(a.copy() for a in ref)
    obj_id = rng.permutation(400).astype(np.uint64) + (np.uint64(2**40) if big_ids else np.uint64(0))
    live: dict[int, int] = {}
    frames = 0
    for _ in range(40):
        nt = int(rng.integers(1, 6))
        out_n = rng.integers(0, 12, nt).astype(np.int64)
        ev_off = np.zeros(nt + 1, np.int64)
        ev_off[1:] = np.cumsum(out_n + rng.integers(0, 3, nt))
        ev_key = np.zeros(int(ev_off[-1]), np.uint64)
        for t in range(nt):
            for i in range(out_n[t]):
                if live and rng.random() < 0.4:
                    key = int(rng.choice(list(live)))
                    ev_key[ev_off[t] + i] = np.uint64(key) | EVENT_REMOVED
                    live[key] -= 1
                    if live[key] == 0:
                        del live[key]
                else:
                    a, b = sorted(rng.choice(400, 2, replace=False).tolist())
                    key = (a << 32) | b
                    ev_key[ev_off[t] + i] = np.uint64(key)
                    live[key] = live.get(key, 0) + 1
        done, cr, de, pairs = kmerge.world_merge_small(ev_key, ev_off, out_n, SHARDS, *ref[:3], cap, ref[3])
        done2, cr2, de2, pairs2 = kframe._merge_ids(ev_key, ev_off, out_n, SHARDS, *got[:3], cap, got[3], obj_id)
        assert done and done2 and pairs == pairs2 == len(live)
        for a, b in zip(ref, got):
            assert (a == b).all()
        for keys, rows in ((cr, cr2), (de, de2)):
            ids = np.sort(np.stack([obj_id[(keys >> np.uint64(32)).astype(np.int64)],
                                    obj_id[(keys & np.uint64(0xFFFFFFFF)).astype(np.int64)]], 1), axis=1)
            expect = ids[np.lexsort((ids[:, 1], ids[:, 0]))] if len(ids) else np.zeros((0, 2), np.uint64)
            assert rows.dtype == np.uint64 and rows.shape == expect.shape and (rows == expect).all()
        frames += len(cr) > 0 and len(de) > 0
    assert frames > 5
    # a shard without room: nothing changes
    key = np.uint64((1 << 32) | 2)
    many = np.full(cap, key, np.uint64)
    before = tuple(a.copy() for a in got)
    done, cr, de, _ = kframe._merge_ids(many, np.array([0, cap], np.int64), np.array([cap], np.int64), SHARDS,
                                        *got[:3], cap, got[3], obj_id)
    assert not done and cr.shape == de.shape == (0, 2)
    for a, b in zip(before, got):
        assert (a == b).all()


def test_a_small_one_call_frame_keeps_the_gil_and_a_larger_one_releases_it(monkeypatch):
    """Under ``parallel.HOLD_GIL_BELOW`` updates the one call is ``frame_listed_held`` (compiled without
    ``nogil``), from there on ``frame_listed`` (which releases the GIL), and both give the same deltas."""
    from sapcore import parallel
    from sapgrid.tools.bench_frames import _moving_world

    import numba

    if not numba.config.DISABLE_JIT:        # (as plain Python, both are functions without options)
        assert kframe.frame_listed.targetoptions["nogil"] is True
        assert kframe.frame_listed_held.targetoptions.get("nogil", False) is False
    compile_one_call_frames()
    calls = []
    for name in ("frame_listed", "frame_listed_held"):
        kernel = getattr(kframe, name)
        monkeypatch.setattr(kframe, name, lambda *a, _k=kernel, _n=name: calls.append(_n) or _k(*a))
    bar = parallel.HOLD_GIL_BELOW
    for n, expected in ((bar - 1, "frame_listed_held"), (bar, "frame_listed")):
        world, ids, boxes = _moving_world(n, 12, seed=n)
        twin, _, _ = _moving_world(n, 12, seed=n)
        for w in (world, twin):       # the first updates after the adds make the list the next frames repeat
            w.step(update_ids=ids, update_boxes=boxes[0])
        for b in boxes[1:]:
            calls.clear()
            monkeypatch.setattr(parallel, "HOLD_GIL_BELOW", bar)
            got = world.step(update_ids=ids, update_boxes=b)
            assert calls[:1] == [expected], (n, calls)      # (as Python, the held one calls the other)
            # the twin world through the other kernel: the same delta, pairs and counts
            monkeypatch.setattr(parallel, "HOLD_GIL_BELOW", 0 if expected == "frame_listed_held" else 1 << 30)
            want = twin.step(update_ids=ids, update_boxes=b)
            assert np.array_equal(got.created, want.created) and np.array_equal(got.deleted, want.deleted)
            assert got.stats.pairs == want.stats.pairs
        assert np.array_equal(world.pairs(), twin.pairs())


@pytest.mark.parametrize("dims", [2, 3])
def test_the_one_call_frame_runs_its_compiled_specialization_by_the_arguments_types(dims):
    """After its first frame, a world's listed frame calls the compiled specialization directly
    (``_numba.entry_point``), kept by whether it keeps the GIL and the ids' and boxes' flags: read-only
    arrays get specializations of their own (unaligned ones are kept apart too), a new list's state
    forgets them; every delta equals a twin world's whose every call goes through the dispatcher (its
    callables forgotten each frame)."""
    import numba

    from sapcore import World, WorldConfig

    compile_one_call_frames()
    rng = np.random.default_rng(dims)
    n = 120
    cfg = WorldConfig(dims=dims, bounds=(0.0,) * dims + (30.0,) * dims, cells=(3,) * dims, threads=1)
    world, twin = World(cfg), World(cfg)
    ids = np.arange(n, dtype=np.uint64) * 7 + 3
    c = rng.uniform(0, 30, (n, dims)).astype(np.float32)
    boxes = np.concatenate([c - 1, c + 1], 1)
    for w in (world, twin):
        w.step(add_ids=ids, add_boxes=boxes)

    def unaligned(a):
        raw = np.zeros(a.nbytes + 1, np.uint8)[1:]
        out = raw.view(a.dtype).reshape(a.shape)
        out[...] = a
        return out

    def read_only(a):
        a = a.copy()
        a.flags.writeable = False
        return a

    kinds = [lambda a: a, read_only, unaligned]
    seen, flags = set(), set()
    empty = 0
    for f in range(40):
        c = c + rng.normal(0, 0.3 if f % 3 else 1e-4, c.shape).astype(np.float32)     # (some frames: no change)
        boxes = np.concatenate([c - 1, c + 1], 1)
        kind_ids, kind_boxes = kinds[f // 2 % 3], kinds[f // 6 % 3]
        u, b = kind_ids(ids), kind_boxes(boxes)
        if f == 20:         # a new list (one id fewer): a new state, its callables forgotten
            ids, u, b, c = ids[1:], u[1:], b[1:], c[1:]
            for w in (world, twin):
                w.step(remove_ids=ids[:0] + 3)
        twin._listed_calls.clear()                   # (and the last one kept beside them)
        twin._listed_last = (None, 0, 0)
        got, want = world.step(update_ids=u, update_boxes=b), twin.step(update_ids=u, update_boxes=b)
        assert np.array_equal(got.created, want.created) and np.array_equal(got.deleted, want.deleted), f
        assert got.stats.pairs == want.stats.pairs
        for side in (got.created, got.deleted):      # (an empty side comes back from the call as None)
            assert side.dtype == np.uint64 and side.shape == (side.shape[0], 2) and side.flags.writeable
        assert got.created is not got.deleted
        empty += (got.created.shape[0] == 0) + (got.deleted.shape[0] == 0)
        if f == 21:         # (frame 20 is the new list's first: the general phases)
            assert len(world._listed_calls) == 1, world._listed_calls
        if f > 20:
            seen.add((u.flags.writeable, u.flags.aligned, b.flags.writeable, b.flags.aligned))
            flags.add((u.flags.num, b.flags.num))
            # the frame's callable is kept as the last one, with its arrays' flags
            assert world._listed_last == (world._listed_calls[True, u.flags.num, b.flags.num], u.flags.num,
                                          b.flags.num)
    assert np.array_equal(world.pairs(), twin.pairs())
    assert 0 < empty < 80, empty
    assert len(seen) == 9
    calls = world._listed_calls
    assert len(calls) == len(flags), (calls, flags)
    if not numba.config.DISABLE_JIT:     # one specialization for each kind of arrays (numba types every array
        # as aligned: read-only or not, twice)
        assert len({id(call) for call in calls.values()}) == len({(s[0], s[2]) for s in seen}) == 4
    for call in calls.values():
        if numba.config.DISABLE_JIT:
            assert call is kframe.frame_listed_held
        else:       # a compiled entry, not the dispatcher
            assert call is not kframe.frame_listed_held and call is not kframe.frame_listed, call


def test_a_small_world_calls_its_last_callable_until_a_new_state_forgets_it():
    """A small world's listed frames (fewer than ``parallel.HOLD_GIL_BELOW`` updates) call the callable of
    the last one (``World._listed_last``) while their arrays' flags are the same; a new list of ids of 2**32
    and more (kept as uint64: a state of another type) forgets it, and every frame stays exact against the
    oracle, before and after, with read-only arrays between writable ones."""
    import numba

    from core_harness import Twin
    from sapcore import WorldConfig

    compile_one_call_frames()
    rng = np.random.default_rng(5)
    n = 150
    t = Twin(WorldConfig(dims=2, bounds=(0.0, 0.0, 40.0, 40.0), cells=(4, 4), threads=1), queries_per_frame=1)
    ids = np.arange(n, dtype=np.uint64) * 3 + 1
    c = rng.uniform(0, 40, (n, 2)).astype(np.float32)
    t.step(add_ids=ids, add_boxes=np.concatenate([c - 1, c + 1], 1))
    types, before = set(), None
    for f in range(24):
        if f == 12:     # a new list: ids of 2**32 and more appended, the list's ids uint64 from here on
            big = np.array([2**33 + 5, 2**40], np.uint64)
            t.step(add_ids=big, add_boxes=np.array([[1, 1, 3, 3], [2, 2, 4, 4]], np.float32))
            ids, c = np.concatenate([ids, big]), np.concatenate([c, [[2, 2], [3, 3]]]).astype(np.float32)
        c = np.clip(c + rng.normal(0, 0.6, c.shape).astype(np.float32), 0, 40)
        u, b = ids.copy(), np.concatenate([c - 1, c + 1], 1)
        if f in (3, 4, 8, 15, 16, 20):     # (the frames around the new list's: writable arrays, as frame 11's)
            u.flags.writeable = b.flags.writeable = False
        t.step(update_ids=u, update_boxes=b)
        call, uflags, bflags = t.world._listed_last
        if f not in (0, 12):      # (the first frame of a list makes it: the general phases)
            assert (uflags, bflags) == (u.flags.num, b.flags.num) and call is not None
            types.add(t.world.update_list.ids.dtype)
            if not numba.config.DISABLE_JIT:
                assert call is not kframe.frame_listed_held, "a compiled entry, not the dispatcher"
                if f == 11:
                    before = call
                elif f > 12:       # the new state's own specialization, not the one kept for the old state
                    assert call is not before
    assert types == {np.dtype(np.uint32), np.dtype(np.uint64)}


def test_a_one_call_frame_reports_the_stats_of_the_general_phases(monkeypatch):
    """A small frame of the last list's updates runs whole in one call (``World.step``'s own path): its
    delta and stats are those the general phases give the same frame (objects, pairs, created, deleted,
    endpoint swaps, cells touched, overflows; a twin world whose frames all take the general phases), its
    engine time all in apply_s, with pairs starting and ending or none (boxes moved a hair); a still frame
    (the last boxes again) reports its objects and pairs and no work."""
    from sapcore import World, WorldConfig, parallel

    compile_one_call_frames()
    rng = np.random.default_rng(11)
    n = 200
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 40.0, 40.0), cells=(3, 3), threads=1)
    world, twin = World(cfg), World(cfg)
    ids = np.arange(n, dtype=np.uint64) * 5 + 2
    c = rng.uniform(0, 40, (n, 2)).astype(np.float32)
    boxes = np.concatenate([c - 1, c + 1], 1)
    for w in (world, twin):
        w.step(add_ids=ids, add_boxes=boxes)
    fields = ("objects", "pairs", "created", "deleted", "swaps", "cells_touched", "cell_overflows")
    one_call = changed = unchanged = still = 0
    for f in range(40):
        moving = f % 5 != 4                     # every fifth frame: the last boxes again; every fifth but
        if moving:                              # two, moves too small to start or end a pair
            c = np.clip(c + rng.normal(0, 1e-4 if f % 5 == 2 else 0.4, c.shape).astype(np.float32), 0, 40)
            boxes = np.concatenate([c - 1, c + 1], 1)
        got = world.step(update_ids=ids, update_boxes=boxes)
        with monkeypatch.context() as m:
            m.setattr(parallel, "MIN_OPS", 0)   # no frame is small: the general phases
            want = twin.step(update_ids=ids, update_boxes=boxes)
        assert np.array_equal(got.created, want.created) and np.array_equal(got.deleted, want.deleted), f
        g, w = got.stats, want.stats
        assert [getattr(g, k) for k in fields] == [getattr(w, k) for k in fields], (f, g, w)
        assert g.objects == n and g.pairs == len(world.pairs())
        if f < 2:           # (the list's first frames may take the general phases)
            continue
        assert w.validate_s > 0.0, (f, w)
        if moving and g.rasterize_s == 0.0:     # whole in one call: its seconds all in apply_s
            assert g.validate_s == g.merge_s == 0.0 and 0.0 < g.apply_s == g.total_s, (f, g)
            one_call += 1
            changed += g.created + g.deleted > 0
            unchanged += g.created + g.deleted == 0 and g.swaps > 0
        elif moving:        # (the call stopped where Python must make room; the general phases went on)
            assert g.rasterize_s > 0.0 and g.total_s >= g.apply_s > 0.0, (f, g)
        else:
            assert g.swaps == g.cells_touched == g.created == g.deleted == 0, (f, g)
            assert 0.0 < g.validate_s == g.total_s, (f, g)
            still += 1
    assert one_call >= 20 and changed >= 10 and unchanged >= 5 and still == 8, (one_call, changed, unchanged, still)
    assert world.frames == twin.frames and np.array_equal(world.pairs(), twin.pairs())
