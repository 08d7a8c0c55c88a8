"""Internal invariants of a World, checked by tests after every frame (Box2D's b2Validate*).

``check_world`` calls each owner's own check (objects, update list, arenas, world pair table) and
checks what ties them together: the cells' contents against the objects' cell ranges, and the world's
pair counts against the cells' pair sets.
"""
import numpy as np

from .kernels import arena as karena
from .kernels import grid as kgrid
from .kernels import merge as kmerge
from .kernels.pair_set import pair_set_find


def _decode(enc):
    """float32 values of encoded endpoint values (the inverse of ``sap_cell.encode``)."""
    enc = enc.astype(np.uint32)
    bits = np.where(enc & np.uint32(0x80000000), enc & np.uint32(0x7FFFFFFF), ~enc)
    return bits.astype(np.uint32).view(np.float32)


def _check_cell_ranges(world) -> None:
    """Every live object's cell range is its box's (``kernels.grid._cell_span`` on each axis): the
    big listed frame's ranges pass reads an object's old range from its old box."""
    C, o, d = world._C, world.objects, world.dims
    live = np.flatnonzero(o.alive[:o.next_handle])
    box = o.box[live].astype(np.float64)
    want = np.zeros((live.shape[0], 6), np.int64)
    for a in range(d):
        lo, hi = ((np.clip((box[:, k] - world._bmin[a]) * world._inv[a], -kgrid._CLAMP, kgrid._CLAMP))
                  for k in (a, d + a))
        lo, hi = np.floor(lo).astype(np.int64), np.floor(hi).astype(np.int64)
        want[:, 3 + a] = np.minimum(hi - lo, C[a] - 1)
        want[:, a] = lo % C[a]
    bad = np.flatnonzero((o.crange[live] != want).any(axis=1))
    assert bad.shape[0] == 0, f"object {int(o.id[live[bad[0]]])}: cell range {o.crange[live[bad[0]]]} is not its box's"


def _expected_members(world) -> dict:
    """cell -> the live handles whose cell range covers it."""
    C, objects = world._C, world.objects
    expect = {}
    for h in np.flatnonzero(objects.alive[:objects.next_handle]):
        r = objects.crange[h]
        for i in range(r[3] + 1):
            for j in range(r[4] + 1):
                for k in range(r[5] + 1):
                    c = (((r[0] + i) % C[0]) * C[1] + (r[1] + j) % C[1]) * C[2] + (r[2] + k) % C[2]
                    expect.setdefault(int(c), []).append(int(h))
    return expect


def _check_cell_sap(world, c: int, members: np.ndarray) -> None:
    """Endpoint keys sorted by (value, is_max) behind a zero sentinel, with the boxes' current values,
    agreeing with the recorded positions."""
    sap, d, box = world.sap, world.dims, world.objects.box
    _, bx_pos, ep_key = sap.arrays
    n, base = int(sap.n[c]), int(sap.base[c])
    for a in range(d):
        key = ep_key[a, 2 * base:2 * base + 2 * n + 1]
        assert key[0] == 0, f"cell {c} axis {a}: sentinel"
        order = key[1:] >> np.uint64(31)                      # (encoded value, is_max)
        assert np.all(order[:-1] <= order[1:]), f"cell {c} axis {a}: endpoints not sorted"
        m = (order & np.uint64(1)).astype(np.int64)
        v = _decode(key[1:] >> np.uint64(32))
        slot = (key[1:] & np.uint64(0x7FFFFFFF)).astype(np.int64)
        assert np.array_equal(bx_pos[base + slot, 2 * a + m], np.arange(1, 2 * n + 1)), f"cell {c} axis {a}: positions"
        boxes = box[members[slot]]
        assert np.array_equal(v, np.where(m == 0, boxes[:, a], boxes[:, d + a]) + np.float32(0.0)), \
            f"cell {c} axis {a}: stale endpoint values"


def _check_cell_pairs(world, c: int) -> np.ndarray:
    """The cell's pair set equals its pairs recomputed from scratch, all active, hashed; returns its keys."""
    sap, ps, o = world.sap, world.pair_sets, world.objects
    args = (c, world.dims, o.cat, o.mask, o.static, sap.n, sap.base, *sap.arrays)
    full = np.empty(karena.cell_all_pairs(*args, np.empty(0, np.uint64), 0), np.uint64)
    karena.cell_all_pairs(*args, full, 0)
    slots, keys_all, flags = ps.arrays
    pn, pb = int(ps.n[c]), int(ps.base[c]) // 2
    keys = keys_all[pb:pb + pn]
    assert np.array_equal(np.sort(keys), np.sort(full)), f"cell {c}: pair set differs from its SAP"
    assert np.all(flags[pb:pb + pn] == kmerge.ACTIVE), f"cell {c}: pair flags"
    assert 2 * pn <= ps.cap[c] or pn == 0, f"cell {c}: pair set load factor"
    for p in range(pn):
        assert pair_set_find(slots, keys_all, int(ps.base[c]), int(ps.cap[c]), pb, keys[p]) == p, \
            f"cell {c}: pair hash"
    return keys


def check_world(world) -> None:
    """Check every internal invariant; raise AssertionError on the first one broken (tests only).

    Every live object's cell range is its box's; each cell holds exactly the live objects whose cell range
    covers it, its SAP is consistent and its pair set holds exactly the cell's overlapping, allowed pairs;
    the world counts per pair the cells holding it, and holds no other pair.
    """
    world.objects.check()
    world.update_list.check(world.objects)
    world.sap.check()
    world.pair_sets.check()
    _check_cell_ranges(world)
    expect = _expected_members(world)
    bx_h = world.sap.arrays[0]
    counts: dict = {}
    for c in range(world.n_cells):
        n, base = int(world.sap.n[c]), int(world.sap.base[c])
        members = bx_h[base:base + n]
        assert sorted(members.tolist()) == sorted(expect.get(c, [])), f"cell {c}: members"
        if n:
            _check_cell_sap(world, c, members)
        for key in _check_cell_pairs(world, c).tolist():
            counts[key] = counts.get(key, 0) + 1
    world.world_pairs.check(counts)
