"""Region-filtered views: a mirror built from the per-frame entering/leaving pairs equals the
world's pairs filtered by the region after every frame, with objects crossing the region's border."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sapgrid.server.interest import RegionView, filter_pairs, ids_in_region, validate_region


def brute_pairs(ids, boxes):
    dims = boxes.shape[1] // 2
    lo, hi = boxes[:, :dims], boxes[:, dims:]
    ov = np.all((lo[:, None, :] <= hi[None, :, :]) & (hi[:, None, :] >= lo[None, :, :]), axis=2)
    i, j = np.nonzero(np.triu(ov, 1))
    a, b = ids[i], ids[j]
    return np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1).astype(np.uint64)


def as_set(pairs):
    return {tuple(map(int, p)) for p in np.asarray(pairs).reshape(-1, 2)}


def pairs_touching(pairs, ids):
    return filter_pairs(pairs, np.sort(ids))


def run(seed, dims, frames=25, n=40):
    rng = np.random.default_rng(seed)
    region = np.array([30.0] * dims + [60.0] * dims)
    objs = {}
    next_id = 1
    def random_box():
        lo = rng.uniform(0, 90, dims)
        return np.concatenate([lo, lo + rng.uniform(1, 12, dims)])
    for _ in range(n):
        objs[next_id] = random_box(); next_id += 1
    def state():
        ids = np.array(sorted(objs), dtype=np.uint64)
        boxes = np.array([objs[int(i)] for i in ids]).reshape(len(ids), 2 * dims)
        return ids, boxes
    ids, boxes = state()
    world = as_set(brute_pairs(ids, boxes))
    view = RegionView(region, dims)
    mirror = as_set(view.start(ids, boxes, brute_pairs(ids, boxes)))
    assert mirror == as_set(filter_pairs(brute_pairs(ids, boxes), ids_in_region(ids, boxes, region)))
    crossings = 0
    for _ in range(frames):
        for k in list(objs):  # moves, many across the region's border
            if rng.random() < 0.4:
                objs[k] = objs[k] + np.tile(rng.normal(0, 8, dims), 2)
        for k in list(objs):
            if rng.random() < 0.05:
                del objs[k]
        for _ in range(rng.integers(0, 4)):
            objs[next_id] = random_box(); next_id += 1
        ids, boxes = state()
        after = brute_pairs(ids, boxes)
        after_set = as_set(after)
        created = np.array(sorted(after_set - world), dtype=np.uint64).reshape(-1, 2)
        deleted = np.array(sorted(world - after_set), dtype=np.uint64).reshape(-1, 2)
        world = after_set
        inside = ids_in_region(ids, boxes, region)
        crossings += len(np.setxor1d(view.inside, inside))
        d = view.step(inside, created, deleted, lambda moved: pairs_touching(after, moved))
        ent, lev = as_set(d.entering), as_set(d.leaving)
        assert not ent & lev
        assert ent.isdisjoint(mirror) and lev <= mirror
        mirror = (mirror - lev) | ent
        assert mirror == as_set(filter_pairs(after, inside))
    return crossings


@pytest.mark.parametrize("dims", [2, 3])
def test_mirror_matches_brute_force_with_border_crossings(dims):
    assert run(7, dims) > 10  # objects really crossed the border


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([2, 3]))
def test_mirror_matches_brute_force_random(seed, dims):
    run(seed, dims, frames=10, n=25)


@pytest.mark.parametrize("region", [[0, 0, 1], [0, 0, float("nan"), 1], [2, 0, 1, 1]])
def test_bad_region_is_rejected(region):
    with pytest.raises(ValueError):
        validate_region(region, 2)
