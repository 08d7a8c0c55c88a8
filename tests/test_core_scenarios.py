"""Scenario tests of sapcore.World against the brute-force oracle: adversarial hand-made scenes (touching
lattices on cell borders, the wrap seam, aliasing, identical and zero-size boxes, huge boxes, float32
rounding, filters and static flags) and seeded random scenes over many grid shapes, with determinism
across thread counts. Every ``Twin.step`` checks pairs, delta invariants, validate(), counts and queries.
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import weakref

import numpy as np
import pytest

from core_harness import Twin, new_world
from core_scenes import SceneGen
from sapcore import WorldConfig

#: the NUMBA_DISABLE_JIT=1 coverage run runs the kernels as Python: the biggest scenes are made smaller
NO_JIT = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")


def cfg2(cells=(4, 4), bounds=(0.0, 0.0, 4.0, 4.0), threads=1):
    return WorldConfig(dims=2, bounds=bounds, cells=cells, threads=threads)


def cfg3(cells=(3, 3, 3), bounds=(0.0, 0.0, 0.0, 3.0, 3.0, 3.0), threads=2):
    return WorldConfig(dims=3, bounds=bounds, cells=cells, threads=threads)


def lattice(dims, n, side=1.0):
    """Unit boxes on an integer lattice of n per axis: neighbours share faces, edges and corners."""
    mins = np.array(list(itertools.product(range(n), repeat=dims)), np.float64) * side
    return np.concatenate([mins, mins + side], axis=1)


def assert_no_delta(delta, what):
    assert len(delta.created) == 0 and len(delta.deleted) == 0, \
        f"{what}: unexpected delta created={delta.created.tolist()[:5]} deleted={delta.deleted.tolist()[:5]}"


@pytest.mark.parametrize("cfg", [cfg2(), cfg2(cells=(3, 5)), cfg2(cells=(1, 1)), cfg2(cells=(1, 4)),
                                 cfg3(), cfg3(cells=(1, 2, 5))], ids=lambda c: f"{c.dims}d-{c.cells}")
def test_touching_lattice_moves_without_delta(cfg):
    """Boxes sharing faces/edges/corners pair; translating the whole scene (across cell borders, the wrap
    seam, whole-world and far-away aliases) keeps every pair, so no frame may report anything."""
    n = 4 if cfg.dims == 2 else 3
    boxes = lattice(cfg.dims, n)
    ids = np.arange(100, 100 + len(boxes), dtype=np.uint64)
    twin = Twin(cfg)
    twin.step(add_ids=ids, add_boxes=boxes)
    expect = {2: 2 * 12 + 2 * 9, 3: 3 * 18 + 6 * 12 + 4 * 8}[cfg.dims]  # faces, edges, corners
    assert len(twin.active) == expect
    size = np.asarray(cfg.bounds[cfg.dims:]) - np.asarray(cfg.bounds[: cfg.dims])
    cell = size / np.asarray(cfg.cells)
    for shift in [cell * 0.5, cell * 0.5, cell, size, -3 * size, size * 0 + 1.0e6, size * 0 - 2.0e6, size * 977]:
        boxes = boxes + np.tile(shift, 2)
        assert_no_delta(twin.step(update_ids=ids, update_boxes=boxes), f"shift by {shift.tolist()}")
    assert len(twin.active) == expect


@pytest.mark.parametrize("cfg", [cfg2(), cfg2(cells=(1, 1)), cfg3()], ids=lambda c: f"{c.dims}d-{c.cells}")
def test_identical_and_zero_size_boxes(cfg):
    d = cfg.dims
    twin = Twin(cfg)
    cube = np.array([1.0] * d + [2.0] * d)  # faces on cell borders
    point = np.array([2.0] * d * 2)  # on its max corner, on a cell corner
    twin.step(add_ids=np.arange(12), add_boxes=np.tile(cube, (12, 1)))
    twin.step(add_ids=np.arange(12, 24), add_boxes=np.tile(point, (12, 1)))
    assert len(twin.active) == 24 * 23 // 2
    twin.step(update_ids=np.arange(12), update_boxes=np.tile(point, (12, 1)))  # all points now
    assert len(twin.active) == 24 * 23 // 2
    nudged = point.astype(np.float32)
    nudged[:] = np.nextafter(np.float32(2.0), np.float32(3.0))  # one float32 ulp away
    twin.step(update_ids=[5], update_boxes=[nudged])
    assert len(twin.active) == 23 * 22 // 2
    twin.step(update_ids=[5], update_boxes=[point])
    assert len(twin.active) == 24 * 23 // 2


@pytest.mark.parametrize("cfg", [cfg2(), cfg2(cells=(2, 3), bounds=(-1.3, 0.7, 2.9, 5.1)), cfg3()],
                         ids=lambda c: f"{c.dims}d-{c.cells}")
def test_aliased_cells_do_not_make_pairs(cfg):
    """Boxes whole world sizes apart share every cell but do not overlap; far boxes still pair."""
    d = cfg.dims
    size = np.asarray(cfg.bounds[d:]) - np.asarray(cfg.bounds[:d])
    base = np.concatenate([np.asarray(cfg.bounds[:d]) + 0.25 * size] * 2) + np.r_[np.zeros(d), 0.2 * size]
    ks = [0, 1, -1, 2, 1000, -1000, 333333]
    boxes = np.array([base + np.tile(np.r_[k * size[0], np.zeros(d - 1)], 2) for k in ks])
    twin = Twin(cfg)
    twin.step(add_ids=np.arange(len(ks)) * 7, add_boxes=boxes)
    assert not twin.active
    twin.step(add_ids=[1], add_boxes=[np.r_[np.full(d, -1.0e9), np.full(d, 1.0e9)]])  # covers them all
    assert len(twin.active) == len(ks)
    twin.step(update_ids=[7], update_boxes=[boxes[0]])  # k=1 teleports onto k=0
    assert (0, 7) in twin.active
    twin.step(update_ids=[7, 1], update_boxes=[boxes[4] + 1.0e-3, boxes[4]])  # far: 1000 world sizes away
    assert (7, 28) in twin.active and (1, 7) in twin.active and (0, 1) not in twin.active


@pytest.mark.parametrize("cfg", [cfg2(cells=(5, 3)), cfg2(cells=(1, 1)), cfg3(cells=(2, 3, 1))],
                         ids=lambda c: f"{c.dims}d-{c.cells}")
def test_huge_boxes(cfg):
    d = cfg.dims
    rng = np.random.default_rng(3)
    twin = Twin(cfg, seed=3)
    gen = SceneGen(cfg, rng, adversarial=0.3, filters=False)
    twin.step(**gen.fill(twin.oracle, 80))
    lo, hi = np.asarray(cfg.bounds[:d]), np.asarray(cfg.bounds[d:])
    huge = [np.r_[lo, hi], np.r_[lo - 1.0e7, hi + 1.0e7], np.r_[lo - 10.0, lo + 0.01], np.r_[hi, hi + 5 * (hi - lo)]]
    ids = np.array([2**64 - 1, 2**63, 0, 1 << 40], np.uint64)
    twin.step(add_ids=ids, add_boxes=huge)
    for _ in range(4):
        twin.step(update_ids=ids, update_boxes=rng.permutation(np.array(huge)))
        f = gen.frame(twin.oracle, remove=0.0)
        if "update_ids" in f:  # the huge ones stay under this test's control
            keep = ~np.isin(f["update_ids"], ids)
            f["update_ids"], f["update_boxes"] = f["update_ids"][keep], f["update_boxes"][keep]
        twin.step(**f)
    twin.step(update_ids=ids, update_boxes=np.tile(np.r_[lo, lo], (4, 1)))  # shrink to points
    twin.step(update_ids=ids, update_boxes=huge)
    twin.step(remove_ids=ids)


def test_float32_rounding():
    """Boxes are compared as float32: float64 input that rounds onto a touching value pairs."""
    twin = Twin(cfg2(cells=(3, 3), bounds=(0.0, 0.0, 3.0, 3.0)))
    f01 = float(np.float32(0.1))  # 0.100000001490116...: above 0.1 in float64, equal in float32
    boxes = [
        [0.0, 0.0, 0.1, 1.0], [f01, 0.0, 1.0, 1.0],  # touch in float32 only
        [0.0, 1.0 + 1.0e-9, 1.0, 2.0],  # rounds down onto y = 1: touches 0 and 1
        [2.0, 2.0, 2.0 + 1.0e-9, 2.5], [2.0 + 3.0e-9, 2.0, 2.9, 2.5],  # both round to 2.0: touch
        [1.5, 0.0, float(np.nextafter(np.float32(1.75), np.float32(0.0))), 0.5], [1.75, 0.0, 2.0, 0.5],  # 1 ulp apart
    ]
    twin.step(add_ids=np.arange(7), add_boxes=np.array(boxes))
    assert twin.active == {(0, 1), (0, 2), (1, 2), (3, 4)}
    assert np.array_equal(twin.world.boxes([0]), np.array([boxes[0]], np.float32))


@pytest.mark.parametrize("dims", [2, 3])
def test_signed_zeros_and_negative_coordinates(dims):
    """-0.0 equals +0.0 (boxes touching at zero from either side pair, whichever zero each carries), and
    negative coordinates order below positive ones, on every axis, as boxes are added, moved and moved
    back across zero."""
    cfg = cfg2(cells=(2, 2), bounds=(-2.0, -2.0, 2.0, 2.0)) if dims == 2 else cfg3(
        cells=(2, 2, 2), bounds=(-2.0, -2.0, -2.0, 2.0, 2.0, 2.0))
    twin = Twin(cfg)
    lo, hi = np.full(dims, -1.0), np.full(dims, 1.0)
    z, nz = np.zeros(dims), np.full(dims, -0.0)
    boxes = np.array([np.r_[lo, nz], np.r_[z, hi], np.r_[nz, hi], np.r_[lo, z],          # touch at 0
                      np.r_[lo - 0.5, lo], np.r_[lo * 1e-30, nz],                        # far / tiny negative
                      np.r_[nz, z]])                                                      # a point at zero
    ids = np.arange(len(boxes), dtype=np.uint64)
    twin.step(add_ids=ids, add_boxes=boxes)
    assert {(0, 1), (0, 2), (1, 3), (2, 3), (0, 6), (1, 6), (5, 6)} <= twin.active
    for shift in (-0.25, 0.25, 0.0):
        moved = boxes.copy()
        moved[:4] += shift
        twin.step(update_ids=ids, update_boxes=moved)
    mirrored = np.concatenate([-boxes[:, dims:], -boxes[:, :dims]], axis=1)      # zeros flip sign
    twin.step(update_ids=ids[::-1], update_boxes=mirrored[::-1])


def test_filters_and_static():
    cfg = cfg2(cells=(2, 2))
    twin = Twin(cfg)
    everywhere = [1.5, 1.5, 2.5, 2.5]  # on the corner shared by all four cells
    spec = {  # id: (category, mask, static)
        1: (1, 2, False), 2: (2, 1, False), 3: (1, 1, False), 4: (0xFFFFFFFF, 0xFFFFFFFF, True),
        5: (0xFFFFFFFF, 0xFFFFFFFF, True), 6: (0, 0xFFFFFFFF, False), 7: (0x80000000, 0x80000000, False),
        8: (0x80000000, 0x80000000, True),
    }
    ids = np.array(sorted(spec), np.uint64)
    twin.step(add_ids=ids, add_boxes=[everywhere] * len(ids),
              add_category=np.array([spec[i][0] for i in sorted(spec)], np.uint32),
              add_mask=np.array([spec[i][1] for i in sorted(spec)], np.uint32),
              add_static=np.array([spec[i][2] for i in sorted(spec)]))
    expect = {(1, 2), (1, 4), (1, 5), (2, 4), (2, 5), (3, 4), (3, 5), (4, 7), (5, 7), (7, 8)}  # not 4-5, 4-8, 5-8, 6
    assert twin.active == expect
    twin.step(update_ids=[4, 5, 8], update_boxes=[[0.0, 0.0, 0.5, 0.5]] * 3)  # statics move away, together
    assert twin.active == {(1, 2)}
    twin.step(update_ids=[4, 1], update_boxes=[everywhere, [0.5, 0.5, 0.5, 0.5]])  # 4 back; 1 onto 5 and 8
    assert twin.active == {(2, 4), (3, 4), (4, 7), (1, 5)}


@pytest.mark.parametrize("threads", [1, 2])
def test_filters_arrive_in_a_world_without_them(threads):
    """The kernels read no filter while no object has one of its own (``ObjectStore.pair_filters`` gives
    empty arrays: every pair allowed); the first object with a category, mask or static flag of its own
    makes every later frame filter, the one-call frames of an unchanged list included."""
    twin = Twin(cfg2(cells=(3, 3), bounds=(0.0, 0.0, 6.0, 6.0), threads=threads))
    objects = twin.world.objects
    rng = np.random.default_rng(7)
    ids = np.arange(1, 41, dtype=np.uint64)
    lo = rng.uniform(0.0, 5.0, (40, 2))
    boxes = np.concatenate([lo, lo + rng.uniform(0.2, 1.5, (40, 2))], axis=1)
    # explicit defaults are no filters of their own
    twin.step(add_ids=ids, add_boxes=boxes, add_category=np.full(40, 0xFFFFFFFF, np.uint32),
              add_mask=np.full(40, 0xFFFFFFFF, np.uint32), add_static=np.zeros(40, bool))
    for k in range(3):                      # the same list: one-call frames
        boxes[:, [0, 2]] += 0.05
        twin.step(update_ids=ids, update_boxes=boxes)
    assert not objects.filtered and all(a.shape[0] == 0 for a in objects.pair_filters())
    # everything on one spot: category 1 meets only mask 1; static ones never meet each other
    spot = [2.5, 2.5, 3.5, 3.5]
    twin.step(add_ids=[100, 101, 102, 103], add_boxes=[spot] * 4, add_category=[1, 2, 0xFFFFFFFF, 0xFFFFFFFF],
              add_mask=[1, 1, 0xFFFFFFFF, 0xFFFFFFFF], add_static=[False, False, True, True])
    assert objects.filtered and objects.pair_filters()[0] is objects.cat
    assert (100, 101) not in twin.active and (102, 103) not in twin.active
    assert {(100, 102), (100, 103), (101, 102), (101, 103)} <= twin.active
    for k in range(4):                      # a new list, then the same list again: one-call frames filter too
        boxes[:, [1, 3]] += 0.1
        twin.step(update_ids=ids, update_boxes=boxes)
        assert (102, 103) not in twin.active
    twin.step(update_ids=[101, 103], update_boxes=[spot, spot])
    assert (100, 101) not in twin.active and (102, 103) not in twin.active


def test_extreme_coordinates_in_a_tiny_world():
    """Grid coordinates of 1e15-sized boxes in a world of 1e-6 cells are far beyond int64."""
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 1.0e-6, 1.0e-6), cells=(8, 8), threads=2)
    twin = Twin(cfg)
    boxes = [[-9.9e14, -9.9e14, 9.9e14, 9.9e14], [9.0e14, 9.0e14, 9.9e14, 9.9e14], [-9.9e14, 0.0, -9.0e14, 1.0],
             [0.0, 0.0, 1.0e-7, 1.0e-7], [1.0e-7, 1.0e-7, 1.0e-7, 1.0e-7], [5.0e14, -5.0e14, 5.0e14, -5.0e14]]
    twin.step(add_ids=np.arange(len(boxes)), add_boxes=np.array(boxes))
    assert twin.active == {(0, k) for k in range(1, len(boxes))} | {(3, 4)}
    twin.step(update_ids=[1, 5], update_boxes=[[-9.9e14, 0.5, -9.9e14, 0.5], [0.0, 0.0, 0.0, 0.0]])


CONFIGS = [
    cfg2(cells=(1, 1), bounds=(0.0, 0.0, 10.0, 10.0)),
    cfg2(cells=(1, 7), bounds=(0.0, 0.0, 10.0, 10.0), threads=2),
    cfg2(cells=(5, 3), bounds=(-1.3, 0.7, 2.9, 5.1)),
    cfg2(cells=(16, 16), bounds=(0.0, 0.0, 100.0, 100.0), threads=2),
    cfg2(cells=(7, 1), bounds=(-100.0, -50.0, -10.0, -5.0)),
    cfg3(cells=(1, 1, 1)),
    cfg3(cells=(3, 1, 5), bounds=(-1.3, 0.7, -5.0, 2.9, 5.1, 0.1), threads=1),
    cfg3(cells=(4, 4, 4), bounds=(-64.0, -64.0, -64.0, -32.0, -32.0, -32.0)),
]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.dims}d-{c.cells}-t{c.threads}")
def test_seeded_random_scenes(cfg, seed):
    """Motion, teleports and churn; the world with the other thread count gives byte-identical deltas."""
    rng = np.random.default_rng(seed)
    twin = Twin(cfg, seed=seed)
    mirror = new_world(dataclasses.replace(cfg, threads=3 - cfg.threads))
    gen = SceneGen(cfg, rng, adversarial=0.5)
    frames = [gen.fill(twin.oracle, 150)]
    for n in range(14):
        f = frames[-1]
        a, b = twin.step(**f), mirror.step(**f)
        assert a.created.tobytes() == b.created.tobytes() and a.deleted.tobytes() == b.deleted.tobytes(), \
            f"frame {n}: deltas differ between threads=1 and threads=2"
        heavy = n % 5 == 4  # every fifth frame is heavy churn
        frames.append(gen.frame(twin.oracle, move=0.6 if heavy else 0.3, teleport=0.1 if heavy else 0.02,
                                remove=0.25 if heavy else 0.03, add=0.25 if heavy else 0.03))
    assert twin.world.pairs().tobytes() == mirror.pairs().tobytes()


@pytest.mark.parametrize("cfg", [CONFIGS[3], CONFIGS[7]], ids=["2d", "3d"])
def test_clear_then_refill(cfg):
    rng = np.random.default_rng(5)
    twin = Twin(cfg, seed=5)
    gen = SceneGen(cfg, rng)
    twin.step(**gen.fill(twin.oracle, 300))
    ids, boxes, before = twin.oracle.ids(), twin.oracle.boxes(twin.oracle.ids()), set(twin.active)
    d = twin.step(remove_ids=rng.permutation(ids))
    assert len(d.deleted) == len(before) and twin.world.object_count == 0
    twin.step(add_ids=ids, add_boxes=boxes)  # same ids, same boxes, default filters
    twin.step(remove_ids=ids[::2])
    twin.step(**gen.fill(twin.oracle, 200))  # new ids and retired ones
    twin.step(**gen.frame(twin.oracle, remove=1.0, add=1.0))  # everything out, as many in, one frame


@pytest.mark.parametrize("cells", [(16, 16), (1, 1)])
def test_large_random_scene(cells):
    """3000 objects (600 without JIT), 30 frames (6) of motion and churn, checked after every frame."""
    n, frames = (600, 6) if NO_JIT else (3000, 30)
    cfg = cfg2(cells=cells, bounds=(0.0, 0.0, 160.0, 160.0), threads=2)
    rng = np.random.default_rng(2024)
    twin = Twin(cfg, seed=2024, queries_per_frame=2)
    gen = SceneGen(cfg, rng, adversarial=0.3, extent=0.25 if cells == (16, 16) else 0.02)
    twin.step(**gen.fill(twin.oracle, n))
    for _ in range(frames):
        twin.step(**gen.frame(twin.oracle, move=0.4, teleport=0.01, remove=0.02, add=0.02))
    assert twin.world.object_count > n * 0.8 and len(twin.active) > n // 5


def test_cell_occupancy_follows_the_wrapping_grid():
    """An object is in every cell its box touches, cell = floor((x - min) / cell_size) mod cells
    (dyadic values, so the expected cells are exact)."""
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 8.0, 8.0), cells=(4, 4), threads=1)
    boxes = {  # box: the (x cells, y cells) it touches
        (0.5, 0.5, 1.0, 1.0): ([0], [0]),
        (0.0, 0.0, 2.0, 2.0): ([0, 1], [0, 1]),  # max on a border: in the next cell too
        (-2.0, 0.5, -1.0, 1.0): ([3], [0]),  # negative: wraps to the last cell
        (7.0, 7.0, 9.0, 9.0): ([3, 0], [3, 0]),  # across the seam
        (-100.0, 1.0, 100.0, 1.0): ([0, 1, 2, 3], [0]),
        (8.0, 8.0, 8.0, 8.0): ([0], [0]),  # on the bounds max: the first cell again
        (1.0e6 + 4.5, 3.0, 1.0e6 + 4.5, 3.0): ([2], [1]),  # 1e6 is a multiple of the world size
    }
    twin = Twin(cfg)
    twin.step(add_ids=np.arange(len(boxes)), add_boxes=np.array(list(boxes)))
    grid = np.zeros(cfg.cells, np.int64)
    for xs, ys in boxes.values():
        for x in xs:
            grid[x, ys] += 1
    occ = twin.world.cell_occupancy()
    assert occ.shape == (16,)
    assert np.array_equal(occ, grid.ravel(order="C")) or np.array_equal(occ, grid.ravel(order="F")), \
        f"occupancy {occ.reshape(4, 4).tolist()} != expected {grid.tolist()} (or its transpose)"
    twin.step(remove_ids=np.arange(len(boxes)))
    assert not twin.world.cell_occupancy().any()


@pytest.mark.parametrize("cells", [(1, 1), (2, 2)])
def test_dense_pile(cells):
    """Hundreds of mutually overlapping boxes in one frame (event buffers overflow and must be redone),
    then all of them teleported away and back; ids share their low bits (k << 40) or are near 2**64."""
    cfg = cfg2(cells=cells, bounds=(0.0, 0.0, 8.0, 8.0), threads=2)
    rng = np.random.default_rng(11)
    twin = Twin(cfg, seed=11)
    mirror = new_world(dataclasses.replace(cfg, threads=1))
    n = 120 if NO_JIT else 300
    ids = np.r_[np.arange(n // 2, dtype=np.uint64) << np.uint64(40), np.uint64(2**64 - 1) - np.arange(n // 2, dtype=np.uint64)]
    pile = np.c_[3.0 + rng.random((n, 2)), 4.0 + 2 * rng.random((n, 2))]  # every box covers (4, 4)
    away = pile + 100.0 * 8.0 + 1.0  # a hundred world sizes away, so the same cells, no overlap with pile
    frames = [
        dict(add_ids=ids, add_boxes=pile),
        dict(update_ids=ids[::2], update_boxes=away[::2]),
        dict(update_ids=ids, update_boxes=np.r_[pile[: n // 2], away[n // 2:]][rng.permutation(n)]),
        dict(remove_ids=ids[:100], update_ids=ids[100:], update_boxes=pile[100:]),
        dict(add_ids=ids[:100], add_boxes=away[:100]),
    ]
    for k, f in enumerate(frames):
        a, b = twin.step(**f), mirror.step(**f)
        assert a.created.tobytes() == b.created.tobytes() and a.deleted.tobytes() == b.deleted.tobytes(), f"frame {k}"
    assert len(twin.active) >= (n - 100) * (n - 101) // 2


def test_growth_and_shrink_over_frames():
    """The world grows from empty to 2400 objects 300 a frame, with churn, then shrinks back to empty."""
    cfg = cfg2(cells=(8, 8), bounds=(0.0, 0.0, 64.0, 64.0), threads=2)
    rng = np.random.default_rng(17)
    twin = Twin(cfg, seed=17, queries_per_frame=1)
    gen = SceneGen(cfg, rng, adversarial=0.3, extent=0.4)
    for _ in range(8):
        f = gen.frame(twin.oracle, move=0.3, remove=0.05, add=0.0)
        f.pop("add_ids", None)
        add = gen.fill(twin.oracle, 300)
        twin.step(**f, **add)
    while twin.oracle.object_count:
        f = gen.frame(twin.oracle, move=0.3, remove=0.0, add=0.0)
        f["remove_ids"] = twin.oracle.ids()[:500]
        if "update_ids" in f:
            keep = ~np.isin(f["update_ids"], f["remove_ids"])
            f["update_ids"], f["update_boxes"] = f["update_ids"][keep], f["update_boxes"][keep]
        twin.step(**f)
    assert not twin.active and twin.world.object_count == 0


def test_a_world_is_freed_by_its_last_reference_alone():
    """No reference cycle holds a world: dropping its last reference frees it at once, with the garbage
    collector off (else only a pass of the collector would, and never one that froze it: ``sapgrid
    serve`` freezes its start's objects, a default or recovered world among them). Its arenas grew and
    moved regions first, its small frames went through the one-call path. (A first world runs the same
    frames before: a kernel compiled meanwhile could hold its arguments.)"""
    def frames():
        world = new_world(cfg2(cells=(4, 4), bounds=(0.0, 0.0, 16.0, 16.0), threads=2))
        rng = np.random.default_rng(5)
        ids = np.arange(3000, dtype=np.uint64)
        centre = rng.uniform(0, 16, (3000, 2)).astype(np.float32)
        boxes = np.concatenate([centre - 0.1, centre + 0.1], 1)
        world.step(add_ids=ids[:300], add_boxes=boxes[:300])
        world.step(add_ids=ids[300:], add_boxes=boxes[300:])        # the cells' regions grow: they move
        for n in (3000, 3000, 100, 100):
            centre += rng.normal(0, 0.3, centre.shape).astype(np.float32)
            world.step(update_ids=ids[:n], update_boxes=np.concatenate([centre - 0.1, centre + 0.1], 1)[:n])
        return world

    frames()
    world = frames()
    assert world.sap.garbage and world.pair_sets.garbage and world.pair_count     # regions moved in both
    gone = weakref.ref(world)
    gc.disable()
    try:
        del world
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("cells", [(32, 24), (400, 1)])
def test_many_cells_and_huge_boxes(cells):
    """Boxes in hundreds of cells at once: a pair of two huge boxes lives in every cell, and must be
    reported once when it appears and once when it goes."""
    cfg = cfg2(cells=cells, bounds=(0.0, 0.0, 64.0, 64.0), threads=2)
    rng = np.random.default_rng(23)
    twin = Twin(cfg, seed=23, queries_per_frame=2)
    gen = SceneGen(cfg, rng, adversarial=0.5, extent=2.0)
    twin.step(**gen.fill(twin.oracle, 200))
    huge = np.array([[-1e5, -1e5, 1e5, 1e5], [0, 0, 64, 64], [-10, 3, 80, 3], [5, -100, 5, 200]] * 2, float)
    hid = np.arange(10**12, 10**12 + len(huge))
    twin.step(add_ids=hid, add_boxes=huge)
    for k in range(5):
        f = gen.frame(twin.oracle, move=0.5, teleport=0.1, remove=0.1, add=0.1)
        for key in ("update_ids", "remove_ids"):  # the huge ones move only below
            if key in f:
                keep = ~np.isin(f[key], hid)
                f[key] = f[key][keep]
                if key == "update_ids":
                    f["update_boxes"] = f["update_boxes"][keep]
        twin.step(**f)
        twin.step(update_ids=hid, update_boxes=rng.permutation(huge) if k % 2 else huge * 0.01)
    twin.step(remove_ids=hid)


def test_a_world_rebuilt_from_its_objects_continues_like_the_original():
    """ids(), boxes() and filters() are everything a world is made of: a new world built from them by
    one batch insert holds the same pairs, and the same next frames give it the same deltas."""
    from sapcore import FrameError, World

    rng = np.random.default_rng(11)
    cfg = WorldConfig(dims=3, bounds=(0, 0, 0, 50, 50, 50), cells=(4, 4, 4))
    w = World(cfg)
    n = 300
    ids = rng.choice(10**12, n, replace=False).astype(np.uint64)
    lo = rng.uniform(0, 45, (n, 3))
    boxes = np.concatenate([lo, lo + rng.uniform(0.5, 6, (n, 3))], 1).astype(np.float32)
    cat = rng.integers(1, 4, n).astype(np.uint32)
    mask = rng.integers(1, 4, n).astype(np.uint32)
    static = rng.random(n) < 0.2
    w.step(add_ids=ids, add_boxes=boxes, add_category=cat, add_mask=mask, add_static=static)
    w.step(remove_ids=ids[:20], update_ids=ids[20:60], update_boxes=boxes[20:60] + np.float32(1))
    live = w.ids()
    c, m, s = w.filters(live)
    assert c.dtype == np.uint32 and m.dtype == np.uint32 and s.dtype == np.bool_
    order = np.argsort(ids)
    keep = np.isin(ids[order], live)
    assert np.array_equal(c, cat[order][keep]) and np.array_equal(s, static[order][keep])
    copy = World(cfg)
    copy.step(add_ids=live, add_boxes=w.boxes(live), add_category=c, add_mask=m, add_static=s)
    assert np.array_equal(copy.pairs(), w.pairs())
    for _ in range(3):
        upd = live[rng.random(live.shape[0]) < 0.5]
        nb = w.boxes(upd) + rng.normal(0, 1, (upd.shape[0], 1)).astype(np.float32)
        a, b = w.step(update_ids=upd, update_boxes=nb), copy.step(update_ids=upd, update_boxes=nb)
        assert np.array_equal(a.created, b.created) and np.array_equal(a.deleted, b.deleted)
    copy.validate()
    with pytest.raises(FrameError) as ei:
        w.filters([live[0], ids[0]])                       # ids[0] was removed
    assert ei.value.field == "ids" and ei.value.index == 1


@pytest.mark.parametrize("id_base", [0, 2**40])
def test_large_deltas_are_sorted_and_exact(id_base):
    """Deltas of thousands of pairs (a batch insert, everything moving, half removed) take the radix sort of
    packed id pairs (``RADIX_SORT_MIN``); ids beyond 32 bits take the general sort. Both exact, sorted."""
    import sapcore.world as sw

    n = 600 if NO_JIT else 3000
    rng = np.random.default_rng(11)
    tw = Twin(cfg2(cells=(8, 8), bounds=(0.0, 0.0, 40.0, 40.0), threads=2), queries_per_frame=1)
    ids = (np.uint64(id_base) + rng.permutation(10 * n)[:n].astype(np.uint64))
    lo = rng.uniform(0.0, 38.0, (n, 2))
    size = rng.uniform(0.5, 2.5, (n, 2))
    boxes = np.concatenate([lo, lo + size], 1).astype(np.float32)
    d = tw.step(add_ids=ids, add_boxes=boxes)
    assert NO_JIT or len(d.created) >= sw.RADIX_SORT_MIN
    boxes[:, :2] += rng.uniform(-1.5, 1.5, (n, 2)).astype(np.float32)
    boxes[:, 2:] = boxes[:, :2] + size.astype(np.float32)
    tw.step(update_ids=ids, update_boxes=boxes)
    d = tw.step(remove_ids=ids[::2])
    assert NO_JIT or len(d.deleted) >= sw.RADIX_SORT_MIN


class _FirstCell:
    """n boxes of random sizes, every one inside the first of a 2 x 2 (x 2) grid's cells at first, added to a
    ``threads=1`` world checked against the oracle every frame (``Twin``); ``centres`` is the scene's to move."""

    def __init__(self, dims, seed, n):
        self.rng = np.random.default_rng(seed)
        self.t = Twin(WorldConfig(dims=dims, bounds=(0.0,) * dims + (8.0,) * dims, cells=(2,) * dims, threads=1),
                      seed=seed)
        self.centres = self.rng.uniform(0.6, 3.4, (n, dims))
        self.half = self.rng.uniform(0.05, 0.5, (n, dims))
        self.ids = np.arange(1, n + 1, dtype=np.uint64)
        self.t.step(add_ids=self.ids, add_boxes=self.boxes(np.arange(n)))

    def boxes(self, rows):
        c, h = self.centres[rows], self.half[rows]
        return np.concatenate([c - h, c + h], 1).astype(np.float32)

    def inside(self, i):
        """Is box i in the first cell (every coordinate below 4.0)?"""
        return bool((self.centres[i] < 4.0).all())


@pytest.mark.parametrize("dims, seed", [(2, 1), (2, 2), (3, 3), (3, 4)])
def test_one_box_at_a_time_crosses_a_cell_border_among_still_boxes(dims, seed):
    """A cell with many still boxes and one that leaves it (the single-leaver removal of a cell's SAP: the
    box's endpoints shifted out of each axis, the cell's last box taking its slot), frame after frame:
    the leaver anywhere in the cell's slots (the last one too), often beside the box in the cell's last
    slot moving inside the cell (its slot changes in that frame), sometimes coming back (entering);
    every frame checked against the oracle. The test follows the first cell's slots as the engine fills
    them (adds and entering boxes at the end, a leaver's slot taken by the last) to aim at that case."""
    sc = _FirstCell(dims, seed, 48 if dims == 2 else 64)
    rng, t, centres, ids, boxes, inside = sc.rng, sc.t, sc.centres, sc.ids, sc.boxes, sc.inside
    n = ids.shape[0]
    slots = list(range(n))                              # the first cell's boxes by slot
    aimed = 0
    for _ in range(80):
        away = [i for i in range(n) if not inside(i)]
        if away and (len(slots) < n // 2 or rng.random() < 0.3):
            leaver = away[int(rng.integers(len(away)))]  # one comes back (enters at the last slot)
        else:
            leaver = slots[int(rng.integers(len(slots)))]
        axis = int(rng.integers(dims))
        was_inside = inside(leaver)
        if centres[leaver, axis] < 4.0:                  # across the border at 4.0, or back
            centres[leaver, axis] = rng.uniform(4.6, 5.4)
        else:
            centres[leaver, axis] = rng.uniform(2.6, 3.4)
        rows = [leaver]
        others = list(rng.choice(n, size=int(rng.integers(0, 3)), replace=False))
        if was_inside and slots[-1] != leaver and rng.random() < 0.6:
            others.append(slots[-1])                    # the last slot's box moves in the same frame
            aimed += 1
        for other in others:
            if other != leaver and other not in rows:    # moves within its own cells
                lo, hi = (0.6, 3.4) if inside(other) else (0.6, 7.4)
                step = np.clip(centres[other] + rng.normal(0, 0.2, dims), lo, hi)
                if inside(other) or not ((step < 4.0).all() or ((step > 4.0) & (centres[other] < 4.0)).any()
                                         or ((step < 4.0) & (centres[other] > 4.0)).any()):
                    centres[other] = step
                    rows.append(int(other))
        if was_inside and not inside(leaver):
            i = slots.index(leaver)
            slots[i] = slots[-1]
            slots.pop()
        elif not was_inside and inside(leaver):
            slots.append(leaver)
        rows = np.array(rows)
        t.step(update_ids=ids[rows], update_boxes=boxes(rows))
    assert aimed >= 10, aimed


@pytest.mark.parametrize("dims, seed", [(2, 5), (2, 6), (3, 7), (3, 8)])
def test_several_boxes_leave_a_cell_among_still_boxes(dims, seed):
    """Two to twelve boxes leave a cell of many still boxes in one frame, with a few others moving inside it
    (the cell's removal with few moved boxes: one pass per axis from the leaving boxes' first endpoint, the
    staying boxes of the last slots taking the leaving boxes' slots): leavers in the last slots and below
    them, staying boxes of the last slots moving in the same frame (their slots change in it), boxes coming
    back (entering at the end); every frame checked against the oracle. The test follows the first cell's
    slots as the engine fills them to aim at those cases."""
    sc = _FirstCell(dims, seed, 64 if dims == 2 else 80)
    rng, t, centres, ids, boxes, inside = sc.rng, sc.t, sc.centres, sc.ids, sc.boxes, sc.inside
    n = ids.shape[0]
    slots = list(range(n))                              # the first cell's boxes by slot
    aimed_last = aimed_filler = 0
    for _ in range(60):
        k = int(rng.integers(2, 6)) if rng.random() < 0.7 else int(rng.integers(9, 13))    # few, or many
        k = min(k, len(slots) // 3)
        tail = slots[-k:]
        pick = list(rng.choice(tail, size=int(rng.integers(0, 3)), replace=False))   # from the last slots
        rest = [b for b in slots if b not in pick]
        pick += list(rng.choice(rest, size=k - len(pick), replace=False))
        aimed_last += any(b in tail for b in pick)
        away = [i for i in range(n) if not inside(i)]
        want = int(rng.integers(0, 3)) if len(slots) > 2 * n // 3 else int(rng.integers(6, 14))  # keep it full
        back = list(rng.choice(away, size=min(len(away), want), replace=False)) if away else []
        rows = []
        for b in pick + back:
            b = int(b)
            axis = int(rng.integers(dims))
            if inside(b):                               # across the border at 4.0
                centres[b, axis] = rng.uniform(4.6, 5.4)
            else:
                centres[b] = np.minimum(centres[b], rng.uniform(2.6, 3.4, dims))   # back inside
            rows.append(b)
        stay_tail = [b for b in tail if b not in pick]
        movers = list(rng.choice(stay_tail, size=min(len(stay_tail), 2), replace=False)) if stay_tail else []
        movers += list(rng.choice(slots, size=2, replace=False))
        for b in movers:
            b = int(b)
            if b not in rows and inside(b):                 # moves inside the first cell
                centres[b] = np.clip(centres[b] + rng.normal(0, 0.2, dims), 0.6, 3.4)
                rows.append(b)
                aimed_filler += b in stay_tail
        # the engine's slots after the frame: leaving slots below the last k taken, in order, by the staying
        # boxes of the last k slots; entering boxes appended in frame order
        leaving = [b for b in slots if not inside(b)]
        m = len(slots) - len(leaving)
        holes = [i for i, b in enumerate(slots[:m]) if b in leaving]
        fillers = [b for b in slots[m:] if b not in leaving]
        new = list(slots[:m])
        for h, b in zip(holes, fillers):
            new[h] = b
        slots = new + [b for b in rows if b in back and inside(b)]
        t.step(update_ids=ids[np.array(rows)], update_boxes=boxes(np.array(rows)))
    assert aimed_last >= 20 and aimed_filler >= 20, (aimed_last, aimed_filler)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("all_move", [True, False], ids=["all-move", "few-move"])
def test_overlapping_boxes_leave_a_cell_together(dims, all_move):
    """Groups of one to six boxes piled on one spot leave their cell in the same frame, with category/mask
    filters and static boxes among them (pairs that overlap but are not allowed are in no pair set): every
    box moving a little besides (a few leaving boxes' pairs found by their endpoint positions, a pair of two
    leaving boxes once; more leaving boxes' by a pass over the cell's pair set), or only the group (by that
    pass); every frame checked against the oracle."""
    rng = np.random.default_rng(11 + dims)
    side = 4.0
    cfg = WorldConfig(dims=dims, bounds=(0.0,) * dims + (side,) * dims, cells=(2,) * dims, threads=2)
    twin = Twin(cfg, queries_per_frame=1)
    n = 48
    ids = np.arange(1, n + 1, dtype=np.uint64)
    centres = rng.uniform(0.6, side - 0.6, (n, dims))
    half = rng.uniform(0.2, 0.5, (n, dims))
    bits = np.array([1, 2, 3, 0xFFFFFFFF], np.uint32)

    def boxes(rows):
        return np.concatenate([centres[rows] - half[rows], centres[rows] + half[rows]], axis=1)

    twin.step(add_ids=ids, add_boxes=boxes(np.arange(n)), add_category=bits[rng.integers(0, 4, n)],
              add_mask=bits[rng.integers(0, 4, n)], add_static=rng.random(n) < 0.25)
    groups = 0
    for _ in range(40):
        k = int(rng.integers(1, 7))
        group = rng.choice(n, size=k, replace=False)
        spot = rng.uniform(0.8, 1.2, dims) + np.where(centres[group[0]] < side / 2, side / 2, 0.0)
        centres[group] = spot + rng.uniform(-0.1, 0.1, (k, dims))     # piled: they overlap each other
        rows = np.arange(n) if all_move else np.sort(group)
        if all_move:
            rest = np.setdiff1d(rows, group)
            centres[rest] = np.clip(centres[rest] + rng.normal(0, 0.05, (rest.size, dims)), 0.6, side - 0.6)
        twin.step(update_ids=ids[rows], update_boxes=boxes(rows))
        groups += k > 1
    assert groups >= 25
