"""The viewer's web side: aiohttp serves the static page and one WebSocket per page.

Per world and shown area, a feed task holds a region subscription (Subscribe with the area as its
region): the mirror of the pairs with an object in the area, recent created/deleted pairs for
flashing, frame stats and frames/s. Per page, a loop queries the boxes in
the page's visible area (QueryRegion with boxes) at a bounded rate, decimates them to a cap, and
sends the latest state. Sending waits for the page: a slow page gets fewer, newer updates, never a
queue. The server does no extra work per frame for the viewer beyond one subscriber per world.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import numpy as np
from aiohttp import WSMsgType, web

from sapgrid.client import AsyncClient
from sapgrid.client.errors import SapgridError

STATIC = Path(__file__).parent / "static"
MAX_BOXES = 20_000   # boxes per update; beyond it the visible boxes are sampled evenly
MAX_PAIRS = 20_000   # pair segments per update
FLASH_S = 0.3        # how long a started/stopped pair stays flashed
UPDATE_HZ = 10.0


def _pair_keys(pairs: np.ndarray) -> np.ndarray:
    p = np.ascontiguousarray(np.asarray(pairs, dtype=np.uint64).reshape(-1, 2))
    return p.view(np.dtype([("a", "<u8"), ("b", "<u8")])).reshape(-1)


class WorldFeed:
    """One region subscription to a world (the area a page shows): the mirror of the pairs with an
    object in the region, recent pair changes and frame stats."""

    def __init__(self, client: AsyncClient, world: str, region: list[float]):
        self.client, self.world, self.region = client, world, region
        self.pairs = set()
        self._pairs_array = None
        self.flashes: list[tuple[float, np.ndarray, np.ndarray]] = []
        self.stats: dict = {}
        self.frame = 0
        self._times: list[tuple[float, int]] = []
        self.error: str | None = None
        self.task = asyncio.create_task(self._run())
        self.users = 0

    async def _run(self) -> None:
        try:
            sub = self.client.subscribe(self.world, region=self.region)
            first = asyncio.ensure_future(sub.__anext__())
            # until a frame comes: the pairs in the region now (the first delta then carries the whole view)
            ids = await self.client.query(self.world, self.region)
            pairs = await self.client.pairs(self.world)
            if len(pairs) and len(ids):
                pairs = pairs[np.isin(pairs[:, 0], ids) | np.isin(pairs[:, 1], ids)]
            if not first.done():
                self.pairs = set(map(tuple, pairs.tolist()))
            d = await first
            self.pairs = set()
            while True:
                self._apply(d)
                d = await sub.__anext__()
        except StopAsyncIteration:
            self.error = "subscription ended"
        except SapgridError as err:
            self.error = str(err)

    def _apply(self, d) -> None:
        now = time.monotonic()
        for row in d.deleted.tolist():
            self.pairs.discard(tuple(row))
        for row in d.created.tolist():
            self.pairs.add(tuple(row))
        self._pairs_array = None
        if len(d.created) or len(d.deleted):
            self.flashes.append((now, np.array(d.created), np.array(d.deleted)))
        self.flashes = [f for f in self.flashes if now - f[0] < FLASH_S][-50:]
        s = d.stats
        self.frame = d.frame
        self._times = [t for t in self._times if now - t[0] < 2.0] + [(now, d.frame)]
        fps = 0.0
        if len(self._times) > 1 and self._times[-1][0] > self._times[0][0]:
            fps = (self._times[-1][1] - self._times[0][1]) / (self._times[-1][0] - self._times[0][0])
        self.stats = {"frame": d.frame, "objects": s.objects, "pairs": s.pairs, "created": s.created,
                      "deleted": s.deleted, "engine_ms": s.total_s * 1e3, "fps": fps}

    def pairs_array(self) -> np.ndarray:
        if self._pairs_array is None:
            self._pairs_array = np.array(sorted(self.pairs), dtype=np.uint64).reshape(-1, 2)
        return self._pairs_array

    def pairs_of(self, ids: np.ndarray) -> np.ndarray:
        p = self.pairs_array()
        if not len(p) or not len(ids):
            return p[:0]
        return p[np.isin(p[:, 0], ids) | np.isin(p[:, 1], ids)]

    def recent(self) -> tuple[np.ndarray, np.ndarray]:
        now = time.monotonic()
        live = [f for f in self.flashes if now - f[0] < FLASH_S]
        cat = lambda xs: np.concatenate(xs) if xs else np.zeros((0, 2), np.uint64)  # noqa: E731
        return cat([f[1].reshape(-1, 2) for f in live]), cat([f[2].reshape(-1, 2) for f in live])


class Viewer:
    def __init__(self, server: str, default_world: str = ""):
        self.server, self.default_world = server, default_world
        self.client: AsyncClient | None = None
        self.feeds: dict[tuple, WorldFeed] = {}

    async def start(self, app) -> None:
        self.client = AsyncClient(self.server)

    async def stop(self, app) -> None:
        for f in list(self.feeds.values()):
            f.task.cancel()
        for f in list(self.feeds.values()):
            with contextlib.suppress(BaseException):
                await f.task
        if self.client is not None:
            await self.client.close()

    def feed(self, page: "PageState") -> WorldFeed:
        """The page's feed: one region subscription per world and shown area, shared by pages."""
        key = (page.world, tuple(page.region(page.rect)))
        f = self.feeds.get(key)
        if f is None or f.task.done():
            users = f.users if f is not None else 0
            f = self.feeds[key] = WorldFeed(self.client, page.world, list(key[1]))
            f.users = users
        if page.feed_key != key:
            self.release(page)
            page.feed_key = key
            f.users += 1
        return f

    def release(self, page: "PageState") -> None:
        f = self.feeds.get(page.feed_key) if page.feed_key else None
        page.feed_key = None
        if f is not None:
            f.users -= 1
            if f.users <= 0:
                f.task.cancel()
                del self.feeds[(f.world, tuple(f.region))]

    async def worlds(self, request) -> web.Response:
        try:
            infos = await self.client.list_worlds()
        except SapgridError as exc:             # the server is down, restarting or recovering: say so
            return web.json_response({"default": self.default_world, "worlds": [], "error": str(exc)}, status=503)
        return web.json_response({"default": self.default_world, "worlds": [
            {"name": w.name, "dims": w.config.dims, "bounds": list(w.config.bounds),
             "cells": list(w.config.cells), "objects": w.objects, "pairs": w.pairs} for w in infos]})

    async def index(self, request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def socket(self, request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=20)
        await ws.prepare(request)
        page = PageState()
        sender = asyncio.create_task(self._send_loop(ws, page))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    await self._handle(ws, page, json.loads(msg.data))
                except (ValueError, KeyError, TypeError, SapgridError) as err:
                    await ws.send_json({"type": "error", "message": str(err)})
        finally:
            self.release(page)
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
        return ws

    async def _handle(self, ws, page: "PageState", m: dict) -> None:
        kind = m["type"]
        if kind == "view":
            info = await self.client.get_world(str(m["world"]))
            dims = info.config.dims
            axes = [int(a) for a in m.get("axes", [0, 1])]
            if len(axes) != 2 or not all(0 <= a < dims for a in axes) or axes[0] == axes[1]:
                raise ValueError(f"axes must be two different axes below {dims}")
            rect = [float(x) for x in m["rect"]]
            if len(rect) != 4 or not np.all(np.isfinite(rect)):
                raise ValueError("rect must be 4 finite values: x0, y0, x1, y1")
            # checked: now the page changes
            page.world, page.dims, page.axes, page.rect = info.name, dims, axes, rect
            page.bounds = np.array(info.config.bounds, dtype=np.float64)
            self.feed(page)
            page.wake.set()
        elif kind == "query":
            ids = await self.client.query(page.world, page.region(m["rect"]))
            await ws.send_json({"type": "query", "ids": [int(i) for i in ids[:10_000]], "count": int(len(ids))})
        elif kind == "pick":
            x, y, r = float(m["x"]), float(m["y"]), float(m.get("r", 0.0))
            ids, boxes = await self.client.query(page.world, page.region([x - r, y - r, x + r, y + r]),
                                                 include_boxes=True)
            if not len(ids):
                await ws.send_json({"type": "pick", "id": None})
                return
            # the smallest box under the cursor (on the shown axes)
            a0, a1, d = page.axes[0], page.axes[1], page.dims
            area = (boxes[:, d + a0] - boxes[:, a0]) * (boxes[:, d + a1] - boxes[:, a1])
            k = int(np.argmin(area))
            oid = ids[k]
            pairs = self.feed(page).pairs_of(np.array([oid], dtype=np.uint64))
            others = np.where(pairs[:, 0] == oid, pairs[:, 1], pairs[:, 0]) if len(pairs) else pairs[:, 0]
            await ws.send_json({"type": "pick", "id": int(oid), "box": [float(v) for v in boxes[k]],
                                "pairs": sorted(int(o) for o in others)})
        else:
            raise ValueError(f"unknown message type {kind!r}")

    async def _send_loop(self, ws, page: "PageState") -> None:
        period = 1.0 / UPDATE_HZ
        while not ws.closed:
            await page.wake.wait()
            if page.world is None:
                page.wake.clear()
                continue
            t0 = time.monotonic()
            try:
                state = await self._state(page)
            except SapgridError as err:
                state = {"type": "error", "message": str(err)}
            await ws.send_json(state)  # waits for a slow page: it skips the frames in between
            await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))

    async def _state(self, page: "PageState") -> dict:
        feed = self.feed(page)
        ids, boxes = await self.client.query(page.world, page.region(page.rect), include_boxes=True)
        total = len(ids)
        if total > MAX_BOXES:  # decimate: an even sample of the visible boxes
            keep = np.linspace(0, total - 1, MAX_BOXES).astype(np.int64)
            ids, boxes = ids[keep], boxes[keep]
        d, (a0, a1) = page.dims, page.axes
        shown = boxes[:, [a0, a1, d + a0, d + a1]] if len(ids) else np.zeros((0, 4), np.float32)
        order = np.argsort(ids)
        sids = ids[order]

        def segments(pairs: np.ndarray, cap: int) -> list:
            if not len(pairs) or not len(sids):
                return []
            ia = np.searchsorted(sids, pairs[:, 0]).clip(0, len(sids) - 1)
            ib = np.searchsorted(sids, pairs[:, 1]).clip(0, len(sids) - 1)
            ok = (sids[ia] == pairs[:, 0]) & (sids[ib] == pairs[:, 1])
            return np.stack([order[ia[ok]], order[ib[ok]]], axis=1)[:cap].ravel().tolist()

        created, deleted = feed.recent()
        return {"type": "state", "world": page.world, "dims": d, "axes": page.axes,
                "bounds": page.bounds.tolist(), "total": total, "sent": int(len(ids)),
                "ids": ids.tolist(), "boxes": np.round(shown.astype(np.float64), 3).ravel().tolist(),
                "pairs": segments(feed.pairs_array(), MAX_PAIRS), "created": segments(created, 2000),
                "deleted": segments(deleted, 2000), "stats": feed.stats, "error": feed.error}


class PageState:
    def __init__(self):
        self.world: str | None = None
        self.dims = 2
        self.axes = [0, 1]
        self.rect = [0.0, 0.0, 1.0, 1.0]
        self.bounds = np.zeros(4)
        self.feed_key = None
        self.wake = asyncio.Event()

    def region(self, rect) -> list[float]:
        """A page rectangle (x0, y0, x1, y1 on the shown axes) as a world region; other axes: all."""
        x0, y0, x1, y1 = (float(v) for v in rect)
        if not all(np.isfinite([x0, y0, x1, y1])):
            raise ValueError("rectangle values must be finite")
        d = self.dims
        lo, hi = [-3.0e38] * d, [3.0e38] * d
        lo[self.axes[0]], hi[self.axes[0]] = min(x0, x1), max(x0, x1)
        lo[self.axes[1]], hi[self.axes[1]] = min(y0, y1), max(y0, y1)
        return lo + hi


def make_app(server: str, world: str = "") -> web.Application:
    viewer = Viewer(server, world)
    app = web.Application()
    app.on_startup.append(viewer.start)
    app.on_cleanup.append(viewer.stop)
    app.add_routes([web.get("/", viewer.index), web.get("/api/worlds", viewer.worlds),
                    web.get("/ws", viewer.socket), web.static("/static", STATIC)])
    return app


def run(server: str, world: str, listen: str) -> int:
    import sys

    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        print(f"sapgrid view: --listen must be HOST:PORT, got {listen!r}", file=sys.stderr)
        return 2
    started = lambda _message: print(f"sapgrid view: http://{listen}/ (server {server})", flush=True)  # noqa: E731
    try:                                # the address line once the page is served (aiohttp calls ``print``)
        web.run_app(make_app(server, world), host=host, port=int(port), print=started)
    except OSError as exc:
        print(f"sapgrid view: --listen {listen}: cannot listen there ({exc.strerror or exc})", file=sys.stderr)
        return 2
    return 0
