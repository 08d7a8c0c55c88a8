"""Property-based tests of sapcore.World against the brute-force oracle (tests/naive.py).

Hypothesis draws a world configuration (2D/3D, 1x1 .. odd grids, dyadic and non-dyadic bounds, 1 or 2
threads) and up to 8 frames of removes + updates + adds over <= 60 objects, with coordinates biased
towards the hard cases: cell borders and the wrap seam, exactly touching and identical boxes, zero-size
and huge boxes, far-away (aliased) boxes, float64 values that round in float32. After every frame
``Twin.step`` checks pairs, the delta invariants, validate(), counts and queries; a second world with
the other thread count must return byte-identical deltas.

Runs are derandomized and database-less so CI is stable; set SAPGRID_CORE_EXAMPLES to run more.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_harness import Twin, new_world
from sapcore import WorldConfig

EXAMPLES = int(os.environ.get("SAPGRID_CORE_EXAMPLES", "60"))
CORE_SETTINGS = settings(deadline=None, derandomize=True, database=None, max_examples=EXAMPLES,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Client-chosen uint64 ids: small ones, and the extremes (0 and 2**64 - 1 are valid ids).
ID_POOL = list(range(40)) + [2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1,
                             123456789012345, 2**40 + 7, 2**53 + 1]
MAX_OBJECTS = 60
BOUNDS = {
    2: [(0.0, 0.0, 10.0, 10.0), (-7.5, -2.0, 12.5, 30.0), (-1.3, 0.7, 2.9, 5.1), (0.0, 0.0, 1.0, 1.0)],
    3: [(0.0, 0.0, 0.0, 8.0, 8.0, 8.0), (-1.3, 0.7, -5.0, 2.9, 5.1, 0.1), (-100.0, -100.0, -100.0, 100.0, 100.0, 100.0)],
}


@st.composite
def configs(draw, threads=None):
    dims = draw(st.sampled_from([2, 3]))
    bounds = draw(st.sampled_from(BOUNDS[dims]))
    sizes = [1, 2, 3, 5, 8] if dims == 2 else [1, 2, 3, 5]
    cells = tuple(draw(st.sampled_from(sizes)) for _ in range(dims))
    if threads is None:
        threads = draw(st.sampled_from([1, 2]))
    return WorldConfig(dims=dims, bounds=bounds, cells=cells, threads=threads, max_objects=MAX_OBJECTS)


def _axis_values(cfg, axis, live_boxes):
    """Interesting float64 coordinates of one axis: cell borders, bounds, live box faces."""
    d = cfg.dims
    lo, hi = cfg.bounds[axis], cfg.bounds[d + axis]
    n = cfg.cells[axis]
    cs = (hi - lo) / n
    vals = [lo + k * cs for k in range(-n - 1, 2 * n + 2)] + [lo, hi]
    if len(live_boxes):
        vals += live_boxes[:, axis].astype(np.float64).tolist() + live_boxes[:, d + axis].astype(np.float64).tolist()
    return vals


@st.composite
def coordinate(draw, cfg, axis, live_boxes):
    d = cfg.dims
    lo, hi = cfg.bounds[axis], cfg.bounds[d + axis]
    size = hi - lo
    kind = draw(st.sampled_from(["grid", "grid", "grid", "uniform", "near", "far", "alias"]))
    if kind == "uniform":
        return draw(st.floats(lo - size, hi + size, allow_nan=False, allow_infinity=False))
    v = draw(st.sampled_from(_axis_values(cfg, axis, live_boxes)))
    if kind == "near":  # a float64 neighbour that (usually) rounds onto the same float32
        return v + draw(st.sampled_from([-1.0, 1.0])) * 1.0e-9 * max(1.0, abs(v))
    if kind == "far":
        return v + draw(st.sampled_from([-1.0e6, 1.0e6, -3.3e7]))
    if kind == "alias":  # a whole number of world sizes away: wraps onto the same cells
        return v + draw(st.sampled_from([-1000, -1, 1, 977])) * size
    return v


@st.composite
def box(draw, cfg, live_boxes):
    d = cfg.dims
    shape = draw(st.sampled_from(["two", "two", "two", "point", "huge", "world"]))
    row = np.zeros(2 * d)
    for axis in range(d):
        a = draw(coordinate(cfg, axis, live_boxes))
        if shape == "point":
            b = a
        elif shape == "world":
            b = a + (cfg.bounds[d + axis] - cfg.bounds[axis]) * draw(st.sampled_from([1.0, 1.5]))
        elif shape == "huge":
            a, b = a - 1.0e7, a + 1.0e7
        else:
            b = draw(coordinate(cfg, axis, live_boxes))
        row[axis], row[d + axis] = min(a, b), max(a, b)
    return row


def _id_array(draw, ids):
    dtype = np.int64 if all(x < 2**63 for x in ids) and draw(st.booleans()) else np.uint64
    return np.array(ids, dtype=dtype)


def _box_array(draw, rows, dims):
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    return np.array(rows, dtype=dtype).reshape(-1, 2 * dims)


@st.composite
def frame(draw, cfg, oracle, last=()):
    """One valid frame for the current oracle state. ``last``: the previous frame's update ids then its
    new ids; the updates are often that list again, whole or with gaps (the engine's guided paths)."""
    live = sorted(oracle.objects)
    live_boxes = oracle.boxes(live) if live else np.zeros((0, 2 * cfg.dims), np.float32)
    f = {}
    removes = draw(st.lists(st.sampled_from(live), unique=True, max_size=len(live))) if live else []
    rest = [x for x in live if x not in set(removes)]
    order = draw(st.sampled_from(["random", "last", "gaps"])) if last else "random"
    if order == "random":
        updates = draw(st.lists(st.sampled_from(rest), unique=True, max_size=len(rest))) if rest else []
    else:
        kept = set(rest)
        updates = [x for x in last if x in kept and (order == "last" or draw(st.integers(0, 3)) > 0)]
    free = [x for x in ID_POOL if x not in oracle.objects]
    room = MAX_OBJECTS - len(live) + len(removes)
    adds = draw(st.lists(st.sampled_from(free), unique=True, max_size=min(room, 25))) if free else []
    if removes:
        f["remove_ids"] = _id_array(draw, removes)
    if updates:
        rows = []
        for x in updates:
            how = draw(st.sampled_from(["new", "new", "same", "jitter"]))
            if how == "new":
                rows.append(draw(box(cfg, live_boxes)))
            else:
                cur = oracle.objects[x][0].astype(np.float64)
                if how == "jitter":  # a small move of the whole box
                    shift = [draw(st.sampled_from([-0.25, -1.0e-3, 0.0, 1.0e-3, 0.25])) for _ in range(cfg.dims)]
                    cur = cur + np.tile(shift, 2)
                rows.append(cur)
        f["update_ids"] = _id_array(draw, updates)
        f["update_boxes"] = _box_array(draw, rows, cfg.dims)
    if adds:
        f["add_ids"] = _id_array(draw, adds)
        f["add_boxes"] = _box_array(draw, [draw(box(cfg, live_boxes)) for _ in adds], cfg.dims)
        if draw(st.booleans()):
            bits = st.sampled_from([0xFFFFFFFF, 1, 2, 3, 0x80000000, 0])
            f["add_category"] = np.array([draw(bits) for _ in adds], dtype=np.uint32)
            f["add_mask"] = np.array([draw(bits) for _ in adds], dtype=np.uint32)
        if draw(st.booleans()):
            f["add_static"] = np.array([draw(st.booleans()) for _ in adds], dtype=bool)
    return f


def _assert_same_delta(a, b, n):
    for name in ("created", "deleted"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), \
            f"frame {n}: {name} differs between thread counts"


@CORE_SETTINGS
@given(data=st.data())
def test_random_frames_match_oracle(data):
    cfg = data.draw(configs())
    twin = Twin(cfg, seed=0)
    mirror = new_world(dataclasses.replace(cfg, threads=3 - cfg.threads))
    n_frames = data.draw(st.integers(1, 8))
    last = []
    for n in range(n_frames):
        f = data.draw(frame(cfg, twin.oracle, last))
        delta = twin.step(**f)
        _assert_same_delta(delta, mirror.step(**f), n)
        last = [int(x) for k in ("update_ids", "add_ids") for x in f.get(k, [])]
    assert twin.world.pairs().tobytes() == mirror.pairs().tobytes()


@CORE_SETTINGS
@given(data=st.data())
def test_clear_and_refill(data):
    """Everything removed, then re-added under the same ids and under new ids."""
    cfg = data.draw(configs())
    twin = Twin(cfg, seed=1)
    twin.step(**data.draw(frame(cfg, twin.oracle)))
    for _ in range(2):
        live = twin.oracle.ids()
        boxes = twin.oracle.boxes(live)
        twin.step(remove_ids=live)
        assert twin.world.object_count == 0 and len(twin.world.pairs()) == 0
        twin.step(add_ids=live, add_boxes=boxes)  # same ids, same boxes: same pairs as before
        twin.step(remove_ids=live)
        twin.step(**data.draw(frame(cfg, twin.oracle)))
