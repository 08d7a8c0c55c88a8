"""The viewer's web side without a browser: the world list, the state of a shown area (decimated
above the cap), pairs from its region subscription, and bad page messages answered with an error."""
import asyncio

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sapgrid.client import Client
from sapgrid.tools.viewer import app as viewer_app


def _world(server, name, n, rng):
    with Client(server.address) as c:
        c.create_world(name, dims=3, bounds=(0.0, 0.0, 0.0, 100.0, 100.0, 100.0))
        lo = rng.uniform(0, 96, (n, 3))
        boxes = np.concatenate([lo, lo + 3.0], axis=1).astype(np.float32)
        c.step(name, add_ids=np.arange(1, n + 1, dtype=np.uint64), add_boxes=boxes)
        return boxes, c.pairs(name)


async def _session(server, world, monkeypatch, cap):
    monkeypatch.setattr(viewer_app, "MAX_BOXES", cap)
    client = TestClient(TestServer(viewer_app.make_app(server.address, world)))
    await client.start_server()
    return client


async def _next(ws, kind):
    while True:
        m = await asyncio.wait_for(ws.receive_json(), 20)
        if m["type"] == kind:
            return m


def test_state_is_decimated_and_pairs_come_from_the_region(server, world_name, monkeypatch, rng):
    boxes, pairs = _world(server, world_name, 3000, rng)

    async def run():
        client = await _session(server, world_name, monkeypatch, cap=500)
        try:
            worlds = await (await client.get("/api/worlds")).json()
            assert worlds["default"] == world_name
            assert {"name": world_name, "dims": 3} .items() <= next(
                w for w in worlds["worlds"] if w["name"] == world_name).items()
            ws = await client.ws_connect("/ws")
            await ws.send_json({"type": "view", "world": world_name, "axes": [0, 2], "rect": [0, 0, 100, 100]})
            s = await _next(ws, "state")
            assert s["total"] == 3000 and s["sent"] == 500 and len(s["boxes"]) == 4 * 500
            # shown on axes x, z: each sent box is (x0, z0, x1, z1) of the world's box
            first = s["ids"][0] - 1
            assert s["boxes"][:4] == pytest.approx(boxes[first, [0, 2, 3, 5]], abs=1e-3)
            # pairs drawn: only between sent boxes, each a real pair of the world
            sent = np.array(s["ids"], dtype=np.uint64)
            seg = np.array(s["pairs"]).reshape(-1, 2)
            world_pairs = {tuple(p) for p in pairs.tolist()}
            for i, j in seg:
                a, b = sorted((int(sent[i]), int(sent[j])))
                assert (a, b) in world_pairs
            # region query on the shown axes (y unrestricted)
            await ws.send_json({"type": "query", "rect": [10, 10, 30, 40]})
            q = await _next(ws, "query")
            b = boxes
            hit = (b[:, 0] <= 30) & (b[:, 3] >= 10) & (b[:, 2] <= 40) & (b[:, 5] >= 10)
            assert q["ids"] == [int(i) + 1 for i in np.nonzero(hit)[0]]
            # bad messages: an error, and the page goes on
            for bad in ({"type": "nope"}, {"type": "query", "rect": [0, 0, "x", 1]},
                        {"type": "view", "world": world_name, "axes": [0, 0], "rect": [0, 0, 1, 1]},
                        {"type": "view", "world": world_name, "rect": [0, 0, 1]},
                        {"type": "view", "world": "no-such-world", "rect": [0, 0, 1, 1]}, "not json"):
                await (ws.send_str(bad) if isinstance(bad, str) else ws.send_json(bad))
                assert (await _next(ws, "error"))["message"]
            await ws.send_json({"type": "query", "rect": [10, 10, 30, 40]})
            assert (await _next(ws, "query"))["ids"] == q["ids"]
            await ws.close()
        finally:
            await client.close()
        with Client(server.address) as c:
            for _ in range(100):  # the page's region subscription ends with the page
                if c.get_world(world_name).subscribers == 0:
                    break
                await asyncio.sleep(0.05)
            assert c.get_world(world_name).subscribers == 0
            c.delete_world(world_name)

    asyncio.run(run())
