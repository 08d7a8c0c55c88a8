"""``sapgrid bench --server spawn --data-dir-compare``: what durable worlds cost, every number of one run.

Spawns three servers on loopback, each with a fresh temp data directory where it has one: in memory (no
``--data-dir``), ``--data-dir --fsync everysec`` and ``--data-dir --fsync always``, and measures:

1. crowd2d-10k round trip (every object moves every tick), one world and one stream per server, the three
   servers taken in turn for ``RTT_BLOCKS_PER_ROUND`` x ``--rounds`` (at least ``--ticks``) blocks of ``RTT_BLOCK`` ticks, each
   block starting with the next server (``rtt_in_turn``): the median of every tick of each server, ratio
   to the in-memory server. Short blocks in turn see the same machine (its load, the host's neighbours)
   where whole runs one after the other did not (per-run ratios swung 0.77-1.28x on a quiet VM).
2. crowd2d-100k frames/s over one pipelined stream, in memory vs ``everysec`` (also in turn), with the
   world's log cut and snapshotted by size as it streams (``--snapshot-bytes``, default 64 MiB).
3. In process, a 100k-object world (crowd2d-100k after some ticks): the time the world is held for a
   snapshot (``WorldRunner.state``: what frames wait), its encoding (outside the world's turn) and size,
   and a restore from it (``Registry.restore``) against the median moving tick of the same world.
4. kill -9 of an ``everysec`` server streaming crowd2d-100k, then a restart: the world's recovery time
   (from the server's log line) and the restart's time to SERVING, against a start with an empty data dir.

Targets: round trip ratio <= 1.10 (everysec), frames/s ratio >= 0.9, snapshot < 50 ms of world time,
restore < 5 moving ticks, recovery < 2 s.
"""
from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import threading
import time

import numpy as np

from sapgrid.client import Client

from . import bench_server as bs
from .spawn import SpawnedServer

STOP_TIMEOUT_S = 60.0          # a server's SIGTERM stop before it is killed
RTT_BLOCK = 20                 # ticks a server streams before the next one's turn
RTT_BLOCKS_PER_ROUND = 5
RTT_WARM = 10                  # first ticks of each stream, not counted (JIT paths, connection windows)

TARGETS = dict(rtt_ratio=1.10, fps_ratio=0.9, snapshot_ms=50.0, restore_ticks=5.0, recovery_s=2.0)


def _spawn(*flags: str) -> tuple[SpawnedServer, float]:
    """A server process (its log lines in ``lines`` too) once it has loaded the engine's kernels (its
    measures never include the load), and its seconds from the start to listening."""
    t0 = time.perf_counter()
    server = SpawnedServer("--default-world", "", *flags, metrics_port=-1, logs=True)
    listening_s = time.perf_counter() - t0
    try:
        server.wait_kernels()
    except BaseException:
        server.stop()
        raise
    return server, listening_s


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


class DiskWatch:
    """The largest size of a directory tree, sampled every 20 ms while in use (``with``)."""

    def __init__(self, path: str):
        self.path, self.max_bytes = path, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.02):
            self.max_bytes = max(self.max_bytes, _dir_bytes(self.path))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads; Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fps(client: Client, tr: dict, init, frames, window: int, pid: int | None = None):
    """Frames/s of ``frames`` pipelined over one stream into a fresh world (``bench_server.bench_fps``'s loop
    on frames encoded once); with ``pid``, (frames/s, the server's CPU milliseconds per timed frame)."""
    name = init.frame.world
    bs._world(client, name, tr)
    stream = client.stream(name)
    try:
        stream.send_request(init)
        stream.recv()
        for f in frames[:3]:
            stream.send_request(f)
            stream.recv()
        timed = frames[3:]
        cpu0 = _cpu_s(pid) if pid else 0.0
        t0 = time.perf_counter()
        for _ in bs.pipelined(stream, timed, window):
            pass
        elapsed = time.perf_counter() - t0
        cpu = (_cpu_s(pid) - cpu0) / len(timed) * 1e3 if pid else 0.0
    finally:
        stream.close()
        client.delete_world(name)
    return (len(timed) / elapsed, cpu) if pid else len(timed) / elapsed


def rtt_in_turn(clients: dict, n: int, blocks: int, seed: int) -> dict:
    """crowd2d-``n`` round trips through each of ``clients`` (mode -> Client): the same frames to one world per
    server over one stream, the servers taken in turn, ``blocks`` blocks of ``RTT_BLOCK`` ticks, each block
    starting with the next server. Per mode: every tick's round trip (s) and each block's median."""
    tr = bs._trace(n, RTT_WARM + blocks * RTT_BLOCK, seed)
    name = f"bench-rtt-{n}"
    modes = list(clients)
    streams, frames = {}, {}
    out = {m: dict(ticks=[], blocks=[]) for m in modes}
    try:
        for m in modes:
            bs._world(clients[m], name, tr)
            init, frames[m] = bs._frames(tr, name)
            streams[m] = clients[m].stream(name)
            streams[m].send_request(init)
            streams[m].recv()
            for f in frames[m][:RTT_WARM]:
                streams[m].send_request(f)
                streams[m].recv()
        for b in range(blocks):
            lo = RTT_WARM + b * RTT_BLOCK
            for m in modes[b % len(modes):] + modes[:b % len(modes)]:
                stream, times = streams[m], []
                for f in frames[m][lo:lo + RTT_BLOCK]:
                    t0 = time.perf_counter()
                    stream.send_request(f)
                    stream.recv()
                    times.append(time.perf_counter() - t0)
                out[m]["ticks"] += times
                out[m]["blocks"].append(float(np.median(times)))
    finally:
        for m, stream in streams.items():
            stream.close()
            clients[m].delete_world(name)
    return out


def snapshot_in_process(n: int, ticks: int, seed: int) -> dict:
    """A 100k-object world in a registry: world time of a snapshot, its encoding, a restore from it."""
    from sapcore.world import World  # noqa: F401  (the engine, in process)

    from sapgrid.server import snapshot
    from sapgrid.server.metrics import Metrics
    from sapgrid.server.protocol import world_config
    from sapgrid.server.registry import Caller, Registry
    from sapgrid.layout import config_message

    tr = bs._trace(n, ticks, seed)
    reg = Registry(Metrics())
    msg = config_message(dims=int(tr["dims"]), bounds=tuple(float(x) for x in tr["bounds"]), expected_objects=n)
    runner = reg.create("snap", world_config(msg), n)
    caller = Caller()
    runner.apply(dict(add_ids=tr["init_ids"], add_boxes=tr["init_boxes"]), 0, time.perf_counter(), caller)
    off, ticks_ms = tr["upd_off"], []
    for t in range(int(tr["ticks"])):
        s, e = off[t], off[t + 1]
        a = runner.apply(dict(update_ids=tr["upd_ids"][s:e], update_boxes=tr["upd_boxes"][s:e]), t + 1,
                         time.perf_counter(), caller)
        ticks_ms.append(a.delta.stats.total_s * 1e3)
    held, enc, restore = [], [], []
    for k in range(3):
        t0 = time.perf_counter()
        state = runner.run(runner.state, caller)
        t1 = time.perf_counter()
        data = snapshot.encode(state)
        t2 = time.perf_counter()
        decoded = snapshot.decode(data)
        copy = reg.restore(f"copy{k}", decoded)
        t4 = time.perf_counter()
        assert copy.digest == runner.digest and copy.pairs == runner.pairs
        reg.delete(f"copy{k}")
        held.append((t1 - t0) * 1e3)
        enc.append((t2 - t1) * 1e3)
        restore.append((t4 - t2) * 1e3)
    tick = float(np.median(ticks_ms[len(ticks_ms) // 2:]))
    return dict(objects=n, pairs=runner.pairs, snapshot_world_ms=float(np.median(held)),
                snapshot_world_ms_max=float(np.max(held)), encode_ms=float(np.median(enc)),
                snapshot_bytes=len(data), restore_ms=float(np.median(restore)), moving_tick_ms=tick,
                restore_ticks=float(np.median(restore)) / tick)


def make_worlds(root: str, worlds: int, lo: int, hi: int, frames: int, seed: int) -> int:
    """``worlds`` worlds of ``lo``..``hi`` objects (evenly spread) in a data directory, each with its first
    snapshot and ``frames`` logged frames moving a tenth of its objects; the objects in all."""
    from sapgrid.layout import config_message
    from sapgrid.server import protocol
    from sapgrid.server.metrics import Metrics
    from sapgrid.server.registry import Caller, Registry
    from sapgrid.server.storage import Storage

    rng = np.random.default_rng(seed)
    reg = Registry(Metrics(), max_worlds=worlds + 1)
    reg.storage = storage = Storage(root, "no")
    caller, total = Caller(), 0

    def step(name, seq, **arrays):
        req = bs.pb.ApplyFrameRequest()
        bs.encode_frame(name, seq, **arrays, into=req.frame)
        raw = req.SerializeToString()
        runner.apply(protocol.frame_arrays(protocol.read_frame(raw), 2), seq, time.perf_counter(), caller, raw=raw)

    try:
        for k in range(worlds):
            n = int(lo + (hi - lo) * k / max(1, worlds - 1))
            name, side = f"w{k:03d}", float(np.sqrt(n) * 4)
            runner = reg.create(name, protocol.world_config(config_message(dims=2, bounds=(0, 0, side, side),
                                                                           expected_objects=n)), n)
            lows = rng.random((n, 2), np.float32) * side
            boxes = np.hstack([lows, lows + 1 + rng.random((n, 2), np.float32)])
            step(name, 1, add_ids=np.arange(n, dtype=np.uint64), add_boxes=boxes)
            for seq in range(2, frames + 2):
                moved = rng.choice(n, n // 10, replace=False)
                boxes[moved, :2] = rng.random((len(moved), 2), np.float32) * side
                boxes[moved, 2:] = boxes[moved, :2] + 1
                step(name, seq, update_ids=moved.astype(np.uint64), update_boxes=boxes[moved])
            total += n
    finally:
        storage.close()
    return total


def recovery_of_many(worlds: int = 64, lo: int = 1000, hi: int = 10_000, frames: int = 20, rounds: int = 2,
                     seed: int = 1, workers: int = 0) -> dict:
    """Recovery of a data directory of ``worlds`` worlds (in process, ``Storage.recover``), one world at a time
    against ``workers`` at a time (default: the server's ``RECOVERY_WORKERS``, at least 2), the two taken in
    turn for ``rounds`` rounds: seconds (medians)."""
    from sapgrid.server.metrics import Metrics
    from sapgrid.server.registry import Registry
    from sapgrid.server.storage import RECOVERY_WORKERS, Storage

    many = workers or max(2, RECOVERY_WORKERS)
    times: dict = {1: [], many: []}
    with tempfile.TemporaryDirectory(prefix="sapgrid-bench-") as tmp:
        objects = make_worlds(tmp, worlds, lo, hi, frames, seed)
        for k in range(rounds):
            for w in (1, many) if k % 2 == 0 else (many, 1):
                reg = Registry(Metrics(), max_worlds=worlds + 1)
                reg.storage = storage = Storage(tmp, "no")
                try:
                    t0 = time.perf_counter()
                    rec = storage.recover(reg, w)
                    times[w].append(time.perf_counter() - t0)
                finally:
                    storage.close()
                assert len(rec.worlds) == worlds and not rec.failed, rec.failed
    seq, conc = float(np.median(times[1])), float(np.median(times[many]))
    return dict(worlds=worlds, objects=objects, frames=frames, workers=many, default_workers=RECOVERY_WORKERS,
                sequential_s=seq,
                concurrent_s=conc, speedup=seq / conc, runs={str(w): t for w, t in times.items()})


def recovery_after_kill(tr: dict, init, frames, window: int, kill_after: int, snapshot_bytes: int) -> dict:
    """Stream crowd2d-100k into an everysec server, kill -9 it mid-run, restart it: recovery seconds."""
    with tempfile.TemporaryDirectory(prefix="sapgrid-bench-") as tmp:
        server, empty_start = _spawn("--data-dir", os.path.join(tmp, "empty"))
        server.stop(STOP_TIMEOUT_S)
        data = os.path.join(tmp, "data")
        flags = ("--data-dir", data, "--fsync", "everysec", "--snapshot-bytes", str(snapshot_bytes))
        server, _ = _spawn(*flags)
        answered = 0
        try:
            with Client(server.address, timeout=600) as client:
                bs._world(client, init.frame.world, tr)
                stream = client.stream(init.frame.world)
                stream.send_request(init)
                stream.recv()
                for _ in bs.pipelined(stream, frames, window):
                    answered += 1
                    if answered >= kill_after:
                        break
                os.kill(server.proc.pid, signal.SIGKILL)      # frames in flight
                try:
                    stream.close()
                except Exception:
                    pass
        finally:
            server.proc.kill()
            server.wait(30)
        server, restart_s = _spawn(*flags)
        try:
            with Client(server.address, timeout=600) as client:
                info = client.get_world(init.frame.world)
        finally:
            server.stop(STOP_TIMEOUT_S)
        rec = [float(m.group(1)) for line in server.lines
               if (m := re.search(r"recovered: .* in ([0-9.]+) s", line))]
        return dict(answered=answered + 1, recovered_frames=int(info.frames), objects=int(info.objects),
                    recovery_s=rec[0] if rec else float("nan"), restart_to_serving_s=restart_s,
                    empty_start_s=empty_start)


def run(args) -> int:
    rounds = max(1, int(getattr(args, "rounds", 2) or 2))
    ticks = max(20, int(getattr(args, "ticks", 100) or 100))
    seed = int(getattr(args, "seed", 1) or 1)
    snap_bytes = int(getattr(args, "snapshot_bytes", 0) or 64 << 20)
    n1, n2 = args.rtt_objects, args.fps_objects
    modes = {"memory": (), "everysec": ("--fsync", "everysec"), "always": ("--fsync", "always")}
    results: dict = {m: dict(rtt=[], p99=[], fps=[], cpu=[]) for m in modes}
    fps_ratios, cpu_ratios, rtt_ratios = [], [], []
    with tempfile.TemporaryDirectory(prefix="sapgrid-bench-") as tmp:
        servers = {}
        try:
            for m, flags in modes.items():
                extra = () if m == "memory" else ("--data-dir", os.path.join(tmp, m), "--snapshot-bytes",
                                                  str(snap_bytes), *flags)
                servers[m] = _spawn("--echo", *extra)[0]
            clients = {m: Client(server.address, timeout=600) for m, server in servers.items()}
            blocks = max(RTT_BLOCKS_PER_ROUND * rounds, ticks // RTT_BLOCK)
            print(f"sapgrid bench --data-dir-compare: crowd2d-{n1} round trip, {blocks} blocks of {RTT_BLOCK} ticks "
                  f"per server, the servers in turn...", flush=True)
            rtt = rtt_in_turn(clients, n1, blocks, seed)
            for m, r in rtt.items():
                ms = np.array(r["ticks"]) * 1e3
                results[m]["rtt"].append(float(np.median(ms)))
                results[m]["p99"].append(float(np.percentile(ms, 99)))
            rtt_ratios = [e / m for e, m in zip(rtt["everysec"]["blocks"], rtt["memory"]["blocks"])]
            print(f"crowd2d-{n2} frames/s over one stream ({args.fps_ticks} ticks, window {args.window})...",
                  flush=True)
            tr = bs._trace(n2, args.fps_ticks, seed)
            init, frames = bs._frames(tr, f"bench-fps-{n2}")
            disk = 0
            for k in range(rounds):
                # in turn, the first of each round alternating: a round's two runs share the machine's load
                for m in ("memory", "everysec") if k % 2 == 0 else ("everysec", "memory"):
                    with DiskWatch(os.path.join(tmp, m)) as watch:
                        fps, cpu = _fps(clients[m], tr, init, frames, args.window, servers[m].proc.pid)
                    results[m]["fps"].append(fps)
                    results[m]["cpu"].append(cpu)
                    if m == "everysec":
                        disk = max(disk, watch.max_bytes)
                fps_ratios.append(results["everysec"]["fps"][-1] / results["memory"]["fps"][-1])
                cpu_ratios.append(results["everysec"]["cpu"][-1] / results["memory"]["cpu"][-1])
            for c in clients.values():
                c.close()
        finally:
            for server in servers.values():
                server.stop(STOP_TIMEOUT_S)
    print(f"snapshot and restore of a {n2}-object world (in process)...", flush=True)
    snap = snapshot_in_process(n2, 20, seed)
    print(f"kill -9 of a server streaming crowd2d-{n2}, then recovery...", flush=True)
    rec = recovery_after_kill(tr, init, frames, args.window, min(30, len(frames) - 5), snap_bytes)

    print("recovery of 64 worlds of 1,000-10,000 objects (in process), one at a time and concurrently...", flush=True)
    many = recovery_of_many(rounds=rounds, seed=seed)

    med = {m: {k: float(np.median(v)) if v else float("nan") for k, v in r.items()} for m, r in results.items()}
    rtt_ratio = med["everysec"]["rtt"] / med["memory"]["rtt"]
    always_ratio = med["always"]["rtt"] / med["memory"]["rtt"]
    fps_ratio = med["everysec"]["fps"] / med["memory"]["fps"]
    cpu_ratio = med["everysec"]["cpu"] / med["memory"]["cpu"]
    checks = dict(rtt_ratio=rtt_ratio <= TARGETS["rtt_ratio"], fps_ratio=fps_ratio >= TARGETS["fps_ratio"],
                  snapshot=snap["snapshot_world_ms_max"] < TARGETS["snapshot_ms"],
                  restore=snap["restore_ticks"] < TARGETS["restore_ticks"],
                  recovery=rec["recovery_s"] < TARGETS["recovery_s"])
    ok = bs._ok
    print()
    print("| measure | value | target | |")
    print("|---|---:|---:|---|")
    print(f"| crowd2d-{n1} round trip median: memory / everysec / always | {med['memory']['rtt']:.2f} / "
          f"{med['everysec']['rtt']:.2f} / {med['always']['rtt']:.2f} ms | | |")
    print(f"| crowd2d-{n1} round trip p99: memory / everysec / always | {med['memory']['p99']:.2f} / "
          f"{med['everysec']['p99']:.2f} / {med['always']['p99']:.2f} ms | | |")
    print(f"| round trip everysec / memory | {rtt_ratio:.2f}x | <= 1.10x | {ok(checks['rtt_ratio'])} |")
    print(f"| round trip ratio of each block (min / median / max of {len(rtt_ratios)}) | {min(rtt_ratios):.2f} / "
          f"{float(np.median(rtt_ratios)):.2f} / {max(rtt_ratios):.2f}x | | |")
    print(f"| round trip always / memory | {always_ratio:.2f}x | (reported) | |")
    print(f"| crowd2d-{n2} frames/s, one stream: memory / everysec | {med['memory']['fps']:.1f} / "
          f"{med['everysec']['fps']:.1f} | | |")
    print(f"| frames/s everysec / memory | {fps_ratio:.2f}x | >= 0.9x | {ok(checks['fps_ratio'])} |")
    print(f"| frames/s ratio of each round (min / median / max of {len(fps_ratios)}) | {min(fps_ratios):.2f} / "
          f"{float(np.median(fps_ratios)):.2f} / {max(fps_ratios):.2f}x | | |")
    print(f"| server CPU per 100k frame, memory / everysec (all its threads) | {med['memory']['cpu']:.1f} / "
          f"{med['everysec']['cpu']:.1f} ms = {cpu_ratio:.2f}x (rounds: {min(cpu_ratios):.2f} - "
          f"{max(cpu_ratios):.2f}x) | | |")
    print(f"| the everysec world's files on disk while streaming, at most | {disk / 2**20:.0f} MiB "
          f"(--snapshot-bytes {snap_bytes / 2**20:.0f} MiB) | | |")
    print(f"| snapshot of {n2} objects: world held (median / max of 3) | {snap['snapshot_world_ms']:.1f} / "
          f"{snap['snapshot_world_ms_max']:.1f} ms | < 50 ms | {ok(checks['snapshot'])} |")
    print(f"| snapshot encoding, outside the world's turn | {snap['encode_ms']:.1f} ms "
          f"({snap['snapshot_bytes'] / 1e6:.1f} MB) | | |")
    print(f"| restore of it | {snap['restore_ms']:.1f} ms = {snap['restore_ticks']:.2f} moving ticks "
          f"({snap['moving_tick_ms']:.2f} ms) | < 5 ticks | {ok(checks['restore'])} |")
    print(f"| recovery after kill -9 mid-run ({rec['recovered_frames']} frames, {rec['answered']} answered) | "
          f"{rec['recovery_s']:.2f} s | < 2 s | {ok(checks['recovery'])} |")
    print(f"| restart to SERVING after the kill / with an empty data dir | {rec['restart_to_serving_s']:.2f} / "
          f"{rec['empty_start_s']:.2f} s | | |")
    print(f"| recovery of {many['worlds']} worlds ({many['objects']} objects, {many['frames'] + 1} logged frames "
          f"each): 1 / {many['workers']} at a time | {many['sequential_s']:.2f} / {many['concurrent_s']:.2f} s = "
          f"{many['speedup']:.2f}x (the server recovers {many['default_workers']} at a time here) | | |")
    if getattr(args, "json", False):
        print(json.dumps(dict(bench="sapgrid-durable", medians=med, rtt_ratio=rtt_ratio, always_ratio=always_ratio,
                              fps_ratio=fps_ratio, fps_ratios=fps_ratios, rtt_ratios=rtt_ratios,
                              cpu_ratio=cpu_ratio, cpu_ratios=cpu_ratios, disk_max_bytes=disk, snapshot=snap,
                              recovery=rec, recovery_of_many=many, checks=checks,
                              runs=results)))
    return 0
