"""The cluster proxy's cost: median round trip of a frame stream's frames, direct to a replica and
through Debian's HAProxy (the configuration of deploy/proxy/), in one run.

    python -m sapgrid.tools.bench_cluster [--objects 10000] [--frames 200]
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(address: str, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start on {address}") from None
            time.sleep(0.05)


def round_trips(address: str, world: str, objects: int, frames: int, seed: int = 0) -> np.ndarray:
    """Seconds per frame (send -> answer) of a stream moving every object a little each frame."""
    from sapgrid.client import Client

    rng = np.random.default_rng(seed)
    ids = np.arange(1, objects + 1, dtype=np.uint64)
    side = 1000.0
    pos = rng.uniform(0, side - 4, size=(objects, 2))
    times = np.empty(frames)
    with Client(address, timeout=60) as c:
        c.create_world(world, bounds=[0, 0, side, side])
        with c.stream(world) as s:
            s.send(add_ids=ids, add_boxes=np.hstack([pos, pos + 3.0]))
            s.recv()
            for i in range(frames):
                pos = np.clip(pos + rng.normal(0, 0.5, size=pos.shape), 0, side - 4)
                boxes = np.hstack([pos, pos + 3.0])
                t0 = time.perf_counter()
                s.send(update_ids=ids, update_boxes=boxes)
                s.recv()
                times[i] = time.perf_counter() - t0
        c.delete_world(world)
    return times


def run(objects: int, frames: int) -> dict:
    from sapgrid.server.app import build_server
    from sapgrid.server.config import ServerConfig
    from sapgrid.tools.cluster import write_proxy_config

    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    member = f"127.0.0.1:{_free_port()}"
    app = build_server(ServerConfig(listen=member, metrics_port=-1, default_world="",
                                    cluster_members=member, cluster_self=member))
    app.start()
    with tempfile.TemporaryDirectory() as tmp:
        bind = f"127.0.0.1:{_free_port()}"
        proxy = subprocess.Popen([haproxy, "-db", "-f", str(write_proxy_config([member], bind, tmp))],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_port(bind, proxy)
            round_trips(member, "warm", objects, 20)
            direct, proxied = [], []
            for k in range(3):  # interleaved runs: the machine's load hits both alike
                direct.append(round_trips(member, f"d{k}", objects, frames))
                proxied.append(round_trips(bind, f"p{k}", objects, frames))
        finally:
            proxy.terminate()
            proxy.wait(10)
            app.stop(0)
    d, p = np.median(np.concatenate(direct)), np.median(np.concatenate(proxied))
    return {"objects": objects, "frames": frames * 3, "direct_ms": d * 1e3, "proxy_ms": p * 1e3,
            "overhead_ms": (p - d) * 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--frames", type=int, default=200)
    a = ap.parse_args(argv)
    r = run(a.objects, a.frames)
    print(f"{r['objects']} objects, {r['frames']} frames: direct median {r['direct_ms']:.3f} ms, through HAProxy "
          f"{r['proxy_ms']:.3f} ms, overhead {r['overhead_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
