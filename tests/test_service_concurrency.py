"""Several worlds and streams at once; bounded queues; deadlines and cancellation honoured.

A ``GatedWorld`` wraps the real sapcore.World so a test can hold a world's worker inside ``step``
(a test seam of the server's world_factory, not a stand-in engine).
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sapcore import World, WorldConfig
from sapgrid.client import AsyncClient, Client
from sapgrid.client.errors import DeadlineExceeded, NotFound, ResourceExhausted, Unavailable
from sapgrid.server import kernels
from service_helpers import assert_same_pairs, metric_value, random_boxes, scrape

CFG = WorldConfig(dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))


class GatedWorld:
    """sapcore.World whose step waits for ``gate`` (set = open) and signals ``entered``."""

    def __init__(self, cfg):
        self._w = World(cfg)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def step(self, **kw):
        self.entered.set()
        self.gate.wait(120)
        return self._w.step(**kw)

    def __getattr__(self, name):
        return getattr(self._w, name)


def test_two_worlds_at_once(client, rng):
    names = [f"two-{i}-{rng.integers(1 << 30)}" for i in range(2)]
    cfgs = [CFG, WorldConfig(dims=3, bounds=(0, 0, 0, 100, 100, 100), cells=(2, 2, 2))]
    locals_ = [World(c) for c in cfgs]
    for n, c in zip(names, cfgs):
        client.create_world(n, c)
    with client.stream() as s:                  # one stream, frames alternate between the worlds
        for tick in range(5):
            for n, c, loc in zip(names, cfgs, locals_):
                ids = np.arange(tick * 50, tick * 50 + 50)
                f = dict(add_ids=ids, add_boxes=random_boxes(rng, 50, c.dims, side=50, size=6))
                want = loc.step(**f)
                got = s.step(world=n, **f)
                assert got.world == n
                assert_same_pairs(got.created, want.created)
    for n, loc in zip(names, locals_):
        assert_same_pairs(client.pairs(n), loc.pairs())
        client.delete_world(n)


def test_many_concurrent_streams(server, rng):
    n_streams, ticks, per = 12, 15, 40
    shared = f"shared-{rng.integers(1 << 30)}"
    own = [f"own-{i}-{rng.integers(1 << 30)}" for i in range(n_streams)]
    seeds = rng.integers(1 << 30, size=n_streams)
    with Client(server.address) as c:
        c.create_world(shared, CFG)
        for n in own:
            c.create_world(n, CFG)

    def run(i):
        r = np.random.default_rng(seeds[i])
        ids = np.arange(i * per, (i + 1) * per)
        local = World(CFG)
        with Client(server.address) as c, c.stream() as s:
            boxes = random_boxes(r, per)
            s.step(world=shared, add_ids=ids, add_boxes=boxes)
            d = s.step(world=own[i], add_ids=ids, add_boxes=boxes)
            assert_same_pairs(d.created, local.step(add_ids=ids, add_boxes=boxes).created)
            for _ in range(ticks):
                boxes = random_boxes(r, per)
                s.send(world=shared, update_ids=ids, update_boxes=boxes)
                s.send(world=own[i], update_ids=ids, update_boxes=boxes)
                s.recv()
                d = s.recv()
                want = local.step(update_ids=ids, update_boxes=boxes)
                assert_same_pairs(d.created, want.created)
                assert_same_pairs(d.deleted, want.deleted)
            return ids, boxes

    with ThreadPoolExecutor(n_streams) as pool:
        finals = list(pool.map(run, range(n_streams)))
    ref = World(CFG)
    ref.step(add_ids=np.concatenate([f[0] for f in finals]), add_boxes=np.concatenate([f[1] for f in finals]))
    with Client(server.address) as c:
        assert_same_pairs(c.pairs(shared), ref.pairs())
        info = c.get_world(shared)
        assert info.frames == n_streams * (ticks + 1) and info.frames_rejected == 0
        for n in [shared, *own]:
            c.delete_world(n)


def _gated_server(make_server, **overrides):
    """A server of GatedWorlds whose frames are all applied in threads of the call pool: a frame held in
    the server's loop would hold every call (the loop applies small frames only, which take microseconds)."""
    worlds = []

    def factory(cfg):
        w = GatedWorld(cfg)
        worlds.append(w)
        return w

    srv = make_server(world_factory=factory, default_world="", in_loop_frame_bytes=0, **overrides)
    return srv, worlds


def test_full_queue_answers_resource_exhausted(make_server):
    srv, worlds = _gated_server(make_server, queue_size=2)
    with Client(srv.address) as c:
        c.create_world("q", CFG)
        w = worlds[0]
        w.gate.clear()
        runner = srv.app.registry.get("q")
        with c.stream("q") as s, c.stream("q") as s2, c.stream("q") as s3, c.stream("q") as s4:
            s.send(seq=1, add_ids=[1], add_boxes=[[0, 0, 1, 1]])
            assert w.entered.wait(60)                           # frame 1 is inside step
            s2.send(seq=2, add_ids=[2], add_boxes=[[0, 0, 1, 1]])
            s3.send(seq=3, add_ids=[3], add_boxes=[[0, 0, 1, 1]])
            while len(runner.pending) < 2:                      # frames 2 and 3 wait in line
                time.sleep(0.001)
            s4.send(seq=4, add_ids=[4], add_boxes=[[0, 0, 1, 1]])  # line (2) full
            with pytest.raises(ResourceExhausted) as ei:        # refused on arrival, in frame 4's slot
                s4.recv()
            assert "queue full" in ei.value.message
            w.gate.set()
            assert s.recv().seq == 1
            assert s2.recv().seq == 2 and s3.recv().seq == 3
            assert s4.step(add_ids=[4], add_boxes=[[0, 0, 1, 1]]).stats.objects == 4   # stream goes on
        info = c.get_world("q")
        assert info.objects == 4 and info.frames == 4 and info.frames_rejected == 1


def test_frames_wait_in_arrival_order(make_server):
    srv, worlds = _gated_server(make_server)
    with Client(srv.address) as c:
        c.create_world("o", CFG)
        w = worlds[0]
        w.gate.clear()
        runner = srv.app.registry.get("o")
        streams = [c.stream("o") for _ in range(4)]
        try:
            streams[0].send(add_ids=[0], add_boxes=[[0, 0, 1, 1]])
            assert w.entered.wait(60)
            for i, s in enumerate(streams[1:], 1):               # each queued behind the one before
                s.send(add_ids=[i], add_boxes=[[0, 0, 1, 1]])
                while len(runner.pending) < i:
                    time.sleep(0.001)
            w.gate.set()
            frames = [s.recv().frame for s in streams]
            assert frames == [1, 2, 3, 4]
        finally:
            for s in streams:
                s.close()


def test_heavy_world_does_not_block_another(make_server):
    srv, worlds = _gated_server(make_server, worker_threads=4)
    with Client(srv.address) as c:
        c.create_world("heavy", CFG)
        c.create_world("light", CFG)
        heavy = worlds[0]
        heavy.gate.clear()
        with c.stream("heavy") as s:
            s.send(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
            assert heavy.entered.wait(60)
            d = c.step("light", add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]])   # not blocked
            assert d.created.tolist() == [[1, 2]]
            assert c.get_world("heavy").frames == 0
            heavy.gate.set()
            assert s.recv().stats.objects == 1


def test_deadline_exceeded_frame_is_not_applied(make_server):
    srv, worlds = _gated_server(make_server)
    with Client(srv.address) as c:
        c.create_world("d", CFG)
        w = worlds[0]
        w.gate.clear()
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.step, "d", 1, add_ids=[1], add_boxes=[[0, 0, 1, 1]])
            assert w.entered.wait(60)
            with pytest.raises(DeadlineExceeded):
                c.step("d", 2, add_ids=[2], add_boxes=[[0, 0, 1, 1]], timeout=0.2)
            runner = srv.app.registry.get("d")
            # wait until the server has seen the deadline too (the job left the line)
            while runner.pending:
                time.sleep(0.001)
            w.gate.set()
            assert first.result(60).stats.objects == 1
        d = c.step("d", 3, update_ids=[1], update_boxes=[[0, 0, 2, 2]])
        assert d.frame == 2                                    # frame 2 was never applied
        np.testing.assert_array_equal(c.query("d", [0, 0, 10, 10]), [1])


def test_cancelled_stream_frames_are_not_applied(make_server):
    srv, worlds = _gated_server(make_server)
    with Client(srv.address) as c:
        c.create_world("c", CFG)
        w = worlds[0]
        w.gate.clear()
        runner = srv.app.registry.get("c")
        s, s2 = c.stream("c"), c.stream("c")
        s.send(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
        assert w.entered.wait(60)
        s.send(add_ids=[3], add_boxes=[[0, 0, 1, 1]])          # sent ahead on the same stream
        s2.send(add_ids=[2], add_boxes=[[0, 0, 1, 1]])         # waits in line
        while len(runner.pending) < 1:
            time.sleep(0.001)
        s.close()                                              # both clients go away
        s2.close()
        while runner.pending:                                  # the waiting frame left the line
            time.sleep(0.001)
        time.sleep(0.2)                                        # the server sees the first stream end too
        w.gate.set()
        d = c.step("c", update_ids=[1], update_boxes=[[0, 0, 2, 2]])
        assert d.frame == 2 and d.stats.objects == 1           # frame 1 applied (it was running), 2 and 3 not
        _wait_slots_free(srv)                                  # the cancelled calls gave their slots back


def test_deleting_a_world_answers_its_queued_frames(make_server):
    srv, worlds = _gated_server(make_server)
    with Client(srv.address) as c:
        c.create_world("del", CFG)
        w = worlds[0]
        w.gate.clear()
        with c.stream("del") as s, c.stream("del") as s2:
            s.send(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
            assert w.entered.wait(60)
            s2.send(add_ids=[2], add_boxes=[[0, 0, 1, 1]])
            runner = srv.app.registry.get("del")
            while len(runner.pending) < 1:
                time.sleep(0.001)
            c.delete_world("del")
            with pytest.raises(NotFound):                      # the waiting frame is answered at once
                s2.recv()
            w.gate.set()
            s.recv()                                           # the running frame completes
        c.list_worlds()                                        # a round trip: deferred metric updates ran
        assert 'world="del"' not in scrape(srv.metrics_url)     # no series re-created for the deleted world


def _slots_in_use(srv) -> float | None:
    return metric_value(scrape(srv.metrics_url), "sapgrid_call_slots_in_use")


def _wait_slots_free(srv) -> None:
    """Every call slot is given back (ended and cancelled calls release theirs as they terminate)."""
    deadline = time.monotonic() + 30
    while _slots_in_use(srv) != 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_long_calls_beyond_the_slots_are_refused_and_health_is_still_answered(make_server):
    srv = make_server(worker_threads=2, default_world="")
    with Client(srv.address) as c, grpc.insecure_channel(srv.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        c.create_world("m", CFG)
        with c.stream("m") as s, c.stream("m") as s2:       # two open streams hold both slots
            s.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
            s2.step(add_ids=[2], add_boxes=[[0, 0, 1, 1]])
            assert _slots_in_use(srv) == 2
            with pytest.raises(ResourceExhausted, match="all 2 call slots are in use"):
                c.step("m", 1, update_ids=[1], update_boxes=[[0, 0, 3, 3]])     # a frame call: refused
            with c.stream("m") as s3, pytest.raises(ResourceExhausted):        # a third stream: refused
                s3.step(update_ids=[1], update_boxes=[[0, 0, 3, 3]])
            with pytest.raises(ResourceExhausted):
                next(iter(c.subscribe("m")))
            # short calls are still answered: the orchestrator's health check, world management
            for _ in range(3 * 16):
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert c.get_world("m").frames == 2                # the refused frames changed nothing
            assert metric_value(scrape(srv.metrics_url), "sapgrid_calls_refused_total") == 3
            assert s.step(update_ids=[1], update_boxes=[[0, 0, 2, 2]]).stats.objects == 2
        _wait_slots_free(srv)                               # the slots are back once the streams end
        assert c.step("m", 2, update_ids=[2], update_boxes=[[0, 0, 3, 3]]).stats.objects == 2
        assert c.get_world("m").frames == 4


def test_graceful_stop_serves_open_streams_then_ends_subscriptions(make_server):
    srv = make_server(default_world="", grace_seconds=60)
    with Client(srv.address) as c:
        c.create_world("g", CFG)
        sub = c.subscribe("g")
        while srv.app.registry.get("g").subscribers < 1:      # the subscription is in place
            time.sleep(0.001)
        s = c.stream("g")
        s.step(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [0.5, 0.5, 2, 2]])
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        while not srv.app.registry.closing:
            time.sleep(0.001)
        with pytest.raises(Unavailable):                    # no new calls while stopping
            c.create_world("late", CFG)
        d = s.step(update_ids=[2], update_boxes=[[5, 5, 6, 6]])   # the open stream is still served
        assert d.deleted.tolist() == [[1, 2]]
        assert stopper.is_alive()                           # the stop waits for the stream's client
        s.close()
        stopper.join(60)
        assert not stopper.is_alive()
        got = [x.frame for x in sub]                        # every delta, then the end of the stream
        assert got == [1, 2]


class ThreadsOfSteps(GatedWorld):
    """GatedWorld recording the thread each frame is applied in, whose gate holds only a frame that adds
    object 999 (the seam that keeps its world busy)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.threads: list[str] = []

    def step(self, **kw):
        self.threads.append(threading.current_thread().name)
        if kw.get("add_ids") is not None and 999 in np.asarray(kw["add_ids"]).tolist():
            return super().step(**kw)
        return self._w.step(**kw)


def test_small_frames_are_applied_in_the_loop_and_big_or_waiting_ones_in_the_pool(make_server, rng):
    """A stream's frame of at most --in-loop-frame-bytes whose world is free is applied in the server's
    loop (``sapgrid-io``); a bigger one, or one whose world is busy, in a thread of the call pool, while
    the loop goes on answering the other calls (health, other worlds' streams); every answer in order
    and against the engine run alone."""
    worlds = {}

    def factory(cfg):
        w = ThreadsOfSteps(cfg)
        worlds[len(worlds)] = w
        return w

    srv = make_server(world_factory=factory, default_world="", in_loop_frame_bytes=4096, worker_threads=8)
    with Client(srv.address) as c, grpc.insecure_channel(srv.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        c.create_world("busy", CFG)
        c.create_world("other", CFG)
        assert kernels.wait(2, 600)                        # (until then every frame goes to the pool)
        busy, other = worlds[0], worlds[1]
        local = World(CFG)
        ids = np.arange(300)
        boxes = random_boxes(rng, 300)
        with c.stream("busy") as s, c.stream("other") as s2:
            d = s.step(add_ids=ids[:10], add_boxes=boxes[:10])             # small: in the loop
            assert_same_pairs(d.created, local.step(add_ids=ids[:10], add_boxes=boxes[:10]).created)
            assert busy.threads[-1] == "sapgrid-io"
            d = s.step(add_ids=ids[10:], add_boxes=boxes[10:])             # ~8 KB: in a pool thread
            assert_same_pairs(d.created, local.step(add_ids=ids[10:], add_boxes=boxes[10:]).created)
            assert busy.threads[-1].startswith("sapgrid-call")
            busy.gate.clear()
            with ThreadPoolExecutor(1) as pool:
                held = pool.submit(c.step, "busy", add_ids=[999], add_boxes=[[0, 0, 1, 1]])   # holds the world
                assert busy.entered.wait(60)
                moved = random_boxes(rng, 5)
                s.send(update_ids=ids[:5], update_boxes=moved)             # small, but its world is busy
                runner = srv.app.registry.get("busy")
                deadline = time.monotonic() + 30
                while not runner.pending:                                  # it waits in line, in a pool thread
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
                for k in range(20):                                        # meanwhile the loop answers the rest
                    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
                    assert s2.step(add_ids=[k], add_boxes=[[k, k, k + 1, k + 1]]).frame == k + 1
                assert other.threads == ["sapgrid-io"] * 20
                busy.gate.set()
                assert held.result(60).stats.objects == 301
            local.step(add_ids=[999], add_boxes=[[0, 0, 1, 1]])
            d = s.recv()
            assert d.frame == 4 and busy.threads[-1].startswith("sapgrid-call")
            want = local.step(update_ids=ids[:5], update_boxes=moved)
            assert_same_pairs(d.created, want.created)
            assert_same_pairs(d.deleted, want.deleted)
            d = s.step(update_ids=ids[:5], update_boxes=boxes[:5])          # free again: in the loop
            assert d.frame == 5 and busy.threads[-1] == "sapgrid-io"
        assert_same_pairs(c.pairs("busy"), local.step(update_ids=ids[:5], update_boxes=boxes[:5]) and local.pairs())


def _relay(target: str):
    """A TCP relay to ``target`` (HOST:PORT) on a free loopback port: (its address, hold, cut, listener).
    ``hold()`` drops the server's bytes from then on (answers sent but never taken: the server's writes
    wait for HTTP/2 flow control), ``cut()`` closes every connection at once, as a network that drops a
    client does."""
    import socket

    host, port = target.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    sockets: list = []
    held = threading.Event()

    def pump(a, b, from_server):
        try:
            while data := a.recv(65536):
                if not (from_server and held.is_set()):
                    b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept():
        while True:
            try:
                down, _ = listener.accept()
            except OSError:
                return
            up = socket.create_connection((host, int(port)))
            sockets.extend([down, up])
            threading.Thread(target=pump, args=(down, up, False), daemon=True).start()
            threading.Thread(target=pump, args=(up, down, True), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

    def cut():
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    return f"127.0.0.1:{listener.getsockname()[1]}", held.set, cut, listener


def test_streams_whose_connection_drops_mid_stream_leave_the_server_serving(make_server):
    """Clients whose connections drop while the server writes their answers (answers held back by the
    network, then the connection cut): the server goes on serving, every slot comes back, and each
    world holds exactly the frames it applied. (A stream whose write fails this way has its generator
    closed after its call has ended; that it then touches nothing of the call, which gRPC has freed, is
    what the node client's test of cut connections found: client/node/test/durable.test.mjs.)"""
    srv = make_server(default_world="")
    n = 200
    ids = np.arange(n)
    together = np.tile([[0.0, 0.0, 1.0, 1.0]], (n, 1))            # every pair: ~320 KB of answer a frame
    apart = np.stack([ids * 0.3, ids * 0.3, ids * 0.3 + 0.1, ids * 0.3 + 0.1], axis=1)
    with Client(srv.address) as direct:
        for round_ in range(4):
            address, hold, cut, listener = _relay(srv.address)
            name = f"drop-{round_}"
            direct.create_world(name, CFG)
            with Client(address) as c:
                s = c.stream(name)
                s.step(add_ids=ids, add_boxes=apart)
                hold()
                for k in range(8):
                    s.send(update_ids=ids, update_boxes=together if k % 2 == 0 else apart)
                deadline = time.monotonic() + 30
                while direct.get_world(name).frames < 2 + round_ % 2:   # applied; answers on their way
                    assert time.monotonic() < deadline
                    time.sleep(0.005)
                time.sleep(0.1)
                cut()
                with pytest.raises(Exception):
                    for _ in range(8):
                        s.recv()
                s.close()
            listener.close()
            info = direct.get_world(name)
            assert 2 <= info.frames <= 9
            assert direct.step(name, update_ids=[0], update_boxes=[[0, 0, 1, 1]]).frame == info.frames + 1
        _wait_slots_free(srv)
        reply = health_pb2_grpc.HealthStub(direct.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_subscription_sees_every_frame_applied_once_subscribe_returns(make_server, late_subscribers):
    """``Client.subscribe`` returns once the server has registered the subscriber (Subscribe's response
    headers): a frame applied right after is in it, however late the server registers it (here 0.5 s)."""
    srv = make_server(default_world="")
    with Client(srv.address) as c:
        c.create_world("w", CFG)
        sub = c.subscribe("w", timeout=60)
        d = c.step("w", add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
        assert d.created.tolist() == [[1, 2]]
        assert next(sub).created.tolist() == [[1, 2]]
        sub.cancel()
        with pytest.raises(NotFound):
            next(c.subscribe("nowhere", timeout=60))


def test_an_async_subscription_sees_every_frame_applied_once_awaited(make_server, late_subscribers):
    """``await AsyncClient.subscribe(...)`` returns once the server has registered the subscriber, as the
    sync client's does; a refusal comes with the first delta; ``async for`` over it without the await works."""
    srv = make_server(default_world="")

    async def main():
        async with AsyncClient(srv.address) as c:
            await c.create_world("w", CFG)
            sub = await c.subscribe("w", timeout=60)
            d = await c.step("w", add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
            assert d.created.tolist() == [[1, 2]]
            assert (await sub.__anext__()).created.tolist() == [[1, 2]]
            sub.cancel()
            with pytest.raises(StopAsyncIteration):
                await sub.__anext__()
            missing = await c.subscribe("nowhere", timeout=60)
            with pytest.raises(NotFound):
                await missing.__anext__()
            idle = await c.subscribe("w", timeout=60)       # cancel() ends a loop waiting for a delta
            asyncio.get_running_loop().call_later(0.05, idle.cancel)
            assert [d async for d in idle] == []
            while (await c.get_world("w")).subscribers:     # the server has dropped the cancelled ones
                await asyncio.sleep(0.01)
            watched = []

            async def watch():
                async for delta in c.subscribe("w", timeout=60):
                    watched.append(delta.frame)
                    return

            task = asyncio.create_task(watch())
            while (await c.get_world("w")).subscribers < 1:
                await asyncio.sleep(0.01)
            await c.step("w", remove_ids=[2])
            await asyncio.wait_for(task, 60)
            assert watched == [2]
            while (await c.get_world("w")).subscribers:     # left the loop: the subscription is dropped
                await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(main(), 120))
