"""Without a network: the one error mapping, config, codec and the servicer called directly."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from sapcore import WorldConfig
from sapcore.errors import CapacityError, ConfigError, FrameError
from sapgrid.server import errors, protocol
from sapgrid.server.metrics import Metrics
from sapgrid.server.registry import Registry
from sapgrid.server.servicer import SapgridServicer
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb, world_pb2


@pytest.mark.parametrize("exc, code, field, index", [
    (FrameError("add_boxes", 3, "min > max on axis 1"), grpc.StatusCode.INVALID_ARGUMENT, "add_boxes", 3),
    (CapacityError("add_ids", "too many"), grpc.StatusCode.RESOURCE_EXHAUSTED, "add_ids", -1),
    (ConfigError("dims must be 2 or 3"), grpc.StatusCode.INVALID_ARGUMENT, "config", -1),
    (errors.WorldNotFound("w"), grpc.StatusCode.NOT_FOUND, "world", -1),
    (errors.WorldExists("x", "name"), grpc.StatusCode.ALREADY_EXISTS, "name", -1),
    (errors.DimsMismatch("3D", "add_boxes"), grpc.StatusCode.FAILED_PRECONDITION, "add_boxes", -1),
    (errors.Exhausted("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED, "", -1),
    (errors.Cancelled("gone"), grpc.StatusCode.CANCELLED, "", -1),
    (TimeoutError(), grpc.StatusCode.DEADLINE_EXCEEDED, "", -1),
    (RuntimeError("secret detail"), grpc.StatusCode.INTERNAL, "", -1),
])
def test_error_mapping(exc, code, field, index):
    got_code, message, got_field, got_index = errors.to_status(exc)
    assert (got_code, got_field, got_index) == (code, field, index)
    if code == grpc.StatusCode.INTERNAL:
        assert "secret" not in message                  # no internals leak to clients
    fe = errors.frame_error(exc)
    assert fe.code == code.value[0] and fe.field == field and fe.index == index


def test_decode_frame_is_zero_copy_and_checks_lengths():
    ids = np.arange(5, dtype="<u8")
    boxes = np.zeros((5, 4), "<f4")
    f = frame_pb2.Frame(add_ids=ids.tobytes(), add_boxes=boxes.tobytes())
    out = protocol.frame_arrays(f, 2)
    assert out["add_ids"].tolist() == ids.tolist() and out["add_boxes"].shape == (5, 4)
    assert not out["add_ids"].flags.writeable                 # a view of the message bytes
    with pytest.raises(errors.DimsMismatch):
        protocol.frame_arrays(frame_pb2.Frame(add_ids=ids.tobytes(), add_boxes=np.zeros((5, 6), "<f4").tobytes()), 2)
    with pytest.raises(errors.InvalidInput) as ei:
        protocol.frame_arrays(frame_pb2.Frame(update_ids=ids.tobytes(), update_boxes=b"\0" * 7), 2)
    assert ei.value.field == "update_boxes"
    # a frame of updates only (read without the helpers' calls when well formed) is checked the same way
    for bad, error, field in ((dict(update_ids=b"\0" * 7), errors.InvalidInput, "update_ids"),
                              (dict(update_ids=ids.tobytes()), errors.InvalidInput, "update_boxes"),
                              (dict(update_ids=ids.tobytes(), update_boxes=np.zeros((5, 6), "<f4").tobytes()),
                               errors.DimsMismatch, "update_boxes"),
                              (dict(update_boxes=boxes.tobytes()), errors.InvalidInput, "update_boxes")):
        with pytest.raises(error) as ei:
            protocol.frame_arrays(frame_pb2.Frame(**bad), 2)
        assert ei.value.field == field, bad
    moved = np.arange(30, dtype="<f4").reshape(5, 6)
    out = protocol.frame_arrays(frame_pb2.Frame(update_ids=ids.tobytes(), update_boxes=moved.tobytes()), 3)
    assert out["update_ids"].tolist() == ids.tolist() and np.array_equal(out["update_boxes"], moved)
    assert out["update_boxes"].dtype == np.float32 and out["update_boxes"].flags.c_contiguous
    assert not out["update_ids"].flags.writeable and not out["update_boxes"].flags.writeable



def test_a_frame_of_updates_only_gives_just_its_two_arrays_and_the_same_delta():
    """Updates only: ``frame_arrays`` gives the two arrays (an empty frame none), and a world stepped with
    them gives the delta and stats of one stepped with every keyword (the others None)."""
    ids = np.arange(4, dtype="<u8")
    boxes = np.array([[0, 0, 2, 2], [1, 1, 3, 3], [5, 5, 6, 6], [9, 9, 9.5, 9.5]], "<f4")
    f = frame_pb2.Frame(update_ids=ids.tobytes(), update_boxes=(boxes + 1).tobytes())
    out = protocol.frame_arrays(f, 2)
    assert sorted(out) == ["update_boxes", "update_ids"]
    assert protocol.frame_arrays(frame_pb2.Frame(), 2) == {}
    from sapcore import World
    cfg = WorldConfig(dims=2, bounds=(0.0, 0.0, 16.0, 16.0), cells=(2, 2))
    worlds = [World(cfg), World(cfg)]
    for w in worlds:
        w.step(add_ids=ids, add_boxes=boxes)
    full = dict.fromkeys(("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static"))
    got, want = worlds[0].step(**out), worlds[1].step(**full, **out)
    assert np.array_equal(got.created, want.created) and np.array_equal(got.deleted, want.deleted)
    assert (got.stats.objects, got.stats.pairs) == (want.stats.objects, want.stats.pairs) == (4, 1)
    got_stats = protocol.fill_stats(world_pb2.FrameStats(), got.stats, 0.5, 0.25)
    assert (got_stats.objects, got_stats.pairs, got_stats.queue_seconds) == (4, 1, 0.5)
    from sapcore.types import FrameStats
    counts = dict(objects=4, pairs=1, created=2, deleted=1, swaps=7, cells_touched=3, cell_overflows=0)
    as_numpy = FrameStats(**{k: np.int64(v) if k != "swaps" else np.uint64(v) for k, v in counts.items()})
    assert (protocol.fill_stats(world_pb2.FrameStats(), as_numpy).SerializeToString()
            == protocol.fill_stats(world_pb2.FrameStats(), FrameStats(**counts)).SerializeToString())


@pytest.mark.parametrize("pairs", [3, protocol.FRAMED_PAIRS])
def test_every_stats_field_reaches_the_delta_and_the_world_info(pairs):
    """Each figure of a frame's stats (every field distinct) is in its Delta's bytes, small (one message) or
    framed around its pairs, and in WorldInfo's last frame, with the service's queue and server seconds."""
    from types import SimpleNamespace

    from sapcore import Delta
    from sapcore.types import FrameStats
    from sapgrid.server.registry import Applied

    names = ("objects", "pairs", "created", "deleted", "swaps", "cells_touched", "cell_overflows")
    seconds = ("validate_s", "rasterize_s", "apply_s", "merge_s", "total_s")
    stats = FrameStats(**{n: 11 + i for i, n in enumerate(names)}, **{n: (i + 1) / 64 for i, n in enumerate(seconds)})
    rows = np.arange(2 * pairs, dtype=np.uint64).reshape(-1, 2)
    applied = Applied("w", 9, 12, Delta(rows, rows[:1], stats), queue_s=0.75, server_s=0.875, digest=77)
    want = dict({n: getattr(stats, n) for n in names}, validate_seconds=1 / 64, rasterize_seconds=2 / 64,
                apply_seconds=3 / 64, merge_seconds=4 / 64, engine_seconds=5 / 64, queue_seconds=0.75,
                server_seconds=0.875)
    delta = frame_pb2.Delta.FromString(protocol.delta_bytes(applied))
    assert (delta.seq, delta.world, delta.frame, delta.pairs_digest) == (9, "w", 12, 77)
    assert len(delta.created) == rows.nbytes and len(delta.deleted) == 16
    runner = SimpleNamespace(name="w", config=WorldConfig(dims=2, bounds=(0, 0, 1, 1), cells=(1, 1)),
                             expected_objects=0, objects=1, pairs=0, frames=12, rejected=0, queue_depth=0,
                             subscribers=0, digest=77, writers=SimpleNamespace(seqs=dict), frozen=False, last=applied,
                             generation=1)
    last = protocol.world_info(runner).stats.last_frame
    for message in (delta.stats, last):
        assert {f: getattr(message, f) for f in want} == want


class FakeContext:
    """Just enough of grpc.ServicerContext for unary handlers."""

    def __init__(self):
        self.status = None
        self.callbacks = []

    def abort_with_status(self, status):
        self.status = status
        raise grpc.RpcError(status.details)

    def abort(self, code, details=""):
        self.status = (code, details)
        raise grpc.RpcError(details)

    def add_callback(self, fn):
        self.callbacks.append(fn)
        return True

    def is_active(self):
        return True


def test_servicer_without_network():
    metrics = Metrics(process=False)
    servicer = SapgridServicer(Registry(metrics), metrics)
    ctx = FakeContext()
    cfg = world_pb2.WorldConfig(dims=2, bounds=[0, 0, 10, 10], cells=[2, 2])
    resp = servicer.CreateWorld(pb.CreateWorldRequest(name="u", config=cfg), ctx)
    assert resp.world.name == "u" and list(resp.world.config.cells) == [2, 2]
    req = pb.ApplyFrameRequest(frame=frame_pb2.Frame(
        world="u", seq=4, add_ids=np.array([1, 2], "<u8").tobytes(),
        add_boxes=np.array([[0, 0, 1, 1], [1, 1, 2, 2]], "<f4").tobytes()))
    raw = servicer.ApplyFrame(req.SerializeToString(), ctx)
    delta = pb.ApplyFrameResponse.FromString(raw).delta
    assert delta.seq == 4 and np.frombuffer(delta.created, "<u8").tolist() == [1, 2]
    with pytest.raises(grpc.RpcError):
        servicer.GetWorld(pb.GetWorldRequest(name="nope"), ctx)
    assert ctx.status.code == grpc.StatusCode.NOT_FOUND
    listed = servicer.ListWorlds(pb.ListWorldsRequest(), ctx)
    assert [w.name for w in listed.worlds] == ["u"] and listed.worlds[0].stats.pairs == 1
    servicer.registry.close(5)
    with pytest.raises(grpc.RpcError):                 # closed: frames are refused, UNAVAILABLE
        servicer.ApplyFrame(req.SerializeToString(), ctx)
    assert ctx.status.code == grpc.StatusCode.UNAVAILABLE


def test_slow_subscriber_is_dropped_not_blocking():
    from sapgrid.server.registry import Subscriber

    from types import SimpleNamespace

    none = np.zeros((0, 2), np.uint64)
    frames = [SimpleNamespace(frame=i, delta=SimpleNamespace(created=none, deleted=none)) for i in range(10)]
    sub = Subscriber(limit=3)
    for f in frames:                         # the world never waits for a subscriber
        sub.offer(f)
    got = []
    while (item := sub.next(timeout=5)) is not None:
        got.append(item.frame)
    assert sub.dropped and got == [0, 1, 2]


def test_a_world_runs_one_job_at_a_time_in_arrival_order():
    """The line of a world: jobs wait in order, a gone caller's job is skipped, a full line refuses."""
    import threading
    import time

    from sapgrid.server.registry import Caller

    metrics = Metrics(process=False)
    registry = Registry(metrics, queue_size=3)
    runner = registry.create("l", WorldConfig(dims=2, bounds=(0, 0, 10, 10), cells=(2, 2)))
    started, release = threading.Event(), threading.Event()
    order, errors_seen = [], []

    def job(i, caller=None):
        def work():
            if i == 0:
                started.set()
                release.wait(30)
            order.append(i)
            return i
        try:
            return runner.run(work, caller or Caller())
        except Exception as exc:
            errors_seen.append((i, type(exc).__name__))

    first = threading.Thread(target=job, args=(0,))
    first.start()
    assert started.wait(30)
    gone = Caller()
    threads = []
    for i, caller in ((1, None), (2, gone), (3, None)):
        t = threading.Thread(target=job, args=(i, caller))
        t.start()
        threads.append(t)
        while len(runner.pending) < i:
            time.sleep(0.001)
    job(4)                                               # line full (3 waiting): refused at once
    assert errors_seen == [(4, "Exhausted")]
    gone.cancel()                                        # job 2's caller goes away: it leaves the line
    assert len(runner.pending) == 2
    release.set()
    for t in (first, *threads):
        t.join(30)
    assert order == [0, 1, 3]
    assert sorted(errors_seen) == [(2, "Cancelled"), (4, "Exhausted")]
    assert not runner.pending and job(5) == 5              # the world is free again
    gone_before = Caller()
    gone_before.cancel()                                 # gone before its job asks for the free world
    with pytest.raises(errors.Cancelled):
        runner.run(lambda: order.append(6), gone_before)
    assert order == [0, 1, 3, 5] and job(7) == 7          # never run; the world is free again


def _holding(runner, timeout: float = 30):
    """A job that holds ``runner`` until the returned event is set, started: (its thread, the event)."""
    import threading

    from sapgrid.server.registry import Caller

    started, release = threading.Event(), threading.Event()

    def work():
        started.set()
        release.wait(timeout)

    job = threading.Thread(target=runner.run, args=(work, Caller()))
    job.start()
    assert started.wait(timeout)
    return job, release


@pytest.mark.parametrize("how", ["wait_idle", "drain"])
def test_who_waits_for_a_world_to_go_idle_is_woken_when_its_job_ends(how):
    """Deleting a world waits for its running job (``wait_idle``), a shutdown for its running and waiting
    ones (``drain``): the job's end wakes them at once (``_next`` notifies its waiters only when there are)."""
    import threading

    runner = Registry(Metrics(process=False)).create("i", WorldConfig(dims=2, bounds=(0, 0, 10, 10), cells=(2, 2)))
    job, release = _holding(runner)
    woken = []
    waiter = threading.Thread(target=lambda: woken.append((getattr(runner, how)(timeout=20), time.monotonic())))
    waiter.start()
    while not runner._idle_waiters:               # the waiter is in its wait
        time.sleep(0.001)
    assert not woken
    released = time.monotonic()
    release.set()
    waiter.join(30)
    job.join(30)
    assert woken and woken[0][0] is True and woken[0][1] - released < 10     # woken by the job's end, not a timeout
    assert runner._idle_waiters == 0
    assert runner.wait_idle(timeout=0) is True             # idle: no wait at all


def test_a_subscriber_is_bounded_in_bytes_too():
    """Few deltas but big ones: the subscriber is dropped once their bytes pass its byte limit."""
    from types import SimpleNamespace

    from sapgrid.server.registry import Subscriber

    big = SimpleNamespace(delta=SimpleNamespace(created=np.zeros((1000, 2), np.uint64),
                                                deleted=np.zeros((0, 2), np.uint64)))     # 16 kB + overhead
    sub = Subscriber(limit=1024, byte_limit=50_000)
    for _ in range(10):
        sub.offer(big)
    got = []
    while (item := sub.next(timeout=5)) is not None:
        got.append(item)
    assert sub.dropped and len(got) == 3                         # 3 x 16.3 kB fit in 50 kB, the 4th does not
    ok = Subscriber(limit=1024, byte_limit=50_000)
    for _ in range(10):                                          # read as they come: never dropped
        ok.offer(big)
        assert ok.next(timeout=5) is big
    assert not ok.dropped


def test_the_default_memory_budget_follows_a_container_limit(tmp_path, monkeypatch):
    from sapgrid.server import app

    limit = tmp_path / "memory.max"
    limit.write_text("2147483648\n")                                # a pod's 2 GiB limit
    monkeypatch.setattr(app, "_CGROUP_LIMITS", (str(limit),))
    assert app._three_quarters_of_memory() == 2147483648 * 3 // 4
    limit.write_text("max\n")                                       # no limit: the machine's memory
    assert app._three_quarters_of_memory() > 0


def test_a_dropped_subscriber_is_counted():
    from sapcore import WorldConfig as WC

    metrics = Metrics(process=False)
    registry = Registry(metrics, subscriber_limit=2)
    runner = registry.create("drops", WC(dims=2, bounds=(0, 0, 10, 10), cells=(2, 2)))
    sub = runner.subscribe()
    from sapgrid.server.registry import Caller

    for i in range(4):                                         # nobody reads: the third frame drops it
        runner.apply(dict(add_ids=np.array([i], np.uint64), add_boxes=np.array([[0, 0, 1, 1]], np.float32)),
                     i + 1, 0.0, Caller())
    assert sub.dropped
    runner.unsubscribe(sub)
    assert metrics.registry.get_sample_value("sapgrid_subscribers_dropped_total", {"world": "drops"}) == 1


def test_the_queue_depth_gauge_follows_the_line_and_is_set_only_when_it_changes():
    import threading
    import time

    from sapgrid.server.registry import Caller

    metrics = Metrics(process=False)
    shown = []
    real = metrics.set_queue_depth
    metrics.set_queue_depth = lambda world, depth: shown.append(depth) or real(world, depth)
    registry = Registry(metrics)
    runner = registry.create("q", WorldConfig(dims=2, bounds=(0, 0, 10, 10), cells=(2, 2)))
    for _ in range(5):                          # jobs that never wait: the gauge is set once, at 0
        assert runner.run(lambda: 7, Caller()) == 7
    assert shown == [0]
    first, release = _holding(runner)
    second = threading.Thread(target=runner.run, args=(lambda: None, Caller()))
    second.start()
    for _ in range(1000):                       # the second job waits in line behind the first
        if runner.queue_depth == 1:
            break
        time.sleep(0.01)
    assert runner.queue_depth == 1 and shown == [0, 1]
    release.set()
    first.join(10)
    second.join(10)
    assert shown == [0, 1, 0] and runner.queue_depth == 0
    from prometheus_client import generate_latest

    assert 'sapgrid_world_queue_depth{world="q"} 0.0' in generate_latest(metrics.registry).decode()
    registry.close(5)


def test_the_garbage_collectors_passes_are_timed_once_for_every_registry():
    """``sapgrid_gc_pause_seconds``: each pass of the collector, by generation, in every registry of the
    process (one callback, however many servers); a full pass is one more count in generation 2 with its
    seconds, in the bucket of its length."""
    import gc

    from prometheus_client import generate_latest

    from sapgrid.server.metrics import GcPauses
    from service_helpers import metric_value

    first, second = Metrics(), Metrics()
    assert gc.callbacks.count(GcPauses._pass) == 1
    edges = (0.00001, 0.0001, 0.001, 0.01, 0.1, 1.0)

    def counts(text):
        return [metric_value(text, "sapgrid_gc_pause_seconds_bucket", generation=2, le=str(b)) for b in edges]

    text = generate_latest(first.registry).decode()
    count, total, buckets = (metric_value(text, "sapgrid_gc_pause_seconds_count", generation=2),
                             metric_value(text, "sapgrid_gc_pause_seconds_sum", generation=2), counts(text))
    t0 = time.perf_counter()
    gc.collect()
    longest = time.perf_counter() - t0
    for m in (first, second):
        text = generate_latest(m.registry).decode()
        assert metric_value(text, "sapgrid_gc_pause_seconds_count", generation=2) == count + 1
        assert total < metric_value(text, "sapgrid_gc_pause_seconds_sum", generation=2) <= total + longest
        assert metric_value(text, "sapgrid_gc_frozen_objects") == gc.get_freeze_count()
        # one more in every bucket from the one that holds the pass's length on
        assert [after - b for after, b, edge in zip(counts(text), buckets, edges) if edge >= longest] == \
            [1] * sum(edge >= longest for edge in edges)
