"""Exactly-once frames through crashes: a real ``sapgrid serve --data-dir`` process is SIGKILLed at random
moments while a client streams a scenario with a writer and ``resume=True``; every kill is followed by a
restart on the same address, and the client carries on by itself.

At the end: the world's pairs equal the brute-force oracle of the whole scenario, its frame counter equals
the frames sent (none applied twice, none lost), every delta the client received equals the one an
uninterrupted in-process run gives for that frame, and every pair digest matched the client's own mirror
(``verify=True``) and the oracle's.

The number of kills is ``SAPGRID_CHAOS_KILLS`` (default 10; a soak run sets more).
"""
from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest

from naive import NaiveWorld
from sapcore import World, WorldConfig
from sapgrid.client import Client
from sapgrid.layout import pairs_digest
from sapgrid.tools.spawn import SpawnedServer, free_port

KILLS = int(os.environ.get("SAPGRID_CHAOS_KILLS", "10"))
BOUNDS = (0.0, 0.0, 200.0, 200.0)


def scenario(n: int = 200, seed: int = 7):
    """Moving boxes, frame after frame for as long as asked: every frame moves every live box a little;
    every 8th frame removes 6 and adds 6."""
    rng = np.random.default_rng(seed)
    ids = np.arange(1, n + 1, dtype=np.uint64)
    centre = rng.uniform(10, 190, size=(n, 2))
    half = rng.uniform(0.5, 3.0, size=(n, 2))
    velocity = rng.uniform(-0.8, 0.8, size=(n, 2))
    next_id = n + 1

    def boxes(c, h):
        return np.concatenate([c - h, c + h], axis=1).astype(np.float32)

    yield dict(add_ids=ids.copy(), add_boxes=boxes(centre, half))
    t = 0
    while True:
        t += 1
        centre = np.clip(centre + velocity, 5, 195)
        velocity[(centre <= 5) | (centre >= 195)] *= -1
        frame = dict(update_ids=ids.copy(), update_boxes=boxes(centre, half))
        if t % 8 == 0:
            gone = rng.choice(len(ids), 6, replace=False)
            keep = np.ones(len(ids), bool)
            keep[gone] = False
            new = np.arange(next_id, next_id + 6, dtype=np.uint64)
            next_id += 6
            new_c, new_h = rng.uniform(10, 190, size=(6, 2)), rng.uniform(0.5, 3.0, size=(6, 2))
            frame = dict(remove_ids=ids[gone].copy(), update_ids=ids[keep].copy(),
                         update_boxes=boxes(centre[keep], half[keep]), add_ids=new, add_boxes=boxes(new_c, new_h))
            ids = np.concatenate([ids[keep], new])
            centre = np.concatenate([centre[keep], new_c])
            half = np.concatenate([half[keep], new_h])
            velocity = np.concatenate([velocity[keep], rng.uniform(-0.8, 0.8, size=(6, 2))])
        yield frame


def test_kill_9_during_a_resuming_writer_stream(tmp_path):
    frames: list[dict] = []               # the scenario's frames, made as the stream asks for them
    source = scenario()
    address = f"127.0.0.1:{free_port()}"
    flags = ("--data-dir", str(tmp_path / "data"), "--fsync", "everysec")
    server = SpawnedServer(*flags, listen=address, metrics_port=-1)
    received: list = []
    failure: list[BaseException] = []
    stop = threading.Event()              # set once the kills are done: the stream then ends its frames
    reconnects = []
    try:
        with Client(address, timeout=30) as c:
            c.create_world("chaos", dims=2, bounds=BOUNDS, cells=(8, 8))

            def stream():
                try:
                    with c.stream("chaos", writer="match-1", resume=True, verify=True, resume_deadline=120) as s:
                        window = 4                     # frames in flight: answers lost in a crash are asked again
                        sent = 0
                        while True:
                            while s.in_flight < window and not stop.is_set():
                                frames.append(next(source))
                                s.send(**frames[sent])
                                sent += 1
                                time.sleep(0.002)      # paced (<= 500 frames/s): the oracle replays them all
                            if not s.in_flight:
                                break
                            received.append(s.recv())
                        reconnects.append(s.reconnects)
                except BaseException as exc:      # reported by the main thread
                    failure.append(exc)

            writer = threading.Thread(target=stream, daemon=True)
            writer.start()
            rng = random.Random(11)
            kills = 0
            while kills < KILLS and writer.is_alive():
                progress = len(received)            # each kill hits a stream that is moving again
                waited = time.monotonic() + 120
                while len(received) <= progress and writer.is_alive() and time.monotonic() < waited:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.4))
                server.proc.kill()                  # SIGKILL: no shutdown, no flush
                server.wait(30)
                kills += 1
                server = SpawnedServer(*flags, listen=address, metrics_port=-1)
            time.sleep(0.3)                         # a few frames on the last server before the end
            stop.set()
            writer.join(600)
            assert not writer.is_alive(), "the writer stream did not finish"
            assert not failure, f"the writer stream failed: {failure[0]!r}"
            assert kills == KILLS and reconnects and reconnects[0] >= KILLS // 2, (kills, reconnects)
            sent = frames
            assert len(received) == len(sent)
            local, oracle = World(WorldConfig(dims=2, bounds=BOUNDS, cells=(8, 8))), NaiveWorld(2)
            info = c.get_world("chaos")
            assert info.frames == len(sent)                  # nothing applied twice, nothing lost
            assert info.writers == {"match-1": len(sent)}
            for i, (got, frame) in enumerate(zip(received, sent)):
                want = local.step(**frame)                   # the uninterrupted in-process run
                oracle.step(**frame)
                assert got.seq == i + 1 and got.frame == i + 1, (i, got.seq, got.frame)
                assert np.array_equal(got.created, want.created), f"frame {i + 1}: created differs"
                assert np.array_equal(got.deleted, want.deleted), f"frame {i + 1}: deleted differs"
            final = c.pairs("chaos")
            assert np.array_equal(final, oracle.pairs())
            assert info.pairs_digest == pairs_digest(oracle.pairs()) == received[-1].pairs_digest
    finally:
        stop.set()
        server.stop()
