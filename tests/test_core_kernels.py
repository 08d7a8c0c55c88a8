"""Unit tests of sapcore's hash kernels: the pair set (open addressing over one dense pair array),
the id map, and the per-frame netting of pair events (a pair added and removed within one frame is
never reported; a persisting pair is never reported again)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sapcore
from sapcore.kernels import idmap as kid
from sapcore.kernels import merge as kmerge
from sapcore.kernels import pair_set as kps
from sapcore.kernels.hashing import EVENT_REMOVED, capacity_for


@pytest.mark.parametrize("count,cap", [(0, 16), (7, 16), (8, 32), (15, 32), (16, 64), (33, 128)])
def test_capacity_keeps_load_at_most_half(count, cap):
    assert capacity_for(count) == cap
    assert 2 * count < capacity_for(count)


def _pair_set(cap, base=0):
    slots = np.full(base + cap, -1, np.int32)
    keys = np.zeros(base // 2 + cap // 2, np.uint64)
    pay = np.zeros(base // 2 + cap // 2, np.int32)
    return slots, keys, pay


def _check_dense(slots, keys, sb, cap, pb, n, expect):
    live = set(keys[pb:pb + n].tolist())
    assert live == expect and len(live) == n
    used = slots[sb:sb + cap]
    assert sorted(used[used >= 0].tolist()) == list(range(n)), "every pair has exactly one slot"
    for p in range(n):
        assert kps.pair_set_find(slots, keys, sb, cap, pb, keys[pb + p]) == p


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=200), st.sampled_from([0, 64]))
def test_pair_set_matches_a_python_set(ops, base):
    cap = 128
    slots, keys, pay = _pair_set(cap, base)
    sb, pb, n, expect = base, base // 2, 0, set()
    for add, k in ops:
        key = np.uint64((k % 7) << 32 | (k + 100))   # clustered keys: long probe runs
        present = kps.pair_set_find(slots, keys, sb, cap, pb, key) >= 0
        assert present == (int(key) in expect)
        if add and not present:
            n = kps.pair_set_insert(slots, keys, pay, sb, cap, pb, n, key, np.int32(k))
            expect.add(int(key))
        elif not add and present:
            i = kps.pair_set_find_slot(slots, keys, sb, cap, pb, key)
            n = kps.pair_set_remove_slot(slots, keys, pay, sb, cap, pb, n, i)
            expect.discard(int(key))
        _check_dense(slots, keys, sb, cap, pb, n, expect)
    # payloads travel with their keys when the last pair fills a hole
    for p in range(n):
        assert int(keys[pb + p]) & 0xFFFFFFFF == int(pay[pb + p]) + 100
    assert (slots[:base] == -1).all(), "nothing written outside the set's region"


def test_pair_set_rehash_keeps_every_pair():
    slots, keys, pay = _pair_set(64)
    n = 0
    for k in range(20):
        n = kps.pair_set_insert(slots, keys, pay, 0, 64, 0, n, np.uint64(k * 977), np.int32(0))
    big = np.full(128, -1, np.int32)
    bkeys = np.zeros(64, np.uint64)
    bkeys[:n] = keys[:n]
    kps.pair_set_rehash(big, bkeys, 0, 128, 0, n)
    _check_dense(big, bkeys, 0, 128, 0, n, {k * 977 for k in range(20)})


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=60), st.data())
def test_idmap_insert_find_remove(ids, data):
    cap = capacity_for(len(ids))
    keys = np.zeros(cap, np.uint64)
    vals = np.full(cap, -1, np.int32)
    arr = np.array(ids, np.uint64)
    kid.idmap_insert_many(keys, vals, arr, np.arange(len(ids), dtype=np.int32))
    gone = data.draw(st.sets(st.sampled_from(ids))) if ids else set()
    kid.idmap_remove_many(keys, vals, np.array(sorted(gone), np.uint64))
    out = np.empty(len(ids), np.int32)
    kid.idmap_find_many(keys, vals, arr, out)
    for i, k in enumerate(ids):
        assert out[i] == (-1 if k in gone else i)
    assert (vals >= 0).sum() == len(ids) - len(gone)


def _net(events, state):
    """Run cell_net on one cell whose pair set holds ``state``; return (created, deleted, new state)."""
    cap = 64
    slots, keys, flags = np.full(cap, -1, np.int32), np.zeros(cap // 2, np.uint64), np.zeros(cap // 2, np.uint8)
    n = 0
    for k in sorted(state):
        n = kps.pair_set_insert(slots, keys, flags, 0, cap, 0, n, np.uint64(k), kmerge.ACTIVE)
    ev = np.array([np.uint64(k) | (EVENT_REMOVED if not add else np.uint64(0)) for add, k in events], np.uint64)
    n, o = kmerge.cell_net(ev, 0, len(ev), slots, keys, flags, 0, cap, n)
    out = ev[:o]
    created = {int(k) for k in out if not (k & EVENT_REMOVED)}
    deleted = {int(k & ~EVENT_REMOVED) for k in out if k & EVENT_REMOVED}
    assert np.all(flags[:n] == kmerge.ACTIVE)
    return created, deleted, set(keys[:n].tolist())


def test_net_reports_only_changes_that_persist():
    # added then removed within the frame: nothing; removed then re-added: nothing
    assert _net([(True, 5), (False, 5)], set()) == (set(), set(), set())
    assert _net([(False, 7), (True, 7)], {7}) == (set(), set(), {7})
    # a real add and a real removal, and a flip-flop that ends removed
    assert _net([(True, 1), (False, 2), (False, 3), (True, 3), (False, 3)], {2, 3, 9}) == ({1}, {2, 3}, {1, 9})
    # added, removed, added again: created once
    assert _net([(True, 4), (False, 4), (True, 4)], set()) == ({4}, set(), {4})


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.sets(st.integers(1, 12)), st.lists(st.integers(1, 12), max_size=40))
def test_net_equals_the_difference_of_states(before, toggles):
    """Any consistent event sequence nets to exactly (after - before, before - after)."""
    live = set(before)
    events = []
    for k in toggles:
        events.append((k not in live, k))
        live ^= {k}
    created, deleted, state = _net(events, before)
    assert created == live - before
    assert deleted == before - live
    assert state == live


@pytest.mark.parametrize("ascending", [False, True])
@pytest.mark.parametrize("cells", [(4, 3, 1), (64, 64, 1), (3, 2, 2)])
def test_spatial_order_gives_handles_in_grid_order(cells, ascending):
    """New objects get their handles in the grid order of their min corners (both sort paths), each
    handle exactly once, frame order kept inside a cell; coordinates far outside the bounds wrap.
    ascending: fresh handles in order, as a batch insert reserves them (handed out without sorting)."""
    from sapcore.kernels import grid as kgrid
    rng = np.random.default_rng(sum(cells))
    dims = 3 if cells[2] > 1 else 2
    C = np.array(cells, np.int64)
    bmin = np.zeros(3)
    inv = np.ones(3)
    inv[:dims] = C[:dims] / 10.0
    n = 200
    lo = rng.uniform(-25.0, 35.0, (n, dims)).astype(np.float32)
    lo[0] = 1e30                                     # clamped, then wrapped: still some cell
    boxes = np.concatenate([lo, lo + 1], 1).astype(np.float32)
    handles = np.arange(1000, 1000 + 3 * n, 3).astype(np.int32)
    if not ascending:
        handles = rng.permutation(handles)
    given_h = handles.copy()
    crange = np.zeros((4000, 6), np.int16)
    kgrid.spatial_order(dims, bmin, inv, C, boxes, handles, crange, 0)        # all fresh
    assert sorted(handles.tolist()) == sorted(given_h.tolist())
    q = np.zeros((n, 3), np.int64)
    q[:, :dims] = np.floor(np.clip(lo.astype(np.float64) * inv[:dims], -4e18, 4e18)).astype(np.int64) % C[:dims]
    key = (q[:, 0] * C[1] + q[:, 1]) * C[2] + q[:, 2]
    order = np.argsort(key, kind="stable")
    assert (np.diff(handles[order]) > 0).all()


def test_spatial_order_hands_reused_handles_out_by_their_last_cell():
    """Reused handles go to the new objects in the grid order of the cells their last objects were in,
    fresh ones after them in ascending order: a new object inherits a handle from about its place."""
    from sapcore.kernels import grid as kgrid
    C = np.array([4, 1, 1], np.int64)
    bmin, inv = np.zeros(3), np.array([1.0, 1.0, 1.0])
    crange = np.zeros((20, 6), np.int16)
    crange[[3, 9, 5], 0] = [2, 0, 3]                 # handles 3, 9, 5 were last in cells 2, 0, 3
    boxes = np.array([[3.5, 0, 3.6, 0.1], [0.2, 0, 0.3, 0.1], [2.2, 0, 2.3, 0.1], [1.5, 0, 1.6, 0.1]],
                     np.float32)                    # new objects in cells 3, 0, 2, 1
    handles = np.array([3, 9, 5, 17], np.int32)     # 17 is fresh (>= 10)
    kgrid.spatial_order(2, bmin, inv, C, boxes, handles, crange, 10)
    # the new objects in cell order: row 1 (cell 0), row 3 (cell 1), row 2 (cell 2), row 0 (cell 3);
    # the handles in the order of their last cells: 9 (cell 0), 3 (cell 2), 5 (cell 3), then fresh 17
    assert handles.tolist() == [17, 9, 5, 3]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(0, 63))
def test_radix_sort_equals_numpy_sort(values, shift):
    """sort_u64 (the radix sort of large deltas' id pairs): numpy's order for any keys, duplicates, the
    largest keys, and keys of few bits (fewer passes)."""
    a = np.array(values, np.uint64) >> np.uint64(shift)
    given_a = a.copy()
    out = kmerge.sort_u64(a)
    assert np.array_equal(out, np.sort(a)) and np.array_equal(a, given_a)


def test_id_pairs_sorted_are_the_sorted_id_pairs_of_the_keys():
    """Handle-pair keys -> their ids (keys_to_ids) -> sorted (low id, high id) rows by the radix sort; an id
    beyond 32 bits is reported by keys_to_ids (the caller sorts those pairs otherwise)."""
    rng = np.random.default_rng(5)
    n, k = 5000, 20000
    obj_id = rng.permutation(np.arange(10, 10 + 3 * n, 3)).astype(np.uint64)
    a, b = rng.integers(0, n, k), rng.integers(0, n, k)
    keys = (np.maximum(a, b).astype(np.uint64) << np.uint64(32)) | np.minimum(a, b).astype(np.uint64)
    lo, hi, out = np.empty(k, np.uint64), np.empty(k, np.uint64), np.zeros((k, 2), np.uint64)
    assert kmerge.keys_to_ids(keys, obj_id, lo, hi, True)
    kmerge.id_pairs_sorted(lo, hi, out)
    lo2, hi2 = np.minimum(obj_id[a], obj_id[b]), np.maximum(obj_id[a], obj_id[b])
    order = np.lexsort((hi2, lo2))
    assert np.array_equal(out, np.stack([lo2[order], hi2[order]], 1))
    obj_id[int(a[7])] = np.uint64(2**40)
    assert not kmerge.keys_to_ids(keys, obj_id, lo, hi, False)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), max_size=300),
       st.integers(0, 32))
def test_id_pairs_sorted_packs_by_the_largest_ids_bits(pairs, shift):
    """id_pairs_sorted packs each pair by the bits of the largest id (2 x 1 to 2 x 32 bits, 0 to 6 passes):
    the pairs in (low id, high id) order for ids of any width, duplicates and ids of 0 and 2**32 - 1; the
    ids of keys_to_ids are the same with and without its requests ahead."""
    a = np.array([p[0] for p in pairs], np.uint64) >> np.uint64(shift)
    b = np.array([p[1] for p in pairs], np.uint64) >> np.uint64(shift)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    out = np.zeros((lo.shape[0], 2), np.uint64)
    kmerge.id_pairs_sorted(lo, hi, out)
    order = np.lexsort((hi, lo))
    assert np.array_equal(out, np.stack([lo[order], hi[order]], 1).reshape(-1, 2))
    obj_id = np.concatenate([a, b])
    k = a.shape[0]
    keys = (np.arange(k, dtype=np.uint64) << np.uint64(32)) | (np.arange(k, 2 * k, dtype=np.uint64))
    got = [np.empty(k, np.uint64) for _ in range(4)]
    assert kmerge.keys_to_ids(keys, obj_id, got[0], got[1], True)
    assert kmerge.keys_to_ids(keys, obj_id, got[2], got[3], False)
    assert np.array_equal(got[0], lo) and np.array_equal(got[1], hi)
    assert np.array_equal(got[2], lo) and np.array_equal(got[3], hi)


def test_row_prefetches_ask_for_reading_or_for_writing():
    """``prefetch_row_read`` emits LLVM's prefetch for reading (rw 0: no request for the line's ownership),
    ``prefetch_row`` for writing (rw 1); neither changes the array."""
    import re

    from numba import njit

    from sapcore.kernels.prefetch import prefetch_row, prefetch_row_read

    @njit
    def touch(a, rows, write):
        for r in rows:
            if write:
                prefetch_row(a, r)
            else:
                prefetch_row_read(a, r)
        return a.sum()

    a = np.arange(40, dtype=np.uint32).reshape(10, 4)
    before = a.copy()
    assert touch(a, np.array([0, 9, 3]), True) == before.sum()
    assert touch(a, np.array([5]), False) == before.sum()
    assert np.array_equal(a, before)
    ir = "".join(touch.inspect_llvm().values())
    kinds = re.findall(r"call void @llvm\.prefetch[.\w]*\([^,()]+, i32 (\d), i32 3, i32 1\)", ir)
    assert sorted(set(kinds)) == ["0", "1"], kinds


@pytest.mark.parametrize("own", [None, "category", "mask", "static"])
def test_objects_admit_answers_own_filters_and_release_undoes_it(own):
    n, cap = 6, 32
    keys, vals = np.zeros(16, np.uint64), np.full(16, -1, np.int32)
    ids = np.arange(500, 500 + n, dtype=np.uint64) * np.uint64(977)
    h = np.array([9, 2, 7, 0, 4, 11], np.int32)
    cat, mask, static = np.full(n, 0xFFFFFFFF, np.uint32), np.full(n, 0xFFFFFFFF, np.uint32), np.zeros(n, np.uint8)
    if own is not None:
        {"category": cat, "mask": mask, "static": static}[own][n - 1] = 1    # the last one only
    obj_id, obj_cat, obj_mask = np.zeros(cap, np.uint64), np.zeros(cap, np.uint32), np.zeros(cap, np.uint32)
    obj_static, alive = np.zeros(cap, np.uint8), np.zeros(cap, np.uint8)
    got = kid.objects_admit(keys, vals, ids, h, cat, mask, static, obj_id, obj_cat, obj_mask, obj_static, alive)
    assert bool(got) == (own is not None)
    assert np.array_equal(obj_id[h], ids) and np.array_equal(obj_cat[h], cat) and np.array_equal(obj_mask[h], mask)
    assert np.array_equal(obj_static[h], static) and alive.sum() == n and alive[h].all()
    kid.objects_release(keys, vals, ids[1:4], h[1:4], alive)
    out = np.empty(n, np.int32)
    kid.idmap_find_many(keys, vals, ids, out)
    assert list(out) == [9, -1, -1, -1, 4, 11]
    assert alive.sum() == n - 3 and not alive[h[1:4]].any()


def test_a_borrowed_field_is_the_records_array_without_a_reference_of_its_own():
    """``borrowed(st, "name")`` reads a ``ListedState``'s field as the record holds it: the same memory
    (a write through it lands in the world's array), numbers as they are, and no owner: returned to Python
    (which a kernel never does with it), the array owns nothing and has no base, where the attribute read
    is a reference of its own to the world's array (numba hands back that array itself). An unknown field
    or a name that is not a literal does not compile."""
    import numba
    from numba import njit

    from sapcore.kernels.borrow import borrowed
    from sapcore.world_pairs import SHARDS

    world = sapcore.World(sapcore.WorldConfig(dims=2, bounds=(0, 0, 100, 100), cells=(2, 2), threads=1))
    ids = np.arange(5, dtype=np.uint64)
    boxes = np.array([[i, i, i + 1, i + 1] for i in range(5)], np.float32)
    world.step(add_ids=ids, add_boxes=boxes)
    world.step(update_ids=ids, update_boxes=boxes + 1)
    world.step(update_ids=ids, update_boxes=boxes + 2)     # a small frame of the list: its record is kept
    st = world._listed
    assert st is not None

    @njit
    def borrowed_boxes(st):
        return borrowed(st, "boxes")

    @njit
    def counted_boxes(st):
        return st.boxes

    @njit
    def write_and_read(st, h, v):
        b = borrowed(st, "boxes")
        b[h, 0] = v
        return borrowed(st, "dims"), borrowed(st, "shards"), borrowed(st, "list_ids").sum()

    got, counted = borrowed_boxes(st), counted_boxes(st)
    assert np.shares_memory(got, world.objects.box) and np.array_equal(got, world.objects.box)
    if not numba.config.DISABLE_JIT:
        assert got is not world.objects.box and got.base is None and not got.flags.owndata
        assert counted is world.objects.box
    h = int(world.update_list.handles[0])
    dims, shards, total = write_and_read(st, h, np.float32(1.5))
    assert world.objects.box[h, 0] == np.float32(1.5)
    assert (dims, shards, total) == (2, SHARDS, int(ids.sum()))

    if not numba.config.DISABLE_JIT:
        @njit
        def unknown(st):
            return borrowed(st, "no_such_field")

        @njit
        def not_literal(st, name):
            return borrowed(st, name)

        with pytest.raises(numba.core.errors.TypingError):
            unknown(st)
        with pytest.raises(numba.core.errors.TypingError):
            not_literal(st, "boxes")
