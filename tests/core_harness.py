"""Test harness of the sapcore engine: drive a ``sapcore.World`` and the ``naive.NaiveWorld`` oracle with
the same frames and check every DESIGN.md "Semantics" invariant after every frame.

``Twin`` is the one place the checks live; the property, scenario and validation tests only build frames.
Frames are dicts of ``World.step`` keyword arguments, kept in ``Twin.frames``; when a check fails they
are saved (``save_frames``) so that ``replay`` reproduces the failure and ``frames_repr`` prints it.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

import sapcore
from naive import NaiveWorld, array_to_pairs
from sapcore import WorldConfig

#: where Twin saves the frames of a failed check (the last failure wins, so after a hypothesis run it
#: holds the shrunk example)
REPRO_PATH = os.path.join(tempfile.gettempdir(), "sapcore-repro-last.npz")
FRAME_KEYS = ("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static",
              "update_ids", "update_boxes")


def new_world(cfg: WorldConfig):
    """The engine under test (looked up at call time, so a harness self-check can substitute it)."""
    return sapcore.World(cfg)


def compile_one_call_frames() -> None:
    """Run a few small frames, listed and not, so that the one-call frames' kernels are compiled (or loaded)
    before a test puts Python wrappers in their modules' places: a kernel compiled while a kernel it calls is wrapped
    cannot type that call (with the kernel cache cold, the order of the tests would decide)."""
    w = sapcore.World(WorldConfig(dims=2, bounds=(0.0, 0.0, 10.0, 10.0), cells=(2, 2), threads=1))
    ids = np.arange(8, dtype=np.uint64)
    boxes = np.concatenate([ids[:, None] * 1.0 + np.zeros((8, 2)), ids[:, None] * 1.0 + 1.5 + np.zeros((8, 2))], 1)
    w.step(add_ids=ids, add_boxes=boxes.astype(np.float32))
    for k in range(3):
        w.step(update_ids=ids, update_boxes=(boxes + 0.1 * (k + 1)).astype(np.float32))
    # and a frame that removes and adds (``frame_cells_pairs``)
    w.step(remove_ids=ids[:1], update_ids=ids[1:], update_boxes=boxes[1:].astype(np.float32), add_ids=ids[:1] + 100,
           add_boxes=boxes[:1].astype(np.float32))


def check_pair_array(arr, name: str) -> set:
    """Check that ``arr`` is a uint64 [K, 2] array of sorted unique (low < high) rows; return it as a set."""
    assert isinstance(arr, np.ndarray), f"{name}: not an ndarray ({type(arr)})"
    assert arr.dtype == np.uint64, f"{name}: dtype {arr.dtype}, expected uint64"
    assert arr.ndim == 2 and arr.shape[1] == 2, f"{name}: shape {arr.shape}, expected [K, 2]"
    lo, hi = arr[:, 0], arr[:, 1]
    bad = arr[lo >= hi]
    assert not len(bad), f"{name}: rows with low >= high: {bad[:5].tolist()}"
    increasing = (lo[1:] > lo[:-1]) | ((lo[1:] == lo[:-1]) & (hi[1:] > hi[:-1]))
    assert increasing.all(), f"{name}: rows not sorted or not unique at row {int(np.argmin(increasing)) + 1}"
    return array_to_pairs(arr)


def random_region(rng: np.random.Generator, cfg: WorldConfig) -> np.ndarray:
    """A float32-representable query region around (and sometimes far outside) the world bounds."""
    d = cfg.dims
    b = np.asarray(cfg.bounds, dtype=np.float64)
    size = b[d:] - b[:d]
    lo = b[:d] - size + rng.random(d) * 3 * size
    ext = rng.choice([0.0, 0.05, 0.3, 1.0, 4.0]) * size * rng.random(d)
    region = np.concatenate([lo, lo + ext])
    if rng.random() < 0.15:
        region[:d] -= 1.0e6
        region[d:] += 1.0e6
    return region.astype(np.float32)


class Twin:
    """A World and its oracle stepped together; ``step`` checks everything after the frame."""

    def __init__(self, cfg: WorldConfig, queries_per_frame: int = 3, seed: int = 0):
        self.cfg = cfg
        self.world = new_world(cfg)
        self.oracle = NaiveWorld.from_config(cfg)
        self.active: set = set()  # running sum of the deltas
        self.frames: list[dict] = []
        self.queries_per_frame = queries_per_frame
        self.rng = np.random.default_rng(seed)

    def step(self, **frame):
        """Step both worlds with ``frame`` and check everything; on a failed check the frames so far are
        saved to REPRO_PATH (replay them with ``replay``)."""
        frame = {k: v for k, v in frame.items() if v is not None}
        self.frames.append(frame)
        try:
            return self._step_checked(frame, len(self.frames) - 1)
        except AssertionError as e:
            save_frames(REPRO_PATH, self.cfg, self.frames)
            raise AssertionError(f"{e}\n[{len(self.frames)} frames saved to {REPRO_PATH}; "
                                 f"core_harness.replay({str(REPRO_PATH)!r}) replays them]") from None

    def _step_checked(self, frame, n):
        delta = self.world.step(**frame)
        expect = self.oracle.step(**frame)
        created = check_pair_array(delta.created, f"frame {n} created")
        deleted = check_pair_array(delta.deleted, f"frame {n} deleted")
        assert not created & deleted, f"frame {n}: pairs both created and deleted: {sorted(created & deleted)[:5]}"
        assert not created & self.active, f"frame {n}: created pairs already active: {sorted(created & self.active)[:5]}"
        assert deleted <= self.active, f"frame {n}: deleted pairs not active: {sorted(deleted - self.active)[:5]}"
        self.active = (self.active - deleted) | created
        want_c, want_d = array_to_pairs(expect.created), array_to_pairs(expect.deleted)
        assert created == want_c, (f"frame {n} created: missing {sorted(want_c - created)[:5]}, "
                                   f"extra {sorted(created - want_c)[:5]}")
        assert deleted == want_d, (f"frame {n} deleted: missing {sorted(want_d - deleted)[:5]}, "
                                   f"extra {sorted(deleted - want_d)[:5]}")
        s = delta.stats
        got_stats = (s.objects, s.pairs, s.created, s.deleted)
        want_stats = (expect.stats.objects, expect.stats.pairs, len(created), len(deleted))
        assert got_stats == want_stats, f"frame {n}: stats (objects, pairs, created, deleted) {got_stats} != {want_stats}"
        self.check_state(n)
        return delta

    def check_state(self, n="?"):
        w, o = self.world, self.oracle
        w.validate()
        assert w.object_count == o.object_count, f"frame {n}: object_count {w.object_count} != {o.object_count}"
        ids = w.ids()
        assert ids.dtype == np.uint64 and np.array_equal(ids, o.ids()), f"frame {n}: ids() differ"
        got = w.boxes(ids)
        assert got.dtype == np.float32 and np.array_equal(got, o.boxes(ids)), f"frame {n}: boxes() differ"
        pairs = check_pair_array(w.pairs(), f"frame {n} pairs()")
        truth = o.pair_set()
        assert pairs == truth, (f"frame {n} pairs(): missing {sorted(truth - pairs)[:5]}, "
                                f"extra {sorted(pairs - truth)[:5]}")
        assert self.active == truth, f"frame {n}: sum of deltas != active pairs"
        assert w.pair_count == len(truth), f"frame {n}: pair_count {w.pair_count} != {len(truth)}"
        assert w.frames == o.frames, f"frame {n}: frames {w.frames} != {o.frames}"
        for _ in range(self.queries_per_frame):
            region = random_region(self.rng, self.cfg)
            q = w.query(region)
            assert q.dtype == np.uint64, f"frame {n}: query dtype {q.dtype}"
            assert np.array_equal(q, o.query(region)), f"frame {n}: query({region.tolist()}) differs"


def frames_repr(frames) -> str:
    """Python source that rebuilds ``frames`` (for a minimal reproducer in a report)."""
    out = []
    for f in frames:
        parts = []
        for k in FRAME_KEYS:
            if k in f:
                a = np.asarray(f[k])
                parts.append(f"{k}=np.array({a.tolist()!r}, dtype=np.{a.dtype})")
        out.append("w.step(" + ", ".join(parts) + ")")
    return "\n".join(out)


def save_frames(path, cfg: WorldConfig, frames) -> None:
    """Save a frame sequence (a regression input) as one .npz of arrays named ``<frame>_<key>``."""
    arrays = {"dims": np.array(cfg.dims), "bounds": np.array(cfg.bounds), "cells": np.array(cfg.cells)}
    for i, f in enumerate(frames):
        for k, v in f.items():
            arrays[f"{i:04d}_{k}"] = np.asarray(v)
    arrays["n_frames"] = np.array(len(frames))
    np.savez(path, **arrays)


def load_frames(path):
    """Inverse of ``save_frames``: (dims, bounds, cells, frames)."""
    z = np.load(path)
    frames = [{} for _ in range(int(z["n_frames"]))]
    for name in z.files:
        if name[:4].isdigit():
            frames[int(name[:4])][name[5:]] = z[name]
    return int(z["dims"]), tuple(z["bounds"].tolist()), tuple(z["cells"].tolist()), frames


def replay(path, threads=1) -> Twin:
    """Replay saved frames through a checked Twin (raises at the first failing frame); copy a failing
    file into tests/data/ to keep it as a regression input."""
    dims, bounds, cells, frames = load_frames(path)
    twin = Twin(WorldConfig(dims=dims, bounds=bounds, cells=cells, threads=threads))
    for f in frames:
        twin.step(**f)
    return twin
