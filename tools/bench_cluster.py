"""The cluster's figures, through Debian's HAProxy with the configuration of deploy/proxy/:

1. The proxy's cost: round trips of crowd2d-10k's frames (every object moving every tick) to a replica
   process over two streams, one direct and one through the proxy, sent tick by tick in turn; the median
   of the per-tick difference is what the proxy adds.

       python -m sapgrid.tools.bench_cluster [--objects 10000] [--frames 600]

2. Aggregate frames/s with 1, 2, 3... replicas (``sapgrid serve`` processes): W worlds of N objects
   created through the proxy, one frame stream each, every object moving every frame, frames sent back
   to back (each answered before the next) for ``--seconds``; frames/s of all streams together, round
   trip p50/p99, and the CPU per frame of the replicas, the proxy and the load generator (from /proc).

       python -m sapgrid.tools.bench_cluster --scale 1,2,3 [--worlds 64] [--objects 1000] [--seconds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def crowd_frames(world: str, objects: int, frames: int, seed: int = 1) -> tuple:
    """(the add request, the update requests) of the trace crowd2d-<objects> (sapgrid.tools.traces, the
    trace of ``sapgrid bench --server``: every object moves every tick), and the world's bounds."""
    from sapgrid.client.codec import encode_frame
    from sapgrid.tools import traces
    from sapgrid.v1 import sapgrid_service_pb2 as pb

    tr = traces.generate(f"crowd2d-{objects}", ticks=frames, seed=seed)
    add = pb.StreamFramesRequest()
    encode_frame(world, 0, add_ids=tr["init_ids"], add_boxes=tr["init_boxes"], into=add.frame)
    off, updates = tr["upd_off"], []
    for t in range(frames):
        req = pb.StreamFramesRequest()
        encode_frame(world, t + 1, update_ids=tr["upd_ids"][off[t]:off[t + 1]],
                     update_boxes=tr["upd_boxes"][off[t]:off[t + 1]], into=req.frame)
        updates.append(req)
    return add, updates, tuple(float(x) for x in tr["bounds"])


def _paired_round_trips(direct: str, proxied: str, objects: int, frames: int, seed: int = 1) -> tuple:
    """Seconds per frame (send -> answer) of crowd2d-<objects> replayed over two streams, one to the replica
    and one through the proxy, tick by tick (the two in turn, the first alternating), so the machine's
    load at any moment hits both alike. Returns (direct [frames], proxied [frames])."""
    from sapgrid.client import Client

    out = []
    with Client(direct, timeout=60) as cd, Client(proxied, timeout=60) as cp:
        legs = []
        for c, world in ((cd, f"rtt-direct-{os.getpid()}"), (cp, f"rtt-proxy-{os.getpid()}")):
            add, updates, bounds = crowd_frames(world, objects, frames, seed)
            c.create_world(world, bounds=bounds, expected_objects=objects)
            s = c.stream(world)
            s.send_request(add)
            s.recv()
            legs.append((c, world, s, updates))
            out.append(np.empty(frames))
        try:
            for i in range(frames):
                for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                    _, _, s, updates = legs[k]
                    t0 = time.perf_counter()
                    s.send_request(updates[i])
                    s.recv()
                    out[k][i] = time.perf_counter() - t0
        finally:
            for c, world, s, _ in legs:
                s.close()
                c.delete_world(world)
    return out[0], out[1]


def run(objects: int, frames: int) -> dict:
    """The proxy's added round trip: a replica process, HAProxy in front of it, paired streams."""
    from sapgrid.tools.spawn import SpawnedCluster

    with SpawnedCluster(1, "--default-world", "") as cluster:
        cluster.wait_kernels()
        member, bind = cluster.members[0], cluster.address
        _paired_round_trips(member, bind, objects, 20)          # warm-up: kernels, connections, windows
        d, p = _paired_round_trips(member, bind, objects, frames)
    return {"objects": objects, "frames": frames, "direct_ms": float(np.median(d) * 1e3),
            "proxy_ms": float(np.median(p) * 1e3), "overhead_ms": float(np.median(p - d) * 1e3),
            "direct_p99_ms": float(np.percentile(d, 99) * 1e3), "proxy_p99_ms": float(np.percentile(p, 99) * 1e3)}


# ---- aggregate frames/s through the proxy -------------------------------------------------------

CYCLE = 16                              # distinct update frames per world, sent in turn


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _world_frames(world: str, objects: int, rng: np.random.Generator) -> tuple:
    """(the add request, CYCLE update requests) of one world: boxes of 2-8 units in 1000 x 1000, each
    update moving every box by ~1 unit."""
    from sapgrid.client.codec import encode_frame
    from sapgrid.v1 import sapgrid_service_pb2 as pb

    ids = np.arange(1, objects + 1, dtype=np.uint64)
    lo = rng.uniform(0, 990, size=(objects, 2))
    size = rng.uniform(2, 8, size=(objects, 2))
    add = pb.StreamFramesRequest()
    encode_frame(world, 0, add_ids=ids, add_boxes=np.hstack([lo, lo + size]).astype(np.float32), into=add.frame)
    updates = []
    for t in range(1, CYCLE + 1):
        lo = np.clip(lo + rng.normal(0, 1.0, size=lo.shape), 0, 990)
        req = pb.StreamFramesRequest()
        encode_frame(world, t, update_ids=ids, update_boxes=np.hstack([lo, lo + size]).astype(np.float32),
                     into=req.frame)
        updates.append(req)
    return add, updates


async def _stream(stub, world: str, requests: list, end: float, rtts: list) -> int:
    """Frames sent back to back on one stream (each answered before the next) until end."""
    import grpc

    from sapgrid.server.cluster import HEADER

    call = stub.StreamFrames(metadata=((HEADER, world),))
    done = 0
    try:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await call.write(requests[done % len(requests)])
            resp = await call.read()
            if resp is grpc.aio.EOF or resp.WhichOneof("result") != "delta":
                raise RuntimeError(f"frame of {world} refused: {resp}")
            rtts.append(time.perf_counter() - t0)
            done += 1
    finally:
        await call.done_writing()
    return done


async def _all_streams(address: str, frames: dict, seconds: float) -> tuple:
    import asyncio

    import grpc

    from sapgrid.client import channel_options
    from sapgrid.v1 import sapgrid_service_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(address, options=channel_options()) as channel:
        stub = pb_grpc.SapgridServiceStub(channel)
        rtts: list = []
        end = time.perf_counter() + seconds
        done = await asyncio.gather(*(_stream(stub, w, reqs, end, rtts) for w, reqs in frames.items()))
    return sum(done), rtts


def scale_run(replicas: int, worlds: int, objects: int, seconds: float, seed: int = 7) -> dict:
    """Aggregate frames/s of ``worlds`` streams through the proxy to ``replicas`` replica processes."""
    import asyncio

    from sapgrid.client import Client
    from sapgrid.tools.spawn import SpawnedCluster

    with SpawnedCluster(replicas, "--default-world", "", "--max-worlds", str(worlds + 8)) as cluster:
        cluster.wait_kernels()
        bind = cluster.address
        rng = np.random.default_rng(seed)
        names = [f"scale-{i:03d}" for i in range(worlds)]
        frames = {}
        with Client(bind, timeout=600) as c:
            for name in names:
                c.create_world(name, bounds=(0, 0, 1000, 1000), expected_objects=objects)
                add, frames[name] = _world_frames(name, objects, rng)
                with c.stream(name) as s:
                    s.send_request(add)
                    s.recv()
        asyncio.run(_all_streams(bind, {n: frames[n] for n in names[:4]}, 0.5))     # warm the connections
        pids = [s.proc.pid for s in cluster.servers]
        cpu0 = [_proc_cpu(p) for p in pids], _proc_cpu(cluster.proxy.pid), time.process_time()
        t0 = time.perf_counter()
        done, rtts = asyncio.run(_all_streams(bind, frames, seconds))
        wall = time.perf_counter() - t0
        cpu1 = [_proc_cpu(p) for p in pids], _proc_cpu(cluster.proxy.pid), time.process_time()
        held = []
        for m in cluster.members:
            with Client(m, timeout=30) as c:
                held.append(len(c.list_worlds()))
    per = 1e3 / max(done, 1)
    return dict(replicas=replicas, worlds=worlds, objects=objects, seconds=wall, frames=done,
                frames_per_s=done / wall, p50_ms=float(np.percentile(rtts, 50) * 1e3),
                p99_ms=float(np.percentile(rtts, 99) * 1e3), worlds_per_replica=held,
                replica_cpu_ms_per_frame=(sum(cpu1[0]) - sum(cpu0[0])) * per,
                proxy_cpu_ms_per_frame=(cpu1[1] - cpu0[1]) * per,
                generator_cpu_ms_per_frame=(cpu1[2] - cpu0[2]) * per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=None,
                    help="objects per frame (default 10000), or per world with --scale (default 1000)")
    ap.add_argument("--frames", type=int, default=600, help="frames of each stream for the proxy's cost (default 600)")
    ap.add_argument("--scale", default="", metavar="R,R,...",
                    help="aggregate frames/s through the proxy with each number of replicas, e.g. 1,2,3")
    ap.add_argument("--worlds", type=int, default=64, help="--scale: worlds, one stream each (default 64)")
    ap.add_argument("--seconds", type=float, default=5.0, help="--scale: seconds per measure (default 5)")
    ap.add_argument("--json", action="store_true", help="also print each result as one JSON line")
    a = ap.parse_args(argv)
    if a.scale:
        counts = [int(x) for x in a.scale.split(",") if x.strip()]
        if not counts or min(counts) < 1:
            ap.error(f"--scale: replica counts >= 1, comma-separated; got {a.scale!r}")
        objects = a.objects or 1000
        print(f"aggregate frames/s through HAProxy: {a.worlds} worlds x {objects} objects, one stream each, "
              f"frames back to back for {a.seconds:g} s", flush=True)
        print("| replicas | worlds per replica | frames/s | round trip p50 / p99 | CPU ms per frame: replicas / "
              "proxy / load generator |")
        print("|---:|---|---:|---|---|")
        for n in counts:
            r = scale_run(n, a.worlds, objects, a.seconds)
            print(f"| {n} | {'/'.join(map(str, r['worlds_per_replica']))} | {r['frames_per_s']:.0f} | "
                  f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms | {r['replica_cpu_ms_per_frame']:.3f} / "
                  f"{r['proxy_cpu_ms_per_frame']:.3f} / {r['generator_cpu_ms_per_frame']:.3f} |", flush=True)
            if a.json:
                print(json.dumps(dict(bench="sapgrid-cluster-scale", **r)))
        return 0
    r = run(a.objects or 10_000, a.frames)
    print(f"crowd2d-{r['objects']}, {r['frames']} frames each way, tick by tick: round trip median direct "
          f"{r['direct_ms']:.3f} ms, through HAProxy {r['proxy_ms']:.3f} ms; median added by the proxy "
          f"{r['overhead_ms']:.3f} ms (target <= 0.3 ms); p99 {r['direct_p99_ms']:.2f} / {r['proxy_p99_ms']:.2f} ms")
    if a.json:
        print(json.dumps(dict(bench="sapgrid-cluster-proxy", **r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
