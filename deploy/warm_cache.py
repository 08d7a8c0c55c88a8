"""Fill numba's on-disk kernel cache (NUMBA_CACHE_DIR) so a fresh server's first frames are not slow.

sapcore's kernels are compiled on first use and cached on disk (``cache=True``). This script starts
a server in this process on a free loopback port (no metrics, no default world) and drives every
kind of call through it, in 2D and 3D: frames with adds (static objects, categories and masks),
updates and removes over a stream and as unary calls, region queries and pair listings. The server
path matters: frames arrive as read-only arrays decoded from the wire, which numba compiles
separately from the writable arrays of an in-process world.

The cache is keyed by the CPU it was compiled for: on a machine with another CPU model the kernels
are compiled again on first use (and cached again if the directory is writable).

    NUMBA_CACHE_DIR=/var/cache/sapgrid/numba python deploy/warm_cache.py
"""
from __future__ import annotations

import sys
import time

import numpy as np

from sapgrid.client import Client
from sapgrid.server.app import build_server
from sapgrid.server.config import ServerConfig


def _boxes(centers: np.ndarray, half: float = 0.75) -> np.ndarray:
    return np.concatenate([centers - half, centers + half], axis=1).astype(np.float32)


def warm(address: str, dims: int) -> None:
    rng = np.random.default_rng(dims)
    n = 64
    ids = np.arange(1, n + 1, dtype=np.uint64)
    c = rng.uniform(1, 15, size=(n, dims))
    name = f"warm-{dims}d"
    with Client(address, timeout=120.0) as client:
        client.create_world(name, dims=dims, bounds=(0.0,) * dims + (16.0,) * dims, cells=(4,) * dims)
        try:
            client.step(name, 1, add_ids=ids, add_boxes=_boxes(c),
                        add_category=np.full(n, 1, np.uint32), add_mask=np.full(n, 0xFFFFFFFF, np.uint32),
                        add_static=np.arange(n) % 8 == 0)
            with client.stream(name) as s:
                for k in range(3):
                    c[8:] += rng.uniform(-1, 1, size=(n - 8, dims))
                    c.clip(1, 15, out=c)
                    s.step(update_ids=ids[8:], update_boxes=_boxes(c[8:]))
                s.step(remove_ids=ids[:4], add_ids=ids[:4] + 1000, add_boxes=_boxes(c[:4] + 0.5))
                s.step(remove_ids=ids[4:12])
            client.query(name, [0.0] * dims + [8.0] * dims)
            client.query(name, [0.0] * dims + [16.0] * dims, include_boxes=True)
            client.pairs(name)
        finally:
            client.delete_world(name)


def main() -> int:
    t0 = time.perf_counter()
    app = build_server(ServerConfig(listen="127.0.0.1:0", metrics_port=-1, default_world="", grace_seconds=1.0))
    app.start()
    try:
        for dims in (2, 3):
            warm(app.address, dims)
    finally:
        app.stop(grace=1.0)
    print(f"warm_cache: kernels compiled and cached in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
