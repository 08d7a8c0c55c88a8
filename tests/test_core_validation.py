"""Frame validation of sapcore.World: every bad input raises FrameError naming the field and the row,
and a bad frame changes nothing (DESIGN.md: "a frame is atomic").

Each bad frame is a valid frame (a remove, an update and adds, all of which would change pairs) with one
fault injected, so that a partly applied frame shows. After the error the world must read exactly as
before, and the next valid frame must give the same delta as on a twin world that never saw the bad frame.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from core_harness import Twin, check_pair_array, new_world
from sapcore import CapacityError, FrameError, WorldConfig

NAN, INF = math.nan, math.inf
CFG2 = WorldConfig(dims=2, bounds=(0.0, 0.0, 10.0, 10.0), cells=(4, 4), threads=1, max_objects=8,
                   coord_limit=1000.0)
CFG3 = WorldConfig(dims=3, bounds=(0.0, 0.0, 0.0, 10.0, 10.0, 10.0), cells=(3, 2, 2), threads=2,
                   max_objects=8, coord_limit=1000.0)
BASE_IDS = np.array([10, 11, 12, 13], dtype=np.uint64)


def _base_boxes(dims):
    rows2 = [[1, 1, 3, 3], [2, 2, 4, 4], [6, 6, 7, 7], [6.5, 6.5, 8, 8]]  # 10-11 and 12-13 overlap
    return np.array([r[:2] + [0.0] * (dims - 2) + r[2:] + [1.0] * (dims - 2) for r in rows2], dtype=np.float64)


def _box(dims, lo, hi):
    return [lo] * dims + [hi] * dims


def valid_frame(dims):
    """Removes 13, moves 12 onto 10, adds 20 (onto 11) and 21 (alone): every part changes pairs."""
    return {
        "remove_ids": np.array([13], dtype=np.uint64),
        "update_ids": np.array([12], dtype=np.uint64),
        "update_boxes": np.array([_box(dims, 0.5, 1.5)]),
        "add_ids": np.array([20, 21], dtype=np.uint64),
        "add_boxes": np.array([_box(dims, 3.5, 5.0), _box(dims, 9.0, 9.5)]),
        "add_category": np.array([1, 1], dtype=np.uint32),
        "add_mask": np.array([0xFFFFFFFF, 0xFFFFFFFF], dtype=np.uint32),
        "add_static": np.array([False, True]),
    }


def _set(frame, key, row, col, value):
    a = np.array(frame[key], dtype=np.float64)
    a[row, col] = value
    frame[key] = a


# name -> (mutation of valid_frame(dims), accepted (field, index) of the FrameError)
BAD = {
    "add_nan": (lambda f, d: _set(f, "add_boxes", 1, 0, NAN), {("add_boxes", 1)}),
    "add_nan_in_max": (lambda f, d: _set(f, "add_boxes", 1, 2 * d - 1, NAN), {("add_boxes", 1)}),
    "add_pos_inf": (lambda f, d: _set(f, "add_boxes", 1, d, INF), {("add_boxes", 1)}),
    "add_neg_inf": (lambda f, d: _set(f, "add_boxes", 0, 0, -INF), {("add_boxes", 0)}),
    "update_nan": (lambda f, d: _set(f, "update_boxes", 0, 1, NAN), {("update_boxes", 0)}),
    "update_pos_inf": (lambda f, d: _set(f, "update_boxes", 0, 2 * d - 1, INF), {("update_boxes", 0)}),
    "update_neg_inf": (lambda f, d: _set(f, "update_boxes", 0, 0, -INF), {("update_boxes", 0)}),
    "add_min_gt_max_axis0": (lambda f, d: _set(f, "add_boxes", 1, 0, 9.75), {("add_boxes", 1)}),
    "add_min_gt_max_last_axis": (lambda f, d: _set(f, "add_boxes", 0, d - 1, 5.5), {("add_boxes", 0)}),
    "update_min_gt_max": (lambda f, d: _set(f, "update_boxes", 0, d, 0.25), {("update_boxes", 0)}),
    "add_beyond_limit": (lambda f, d: _set(f, "add_boxes", 1, d, 1000.5), {("add_boxes", 1)}),
    "add_beyond_neg_limit": (lambda f, d: _set(f, "add_boxes", 0, 0, -1.0e20), {("add_boxes", 0)}),
    "update_beyond_limit": (lambda f, d: _set(f, "update_boxes", 0, 2 * d - 1, 5000.0), {("update_boxes", 0)}),
    "add_boxes_too_few_columns": (lambda f, d: f.update(add_boxes=f["add_boxes"][:, 1:]), {("add_boxes", -1)}),
    "add_boxes_too_many_columns": (lambda f, d: f.update(add_boxes=np.hstack([f["add_boxes"]] * 2)[:, : 2 * d + 2]),
                                   {("add_boxes", -1)}),
    "add_boxes_1d": (lambda f, d: f.update(add_boxes=f["add_boxes"].ravel()), {("add_boxes", -1)}),
    "update_boxes_wrong_columns": (lambda f, d: f.update(update_boxes=f["update_boxes"][:, :-1]), {("update_boxes", -1)}),
    "add_duplicate_id": (lambda f, d: f.update(add_ids=np.array([20, 20], np.uint64)), {("add_ids", 0), ("add_ids", 1)}),
    "remove_duplicate_id": (lambda f, d: f.update(remove_ids=np.array([13, 13], np.uint64)), {("remove_ids", 0), ("remove_ids", 1)}),
    "update_duplicate_id": (lambda f, d: f.update(update_ids=np.array([12, 12], np.uint64),
                                                  update_boxes=np.vstack([f["update_boxes"]] * 2)),
                            {("update_ids", 0), ("update_ids", 1)}),
    "remove_and_update": (lambda f, d: f.update(update_ids=np.array([11, 13], np.uint64),
                                                update_boxes=np.vstack([f["update_boxes"]] * 2)),
                          {("update_ids", 1), ("remove_ids", 0)}),
    "remove_and_add": (lambda f, d: f.update(add_ids=np.array([20, 13], np.uint64)), {("add_ids", 1), ("remove_ids", 0)}),
    "update_and_add": (lambda f, d: f.update(add_ids=np.array([12, 21], np.uint64)), {("add_ids", 0), ("update_ids", 0)}),
    "update_unknown": (lambda f, d: f.update(update_ids=np.array([99], np.uint64)), {("update_ids", 0)}),
    "remove_unknown": (lambda f, d: f.update(remove_ids=np.array([13, 99], np.uint64)), {("remove_ids", 1)}),
    "remove_removed_earlier": (lambda f, d: f.update(remove_ids=np.array([0], np.uint64)), {("remove_ids", 0)}),
    "add_live_id": (lambda f, d: f.update(add_ids=np.array([20, 11], np.uint64)), {("add_ids", 1)}),
    "add_boxes_fewer_rows": (lambda f, d: f.update(add_boxes=f["add_boxes"][:1]), {("add_boxes", -1), ("add_ids", -1)}),
    "add_boxes_more_rows": (lambda f, d: f.update(add_boxes=np.vstack([f["add_boxes"]] * 2)), {("add_boxes", -1), ("add_ids", -1)}),
    "add_boxes_missing": (lambda f, d: f.pop("add_boxes"), {("add_boxes", -1), ("add_ids", -1)}),
    "add_category_length": (lambda f, d: f.update(add_category=f["add_category"][:1]), {("add_category", -1), ("add_ids", -1)}),
    "add_mask_length": (lambda f, d: f.update(add_mask=np.ones(3, np.uint32)), {("add_mask", -1), ("add_ids", -1)}),
    "add_static_length": (lambda f, d: f.update(add_static=np.array([True])), {("add_static", -1), ("add_ids", -1)}),
    "update_boxes_length": (lambda f, d: f.update(update_boxes=np.vstack([f["update_boxes"]] * 2)),
                            {("update_boxes", -1), ("update_ids", -1)}),
    "update_boxes_missing": (lambda f, d: f.pop("update_boxes"), {("update_boxes", -1), ("update_ids", -1)}),
    "update_ids_missing": (lambda f, d: f.pop("update_ids"), {("update_boxes", -1), ("update_ids", -1)}),
}


def _fresh(cfg):
    """A Twin (world + oracle) and a plain twin world, both holding the same base scene."""
    twin, other = Twin(cfg, seed=7), new_world(cfg)
    boxes = _base_boxes(cfg.dims)
    twin.step(add_ids=BASE_IDS, add_boxes=boxes)
    other.step(add_ids=BASE_IDS, add_boxes=boxes)
    twin.step(add_ids=[0], add_boxes=[_box(cfg.dims, 20.0, 21.0)])  # id 0 lives for a frame
    other.step(add_ids=[0], add_boxes=[_box(cfg.dims, 20.0, 21.0)])
    twin.step(remove_ids=[0])
    other.step(remove_ids=[0])
    return twin, other


def _snapshot(w):
    ids = w.ids()
    return (w.pairs().tobytes(), ids.tobytes(), w.boxes(ids).tobytes(), w.object_count, w.pair_count, w.frames)


def _assert_unchanged_then_same(twin, other, before):
    w = twin.world
    assert _snapshot(w) == before, "a bad frame changed the world"
    w.validate()
    twin.check_state("after the bad frame")
    good = valid_frame(twin.cfg.dims)
    d1, d2 = twin.step(**good), other.step(**good)
    check_pair_array(d1.created, "created")
    assert d1.created.tobytes() == d2.created.tobytes() and d1.deleted.tobytes() == d2.deleted.tobytes(), \
        "the frame after a bad frame gives a different delta than on a world that never saw it"
    assert len(d1.created) and len(d1.deleted), "the follow-up frame should change pairs (test setup)"


@pytest.mark.parametrize("cfg", [CFG2, CFG3], ids=["2d", "3d"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_frame_raises_and_changes_nothing(case, cfg):
    mutate, allowed = BAD[case]
    twin, other = _fresh(cfg)
    before = _snapshot(twin.world)
    frame = valid_frame(cfg.dims)
    mutate(frame, cfg.dims)
    with pytest.raises(FrameError) as err:
        twin.world.step(**frame)
    e = err.value
    assert (e.field, e.index) in allowed, f"{case}: got {e.field}[{e.index}] ({e}), want one of {sorted(allowed)}"
    assert e.reason, f"{case}: empty reason"
    _assert_unchanged_then_same(twin, other, before)


@pytest.mark.parametrize("cfg", [CFG2, CFG3], ids=["2d", "3d"])
def test_valid_frame_is_valid(cfg):
    """The frame the bad frames are made from is accepted (so every BAD case fails for its one fault)."""
    twin, other = _fresh(cfg)
    twin.step(**valid_frame(cfg.dims))


def test_coordinates_at_the_limit_are_accepted():
    twin, _ = _fresh(CFG2)
    twin.step(add_ids=[30, 31], add_boxes=[[-1000.0, -1000.0, 1000.0, 1000.0], [1000.0, 1000.0, 1000.0, 1000.0]])
    assert (30, 31) in twin.active


def test_default_coord_limit():
    """coord_limit is the largest accepted |coordinate| (types.py), also when it is not a float32 value."""
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 1.0, 1.0), cells=(2, 2), threads=1)
    twin = Twin(cfg)
    twin.step(add_ids=[1, 2], add_boxes=[[-1.0e15, -1.0e15, 1.0e15, 1.0e15], [1.0e15, 0.0, 1.0e15, 0.0]])
    assert twin.active == {(1, 2)}
    w = new_world(cfg)
    with pytest.raises(FrameError) as err:
        w.step(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [0, 0, 1.0e16, 1]])
    assert (err.value.field, err.value.index) == ("add_boxes", 1)
    assert w.object_count == 0


@pytest.mark.parametrize("cfg", [CFG2, CFG3], ids=["2d", "3d"])
def test_capacity(cfg):
    twin, other = _fresh(cfg)  # 4 live of max 8
    before = _snapshot(twin.world)
    many = [_box(cfg.dims, 9.0, 9.0)] * 5
    with pytest.raises(CapacityError):
        twin.world.step(add_ids=[40, 41, 42, 43, 44], add_boxes=many)
    assert _snapshot(twin.world) == before
    twin.step(add_ids=[40, 41, 42, 43], add_boxes=many[:4])  # exactly full
    assert twin.world.object_count == 8
    twin.step(remove_ids=[40, 41], add_ids=[50, 51], add_boxes=many[:2])  # removes come first
    before = _snapshot(twin.world)
    with pytest.raises(CapacityError):
        twin.world.step(remove_ids=[50], add_ids=[60, 61], add_boxes=many[:2])
    assert _snapshot(twin.world) == before
    twin.check_state("after the refused frame")
    twin.step(remove_ids=[50], add_ids=[60], add_boxes=many[:1])


def test_error_message_names_field_and_row():
    twin, _ = _fresh(CFG2)
    frame = valid_frame(2)
    _set(frame, "add_boxes", 1, 1, 9.9)
    with pytest.raises(FrameError, match=r"^add_boxes\[1\]: .*min > max"):
        twin.world.step(**frame)
