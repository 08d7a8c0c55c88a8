"""Threads and sapcore.World: deltas do not depend on the thread count (threads=None is numba's default),
and worlds stepped at the same time from several Python threads (as the server's per-world workers do)
give exactly the deltas they give one at a time.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from core_harness import new_world
from core_scenes import SceneGen
from naive import NaiveWorld
from sapcore import WorldConfig

CFG = WorldConfig(dims=2, bounds=(0.0, 0.0, 64.0, 64.0), cells=(8, 8), threads=2)


def _frames(cfg, seed, n_objects=800, n_frames=10):
    rng = np.random.default_rng(seed)
    oracle = NaiveWorld(cfg.dims)
    gen = SceneGen(cfg, rng, extent=0.5)
    frames = []
    for k in range(n_frames):
        frames.append(gen.fill(oracle, n_objects) if k == 0 else gen.frame(oracle, move=0.5, remove=0.05, add=0.05))
        oracle.step(**frames[-1])
    return frames


def _run(cfg, frames):
    w = new_world(cfg)
    out = []
    for f in frames:
        d = w.step(**f)
        out.append((d.created.tobytes(), d.deleted.tobytes()))
    return out + [w.pairs().tobytes()]


@pytest.mark.parametrize("threads", [None, 2])
def test_same_deltas_whatever_the_thread_count(threads):
    frames = _frames(CFG, 1)
    base = _run(WorldConfig(dims=2, bounds=CFG.bounds, cells=CFG.cells, threads=1), frames)
    assert _run(WorldConfig(dims=2, bounds=CFG.bounds, cells=CFG.cells, threads=threads), frames) == base
    assert any(len(c) for c, _ in base[:-1])


def test_worlds_stepped_from_several_threads_at_once():
    all_frames = [_frames(CFG, seed) for seed in range(4)]
    serial = [_run(CFG, frames) for frames in all_frames]
    results = [None] * len(all_frames)
    errors = []

    def work(i):
        try:
            results[i] = _run(CFG, all_frames[i])
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(all_frames))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    assert results == serial
