"""The engine's fast paths give the same answers as the general ones: frames that update ids in the order
of the frame before (handles follow that list, ids off it are looked up), updates that keep their box (nothing touched), frames where
most objects move (every occupied cell applied) or only a few do (cells touched one by one), and
frames big enough to run in parallel. Every frame is checked against the oracle by ``Twin``."""
from __future__ import annotations

import numpy as np
import pytest

from core_harness import Twin, compile_one_call_frames
from sapcore import FrameError, WorldConfig

N = 1500   # the parallel big-frame paths (parallel.MIN_OPS updates and more): test_core_big_frames.py


def _boxes(rng, n, side=60.0):
    c = rng.uniform(0, side, (n, 2))
    h = rng.uniform(0.3, 1.5, (n, 2))
    return np.concatenate([c - h, c + h], 1).astype(np.float32)


@pytest.fixture
def twin():
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 60.0, 60.0), cells=(8, 8), threads=2)
    t = Twin(cfg, queries_per_frame=1)
    rng = np.random.default_rng(7)
    ids = np.arange(N, dtype=np.uint64) * 3 + 11
    boxes = _boxes(rng, N)
    t.step(add_ids=ids, add_boxes=boxes)
    return t, rng, ids, boxes


def _move(rng, boxes, frac=1.0, step=0.4):
    out = boxes.copy()
    k = rng.random(len(boxes)) < frac
    d = rng.normal(0, step, (len(boxes), 2)).astype(np.float32)
    out[k] += np.concatenate([d, d], 1)[k]
    return out


def test_same_ids_every_frame_then_removal_then_new_set(twin):
    t, rng, ids, boxes = twin
    for _ in range(4):                                  # same update ids: handles follow the last list
        boxes = _move(rng, boxes)
        t.step(update_ids=ids, update_boxes=boxes)
    gone = ids[::7]
    t.step(remove_ids=gone)                             # a removal frame forgets the list:
    with pytest.raises(FrameError) as e:                # the same update ids now name removed objects
        t.world.step(update_ids=ids, update_boxes=boxes)
    assert e.value.field == "update_ids" and e.value.index == 0
    keep = np.setdiff1d(ids, gone)
    kb = boxes[np.isin(ids, keep)]
    for _ in range(3):
        kb = _move(rng, kb)
        t.step(update_ids=keep, update_boxes=kb)
    # the removed ids are unknown again, even though an earlier frame updated them
    with pytest.raises(FrameError) as e:
        t.world.step(update_ids=ids, update_boxes=boxes)
    assert e.value.field == "update_ids"
    t.check_state()
    # re-adding a removed id while updating the listed set works and pairs it
    t.step(update_ids=keep, update_boxes=kb, add_ids=gone[:5], add_boxes=kb[:5])


def test_rejected_frame_between_cached_frames_changes_nothing(twin):
    t, rng, ids, boxes = twin
    boxes = _move(rng, boxes)
    t.step(update_ids=ids, update_boxes=boxes)
    bad = _move(rng, boxes)
    bad[N // 2, 0] = np.nan
    with pytest.raises(FrameError) as e:
        t.world.step(update_ids=ids, update_boxes=bad)
    assert (e.value.field, e.value.index) == ("update_boxes", N // 2)
    with pytest.raises(FrameError) as e:                # an add of an id the listed updates hold
        t.world.step(update_ids=ids, update_boxes=boxes, add_ids=ids[3:4], add_boxes=boxes[3:4])
    assert e.value.field == "add_ids"
    t.check_state()
    t.step(update_ids=ids, update_boxes=_move(rng, boxes))


def test_reordered_ids_and_unchanged_boxes(twin):
    t, rng, ids, boxes = twin
    t.step(update_ids=ids, update_boxes=boxes)           # every update keeps its box: nothing to do
    d = t.world.step()
    assert d.stats.cells_touched == 0 and len(d.created) == len(d.deleted) == 0
    t.oracle.step()
    perm = rng.permutation(N)
    boxes = _move(rng, boxes)
    t.step(update_ids=ids[perm], update_boxes=boxes[perm])   # same ids, other order: every id looked up
    part = _move(rng, boxes, frac=0.05, step=3.0)            # a few objects move (cells one by one)
    t.step(update_ids=ids, update_boxes=part)
    t.step(update_ids=ids, update_boxes=part)                # then all "update" to the same boxes


def _edit(rng, order, live, dead):
    """The last frame's update order with random edits: dropped runs, inserted ids (live ones from
    elsewhere in the list or not in it, dead ones), swapped neighbours, repeated ids."""
    out = list(order)
    for _ in range(int(rng.integers(0, 6))):
        kind = rng.integers(0, 5)
        i = int(rng.integers(0, len(out) + 1))
        if kind == 0 and out:                                   # drop a run
            del out[i:i + int(rng.integers(1, 40))]
        elif kind == 1:                                         # a live id out of place
            out.insert(i, int(rng.choice(live)))
        elif kind == 2 and len(out) > i + 1:                    # swap neighbours
            out[i], out[i + 1] = out[i + 1], out[i]
        elif kind == 3 and dead and rng.random() < 0.3:         # an id that is not live
            out.insert(i, int(rng.choice(dead)))
        elif kind == 4 and out:                                 # a repeat of an earlier id
            out.insert(i, out[int(rng.integers(0, len(out)))])
    return out


def _id_error(rem, upd, live):
    """(field, index) of the first id error of a frame of removes and updates, or None."""
    seen = set()
    for field, lst in (("remove_ids", rem), ("update_ids", upd)):
        for i, x in enumerate(lst):
            if x not in live or x in seen:
                return field, i
            seen.add(x)
    return None


def test_update_order_edits_match_the_oracle(twin):
    """Updates in the last frame's order with ids dropped, inserted, swapped, repeated, unknown, or also
    removed: handles found along the list or by lookup, every bad frame rejected at the right entry."""
    t, rng, ids, boxes = twin
    box_of = {int(i): b for i, b in zip(ids, boxes)}
    order = [int(i) for i in ids]
    dead, next_id, bad = [], 10 ** 6, 0
    for _ in range(60):
        live = list(box_of)
        upd = _edit(rng, order, live, dead)
        rem = [int(x) for x in rng.choice(live, size=int(rng.integers(0, 3)), replace=False)]
        if rng.random() < 0.5:
            rem = []
        err = _id_error(rem, upd, set(box_of))
        ub = np.array([box_of.get(x, boxes[0]) for x in upd], np.float32).reshape(-1, 4)
        ub = _move(rng, ub, frac=0.5)
        add = list(range(next_id, next_id + int(rng.integers(0, 4))))
        ab = _boxes(rng, len(add))
        frame = dict(remove_ids=np.array(rem, np.uint64), update_ids=np.array(upd, np.uint64),
                     update_boxes=ub, add_ids=np.array(add, np.uint64), add_boxes=ab)
        if err:
            with pytest.raises(FrameError) as e:
                t.world.step(**frame)
            assert (e.value.field, e.value.index) == err
            bad += 1
            continue
        t.step(**frame)
        next_id += len(add)
        for x in rem:
            del box_of[x]
            dead.append(x)
        box_of.update({x: b for x, b in zip(upd, ub)})
        box_of.update({x: b for x, b in zip(add, ab)})
        if upd:                        # the next frame updates the new objects too (at the end), or not
            order = upd + add if rng.random() < 0.5 else upd
    assert 5 <= bad <= 55              # both kinds of frame were exercised
    t.check_state()


def test_same_frames_same_deltas_with_one_or_two_threads():
    rng = np.random.default_rng(3)
    ids = np.arange(N, dtype=np.uint64)
    boxes = _boxes(rng, N)
    frames = [dict(add_ids=ids, add_boxes=boxes)]
    for _ in range(5):
        boxes = _move(rng, boxes, step=1.0)
        frames.append(dict(update_ids=ids, update_boxes=boxes))
    out = []
    for threads in (1, 2):
        t = Twin(WorldConfig(dims=2, bounds=(0.0, 0.0, 60.0, 60.0), cells=(5, 7), threads=threads),
                 queries_per_frame=0)
        out.append([t.step(**f) for f in frames])
    for a, b in zip(*out):
        assert np.array_equal(a.created, b.created) and np.array_equal(a.deleted, b.deleted)


@pytest.mark.parametrize("dims", [2, 3])
def test_few_movers_in_crowded_cells(dims):
    """Few moved boxes in big cells: each endpoint moves left or right on its own (not a full sort)."""
    rng = np.random.default_rng(11 + dims)
    n, side = 700, 12.0
    cfg = WorldConfig(dims=dims, bounds=(0.0,) * dims + (side,) * dims, cells=(2,) * dims, threads=2)
    t = Twin(cfg, queries_per_frame=1)
    ids = np.arange(n, dtype=np.uint64)
    c = rng.uniform(0, side, (n, dims))
    h = rng.uniform(0.2, 1.2, (n, dims))
    t.step(add_ids=ids, add_boxes=np.concatenate([c - h, c + h], 1).astype(np.float32))
    live = set(range(n))
    nxt = n
    for f in range(25):
        ids_live = np.array(sorted(live), dtype=np.uint64)
        k = max(1, len(ids_live) // 40)
        mv = rng.choice(ids_live, size=k, replace=False)
        c = rng.uniform(-1, side + 1, (k, dims))
        h = rng.uniform(0.0, 2.0, (k, dims))            # also grow, shrink and zero size
        if f % 3 == 0:
            h[0] = 0.0
        frame = dict(update_ids=mv, update_boxes=np.concatenate([c - h, c + h], 1).astype(np.float32))
        if f % 5 == 4:                                   # with a few removes and adds now and then
            rest = np.setdiff1d(ids_live, mv)
            gone = rng.choice(rest, size=3, replace=False)
            frame["remove_ids"] = gone
            live -= set(gone.tolist())
            new = np.arange(nxt, nxt + 3, dtype=np.uint64)
            nxt += 3
            cc = rng.uniform(0, side, (3, dims))
            frame.update(add_ids=new, add_boxes=np.concatenate([cc - 0.5, cc + 0.5], 1).astype(np.float32))
            live |= set(new.tolist())
        t.step(**frame)


def test_arena_compaction_keeps_every_cell(monkeypatch):
    """Cells that outgrow their regions leave garbage behind; compacting the arenas (here on every
    occasion) moves every cell's SAP and pair set without changing a pair."""
    import sapcore.arena as arena_mod
    monkeypatch.setattr(arena_mod, "COMPACT_MIN_UNITS", 0)
    calls = {"sap": 0, "pm": 0}
    real = arena_mod.Arena.compact

    def counted(self, *a, **k):
        calls["sap" if self.pad else "pm"] += 1           # the SAP arena's regions have a sentinel unit
        return real(self, *a, **k)
    monkeypatch.setattr(arena_mod.Arena, "compact", counted)
    rng = np.random.default_rng(5)
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 40.0, 40.0), cells=(6, 6), threads=2)
    t = Twin(cfg, queries_per_frame=1)
    ids = np.arange(400, dtype=np.uint64)
    boxes = _boxes(rng, 400, side=40.0)
    t.step(add_ids=ids, add_boxes=boxes)
    for f in range(12):
        # herd everything towards one corner and back: cells empty out and overflow in turn
        target = np.array([5.0, 5.0] if f % 2 == 0 else [35.0, 35.0], np.float32)
        c = (boxes[:, :2] + boxes[:, 2:]) / 2
        c += (target - c) * np.float32(0.6) + rng.normal(0, 1.0, c.shape).astype(np.float32)
        h = (boxes[:, 2:] - boxes[:, :2]) / 2
        boxes = np.concatenate([c - h, c + h], 1).astype(np.float32)
        t.step(update_ids=ids, update_boxes=boxes)
    assert calls["sap"] > 0 and calls["pm"] > 0, f"the scene did not compact both arenas: {calls}"


def test_the_guiding_list_is_the_updates_then_the_new_objects(twin):
    """The list that guides the next frame's handles: this frame's updates then its new objects; a
    frame of adds only appends to it; a frame that removes without updating empties it (the removed
    may be on it). Every frame is checked against the oracle as well."""
    t, rng, ids, boxes = twin
    last = lambda: t.world.update_list.ids.tolist()                          # noqa: E731
    new = np.arange(10**6, 10**6 + 5, dtype=np.uint64)
    t.step(update_ids=ids, update_boxes=_move(rng, boxes), add_ids=new, add_boxes=_boxes(rng, 5))
    assert last() == ids.tolist() + new.tolist()
    more = new + 100
    t.step(add_ids=more, add_boxes=_boxes(rng, 5))
    assert last() == ids.tolist() + new.tolist() + more.tolist()
    every = np.concatenate([ids, new, more])
    t.step(update_ids=every, update_boxes=_boxes(rng, len(every)))     # follows the list all the way
    assert last() == every.tolist()
    t.step(remove_ids=new[:2])
    assert last() == []
    t.check_state()


def test_a_repeated_list_keeps_its_boxes_by_row(twin):
    """The same update list frame after frame: the box check reads the last frame's boxes row by row
    (``_last_boxes``), a frame that repeats every box is a still frame. Rows changed past the first few,
    -0.0 for +0.0, a bad box in the last row (rejected, nothing changes), adds (appended to the rows),
    a list with gaps (rows found along the last list), a shuffled list (no rows kept) all give the
    oracle's answers, and the rows stay equal to the stored boxes (``World.validate``)."""
    t, rng, ids, boxes = twin
    boxes = boxes.copy()
    boxes[5] = [0.0, 1.0, 0.5, 2.0]
    t.step(update_ids=ids, update_boxes=boxes)
    assert t.world.update_list.rows is not None                  # the second frame of this list: rows kept
    signed = boxes.copy()
    signed[5, 0] = np.float32(-0.0)
    d = t.step(update_ids=ids, update_boxes=signed)         # equal boxes (-0.0 == +0.0): a still frame
    assert d.stats.cells_touched == 0 and len(d.created) == len(d.deleted) == 0
    late = boxes.copy()
    late[N - 40:] = _move(rng, boxes[N - 40:], step=5.0)    # only rows past the first 64 change
    t.step(update_ids=ids, update_boxes=late)
    bad = late.copy()
    bad[N - 1, 3] = np.inf
    with pytest.raises(FrameError) as e:
        t.world.step(update_ids=ids, update_boxes=bad)
    assert (e.value.field, e.value.index) == ("update_boxes", N - 1)
    t.check_state()
    t.step(update_ids=ids, update_boxes=late)               # the rejected frame left the rows as they were
    for _ in range(3):
        late = _move(rng, late, frac=0.5)
        t.step(update_ids=ids, update_boxes=late)
    new = np.arange(10**6, 10**6 + 3, dtype=np.uint64)
    t.step(update_ids=ids, update_boxes=late, add_ids=new, add_boxes=_boxes(rng, 3))
    assert t.world.update_list.rows.shape[0] == N + 3            # the list and its rows: the updates, then the adds
    every = np.concatenate([ids, new])
    eb = np.concatenate([late, t.world.boxes(new)])
    keep = np.ones(len(every), bool)
    keep[rng.choice(len(every), 40, replace=False)] = False
    eb[keep] = _move(rng, eb[keep], frac=0.5)
    t.step(update_ids=every[keep], update_boxes=eb[keep])   # a list with gaps: rows found along the last one
    assert t.world.update_list.rows.shape[0] == keep.sum()
    t.step(update_ids=every[keep], update_boxes=eb[keep])   # then the same list, all boxes unchanged
    fewer = keep.copy()
    fewer[np.flatnonzero(keep)[::50]] = False
    d = t.step(update_ids=every[fewer], update_boxes=eb[fewer])  # gaps again, every box as stored: each
    assert d.stats.cells_touched == 0                       # row found along the list, nothing moves
    perm = rng.permutation(len(every))
    t.step(update_ids=every[perm], update_boxes=_move(rng, eb[perm]))
    assert t.world.update_list.rows is None                      # a shuffled list: every id looked up, no rows
    t.step(remove_ids=every[perm][:5])
    assert t.world.update_list.rows is None and t.world.update_list.ids.shape[0] == 0


def test_a_repeated_list_is_still_only_when_every_id_and_box_repeats(twin):
    """A frame listing the last frame's ids in the same order is compared with it (ids, and boxes by row)
    in one pass, block by block: a still frame changes nothing and skips the box check. A change in a
    single coordinate of any row (first, at a block edge, the very last), a NaN or an infinity in an
    otherwise repeated frame, or one id replaced in the last row must each be seen; -0.0 for +0.0 in the
    last row is no change. Still frames with removes or adds apply those."""
    t, rng, ids, boxes = twin
    boxes = boxes.copy()
    boxes[N - 1] = [1.0, 0.0, 2.0, 1.5]
    for _ in range(2):                                          # the second frame keeps the rows
        t.step(update_ids=ids, update_boxes=boxes)
    assert t.world.update_list.rows is not None
    for row in (0, 1023, 1024, N - 1):                          # one coordinate, just above the stored one
        for col in (0, 3):
            b = boxes.copy()
            b[row, col] = np.nextafter(b[row, col], np.float32(np.inf))
            d = t.step(update_ids=ids, update_boxes=b)
            assert d.stats.cells_touched > 0, (row, col)
            d = t.step(update_ids=ids, update_boxes=boxes)       # and back
            assert d.stats.cells_touched > 0, (row, col)
    signed = boxes.copy()
    signed[N - 1, 1] = np.float32(-0.0)
    d = t.step(update_ids=ids, update_boxes=signed)             # -0.0 == +0.0: still
    assert d.stats.cells_touched == 0 and len(d.created) == len(d.deleted) == 0
    d = t.step(update_ids=ids, update_boxes=boxes.astype(np.float64))   # float64 input, same values
    assert d.stats.cells_touched == 0
    for row, col, v in ((N - 1, 2, np.nan), (N - 1, 0, np.inf), (1024, 1, np.nan), (0, 3, -np.inf)):
        bad = boxes.copy()
        bad[row, col] = v
        with pytest.raises(FrameError) as e:
            t.world.step(update_ids=ids, update_boxes=bad)
        assert (e.value.field, e.value.index) == ("update_boxes", row)
        t.check_state()
    with pytest.raises(FrameError) as e:                        # removing a listed object it updates
        t.world.step(update_ids=ids, update_boxes=boxes, remove_ids=ids[N - 1:])
    assert (e.value.field, e.value.index) == ("update_ids", N - 1)
    t.check_state()
    new = np.arange(10**6, 10**6 + 4, dtype=np.uint64)         # a still list with adds
    d = t.step(update_ids=ids, update_boxes=boxes, add_ids=new, add_boxes=boxes[:4])
    assert len(d.created) > 0
    ids = np.concatenate([ids, new])
    boxes = np.concatenate([boxes, boxes[:4]])
    d = t.step(update_ids=ids, update_boxes=boxes)              # the list with the adds appended: still
    assert d.stats.cells_touched == 0
    # the same list but for one object in the last row (its box is the row's stored one): not the list,
    # so that object moves to the box its row held
    part_ids, part_boxes = ids[:-1], boxes[:-1]
    for _ in range(2):
        t.step(update_ids=part_ids, update_boxes=part_boxes)
    assert t.world.update_list.rows is not None and t.world.update_list.ids.shape[0] == len(part_ids)
    other = part_ids.copy()
    other[-1] = ids[-1]
    d = t.step(update_ids=other, update_boxes=part_boxes)
    assert d.stats.cells_touched > 0
    d = t.step(update_ids=other, update_boxes=part_boxes)         # now the list, repeated: still
    assert d.stats.cells_touched == 0
    d = t.step(update_ids=other, update_boxes=part_boxes, remove_ids=ids[-2:-1])   # still, with a remove
    assert len(d.deleted) > 0
    t.check_state()


def test_repeated_lists_of_small_and_large_ids():
    """The world keeps the last update list's ids as uint32 while they all fit, else as uint64. An id
    that differs from the listed one only above bit 31 is another id; lists holding ids of 2**32 and more
    (from the start, or appended by adds) repeat, and are found still, as any other."""
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 60.0, 60.0), cells=(8, 8), threads=2)
    rng = np.random.default_rng(3)
    small = np.arange(N, dtype=np.uint64) * 5 + 7
    for ids in (small, small + np.uint64(1 << 32), np.concatenate([small[:-1], [np.uint64(2**64 - 1)]])):
        t = Twin(cfg, queries_per_frame=1)
        boxes = _boxes(rng, N)
        t.step(add_ids=ids, add_boxes=boxes)
        for _ in range(2):
            t.step(update_ids=ids, update_boxes=boxes)
        assert t.world.update_list.ids.dtype == (np.uint32 if ids.max() < 2**32 else np.uint64)
        d = t.step(update_ids=ids, update_boxes=boxes)
        assert d.stats.cells_touched == 0
        high = ids.copy()
        high[-1] ^= np.uint64(1 << 32)                         # the same low 32 bits: an unknown id
        with pytest.raises(FrameError) as e:
            t.world.step(update_ids=high, update_boxes=boxes)
        assert (e.value.field, e.value.index) == ("update_ids", N - 1)
        t.check_state()
        moved = _move(rng, boxes, frac=0.2)
        t.step(update_ids=ids, update_boxes=moved)
        big = np.array([2**33 + 1, 2**40], np.uint64)           # adds of large ids append to the list
        t.step(add_ids=big, add_boxes=_boxes(rng, 2))
        assert t.world.update_list.ids.dtype == np.uint64
        every = np.concatenate([ids, big])
        eb = t.world.boxes(every)
        d = t.step(update_ids=every, update_boxes=eb)
        d = t.step(update_ids=every, update_boxes=eb)
        assert d.stats.cells_touched == 0
        eb[-1, 2] += 1.0
        d = t.step(update_ids=every, update_boxes=eb)
        assert d.stats.cells_touched > 0
        t.check_state()


def test_serial_frame_falls_back_to_the_general_phases_where_it_must(monkeypatch):
    """A frame on the calling thread runs phases 4-7 in one call, which leaves to the general phases an
    event slice that overflowed, a pair set without room and the world's pair table without room: each
    of the three happens here (counted), and every frame matches the oracle."""
    from sapcore import world as world_mod
    from sapcore.kernels import frame as kframe

    compile_one_call_frames()
    seen = {kframe.PAIRS_OVERFLOW: 0, kframe.PAIRS_NET: 0, kframe.PAIRS_MERGE: 0, kframe.PAIRS_DONE: 0}
    listed = {}      # frame_listed's statuses: the same four, and where it stops before them

    def counted(real, into):
        def call(*args):
            out = real(*args)
            into[out[0]] = into.get(out[0], 0) + 1
            return out
        return call

    monkeypatch.setattr(world_mod.kframe, "frame_pairs", counted(kframe.frame_pairs, seen))
    # a frame that adds runs phases 2-7 in one call too (its statuses beside frame_pairs')
    monkeypatch.setattr(world_mod.kframe, "frame_cells_pairs", counted(kframe.frame_cells_pairs, seen))
    monkeypatch.setattr(world_mod.kframe, "frame_listed", counted(kframe.frame_listed, listed))
    # (these frames are small: their one call is the twin that keeps the GIL)
    monkeypatch.setattr(world_mod.kframe, "frame_listed_held", counted(kframe.frame_listed_held, listed))
    rng = np.random.default_rng(5)
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 40.0, 40.0), cells=(2, 2), threads=1)
    t = Twin(cfg, queries_per_frame=1)
    n = 60
    ids = np.arange(n, dtype=np.uint64)
    c = rng.uniform(1, 19, (n, 2)).astype(np.float32)            # one cell, boxes apart (tiny)
    apart = np.concatenate([c, c + np.float32(0.01)], 1)
    t.step(add_ids=ids, add_boxes=apart)
    boxes = apart.copy()
    for g in range(12):
        # group g of 5 boxes onto a spot of its own: 10 new pairs a frame, in one cell, so that the cell's
        # pair set and the world's pair table run out of room now and then
        boxes[5 * g:5 * g + 5] = np.array([1 + 1.5 * g, 2, 2 + 1.5 * g, 3], np.float32)
        t.step(update_ids=ids, update_boxes=boxes)
    overflows = 0
    for k in range(3):
        # all of them on one spot: ~n^2/2 pairs start in one frame, far beyond the cell's event slice
        together = np.tile(np.array([[5, 5, 6, 6]], np.float32), (n, 1)) + np.float32(0.01 * k)
        overflows += t.step(update_ids=ids, update_boxes=together).stats.cell_overflows
        t.step(update_ids=ids, update_boxes=_move(rng, apart, step=0.005))
    assert overflows > 0
    # every box into the next cell, which has no room for them yet: the same list, phase 3 done by Python
    t.step(update_ids=ids, update_boxes=apart + np.array([20, 0, 20, 0], np.float32))
    # the frames of the same list run whole in frame_listed, which falls back the same way
    for status in seen:
        assert seen[status] + listed.get(status, 0) > 0, (seen, listed)
    assert listed.get(kframe.LISTED_ROOM, 0) > 0, listed
    t.check_state()


def test_serial_frame_that_adds_stops_where_it_must(monkeypatch):
    """A frame on the calling thread that removes or adds runs phases 2-7 in one call (``frame_cells_pairs``),
    which stops after phase 3 for room in a cell, and after the cells' kernels for an event slice that
    overflowed, a pair set or the world's pair table without room: each happens here (counted), every
    frame one object removed and one added (never the listed frame), and every frame matches the oracle."""
    from sapcore import world as world_mod
    from sapcore.kernels import frame as kframe

    compile_one_call_frames()
    seen = {}

    def counted(*args):
        out = real(*args)
        seen[out[0]] = seen.get(out[0], 0) + 1
        return out

    real = kframe.frame_cells_pairs
    monkeypatch.setattr(world_mod.kframe, "frame_cells_pairs", counted)
    rng = np.random.default_rng(9)
    t = Twin(WorldConfig(dims=2, bounds=(0.0, 0.0, 40.0, 40.0), cells=(2, 2), threads=1), queries_per_frame=1)
    n = 60
    ids = np.arange(n, dtype=np.uint64)
    c = rng.uniform(1, 19, (n, 2)).astype(np.float32)            # one cell, boxes apart (tiny)
    apart = np.concatenate([c, c + np.float32(0.01)], 1)
    t.step(add_ids=ids, add_boxes=apart)
    extra = 1000                                                  # the one object swapped every frame

    def churned(boxes):
        nonlocal extra
        spot = np.array([[30.0, 30.0, 30.5, 30.5]], np.float32)
        gone = [extra] if extra > 1000 else None
        extra += 1
        return t.step(update_ids=ids, update_boxes=boxes, remove_ids=gone, add_ids=[extra], add_boxes=spot)

    boxes = apart.copy()
    for g in range(12):      # 10 new pairs a frame in one cell: its pair set and the pair table run short
        boxes[5 * g:5 * g + 5] = np.array([1 + 1.5 * g, 2, 2 + 1.5 * g, 3], np.float32)
        churned(boxes)
    overflows = 0
    for k in range(3):       # ~n^2/2 pairs start in one cell in one frame, beyond its event slice
        together = np.tile(np.array([[5, 5, 6, 6]], np.float32), (n, 1)) + np.float32(0.01 * k)
        overflows += churned(together).stats.cell_overflows
        churned(_move(rng, apart, step=0.005))
    assert overflows > 0
    churned(apart + np.array([20, 0, 20, 0], np.float32))          # into a cell without room for them
    for status in (kframe.LISTED_ROOM, kframe.PAIRS_DONE, kframe.PAIRS_OVERFLOW, kframe.PAIRS_NET,
                   kframe.PAIRS_MERGE):
        assert seen.get(status, 0) > 0, (status, seen)
    t.check_state()


@pytest.mark.parametrize("dims", [2, 3])
def test_a_one_call_frame_names_a_bad_box_as_the_general_check_does(dims, monkeypatch):
    """A small frame of the last list's updates runs whole in ``frame_listed``, which checks the boxes
    against the list's rows in passes of its own: every kind of bad box, in the first, a middle or the
    last row, behind rows that moved, is refused with the general check's field, index and reason, the
    world unchanged; the frames in between (and after) run in that one call and match the oracle."""
    from sapcore import world as world_mod
    from sapcore.kernels import frame as kframe

    statuses = []

    def counted(real):
        def call(*args):
            out = real(*args)
            statuses.append(out[0])
            return out
        return call

    # (300 objects: a small frame, whose one call is the twin that keeps the GIL)
    compile_one_call_frames()
    monkeypatch.setattr(world_mod.kframe, "frame_listed_held", counted(kframe.frame_listed_held))
    rng = np.random.default_rng(11)
    bounds = (0.0,) * dims + (50.0,) * dims
    t = Twin(WorldConfig(dims=dims, bounds=bounds, cells=(4,) * dims, threads=1, coord_limit=1e6),
             queries_per_frame=1)
    n = 300
    ids = np.arange(n, dtype=np.uint64) + 5
    c = rng.uniform(0, 50, (n, dims))
    boxes = np.concatenate([c - 0.8, c + 0.8], 1).astype(np.float32)
    t.step(add_ids=ids, add_boxes=boxes)
    for _ in range(2):                                      # the list, then its rows kept
        boxes = boxes + np.float32(0.05)
        t.step(update_ids=ids, update_boxes=boxes)
    assert t.world.update_list.rows is not None
    kinds = {"NaN coordinate on axis": np.nan, "infinite coordinate on axis": -np.inf,
             "exceeds the supported range": 2e6, "min > max on axis": None}
    for reason, value in kinds.items():
        for row in (0, n // 2, n - 1):
            bad = boxes + np.float32(0.05)
            axis = row % dims
            if value is None:
                bad[row, axis] = bad[row, dims + axis] + 1
            else:
                bad[row, dims + axis] = value
            before = len(statuses)
            with pytest.raises(FrameError) as e:
                t.world.step(update_ids=ids, update_boxes=bad)
            assert statuses[before:] == [kframe.LISTED_BAD]
            assert (e.value.field, e.value.index) == ("update_boxes", row), (reason, row)
            assert reason in str(e.value) and f"axis {axis}" in str(e.value), str(e.value)
            t.check_state()
            boxes = boxes + np.float32(0.05)
            t.step(update_ids=ids, update_boxes=boxes)
    d = t.step(update_ids=ids, update_boxes=boxes.copy())   # every box as stored: a still frame
    assert d.stats.cells_touched == 0
    assert statuses.count(kframe.PAIRS_DONE) >= 8 and statuses[-1] == kframe.LISTED_STILL


def test_a_frame_that_removes_and_adds_reads_the_worlds_arrays_of_now(monkeypatch):
    """``frame_cells_pairs`` reads the world's arrays from its ``ListedState`` record: frames that each
    remove one object and add more and more (never a frame of updates only, whose path would remake the
    record itself) make the objects' arrays, a cell's SAP, its pair set and the world's pair table grow
    again and again; each time ``_serial_frame`` makes a new record, and every frame matches the oracle
    (a record left with the old arrays would give other pairs, or write into freed memory)."""
    from numba import njit

    from sapcore import world as world_mod

    made = []
    real = world_mod.World._listed_state

    def counted(self):
        made.append(self.objects.box.shape[0])
        return real(self)

    compile_one_call_frames()
    monkeypatch.setattr(world_mod.World, "_listed_state", counted)
    rng = np.random.default_rng(3)
    t = Twin(WorldConfig(dims=2, bounds=(0.0, 0.0, 40.0, 40.0), cells=(2, 2), threads=1), queries_per_frame=1)
    ids = list(range(8))
    boxes = {i: b for i, b in zip(ids, _boxes(rng, 8, side=40.0))}
    t.step(add_ids=np.array(ids, np.uint64), add_boxes=np.stack([boxes[i] for i in ids]))
    fresh = 100
    for k in range(1, 40):
        gone = ids.pop(0)
        del boxes[gone]
        for i in ids:
            boxes[i] = _move(rng, boxes[i][None], step=0.05)[0]
        new = list(range(fresh, fresh + k))
        fresh += k
        c = rng.uniform(2, 8, (k, 2)).astype(np.float32)          # in one cell, many overlapping
        added = np.concatenate([c, c + np.float32(2.0)], 1)
        t.step(remove_ids=np.array([gone], np.uint64), update_ids=np.array(ids, np.uint64),
               update_boxes=np.stack([boxes[i] for i in ids]), add_ids=np.array(new, np.uint64), add_boxes=added)
        ids += new
        boxes.update(zip(new, added))
    t.check_state()
    w = t.world
    assert len(ids) > 500 and len(set(made)) >= 3, made      # the objects' arrays grew, records were remade

    @njit
    def held(st):                   # (the record's fields as numba hands them back: the arrays themselves)
        return st.boxes, st.ep_key, st.pm_keys, st.g_slots

    assert all(a is b for a, b in zip(held(w._listed), (w.objects.box, w.sap.arrays[2], w.pair_sets.arrays[1],
                                                       w.world_pairs.slots)))
