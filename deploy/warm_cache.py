"""Fill numba's on-disk kernel cache (NUMBA_CACHE_DIR) so a fresh server's first frames are not slow.

sapcore's kernels are compiled on first use and cached on disk (``cache=True``). This script starts
a server in this process on a free loopback port (no metrics, no default world) and drives every
kind of call through it, in 2D and 3D: frames with every combination of removes, updates and adds
(with and without categories, masks and static flags), a world growing to thousands of crowded
objects and churning, region queries and pair listings. The server path matters: frames arrive as
read-only arrays decoded from the wire, which numba compiles separately from writable arrays, so
which arrays a frame carries decides which compiled variant of a kernel runs.

The cache is keyed by the CPU it was compiled for: on a machine with another CPU model the kernels
are compiled again on first use (and cached again if the directory is writable).

    NUMBA_CACHE_DIR=/var/cache/sapgrid/numba python deploy/warm_cache.py
"""
from __future__ import annotations

import sys
import time

import numpy as np

import sapcore
from sapgrid.client import Client
from sapgrid.server.app import build_server
from sapgrid.server.config import ServerConfig


def _boxes(centers: np.ndarray, half: float = 0.75) -> np.ndarray:
    return np.concatenate([centers - half, centers + half], axis=1).astype(np.float32)


def _small_world(client: Client, name: str, dims: int, rng) -> None:
    """Every combination of removes / updates / adds in one frame, adds with and without the optional
    columns (which of a frame's arrays come from the wire decides the kernels' argument types)."""
    n = 64
    ids = np.arange(1, n + 1, dtype=np.uint64)
    c = rng.uniform(1, 15, size=(n, dims))
    client.create_world(name, dims=dims, bounds=(0.0,) * dims + (16.0,) * dims, cells=(4,) * dims)
    try:
        client.step(name, 1, add_ids=ids[:32], add_boxes=_boxes(c[:32]),
                    add_category=np.full(32, 1, np.uint32), add_mask=np.full(32, 0xFFFFFFFF, np.uint32),
                    add_static=np.arange(32) % 8 == 0)
        with client.stream(name) as s:
            s.step(add_ids=ids[32:48], add_boxes=_boxes(c[32:48]))
            s.step(add_ids=ids[48:], add_boxes=_boxes(c[48:]), add_static=np.zeros(16, bool))
            nxt = 1000
            for remove, update, add in [(r, u, a) for r in (0, 1) for u in (0, 1) for a in (0, 1)]:
                for optional in ((False, True) if add else (False,)):
                    live = np.array(sorted(client.query(name, [0.0] * dims + [16.0] * dims)), np.uint64)
                    arrays = {}
                    if remove:
                        arrays.update(remove_ids=live[:2])
                    if update:
                        moved = live[2:40]
                        arrays.update(update_ids=moved,
                                      update_boxes=_boxes(rng.uniform(1, 15, size=(len(moved), dims))))
                    if add:
                        new = np.arange(nxt, nxt + 3, dtype=np.uint64)
                        nxt += 3
                        arrays.update(add_ids=new, add_boxes=_boxes(rng.uniform(1, 15, size=(3, dims))))
                        if optional:
                            arrays.update(add_category=np.full(3, 2, np.uint32), add_mask=np.full(3, 3, np.uint32),
                                          add_static=np.zeros(3, bool))
                    s.step(**arrays)
        client.query(name, [0.0] * dims + [8.0] * dims)
        client.query(name, [0.0] * dims + [16.0] * dims, include_boxes=True)
        client.pairs(name)
        client.list_pairs(name, page_size=8)
    finally:
        client.delete_world(name)


def _growing_world(client: Client, name: str, dims: int, rng) -> None:
    """Thousands of crowded objects added in batches to a world created without a size hint, then
    moved and churned: the paths that grow buffers and rehash pair sets."""
    n, side = 6000, 100.0
    ids = np.arange(1, n + 1, dtype=np.uint64)
    c = rng.uniform(2, side - 2, size=(n, dims))
    client.create_world(name, dims=dims, bounds=(0.0,) * dims + (side,) * dims, cells=(6,) * dims)
    try:
        with client.stream(name) as s:
            for lo in range(0, n, 1500):
                s.step(add_ids=ids[lo:lo + 1500], add_boxes=_boxes(c[lo:lo + 1500], 1.5))
            for _ in range(4):
                c += rng.uniform(-2, 2, size=c.shape)
                c.clip(2, side - 2, out=c)
                s.step(update_ids=ids, update_boxes=_boxes(c, 1.5))
            for k in range(3):                               # churn: removes, updates and adds in one frame
                gone, back = ids[k * 300:(k + 1) * 300], ids[k * 300:(k + 1) * 300] + 100_000
                stay = ids[(k + 1) * 300:]
                c += rng.uniform(-2, 2, size=c.shape)
                c.clip(2, side - 2, out=c)
                s.step(remove_ids=gone, update_ids=stay, update_boxes=_boxes(c[(k + 1) * 300:], 1.5),
                       add_ids=back, add_boxes=_boxes(c[k * 300:(k + 1) * 300], 1.5))
            s.step(remove_ids=ids[2000:5000])                  # shrink
        client.query(name, [0.0] * dims + [side / 2] * dims)
        client.pairs(name)
    finally:
        client.delete_world(name)


def warm(address: str, dims: int) -> None:
    rng = np.random.default_rng(dims)
    with Client(address, timeout=600.0) as client:
        _small_world(client, f"warm-small-{dims}d", dims, rng)
        _growing_world(client, f"warm-large-{dims}d", dims, rng)


def main() -> int:
    t0 = time.perf_counter()
    app = build_server(ServerConfig(listen="127.0.0.1:0", metrics_port=-1, default_world="", grace_seconds=1.0))
    app.start()
    try:
        for dims in (2, 3):
            warm(app.address, dims)
    finally:
        app.stop(grace=1.0)
    # numba keys its cache by the kernels' source folder: this must be the installed sapcore the server runs.
    print(f"warm_cache: kernels of {sapcore.__file__} compiled and cached in {time.perf_counter() - t0:.1f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
