"""``sapgrid demo``: a live simulation of moving boxes against a sapgrid server.

Creates a world, adds N boxes with random sizes and velocities, then every tick moves them all
(bouncing off the world's walls) and sends one frame over a stream. A status line shows ticks/s,
objects, active pairs, the tick's created/deleted pairs and frame latency (round trip and engine);
ticks/s and latencies are over the last seconds (the final line: ticks/s over the whole run).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import deque

import numpy as np

from sapgrid.client import Client, DEFAULT_ADDRESS
from sapgrid.client.errors import SapgridError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=DEFAULT_ADDRESS, metavar="HOST:PORT",
                        help=f"server address (default {DEFAULT_ADDRESS})")
    parser.add_argument("--spawn-server", action="store_true",
                        help="start a server in a subprocess on a free port first (stopped at the end)")
    parser.add_argument("--world", default=None, help="world name (default demo-PID, deleted at the end)")
    parser.add_argument("--objects", type=int, default=5000, help="boxes (default 5000)")
    parser.add_argument("--ticks", type=int, default=0, help="stop after N ticks (default 0: until Ctrl-C)")
    parser.add_argument("--fps", type=float, default=0.0, help="limit ticks per second (default 0: as fast as it goes)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the boxes (default 1)")
    parser.add_argument("--connect-timeout", type=float, default=5.0,
                        help="seconds to wait for the server to answer (default 5)")
    parser.add_argument("--resume-seconds", type=float, default=120.0,
                        help="seconds to keep reconnecting when the server goes away mid-run, its recovery included "
                             "(default 120)")


class Sim:
    """N 2D boxes (half-extents 0.5..1.5) moving at |v| <= 0.2 per tick inside a square world."""

    def __init__(self, n: int, seed: int):
        rng = np.random.default_rng(seed)
        self.side = float(np.sqrt(8.0 * max(n - 1, 1))) + 4.0
        self.ids = np.arange(1, n + 1, dtype=np.uint64)
        self.half = rng.uniform(0.5, 1.5, size=(n, 2)).astype(np.float32)
        self.c = rng.uniform(2.0, self.side - 2.0, size=(n, 2)).astype(np.float32)
        ang = rng.uniform(0, 2 * np.pi, n)
        speed = rng.uniform(0, 0.2, n)
        self.v = np.stack([np.cos(ang) * speed, np.sin(ang) * speed], axis=1).astype(np.float32)

    @property
    def bounds(self) -> tuple:
        return (0.0, 0.0, self.side, self.side)

    def boxes(self) -> np.ndarray:
        return np.concatenate([self.c - self.half, self.c + self.half], axis=1)

    def tick(self) -> np.ndarray:
        self.c += self.v
        lo, hi = 2.0, self.side - 2.0
        out = (self.c < lo) | (self.c > hi)
        self.v[out] = -self.v[out]
        np.clip(self.c, lo, hi, out=self.c)
        return self.boxes()


def _status(tick, rate, info, rtt_ms, engine_ms, width: int | None = None) -> str:
    """One status line, at most ``width`` characters (default: the terminal's width): the least
    important fields are left out first (engine time, then the round trip's p99, then the counts)."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    p50 = np.percentile(rtt_ms, 50) if rtt_ms else 0.0
    p99 = np.percentile(rtt_ms, 99) if rtt_ms else 0.0
    eng = np.percentile(engine_ms, 50) if engine_ms else 0.0
    fields = [f"tick {tick}", f"{rate:.0f} ticks/s", f"rtt p50 {p50:.2f} ms", f"pairs {info[1]} (+{info[2]} -{info[3]})",
              f"p99 {p99:.2f} ms", f"objects {info[0]}", f"engine {eng:.2f} ms"]
    while len(fields) > 1 and len(" | ".join(fields)) > width - 1:
        fields.pop()
    return " | ".join(fields)[:width - 1]


def run(args: argparse.Namespace) -> int:
    spawned = None
    address = args.server
    if args.spawn_server:
        from sapgrid.tools.spawn import SpawnedServer

        print("starting a sapgrid server...", flush=True)
        spawned = SpawnedServer()
        address = spawned.address
        print(f"server at {address} (metrics {spawned.metrics_url})", flush=True)
    try:
        return _demo(args, address)
    finally:
        if spawned is not None:
            spawned.stop()
            print("server stopped", flush=True)


def _demo(args, address: str) -> int:
    name = args.world or f"demo-{os.getpid()}"
    sim = Sim(args.objects, args.seed)
    tty = sys.stdout.isatty()
    with Client(address) as client:
        try:
            client.wait_ready(args.connect_timeout)
            client.create_world(name, dims=2, bounds=sim.bounds, expected_objects=args.objects)
        except SapgridError as exc:
            hint = (" (start one with `sapgrid serve`, or use --spawn-server; a server with TLS needs --tls-ca or "
                    "SAPGRID_TLS_CA)" if "not reachable" in str(exc) else "")   # not when it is up but recovering
            print(f"sapgrid demo: {exc}{hint}", file=sys.stderr)
            return 1
        print(f"world {name!r}: {args.objects} moving boxes in a {sim.side:.0f} x {sim.side:.0f} square; "
              f"{'Ctrl-C to stop' if not args.ticks else f'{args.ticks} ticks'}", flush=True)
        rtt_ms: list[float] = []
        engine_ms: list[float] = []
        tick = 0
        info = (0, 0, 0, 0)
        try:
            # A writer stream that resumes: a restarted server (with --data-dir) or a dropped connection is
            # a pause, not the end of the demo; no tick is applied twice or lost.
            with client.stream(name, writer=name, resume=True, resume_deadline=args.resume_seconds) as stream:
                print("warming up (the first frames compile the engine's kernels)...", flush=True)
                d = stream.step(add_ids=sim.ids, add_boxes=sim.boxes())
                # An untimed warm-up tick that moves every box: the kernels of a moving frame are loaded (or
                # compiled) now, not in the first timed tick (whose seconds stayed in the p99 for 500 ticks).
                stream.step(update_ids=sim.ids, update_boxes=sim.tick())
                info = (d.stats.objects, d.stats.pairs, len(d.created), len(d.deleted))
                t_start = last_print = time.perf_counter()
                recent: deque = deque()
                while not args.ticks or tick < args.ticks:
                    boxes = sim.tick()
                    t0 = time.perf_counter()
                    d = stream.step(update_ids=sim.ids, update_boxes=boxes)
                    now = time.perf_counter()
                    tick += 1
                    recent.append(now)
                    while now - recent[0] > 2.0:
                        recent.popleft()
                    rtt_ms.append((now - t0) * 1e3)
                    engine_ms.append(d.stats.total_s * 1e3)
                    rtt_ms, engine_ms = rtt_ms[-500:], engine_ms[-500:]
                    info = (d.stats.objects, d.stats.pairs, len(d.created), len(d.deleted))
                    if now - last_print >= (0.25 if tty else 2.0):
                        rate = (len(recent) - 1) / max(recent[-1] - recent[0], 1e-9) if len(recent) > 1 else 0.0
                        line = _status(tick, rate, info, rtt_ms, engine_ms)
                        print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
                        last_print = now
                    if args.fps:
                        time.sleep(max(0.0, t0 + 1.0 / args.fps - time.perf_counter()))
        except KeyboardInterrupt:
            pass
        except SapgridError as exc:
            print(f"\nsapgrid demo: {exc}", file=sys.stderr)
            return 1
        finally:
            elapsed = time.perf_counter() - t_start if tick else 0.0
            if tick:
                print(("\r" if tty else "") + "final: " + _status(tick, tick / max(elapsed, 1e-9), info, rtt_ms,
                                                                   engine_ms, width=200))
            try:
                if args.world is None:
                    client.delete_world(name)
            except SapgridError:
                pass
        print(f"done: {tick} ticks, final pairs {info[1]}", flush=True)
    return 0
