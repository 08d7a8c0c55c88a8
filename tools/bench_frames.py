"""Three engine measures of ``sapgrid bench`` beside the traces (in process, ``threads=1``):

- a frame's fixed cost: one world of N objects, every object moving a little every frame, for N of
  100, 1,000 and 10,000; per-step medians and the ratios of the small frames to the 10,000-object one
  (targets: 100 objects <= 20 us and <= 0.02x, 1,000 objects <= 60 us and <= 0.06x); and the small
  worlds' frames with one object removed and one added besides the updates (a game's spawn and despawn);
- worlds on the cores: two worlds of the bench's largest size (100,000 objects by default) stepped at
  once from two threads against one alone, in frames per second, the two taking turns (``TURNS``;
  target >= 1.7x on 2 cores);
- paced frames: a world of the bench's largest size on every core, its frames back to back and paced at
  30 Hz (the process idle between frames, as next to a game's tick), per-step medians: a frame after an
  idle gap should cost what one back to back does (``sapcore.parallel``'s pinning; 1.7x without it);
- the service's own cost of a frame: ``StreamFrames`` of a server built in process (not started), driven
  with each frame's request bytes for 64 100-object worlds in turn (no gRPC, no threads): what a frame
  costs the server in Python and the engine beyond what the transport costs (the many-worlds measure of
  ``sapgrid bench --server`` compares the server's CPU with an echo's over gRPC, where the cores' other
  threads and the GIL's hand-overs weigh on both).
"""
from __future__ import annotations

import threading
import time

import numpy as np

import sapcore

SMALL_SIZES = (100, 1_000, 10_000)
TARGETS = {100: (20.0, 0.02), 1_000: (60.0, 0.06)}


def _moving_world(n: int, frames: int, seed: int, threads: int | None = 1):
    """A world of n boxes (5% coverage; ``threads``, None: every core) and ``frames`` frames moving every
    box a little."""
    rng = np.random.default_rng(seed)
    side = float(np.sqrt(n / 0.05))
    bounds = (0.0, 0.0, side, side)
    world = sapcore.World(sapcore.WorldConfig(dims=2, bounds=bounds, cells=sapcore.auto_cells(2, bounds, n),
                                              threads=threads))
    ids = np.arange(n, dtype=np.uint64)
    centre = rng.uniform(0, side, (n, 2)).astype(np.float32)
    half = np.float32(1.0)
    world.step(add_ids=ids, add_boxes=np.concatenate([centre - half, centre + half], 1))
    v = rng.normal(0, 0.05, (n, 2)).astype(np.float32)
    boxes = [np.concatenate([centre + v * t - half, centre + v * t + half], 1) for t in range(1, frames + 1)]
    return world, ids, boxes


def _churn_world(n: int, frames: int, seed: int):
    """``_moving_world``'s world and motion, with one object removed and one added every frame (a game's
    spawn and despawn): each frame removes a random object, updates the others in the last frame's order
    and adds a new one at the removed one's place, which the next frame's list ends with."""
    world, ids, boxes = _moving_world(n, frames, seed)
    rng = np.random.default_rng(seed + 1)
    live, rows, nxt = ids.copy(), np.arange(n), n
    out = []
    for t in range(frames):
        k = int(rng.integers(live.shape[0]))
        gone, row = live[k:k + 1].copy(), rows[k]
        live, rows = np.delete(live, k), np.delete(rows, k)
        new = np.array([nxt], np.uint64)
        nxt += 1
        out.append(dict(remove_ids=gone, update_ids=live, update_boxes=boxes[t][rows], add_ids=new,
                        add_boxes=boxes[t][row:row + 1]))
        live, rows = np.append(live, new), np.append(rows, row)
    return world, out


def fixed_cost(seed: int = 1, frames: int = 300, warm: int = 30, rounds: int = 5) -> dict:
    """Median step time (us) per world size, and the ratios to the largest. The sizes take turns, a
    ``frames / rounds`` run each, so that a change of the machine's load falls on every size alike.
    ``churn_step_us``: the small sizes' frames with one object removed and one added (``_churn_world``),
    measured in the same turns."""
    worlds = {n: _moving_world(n, frames + warm, seed) for n in SMALL_SIZES}
    churned = {n: _churn_world(n, frames + warm, seed) for n in SMALL_SIZES[:-1]}
    times: dict[int, list[float]] = {n: [] for n in SMALL_SIZES}
    churn_times: dict[int, list[float]] = {n: [] for n in churned}
    for world, ids, boxes in worlds.values():
        for b in boxes[:warm]:
            world.step(update_ids=ids, update_boxes=b)
    for world, kws in churned.values():
        for kw in kws[:warm]:
            world.step(**kw)
    per = frames // rounds
    for r in range(rounds):
        for n, (world, ids, boxes) in worlds.items():
            for b in boxes[warm + r * per:warm + (r + 1) * per]:
                t0 = time.perf_counter()
                world.step(update_ids=ids, update_boxes=b)
                times[n].append(time.perf_counter() - t0)
        for n, (world, kws) in churned.items():
            for kw in kws[warm + r * per:warm + (r + 1) * per]:
                t0 = time.perf_counter()
                world.step(**kw)
                churn_times[n].append(time.perf_counter() - t0)
    out = {n: float(np.median(times[n])) * 1e6 for n in SMALL_SIZES}
    big = out[SMALL_SIZES[-1]]
    return dict(step_us={str(n): v for n, v in out.items()},
                ratio={str(n): out[n] / big for n in SMALL_SIZES[:-1]},
                churn_step_us={str(n): float(np.median(v)) * 1e6 for n, v in churn_times.items()})


#: ``two_worlds``' turns: a world alone, two at once, two at once, a world alone (as ``fixed_cost``'s sizes take
#: turns: a change of the machine's speed during the measure falls on both alike); each rate is over both
#: turns of its kind
TURNS = ("alone", "together", "together", "alone")
_WARM_FRAMES = 2        # each world's first frames, untimed (its first steps after its adds)


def _stepped(world, ids, boxes, out: list) -> None:
    """Step ``world`` through ``boxes`` (every object's new box, a frame each); append (frames, seconds)."""
    t0 = time.perf_counter()
    for b in boxes:
        world.step(update_ids=ids, update_boxes=b)
    out.append((len(boxes), time.perf_counter() - t0))


def two_worlds(n: int = 100_000, frames: int = 30, seed: int = 1) -> dict:
    """Frames/s of one threads=1 world alone, and of two stepped at once from two threads (the sum of the
    two threads' rates), in ``TURNS`` of ``frames`` frames a world."""
    turns = {kind: TURNS.count(kind) for kind in TURNS}
    alone = _moving_world(n, _WARM_FRAMES + frames * turns["alone"], seed)
    pair = [_moving_world(n, _WARM_FRAMES + frames * turns["together"], seed + k) for k in (1, 2)]
    times: dict[int, list] = {0: [], 1: [], 2: []}     # world (0 alone, 1 and 2 together) -> (frames, seconds)
    for world, ids, boxes in (alone, *pair):
        _stepped(world, ids, boxes[:_WARM_FRAMES], [])
    done = dict.fromkeys(turns, 0)
    for kind in TURNS:
        at = slice(_WARM_FRAMES + frames * done[kind], _WARM_FRAMES + frames * (done[kind] + 1))
        done[kind] += 1
        if kind == "alone":
            _stepped(alone[0], alone[1], alone[2][at], times[0])
            continue
        threads = [threading.Thread(target=_stepped, args=(world, ids, boxes[at], times[k]))
                   for k, (world, ids, boxes) in enumerate(pair, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    rate = {k: sum(f for f, _ in v) / sum(s for _, s in v) for k, v in times.items()}
    together = rate[1] + rate[2]
    return dict(objects=n, alone_fps=rate[0], together_fps=together, scaling=together / rate[0])


def paced(n: int = 100_000, hz: float = 30.0, frames: int = 40, rounds: int = 3, threads: int | None = None,
          seed: int = 1) -> dict:
    """Median step (ms) of a world of n objects (``threads``, None: every core) stepped back to back and
    paced at ``hz`` frames a second, ``frames / rounds`` of each in turn (a change of the machine's load
    falls on both alike)."""
    warm = 5
    world, ids, boxes = _moving_world(n, frames * 2 + warm, seed, threads)
    for b in boxes[:warm]:
        world.step(update_ids=ids, update_boxes=b)
    times: dict[str, list[float]] = {"back_to_back": [], "paced": []}
    per = frames // rounds
    k = warm
    for _ in range(rounds):
        for mode in times:
            due = time.perf_counter()
            for b in boxes[k:k + per]:
                if mode == "paced":
                    due += 1.0 / hz
                t0 = time.perf_counter()
                world.step(update_ids=ids, update_boxes=b)
                times[mode].append(time.perf_counter() - t0)
                if mode == "paced":
                    time.sleep(max(0.0, due - time.perf_counter()))
            k += per
    out = {m: float(np.median(v)) * 1e3 for m, v in times.items()}
    return dict(objects=n, hz=hz, threads=threads, back_to_back_ms=out["back_to_back"], paced_ms=out["paced"],
                ratio=out["paced"] / out["back_to_back"])


class _StreamCall:
    """The little of a gRPC call's context that ``StreamFrames`` reads (a stream bound to its world)."""

    def __init__(self, world: str):
        self._metadata = (("x-sapgrid-world", world),)

    def add_callback(self, callback) -> bool:
        return True

    def is_active(self) -> bool:
        return True

    def invocation_metadata(self):
        return self._metadata


class _Next:
    """A stream's requests, one at a time: the request set last, then the end of the stream."""

    def __init__(self):
        self.request = None

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        request, self.request = self.request, None
        if request is None:
            raise StopIteration
        return request


def service_frame(n: int = 100, worlds: int = 64, rounds: int = 200, seed: int = 1) -> dict:
    """Median and mean time (us) of one frame through ``StreamFrames`` of an in-process server: ``worlds``
    worlds of ``n`` moving objects, one stream each, a frame of each in turn for ``rounds`` rounds (after
    10 untimed); ``engine_us``: the median ``World.step`` of those frames (its share)."""
    from sapgrid.server import app, config
    from sapgrid.server.servicer import SapgridServicer
    from sapgrid.tools.bench_worlds import _moving_frames

    server = app.build_server(config.from_args(None, env={}, listen="127.0.0.1:0", default_world="",
                                               metrics_port=-1))
    try:
        registry = server.registry
        servicer = SapgridServicer(registry, server.metrics)
        rng = np.random.default_rng(seed)
        streams = []
        for k in range(worlds):
            name = f"bench-frame-{k}"
            registry.create(name, sapcore.WorldConfig(dims=2, bounds=(0, 0, 1000, 1000),
                                                      cells=sapcore.auto_cells(2, (0, 0, 1000, 1000), n)))
            add, updates = _moving_frames(name, n, rng)
            feed = _Next()
            call = servicer.StreamFrames(feed, _StreamCall(name))
            feed.request = add.SerializeToString()
            next(call)
            streams.append((feed, call, [u.SerializeToString() for u in updates], registry.get(name)))
        times: list[float] = []
        steps: list[float] = []
        for r in range(10 + rounds):
            for feed, call, updates, runner in streams:
                feed.request = updates[r % len(updates)]
                t0 = time.perf_counter()
                next(call)
                if r >= 10:
                    times.append(time.perf_counter() - t0)
                    steps.append(runner.last.delta.stats.total_s)
        for feed, call, _, _ in streams:
            call.close()
    finally:
        server.stop(0)
    return dict(objects=n, worlds=worlds, frame_us=float(np.median(times)) * 1e6,
                mean_us=float(np.mean(times)) * 1e6, engine_us=float(np.median(steps)) * 1e6)


def text(fc: dict, tw: dict, pc: dict | None = None, sf: dict | None = None) -> str:
    lines = ["frames in process, threads=1 (every object moving):"]
    for n in SMALL_SIZES:
        us = fc["step_us"][str(n)]
        if n in TARGETS:
            t_us, t_ratio = TARGETS[n]
            r = fc["ratio"][str(n)]
            ok = "ok" if us <= t_us and r <= t_ratio else "MISSED"
            lines.append(f"- {n} objects: {us:.1f} us a step = {r:.3f}x the 10000-object step "
                         f"(targets <= {t_us:.0f} us, <= {t_ratio}x): {ok}")
        else:
            lines.append(f"- {n} objects: {us:.1f} us a step")
    for n, us in fc.get("churn_step_us", {}).items():
        lines.append(f"- {n} objects, one removed and one added a frame: {us:.1f} us a step "
                     f"= {us / fc['step_us'][n]:.2f}x the frame of updates only")
    ok = "ok" if tw["scaling"] >= 1.7 else "MISSED"
    lines.append(f"- two {tw['objects']}-object worlds from two threads: {tw['together_fps']:.1f} frames/s "
                 f"against {tw['alone_fps']:.1f} for one alone = {tw['scaling']:.2f}x (target >= 1.7x): {ok}")
    if pc is not None:
        lines.append(f"- a {pc['objects']}-object world on {pc['threads'] or 'every'} core(s), paced at "
                     f"{pc['hz']:g} Hz: {pc['paced_ms']:.2f} ms a step against {pc['back_to_back_ms']:.2f} ms back "
                     f"to back = {pc['ratio']:.2f}x")
    if sf is not None:
        lines.append(f"- a {sf['objects']}-object frame through the service in process ({sf['worlds']} worlds in "
                     f"turn, no gRPC): {sf['frame_us']:.1f} us, of which the engine's step {sf['engine_us']:.1f} us")
    return "\n".join(lines)
