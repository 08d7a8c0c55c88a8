"""Internal invariants of a World, checked by tests after every frame (Box2D's b2Validate*)."""
import numpy as np

from .kernels import arena as karena
from .kernels import idmap as kid
from .kernels import merge as kmerge


def _decode(enc):
    """float32 values of encoded endpoint values (the inverse of ``sap_cell.encode``)."""
    enc = enc.astype(np.uint32)
    bits = np.where(enc & np.uint32(0x80000000), enc & np.uint32(0x7FFFFFFF), ~enc)
    return bits.astype(np.uint32).view(np.float32)


def check_world(world) -> None:
    """Check every internal invariant; raise AssertionError on the first one broken (tests only).

    Invariant: each cell holds exactly the live objects whose cell range covers it; its endpoint keys
    are sorted by (value, is_max) behind a zero sentinel, carry the boxes' current values and agree
    with the recorded positions; its pair set holds exactly the cell's overlapping, allowed pairs, all
    active; the world counts per pair the cells holding it, and holds no other pair.
    """
    d = world.dims
    C = world._C
    hmax = world._next_handle
    alive = np.flatnonzero(world._obj_alive[:hmax])
    assert alive.shape[0] == world.object_count, "object count"
    assert not world._obj_flag[:hmax].any(), "frame flags left set"
    for h in alive:
        assert kid.idmap_find(world._idk, world._idv, world._obj_id[h]) == h, f"id map of handle {h}"
    # the list that guides the next frame's handles: live objects, and their boxes by row when kept
    last_h = world._last_h
    assert last_h.shape == world._last_ids.shape, "guide list: ids and handles"
    assert np.all(world._obj_alive[last_h] == 1), "guide list: an object no longer live"
    assert np.array_equal(world._obj_id[last_h], world._last_ids), "guide list: ids of its handles"
    assert np.array_equal(world._obj_lastpos[last_h], np.arange(last_h.shape[0])), "guide list: positions"
    if world._last_boxes is not None:
        assert np.array_equal(world._last_boxes, world._obj_box[last_h]), "guide list: boxes by row"
    # expected members of every cell, from the objects' cell ranges
    expect = {}
    for h in alive:
        r = world._obj_crange[h]
        for i in range(r[3] + 1):
            for j in range(r[4] + 1):
                for k in range(r[5] + 1):
                    c = (((r[0] + i) % C[0]) * C[1] + (r[1] + j) % C[1]) * C[2] + (r[2] + k) % C[2]
                    expect.setdefault(int(c), []).append(int(h))
    counts = {}
    for c in range(world.n_cells):
        n = int(world._cell_n[c])
        assert n <= world._cell_cap[c], f"cell {c}: {n} boxes over capacity {world._cell_cap[c]}"
        base = int(world._cell_base[c])
        members = world._bx_h[base:base + n]
        assert sorted(members.tolist()) == sorted(expect.get(c, [])), f"cell {c}: members"
        eb = 2 * base
        for a in range(d):
            key = world._ep_key[a, eb:eb + 2 * n + 1]
            if n == 0:
                continue
            assert key[0] == 0, f"cell {c} axis {a}: sentinel"
            order = key[1:] >> np.uint64(31)                      # (encoded value, is_max)
            assert np.all(order[:-1] <= order[1:]), f"cell {c} axis {a}: endpoints not sorted"
            m = (order & np.uint64(1)).astype(np.int64)
            v = _decode(key[1:] >> np.uint64(32))
            slot = (key[1:] & np.uint64(0x7FFFFFFF)).astype(np.int64)
            pos = np.arange(1, 2 * n + 1)
            assert np.array_equal(world._bx_pos[base + slot, 2 * a + m], pos), f"cell {c} axis {a}: positions"
            boxes = world._obj_box[members[slot]]
            assert np.array_equal(v, np.where(m == 0, boxes[:, a], boxes[:, d + a]) + np.float32(0.0)), \
                f"cell {c} axis {a}: stale endpoint values"
        # the pair set equals the cell's pairs recomputed from scratch
        k = karena.cell_all_pairs(c, d, world._obj_cat, world._obj_mask, world._obj_static, world._cell_n,
                                  world._cell_base, world._bx_h, world._bx_pos, world._ep_key,
                                  np.empty(0, np.uint64), 0)
        full = np.empty(k, np.uint64)
        karena.cell_all_pairs(c, d, world._obj_cat, world._obj_mask, world._obj_static, world._cell_n,
                              world._cell_base, world._bx_h, world._bx_pos, world._ep_key, full, 0)
        pn = int(world._cell_pm_n[c])
        pb = int(world._cell_pm_base[c]) // 2
        keys = world._pm_keys[pb:pb + pn]
        assert np.array_equal(np.sort(keys), np.sort(full)), f"cell {c}: pair set differs from its SAP"
        assert np.all(world._pm_flag[pb:pb + pn] == kmerge.ACTIVE), f"cell {c}: pair flags"
        assert 2 * pn <= world._cell_pm_cap[c] or pn == 0, f"cell {c}: pair set load factor"
        for p in range(pn):
            assert kmerge.pair_set_find(world._pm_slots, world._pm_keys, int(world._cell_pm_base[c]),
                                        int(world._cell_pm_cap[c]), pb, keys[p]) == p, f"cell {c}: pair hash"
        for key in keys.tolist():
            counts[key] = counts.get(key, 0) + 1
    assert len(counts) == world._gn == int(world._g_n.sum()), "world pair count"
    cap = world._g_cap
    assert 2 * int(world._g_n.max()) < cap, "world pair table load factor"
    for s in range(world._g_n.shape[0]):
        pb = s * (cap // 2)
        for p in range(int(world._g_n[s])):
            key = world._g_keys[pb + p]
            assert kmerge.world_shard(key, world._g_n.shape[0]) == s, f"shard of pair {int(key):#x}"
            assert counts.get(int(key)) == int(world._g_cnt[pb + p]), f"world count of pair {int(key):#x}"
            assert kmerge.pair_set_find(world._g_slots, world._g_keys, s * cap, cap, pb, key) == p, "world hash"
