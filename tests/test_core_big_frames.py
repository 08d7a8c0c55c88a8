"""Frames big enough for the parallel phases (at least ``parallel.MIN_OPS`` updates, two threads), of the
last frame's list in its order, the commonest big frame: the boxes checked against the list's rows by
whole words in parts side by side (``kernels.validate.rows_check``), their cell ranges by
``kernels.grid.grid_ranges_listed``, and a delta with many created and deleted pairs sorted side by side
(``kernels.merge.id_pairs_both``); the netted pair events grouped by shard of the world's pair table in
parts side by side (``kernels.merge.world_bucket_parts``, launched with the cells' SAPs and the netting in
one call, ``kernels.frame.pairs_parallel``); and frames that remove and add objects too, whose
updates sit at other positions of the last list (boxes checked by ``kernels.validate.rows_of_check``).
Every frame's delta is checked against an exact sweep of the boxes
(numpy: sorted on axis 0, each box against the boxes that start inside it), and each of those kernels
is seen to run. Where most boxes move, the cells take every staying box as moved and only the flags of the
boxes that change cells are written (``all_moved``)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import sapcore
from core_harness import check_pair_array
from sapcore import FrameError, WorldConfig, parallel
from sapcore.invariants import check_world
from sapcore.kernels import frame as kframe
from sapcore.kernels import grid as kgrid
from sapcore.kernels import merge as kmerge
from sapcore.kernels import validate as kval
from sapcore.world import RADIX_SORT_MIN

N = 40_000
assert N >= parallel.MIN_OPS


def sweep_pairs(ids: np.ndarray, boxes: np.ndarray, dims: int) -> set:
    """Every overlapping pair (inclusive bounds) as (low id, high id), exactly: boxes sorted by their min on
    axis 0, each tested on every axis against the boxes whose min lies within its extent there."""
    order = np.argsort(boxes[:, 0], kind="stable")
    b, i_ = boxes[order], ids[order]
    n = len(b)
    end = np.searchsorted(b[:, 0], b[:, dims], side="right")
    counts = end - np.arange(n) - 1
    src = np.repeat(np.arange(n), counts)
    dst = src + 1 + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    ok = np.ones(len(src), bool)
    for a in range(dims):
        ok &= (b[src, a] <= b[dst, dims + a]) & (b[dst, a] <= b[src, dims + a])
    lo = np.minimum(i_[src[ok]], i_[dst[ok]])
    hi = np.maximum(i_[src[ok]], i_[dst[ok]])
    return set(zip(lo.tolist(), hi.tolist()))


def _delta(d) -> tuple[set, set]:
    """A delta's created and deleted rows as sets (checked: uint64 [K, 2], low < high, sorted, unique)."""
    return check_pair_array(d.created, "created"), check_pair_array(d.deleted, "deleted")


def _counted(monkeypatch, module, name: str, calls: dict) -> None:
    real = getattr(module, name)

    def call(*args):
        out = real(*args)
        calls.setdefault(name, []).append(out)
        return out
    monkeypatch.setattr(module, name, call)


def _all_moved_recorded(monkeypatch, calls: dict) -> None:
    """Record in ``calls["all_moved"]`` whether each ``pairs_parallel`` call takes every staying box as moved."""
    real_pairs = kframe.pairs_parallel
    at = list(inspect.signature(real_pairs.py_func).parameters).index("all_moved")

    def pairs(*args):
        calls.setdefault("all_moved", []).append(args[at])
        return real_pairs(*args)
    monkeypatch.setattr(kframe, "pairs_parallel", pairs)


class _Scene:
    """N boxes of side 2 at 20% coverage; each frame moves every box by a random step of about half a side
    (or more), so that thousands of pairs start and end in every frame."""

    def __init__(self, dims: int, ids: np.ndarray, seed: int = 5):
        self.dims = dims
        self.rng = np.random.default_rng(seed)
        self.side = float((N * 2.0 ** dims / 0.2) ** (1 / dims))
        self.ids = ids
        self.centre = self.rng.uniform(0, self.side, (N, dims))
        bounds = (0.0,) * dims + (self.side,) * dims
        self.cfg = dict(dims=dims, bounds=bounds, cells=sapcore.auto_cells(dims, bounds, N))

    def boxes(self) -> np.ndarray:
        return np.concatenate([self.centre - 1.0, self.centre + 1.0], 1).astype(np.float32)

    def move(self) -> np.ndarray:
        self.centre = self.centre + self.rng.normal(0, 1.0, self.centre.shape)
        return self.boxes()


def _started(scene: _Scene) -> tuple:
    """A two-thread world of the scene's boxes (one batch insert), and its pairs by the sweep."""
    world = sapcore.World(WorldConfig(threads=2, **scene.cfg))
    boxes = scene.boxes()
    world.step(add_ids=scene.ids, add_boxes=boxes)
    return world, sweep_pairs(scene.ids, boxes, scene.dims)


@pytest.mark.parametrize("dims", [2, 3])
def test_big_listed_frames_match_an_exact_sweep(dims, monkeypatch):
    calls: dict = {}
    _counted(monkeypatch, kval, "rows_check", calls)
    _counted(monkeypatch, kgrid, "grid_ranges_listed", calls)
    _counted(monkeypatch, kmerge, "id_pairs_both", calls)
    _all_moved_recorded(monkeypatch, calls)
    scene = _Scene(dims, np.arange(N, dtype=np.uint64) * 7 + 3)
    world, before = _started(scene)
    assert check_pair_array(world.pairs(), "world.pairs()") == before
    still = np.union1d(np.arange(0, N, 50), [N // 2 - 1, N // 2, N - 1])
    for k in range(5):
        boxes = scene.move()
        if k == 2:      # some boxes as stored (unchanged), among them the rows on either side of the parts' border
            boxes[still] = world.boxes(scene.ids[still])
        if k == 3:      # one in seven (still a parallel frame): the cells no longer take every box as moved
            boxes[::7] = world.boxes(scene.ids[::7])
        d = world.step(update_ids=scene.ids, update_boxes=boxes)
        after = sweep_pairs(scene.ids, boxes, dims)
        assert _delta(d) == (after - before, before - after), k
        assert world.pair_count == len(after)
        kc, kd = len(d.created), len(d.deleted)          # both large enough to be sorted side by side
        assert min(kc, kd) >= RADIX_SORT_MIN and kc + kd >= parallel.MIN_EVENTS, (kc, kd)
        before = after
    check_world(world)
    # the list repeats from the second update frame on (the first one makes it)
    assert len(calls.get("rows_check", [])) == 4 and len(calls.get("grid_ranges_listed", [])) == 4, calls.keys()
    assert [int(u) for u, _ in calls["rows_check"]] == [0, len(still), len(range(0, N, 7)), 0]
    # the cells take every staying box as moved where most moved (their flags not written), else not
    assert calls["all_moved"] == [False, True, True, True, False, True], calls["all_moved"]
    assert len(calls.get("id_pairs_both", [])) >= 3 and all(calls["id_pairs_both"])


@pytest.mark.parametrize("dims", [2, 3])
def test_a_big_frame_compares_its_rows_only_when_a_sample_finds_an_unchanged_box(dims, monkeypatch):
    """Half the boxes of a big frame unchanged, but none of the rows ``rows_check`` samples: the rows are not
    compared (no row counted unchanged, ``same`` 0) and every update is taken as moved (the cells take every
    staying box as moved); with one sampled row unchanged too, every unchanged row is counted and the cells
    move only the moved boxes. Both the same list (``rows_check``) and a list that removed and added
    objects (``rows_of_check``); every delta against the sweep, the world's invariants after."""
    calls: dict = {}
    _counted(monkeypatch, kval, "rows_check", calls)
    _counted(monkeypatch, kval, "rows_of_check", calls)
    _all_moved_recorded(monkeypatch, calls)
    scene = _Scene(dims, np.arange(N, dtype=np.uint64) + 1, seed=11)
    world, before = _started(scene)
    next_id = N + 1
    expect = []             # the unchanged rows each compared frame counts
    for k in range(6):
        churn = k >= 3                  # remove and add objects: the updates at other positions of the list
        n = len(scene.ids) - (100 if churn else 0)
        sampled = np.arange(kval.SAMPLE_ROWS) * n // kval.SAMPLE_ROWS
        keep_box = np.zeros(n, bool)
        if k % 3 != 0:              # (k 0 and 3: every box moves; they make the list the next frames repeat)
            keep_box[1::2] = True
            keep_box[sampled] = k % 3 == 2      # k 2 and 5: the sampled rows unchanged too
        gone = np.arange(len(scene.ids) - 100, len(scene.ids)) if churn else np.zeros(0, np.int64)
        keep = np.arange(n)
        boxes = scene.move()[keep]
        boxes[keep_box] = world.boxes(scene.ids[keep][keep_box])
        if k > 0:
            expect.append(int(keep_box.sum()) if keep_box[sampled].any() else 0)
        kw = dict(update_ids=scene.ids[keep], update_boxes=boxes)
        new_ids = np.zeros(0, np.uint64)
        new_boxes = np.zeros((0, 2 * dims), np.float32)
        if churn:
            new_ids = np.arange(next_id, next_id + 100, dtype=np.uint64)
            next_id += 100
            new_centre = scene.rng.uniform(0, scene.side, (100, dims))
            new_boxes = np.concatenate([new_centre - 1.0, new_centre + 1.0], 1).astype(np.float32)
            kw.update(remove_ids=scene.ids[gone], add_ids=new_ids, add_boxes=new_boxes)
            scene.centre = np.concatenate([scene.centre[keep], new_centre])
        d = world.step(**kw)
        scene.ids = np.concatenate([scene.ids[keep], new_ids])
        boxes = np.concatenate([boxes, new_boxes])
        after = sweep_pairs(scene.ids, boxes, dims)
        assert _delta(d) == (after - before, before - after), k
        assert world.pair_count == len(after)
        before = after
    check_world(world)
    unchanged = [int(u) for u, ok in calls["rows_check"] + calls["rows_of_check"]]
    assert all(ok for _, ok in calls["rows_check"] + calls["rows_of_check"])
    # the first update frame makes the list (no rows kept to compare yet); half the rows unchanged in frames 1,
    # 2, 4 and 5, counted in 2 and 5 only
    assert unchanged == expect and expect[1] > N // 2 and expect[4] > (N - 100) // 2, (unchanged, expect)
    assert expect[0] == expect[2] == expect[3] == 0
    assert calls["all_moved"] == [False, True, True, False, True, True, False], calls["all_moved"]


def test_a_big_listed_frame_names_a_bad_box_and_changes_nothing(monkeypatch):
    """Every kind of bad box, in the first and the last row and on either side of the border of the two
    threads' parts: the general check's field, index and reason; the world as it was (its pairs, and the
    next frame's delta against the sweep)."""
    calls: dict = {}
    _counted(monkeypatch, kval, "rows_check", calls)
    dims = 2
    scene = _Scene(dims, np.arange(N, dtype=np.uint64) + 1, seed=6)
    world = sapcore.World(WorldConfig(threads=2, coord_limit=1e6, **scene.cfg))
    world.step(add_ids=scene.ids, add_boxes=scene.boxes())
    for _ in range(2):
        boxes = scene.move()
        world.step(update_ids=scene.ids, update_boxes=boxes)
    pairs = world.pairs()
    kinds = {"NaN coordinate on axis": np.nan, "infinite coordinate on axis": np.inf,
             "exceeds the supported range": -2e6, "min > max on axis": None}
    for reason, value in kinds.items():
        for row in (0, N // 2 - 1, N // 2, N - 1):
            bad = boxes + np.float32(0.25)
            axis = row % dims
            if value is None:
                bad[row, axis] = bad[row, dims + axis] + 1
            else:
                bad[row, axis] = value
            seen = len(calls.get("rows_check", []))
            with pytest.raises(FrameError) as e:
                world.step(update_ids=scene.ids, update_boxes=bad)
            assert len(calls["rows_check"]) == seen + 1 and not calls["rows_check"][-1][1]
            assert (e.value.field, e.value.index) == ("update_boxes", row), (reason, row)
            assert reason in str(e.value) and f"axis {axis}" in str(e.value), str(e.value)
            assert np.array_equal(world.pairs(), pairs)
    check_world(world)
    before = check_pair_array(pairs, "pairs")
    boxes = scene.move()
    d = world.step(update_ids=scene.ids, update_boxes=boxes)
    after = sweep_pairs(scene.ids, boxes, dims)
    assert _delta(d) == (after - before, before - after)


def test_big_deltas_of_ids_beyond_32_bits(monkeypatch):
    """Ids that do not fit in 32 bits: the side-by-side sort declines and the delta is sorted the long way,
    the same rows."""
    calls: dict = {}
    _counted(monkeypatch, kmerge, "id_pairs_both", calls)
    dims = 2
    scene = _Scene(dims, (np.uint64(1) << np.uint64(40)) + np.arange(N, dtype=np.uint64) * 3, seed=7)
    world, before = _started(scene)
    for _ in range(3):
        boxes = scene.move()
        d = world.step(update_ids=scene.ids, update_boxes=boxes)
        after = sweep_pairs(scene.ids, boxes, dims)
        assert _delta(d) == (after - before, before - after)
        before = after
    assert calls.get("id_pairs_both") and not any(calls["id_pairs_both"])


def test_big_frames_with_removes_and_adds_match_an_exact_sweep(monkeypatch):
    """Frames that remove some objects, add others (appended to the list) and update the rest in the list's
    order: the updates' stored boxes are at other rows of the last list (``row_of``), and, in the frame after
    one that left some objects out, at none (their objects' boxes): checked by whole words in parts
    (``rows_of_check``), unchanged boxes among them counted; every delta against the sweep."""
    calls: dict = {}
    _counted(monkeypatch, kval, "rows_of_check", calls)
    _counted(monkeypatch, kframe, "pairs_parallel", calls)
    _counted(monkeypatch, kframe, "net_merge", calls)
    dims = 2
    scene = _Scene(dims, np.arange(N, dtype=np.uint64) + 1, seed=8)
    world, before = _started(scene)
    next_id = N + 1
    left_out = np.zeros(0, np.int64)
    expect_unchanged = []
    for k in range(5):
        boxes = scene.move()
        gone = scene.rng.choice(len(scene.ids), 300, replace=False)
        keep = np.setdiff1d(np.arange(len(scene.ids)), gone)
        rem_ids = scene.ids[gone]
        upd = keep if k != 2 else np.setdiff1d(keep, left_out := keep[::400])
        still = upd[::97]
        if k == 3:      # unchanged boxes, among them some of the objects left out of the last frame
            boxes[still] = world.boxes(scene.ids[still])
            boxes[left_out[:20]] = world.boxes(scene.ids[left_out[:20]])
            expect_unchanged.append(len(np.union1d(still, left_out[:20])))
        else:
            expect_unchanged.append(0)
        if k == 2:      # the objects left out keep their boxes
            boxes[left_out] = world.boxes(scene.ids[left_out])
        new_ids = np.arange(next_id, next_id + 300, dtype=np.uint64)
        next_id += 300
        new_centre = scene.rng.uniform(0, scene.side, (300, dims))
        new_boxes = np.concatenate([new_centre - 1.0, new_centre + 1.0], 1).astype(np.float32)
        d = world.step(remove_ids=rem_ids, update_ids=scene.ids[upd], update_boxes=boxes[upd], add_ids=new_ids,
                       add_boxes=new_boxes)
        scene.ids = np.concatenate([scene.ids[keep], new_ids])
        scene.centre = np.concatenate([scene.centre[keep], new_centre])
        left_out = np.searchsorted(keep, left_out) if k == 2 else left_out
        boxes = np.concatenate([boxes[keep], new_boxes])
        after = sweep_pairs(scene.ids, boxes, dims)
        assert _delta(d) == (after - before, before - after), k
        assert world.pair_count == len(after)
        before = after
    # a bad box in such a frame, in the first and the last row and on either side of the parts' border: named,
    # and nothing changes
    pairs = world.pairs()
    gone = np.arange(0, len(scene.ids), 131)
    upd = np.setdiff1d(np.arange(len(scene.ids)), gone)
    nu = len(upd)
    for row in (0, nu // 2 - 1, nu // 2, nu - 1):
        for value in (np.nan, None):
            bad = scene.move()[upd]
            if value is None:
                bad[row, 1] = bad[row, dims + 1] + 1
            else:
                bad[row, 1] = value
            seen = len(calls["rows_of_check"])
            with pytest.raises(FrameError) as e:
                world.step(remove_ids=scene.ids[gone], update_ids=scene.ids[upd], update_boxes=bad,
                           add_ids=np.array([next_id], np.uint64), add_boxes=bad[:1])
            assert len(calls["rows_of_check"]) == seen + 1 and not calls["rows_of_check"][-1][1]
            assert (e.value.field, e.value.index) == ("update_boxes", row) and "axis 1" in str(e.value)
            assert np.array_equal(world.pairs(), pairs)
    calls["rows_of_check"] = [c for c in calls["rows_of_check"] if c[1]]
    check_world(world)
    # every frame but the first (whose list is not kept by row) checks by rows_of_check, with its unchanged rows
    assert [int(u) for u, ok in calls.get("rows_of_check", [])] == expect_unchanged[1:], calls.get("rows_of_check")
    assert all(ok for _, ok in calls["rows_of_check"])
    # the cells' SAPs, the netting and the merge in parallel, in one call a frame, or two where pair sets grew
    # in between (a status first, then the event count): every frame has events enough for the parallel merge
    first = [r[0] for r in calls["pairs_parallel"]]
    assert len(first) == 6 and set(first) <= {kframe.PAIRS_DONE, kframe.PAIRS_NET}, first
    assert all(r[1] >= parallel.MIN_EVENTS for r in calls["pairs_parallel"])
    then = [r[0] for r in calls.get("net_merge", [])]      # PAIRS_MERGE: the world's pair table grew first
    assert len(then) == first.count(kframe.PAIRS_NET) and set(then) <= {kframe.PAIRS_DONE, kframe.PAIRS_MERGE}
    assert first.count(kframe.PAIRS_DONE) + then.count(kframe.PAIRS_DONE) >= 4, (first, then)


def test_big_frames_with_a_pile_that_overflows_its_cells_match_an_exact_sweep(monkeypatch):
    """A frame whose cells run in parallel has phases 4-7 in one call (``kernels.frame.pairs_parallel``), which
    leaves a cell whose event slice overflowed to the general phases (its events recomputed exactly, then
    netted and merged): 400 boxes piled on one spot (~80k pairs start in a few cells), then spread again;
    every delta against the sweep."""
    calls: dict = {}
    _counted(monkeypatch, kframe, "pairs_parallel", calls)
    dims = 2
    scene = _Scene(dims, np.arange(N, dtype=np.uint64) * 3 + 1, seed=12)
    world, before = _started(scene)
    spot = np.float32(scene.side / 2) + scene.rng.uniform(-0.9, 0.9, (400, dims)).astype(np.float32)
    pile = np.concatenate([spot - 1, spot + 1], 1)        # every box covers the spot's centre
    overflows = []
    for k in range(3):
        boxes = scene.move()
        if k == 0:
            boxes[:400] = pile
        d = world.step(update_ids=scene.ids, update_boxes=boxes)
        after = sweep_pairs(scene.ids, boxes, dims)
        assert _delta(d) == (after - before, before - after), k
        assert world.pair_count == len(after)
        overflows.append(d.stats.cell_overflows)
        before = after
    assert overflows[0] > 0 and len(before) < 79_800
    assert calls["pairs_parallel"][1][0] == kframe.PAIRS_OVERFLOW
    check_world(world)


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_world_bucket_in_parts_is_world_bucket(parts):
    """The events grouped by shard in parts of the touched cells give ``world_bucket``'s arrays exactly (its
    stable order inside each shard), with empty cells, cells of one event and more parts than cells."""
    rng = np.random.default_rng(parts)
    for nt in (0, 1, 5, 300):
        out_n = rng.integers(0, 40, nt).astype(np.int64)
        out_n[rng.random(nt) < 0.3] = 0
        cap = out_n + rng.integers(0, 5, nt)          # slices with room left over, as the event buffer has
        ev_off = np.concatenate([[0], np.cumsum(cap)]).astype(np.int64)
        ev_key = rng.integers(0, 1 << 62, int(ev_off[-1]), dtype=np.uint64)
        ev_key[rng.random(ev_key.shape[0]) < 0.5] |= np.uint64(1) << np.uint64(63)     # removed events
        want = kmerge.world_bucket(ev_key, ev_off, out_n, 8)
        got = kmerge.world_bucket_parts(ev_key, ev_off, out_n, 8, parts)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), nt
        assert got[1][-1] == out_n.sum()
