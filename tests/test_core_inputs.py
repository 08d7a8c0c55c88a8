"""Input forms World.step accepts (API.md): any integer dtype for ids, float32/float64 boxes, lists,
non-contiguous and byte-swapped arrays, read-only buffers (the server passes numpy.frombuffer views),
empty arrays. Each form must give the same result as the canonical one and leave the caller's arrays as
they were.
"""
from __future__ import annotations

import numpy as np
import pytest

from core_harness import Twin, new_world
from sapcore import WorldConfig

CFG = WorldConfig(dims=2, bounds=(0.0, 0.0, 8.0, 8.0), cells=(3, 3), threads=2)


def _frames():
    rng = np.random.default_rng(4)
    ids = np.arange(1, 41, dtype=np.uint64) * 3
    boxes = np.c_[rng.random((40, 2)) * 8, np.zeros((40, 2))]
    boxes[:, 2:] = boxes[:, :2] + rng.random((40, 2)) * 2
    moved = boxes[10:30] + 0.75
    return [
        dict(add_ids=ids, add_boxes=boxes, add_category=np.full(40, 3, np.uint32),
             add_mask=np.full(40, 1, np.uint32), add_static=(np.arange(40) % 3 == 0)),
        dict(remove_ids=ids[:10], update_ids=ids[10:30], update_boxes=moved),
        dict(remove_ids=ids[30:], add_ids=ids[:5], add_boxes=boxes[30:35]),
    ]


def _readonly(a):
    a = np.array(a)
    return np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)


FORMS = {
    "int32_ids": lambda k, v: v.astype(np.int32) if k.endswith("_ids") else v,
    "uint16_ids": lambda k, v: v.astype(np.uint16) if k.endswith("_ids") else v,
    "lists": lambda k, v: v.tolist(),
    "float32_boxes": lambda k, v: v.astype(np.float32) if k.endswith("_boxes") else v,
    "int_category_mask_static": lambda k, v: v.astype(np.int64) if k in ("add_category", "add_mask", "add_static") else v,
    "fortran_order": lambda k, v: np.asfortranarray(v),
    "strided": lambda k, v: np.repeat(v, 2, axis=0)[::2],
    "big_endian": lambda k, v: v.astype(v.dtype.newbyteorder(">")) if v.dtype.kind in "uif" else v,
    "read_only": lambda k, v: _readonly(v),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_input_forms(form):
    ref = new_world(CFG)
    twin = Twin(CFG)
    for n, f in enumerate(_frames()):
        want = ref.step(**f)
        given = {k: FORMS[form](k, v) for k, v in f.items()}
        copies = {k: np.array(v, copy=True) for k, v in given.items()}
        got = twin.step(**given)
        assert got.created.tobytes() == want.created.tobytes() and got.deleted.tobytes() == want.deleted.tobytes(), \
            f"{form}: frame {n} delta differs from the canonical input"
        for k, v in given.items():
            assert np.array_equal(np.asarray(v), copies[k]), f"{form}: step modified the caller's {k}"
    assert len(twin.active) > 0


def test_empty_arrays_and_empty_frames():
    twin = Twin(CFG)
    e = np.zeros(0, np.uint64)
    d = twin.step(remove_ids=e, add_ids=e, add_boxes=np.zeros((0, 4)), update_ids=e, update_boxes=np.zeros((0, 4)))
    assert d.created.shape == (0, 2) and d.deleted.shape == (0, 2)
    twin.step(**_frames()[0])
    for _ in range(2):
        d = twin.step()
        assert d.created.shape == (0, 2) and d.deleted.shape == (0, 2)
    assert twin.world.frames == 4


def test_left_out_columns_are_the_defaults_for_few_and_many_adds():
    """Adds without category, mask or static get every bit and not static, a few a frame (slices of shared
    default columns) as a batch bigger than those; no object has filters of its own afterwards."""
    w = new_world(WorldConfig(dims=2, bounds=(0.0, 0.0, 100.0, 100.0), cells=(4, 4)))
    rng = np.random.default_rng(3)
    lo = rng.uniform(0.0, 99.0, (1500, 2))
    boxes = np.concatenate([lo, lo + 0.5], axis=1)
    w.step(add_ids=np.arange(1300, dtype=np.uint64), add_boxes=boxes[:1300])
    for k in range(1300, 1500, 4):
        w.step(add_ids=np.arange(k, k + 4, dtype=np.uint64), add_boxes=boxes[k:k + 4])
    objects = w.objects
    h = objects.handles(np.arange(1500, dtype=np.uint64))
    assert (objects.cat[h] == 0xFFFFFFFF).all() and (objects.mask[h] == 0xFFFFFFFF).all()
    assert not objects.static[h].any() and not objects.filtered
    w.step(add_ids=[5000], add_boxes=[[1.0, 1.0, 2.0, 2.0]], add_static=[True])
    assert objects.filtered
    w.step(add_ids=[5001], add_boxes=[[1.0, 1.0, 2.0, 2.0]])
    assert objects.static[objects.handles([5000, 5001])].tolist() == [1, 0]
