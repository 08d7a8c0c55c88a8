"""Fairness: per-client quotas of call slots, worlds and objects; idle and stalled streams freed;
health checks never refused, even during a flood of refused calls."""
from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sapgrid.client import Client
from sapgrid.client.errors import Cancelled, ResourceExhausted, SapgridError
from sapgrid.v1 import sapgrid_service_pb2 as pb

from security_helpers import auth_file
from service_helpers import metric_value, scrape

CFG = dict(dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))


def _in_use(srv) -> float:
    return metric_value(scrape(srv.metrics_url), "sapgrid_call_slots_in_use")


def _refusals(srv, client, reason) -> float:
    return metric_value(scrape(srv.metrics_url), "sapgrid_client_refusals_total", client=client, reason=reason) or 0


def _wait(predicate, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def two_clients(make_server, tmp_path):
    def make(**overrides):
        path = tmp_path / "auth.toml"
        tokens = auth_file(path, {"a": ("admin", "*"), "b": ("admin", "*")})
        srv = make_server(auth_file=str(path), default_world="", **overrides)
        return srv, Client(srv.address, token=tokens["a"]), Client(srv.address, token=tokens["b"])
    return make


def test_one_client_cannot_take_more_than_its_call_slots(two_clients):
    srv, a, b = two_clients(max_calls_per_client=2, worker_threads=6)
    with a, b:
        a.create_world("q", **CFG)
        s1, s2 = a.stream("q"), a.stream("q")
        s1.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
        s2.step(add_ids=[2], add_boxes=[[0, 0, 1, 1]])
        with pytest.raises(ResourceExhausted, match=r"client 'a'.*--max-calls-per-client 2"):
            a.step("q", 3, add_ids=[3], add_boxes=[[0, 0, 1, 1]])
        with a.stream("q") as s3, pytest.raises(ResourceExhausted, match="max-calls-per-client"):
            s3.step(add_ids=[4], add_boxes=[[0, 0, 1, 1]])
        assert srv.app.registry.get("q").objects == 2                      # the refused frames changed nothing
        with b.stream("q") as s:                                           # every other client as before
            s.step(add_ids=[5], add_boxes=[[0, 0, 1, 1]])
        assert b.query("q", [0, 0, 1, 1]).tolist() == [1, 2, 5]
        assert _refusals(srv, "a", "calls") == 2 and _refusals(srv, "b", "calls") == 0
        s1.close()
        _wait(lambda: srv.app.quotas.calls_held("a") < 2)
        with a.stream("q") as s:                                           # a slot of its own again
            s.step(add_ids=[6], add_boxes=[[0, 0, 1, 1]])
        s2.close()


def test_without_auth_a_client_is_its_peer_address(make_server):
    srv = make_server(max_calls_per_client=1, default_world="")
    with Client(srv.address) as c:
        c.create_world("p", **CFG)
        with c.stream("p") as s:
            s.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
            with Client(srv.address) as other, pytest.raises(ResourceExhausted, match="'peer:127.0.0.1'"):
                other.step("p", 2, add_ids=[2], add_boxes=[[0, 0, 1, 1]])     # another connection, same host


def test_worlds_per_client(two_clients):
    srv, a, b = two_clients(max_worlds_per_client=2)
    with a, b:
        a.create_world("a1", **CFG)
        a.create_world("a2", **CFG)
        with pytest.raises(ResourceExhausted, match=r"client 'a': holds 2 worlds.*--max-worlds-per-client 2"):
            a.create_world("a3", **CFG)
        assert "a3" not in srv.app.registry.worlds
        b.create_world("b1", **CFG)                                        # b is served as before
        a.delete_world("a1")
        a.create_world("a3", **CFG)
        with pytest.raises(SapgridError):                                  # a name taken is not a world held
            a.create_world("b1", **CFG)
        assert sorted(srv.app.registry.worlds) == ["a2", "a3", "b1"]
        assert _refusals(srv, "a", "worlds") == 1


def test_objects_per_client(two_clients):
    srv, a, b = two_clients(max_objects_per_client=10)
    with a, b:
        a.create_world("oa", **CFG)
        b.create_world("ob", **CFG)
        a.step("oa", 1, add_ids=np.arange(1, 9), add_boxes=np.tile([[0, 0, 1, 1]], (8, 1)))
        before = srv.app.registry.get("oa").world.pairs().tolist()
        with pytest.raises(ResourceExhausted, match=r"client 'a': its worlds hold 8 objects.*--max-objects-per-client 10"):
            a.step("oa", 2, add_ids=[20, 21, 22], add_boxes=[[0, 0, 1, 1]] * 3)
        r = srv.app.registry.get("oa")
        assert (r.objects, r.frames, r.world.pairs().tolist()) == (8, 1, before)
        a.step("oa", 3, add_ids=[20, 21], add_boxes=[[0, 0, 1, 1]] * 2)   # up to the quota
        b.step("ob", 1, add_ids=np.arange(1, 11), add_boxes=np.tile([[0, 0, 1, 1]], (10, 1)))   # b has its own
        assert _refusals(srv, "a", "objects") == 1


def test_idle_frame_streams_are_ended_and_free_their_slots(make_server):
    srv = make_server(worker_threads=2, stream_idle_seconds=0.5, default_world="")
    with Client(srv.address) as c:
        c.create_world("idle", **CFG)
        idle = [c.stream("idle") for _ in range(2)]                        # open, never a frame
        _wait(lambda: _in_use(srv) == 2)
        _wait(lambda: _in_use(srv) == 0)                                   # the watchdog ended both
        with c.stream("idle") as s:                                        # everyone is served again
            assert s.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]]).stats.objects == 1
        for s in idle:
            with pytest.raises((Cancelled, SapgridError)):
                s.step(add_ids=[9], add_boxes=[[0, 0, 1, 1]])
            s.close()
        assert srv.app.registry.get("idle").objects == 1
        assert _refusals(srv, "peer:127.0.0.1", "idle") == 2


def test_a_stalled_subscriber_is_ended_and_frees_its_slot(make_server, rng):
    srv = make_server(worker_threads=3, subscriber_stall_seconds=0.5, default_world="",
                      subscriber_queue=100_000, subscriber_queue_bytes=1 << 30)
    with Client(srv.address) as c, grpc.insecure_channel(srv.address) as ch:
        c.create_world("stall", dims=2, bounds=(0, 0, 10, 10), cells=(1, 1))
        call = ch.unary_stream("/sapgrid.v1.SapgridService/Subscribe")(
            pb.SubscribeRequest(world="stall").SerializeToString())         # never read
        _wait(lambda: srv.app.registry.get("stall").subscribers == 1)
        n = 600                                                            # every frame: ~180k pairs toggle
        ids = np.arange(1, n + 1, dtype=np.uint64)
        together = np.tile(np.array([[0, 0, 1, 1]], np.float32), (n, 1))
        apart = np.concatenate([np.arange(n)[:, None] * 0.003 + np.zeros((n, 2)),
                                np.arange(n)[:, None] * 0.003 + 0.001 + np.zeros((n, 2))], axis=1).astype(np.float32)
        with c.stream("stall") as s:
            s.step(add_ids=ids, add_boxes=apart)
            for i in range(40):                                            # bounded: ~3 MB of deltas a frame
                s.step(update_ids=ids, update_boxes=together if i % 2 == 0 else apart)
                if _refusals(srv, "peer:127.0.0.1", "stalled"):
                    break
        _wait(lambda: _refusals(srv, "peer:127.0.0.1", "stalled") == 1)
        _wait(lambda: _in_use(srv) == 0)
        _wait(lambda: srv.app.registry.get("stall").subscribers == 0)
        with pytest.raises(grpc.RpcError):
            for _ in call:
                pass
        call.cancel()


def test_health_is_never_refused_during_a_flood_of_refused_calls(make_server):
    srv = make_server(worker_threads=2, default_world="")
    with Client(srv.address) as c, grpc.insecure_channel(srv.address) as hch:
        c.create_world("h", **CFG)
        s1, s2 = c.stream("h"), c.stream("h")
        s1.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
        s2.step(add_ids=[2], add_boxes=[[0, 0, 1, 1]])
        stop = threading.Event()
        refused = [0]

        request = pb.QueryRegionRequest(world="h", region=[0, 0, 1, 1]).SerializeToString()

        def flood():                                                       # 300 long calls at once, 4 rounds
            with grpc.insecure_channel(srv.address) as fch:
                query = fch.unary_unary("/sapgrid.v1.SapgridService/QueryRegion")
                for _ in range(4):
                    if stop.is_set():
                        return
                    for f in [query.future(request, timeout=60) for _ in range(300)]:
                        try:
                            f.result()
                        except grpc.RpcError as err:
                            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                                refused[0] += 1

        threads = [threading.Thread(target=flood) for _ in range(6)]
        for t in threads:
            t.start()
        health = health_pb2_grpc.HealthStub(hch)
        statuses = []
        try:
            for _ in range(300):
                statuses.append(health.Check(health_pb2.HealthCheckRequest(), timeout=30).status)
        finally:
            stop.set()
            for t in threads:
                t.join(120)
        assert statuses == [health_pb2.HealthCheckResponse.SERVING] * 300
        assert refused[0] > 0
        s1.close()
        s2.close()


def test_health_is_answered_while_every_call_thread_is_busy_and_calls_queue(make_server):
    """Every thread of the call pool held (world creations blocked in the engine) and 100 more calls
    waiting: the health check has threads of its own and is answered, never refused."""
    from sapcore import World

    gate = threading.Event()

    def slow_world(config):
        gate.wait(120)                                                     # bounded
        return World(config)

    srv = make_server(worker_threads=2, default_world="", world_factory=slow_world)
    futures = []
    with grpc.insecure_channel(srv.address) as ch, grpc.insecure_channel(srv.address) as hch:
        create = ch.unary_unary("/sapgrid.v1.SapgridService/CreateWorld")
        try:
            for i in range(120):                                           # 18 threads busy, the rest queued
                request = pb.CreateWorldRequest(name=f"busy-{i}")
                request.config.dims = 2
                request.config.bounds.extend([0, 0, 10, 10])
                futures.append(create.future(request.SerializeToString(), timeout=120))
            _wait(lambda: len(srv.app.registry._pending) >= 16)
            health = health_pb2_grpc.HealthStub(hch)
            for _ in range(20):
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=30)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            gate.set()
            for f in futures:
                f.result()
    assert len(srv.app.registry.worlds) == 120
