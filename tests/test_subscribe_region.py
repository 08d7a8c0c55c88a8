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


def run(seed, dims, frames=25, n=40, id_base=1):
    rng = np.random.default_rng(seed)
    region = np.array([30.0] * dims + [60.0] * dims)
    objs = {}
    next_id = id_base
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


def test_mirror_with_ids_beyond_32_bits():
    assert run(3, 2, id_base=(1 << 40) + 5) > 10


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([2, 3]))
def test_mirror_matches_brute_force_random(seed, dims):
    run(seed, dims, frames=10, n=25)


@pytest.mark.parametrize("region", [[0, 0, 1], [0, 0, float("nan"), 1], [2, 0, 1, 1]])
def test_bad_region_is_rejected(region):
    with pytest.raises(ValueError):
        validate_region(region, 2)


# ---- through the server: Subscribe with a region ------------------------------------------------
from sapgrid.client import Client  # noqa: E402
from sapgrid.client.errors import FailedPrecondition, InvalidArgument  # noqa: E402


def _wait_subscribed(client, world, n):
    import time
    end = time.monotonic() + 10
    while client.get_world(world).subscribers < n:
        assert time.monotonic() < end, "subscription did not open"
        time.sleep(0.02)


@pytest.mark.parametrize("dims", [2, 3])
def test_region_subscription_mirror_equals_filtered_world(server, world_name, dims):
    rng = np.random.default_rng(dims)
    n = 150
    side = 60.0
    region = [20.0] * dims + [40.0] * dims
    with Client(server.address, timeout=60) as c:
        c.create_world(world_name, dims=dims, bounds=tuple([0.0] * dims + [side] * dims))
        ids = np.arange(1, n + 1, dtype=np.uint64)
        lo = rng.uniform(0, side - 4, (n, dims))
        boxes = np.concatenate([lo, lo + rng.uniform(1, 4, (n, dims))], axis=1)
        c.step(world_name, add_ids=ids, add_boxes=boxes.astype(np.float32))  # the view starts non-empty
        sub = c.subscribe(world_name, region=region)
        full = c.subscribe(world_name)
        _wait_subscribed(c, world_name, 2)
        mirror = set()
        crossings = 0
        inside_before = set()
        for f in range(30):
            move = rng.random(n) < 0.5
            step = rng.normal(0, 2.0, (n, dims))
            lo = np.clip(boxes[:, :dims] + step * move[:, None], 0, side - 4)
            boxes = np.concatenate([lo, lo + (boxes[:, dims:] - boxes[:, :dims])], axis=1)
            c.step(world_name, update_ids=ids, update_boxes=boxes.astype(np.float32))
            d = next(sub)
            whole = next(full)
            assert d.frame == whole.frame
            ent, lev = as_set(d.created), as_set(d.deleted)
            assert ent.isdisjoint(mirror) and lev <= mirror
            mirror = (mirror - lev) | ent
            inside = c.query(world_name, region)
            crossings += len(inside_before ^ set(inside.tolist()))
            inside_before = set(inside.tolist())
            assert mirror == as_set(filter_pairs(c.pairs(world_name), np.sort(inside))), f"frame {f}"
        assert crossings > 20 and mirror
        sub.cancel()
        full.cancel()
        c.delete_world(world_name)


def test_region_subscription_bad_region_is_refused(server, world_name):
    with Client(server.address, timeout=60) as c:
        c.create_world(world_name, dims=2, bounds=(0.0, 0.0, 10.0, 10.0))
        with pytest.raises(InvalidArgument, match="region"):
            next(iter(c.subscribe(world_name, region=[5, 5, 1, 1])))
        with pytest.raises(InvalidArgument, match="region"):
            next(iter(c.subscribe(world_name, region=[0, 0, float("inf"), 1])))
        with pytest.raises(FailedPrecondition):
            next(iter(c.subscribe(world_name, region=[0, 0, 0, 1, 1, 1])))
        assert c.get_world(world_name).subscribers == 0
        c.delete_world(world_name)
