"""The Python client's side of scripts/bench.mjs: the same measure with sapgrid.client, one JSON line out.

    python bench_peer.py HOST:PORT OBJECTS FRAMES
"""
import json
import os
import sys
import time

import numpy as np

from sapgrid.client import Client


def main(address: str, n: int, frames: int) -> None:
    rng = np.random.default_rng(1)
    extent = float(np.sqrt(n) * 10)
    pos = (rng.random((n, 2)) * extent).astype(np.float32)

    def boxes():
        pos[:] += (rng.random((n, 2)) - 0.5).astype(np.float32)
        return np.concatenate([pos, pos + 4], axis=1)

    world = f"bench-py-{os.getpid()}"
    ids = np.arange(1, n + 1, dtype=np.uint64)
    with Client(address) as c:
        c.create_world(world, dims=2, bounds=(0, 0, extent, extent), expected_objects=n)
        with c.stream(world) as s:
            s.step(add_ids=ids, add_boxes=boxes())
            todo = [boxes() for _ in range(frames)]
            for b in todo[:20]:                 # warm-up, not timed
                s.step(update_ids=ids, update_boxes=b)
            rt, srv = [], []
            for b in todo:
                t0 = time.perf_counter()
                d = s.step(update_ids=ids, update_boxes=b)
                rt.append((time.perf_counter() - t0) * 1e3)
                srv.append(d.server_s * 1e3)
            t0 = time.perf_counter()
            in_flight = done = 0
            for b in todo:
                s.send(update_ids=ids, update_boxes=b)
                in_flight += 1
                if in_flight >= 8:
                    s.recv()
                    in_flight -= 1
                    done += 1
            while in_flight:
                s.recv()
                in_flight -= 1
                done += 1
            fps = done / (time.perf_counter() - t0)
        c.delete_world(world)
    rt, srv = np.array(rt), np.array(srv)
    print(json.dumps({"rt_p50": float(np.median(rt)), "rt_p99": float(np.quantile(rt, 0.99)),
                      "server_p50": float(np.median(srv)), "client_p50": float(np.median(rt - srv)), "fps": fps}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
