"""The frame path's cheaper steps give what the general ones give: parsing (protobuf's parser for small
requests, the zero-copy reader for large ones), the updates-only arrays, the per-frame metrics (counted
by a collector, exported as prometheus_client's own types would), and heavy frames on their
lower-priority thread."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from service_helpers import metric_value

from sapgrid.client.codec import encode_frame
from sapgrid.server import protocol
from sapgrid.server.config import ServerConfig
from sapgrid.server.errors import InvalidInput
from sapgrid.server.heavy import HeavyFrames
from sapgrid.server.metrics import LATENCY_BUCKETS, PHASES, FrameSeries, Metrics
from sapgrid.server.registry import Caller, Registry
from sapgrid.v1 import sapgrid_service_pb2 as pb

FIELDS = ("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static", "update_ids",
          "update_boxes")


def _request(n: int, seed: int, updates_only: bool) -> bytes:
    rng = np.random.default_rng(seed)
    req = pb.StreamFramesRequest()
    kw = dict(update_ids=np.arange(n), update_boxes=rng.random((n, 4)))
    if not updates_only:
        kw.update(add_ids=np.arange(n, 2 * n), add_boxes=rng.random((n, 4)), add_static=rng.random(n) < 0.5,
                  remove_ids=[7, 9])
    encode_frame("w", seed + 1, **kw, into=req.frame)
    return req.SerializeToString()


@pytest.mark.parametrize("n", [0, 3, 100, 2000, 5000])      # 5000 boxes: beyond PARSE_BYTES, read zero-copy
@pytest.mark.parametrize("updates_only", [True, False])
def test_parse_frame_and_arrays_agree_with_protobuf(n, updates_only):
    raw = _request(n, n, updates_only)
    want = pb.StreamFramesRequest.FromString(raw).frame
    got = protocol.parse_frame(raw)
    assert isinstance(got, protocol.FrameView) == (len(raw) > protocol.PARSE_BYTES)
    assert got.world == want.world and got.seq == want.seq and got.writer == want.writer
    for f in FIELDS:
        assert bytes(getattr(got, f)) == getattr(want, f), f
    fast, general = protocol.frame_arrays(got, 2), protocol.frame_arrays(protocol.read_frame(raw), 2)
    assert fast.keys() == general.keys()
    for key in fast:
        assert (fast[key] is None) == (general[key] is None), key
        if fast[key] is not None:
            np.testing.assert_array_equal(fast[key], general[key])
            assert fast[key].dtype == general[key].dtype


def test_parse_frame_refuses_what_protobuf_refuses():
    with pytest.raises(InvalidInput, match="not a valid protobuf message"):
        protocol.parse_frame(b"\x0a\x05ab")
    frame = pb.StreamFramesRequest.FromString(_request(4, 1, True)).frame
    frame.update_boxes = frame.update_boxes[:-1]                    # a box short of its bytes
    with pytest.raises(InvalidInput, match="update_boxes"):
        protocol.frame_arrays(protocol.parse_frame(pb.StreamFramesRequest(frame=frame).SerializeToString()), 2)


class _Stats:
    def __init__(self, rng):
        self.objects, self.pairs = int(rng.integers(0, 1000)), int(rng.integers(0, 1000))
        self.created, self.deleted, self.swaps = (int(x) for x in rng.integers(0, 50, 3))
        self.cell_overflows = int(rng.integers(0, 2))
        # some values exactly on a bucket's edge (an edge's bucket holds it: le means <=)
        pick = lambda: float(rng.choice(LATENCY_BUCKETS)) if rng.random() < 0.3 else float(rng.exponential(0.003))
        self.validate_s, self.rasterize_s, self.apply_s, self.merge_s, self.total_s = (pick() for _ in range(5))
        self.queue_s, self.server_s = pick(), pick()


def test_frame_series_export_what_prometheus_client_types_export():
    """The collector's exposition equals that of prometheus_client's Counter/Gauge/Histogram fed the same frames,
    scraped at any point: frames pending (fewer than a fold's), just folded, or a world deleted with some."""
    metrics = Metrics(process=False)
    ref = CollectorRegistry()
    frames = Counter("sapgrid_frames_total", "Frames by outcome (ok or the gRPC status code name)",
                     ["world", "outcome"], registry=ref)
    gauges = {k: Gauge(f"sapgrid_world_{k}", h, ["world"], registry=ref)
              for k, h in (("objects", "Live objects per world"), ("pairs", "Active overlapping pairs per world"))}
    counters = {k: Counter(name, h, ["world"], registry=ref) for k, name, h in (
        ("created", "sapgrid_pairs_created_total", "Pairs created (reported in deltas)"),
        ("deleted", "sapgrid_pairs_deleted_total", "Pairs deleted (reported in deltas)"),
        ("swaps", "sapgrid_endpoint_swaps_total", "Endpoint swaps of the incremental sorts"),
        ("cell_overflows", "sapgrid_cell_overflows_total", "Cells whose pair-event buffer overflowed and were "
                                                           "recomputed"))}
    latency = Histogram("sapgrid_frame_duration_seconds", "Frame latency by phase: queue wait, engine validate/"
                        "rasterize/apply/merge, engine total, total server time", ["world", "phase"],
                        buckets=LATENCY_BUCKETS, registry=ref)
    rng = np.random.default_rng(5)
    for w in ("a", "b", "gone"):
        metrics.world_created(w, 1)
        for m in (*gauges.values(), *counters.values()):
            m.labels(w)

    def lines(registry, names):
        text = generate_latest(registry).decode()
        return sorted(line for line in text.splitlines() if line.split("{")[0].split(" ")[0] in names
                      or any(line.startswith(f"# {k} {n} ") for k in ("HELP", "TYPE") for n in names))

    names = {"sapgrid_frames_total", "sapgrid_world_objects", "sapgrid_world_pairs", "sapgrid_pairs_created_total",
             "sapgrid_pairs_deleted_total", "sapgrid_endpoint_swaps_total", "sapgrid_cell_overflows_total",
             "sapgrid_frame_duration_seconds", "sapgrid_frame_duration_seconds_bucket",
             "sapgrid_frame_duration_seconds_count", "sapgrid_frame_duration_seconds_sum"}

    def same() -> str:
        got, want = lines(metrics.registry, names), lines(ref, names)
        for g, w in zip(got, want):
            if g != w and g.startswith("sapgrid_frame_duration_seconds_sum"):     # float sums: same to 1e-9
                gk, gv = g.rsplit(" ", 1)
                wk, wv = w.rsplit(" ", 1)
                assert gk == wk and float(gv) == pytest.approx(float(wv), rel=1e-9)
            else:
                assert g == w
        assert len(got) == len(want)
        return "".join(got)

    fold = FrameSeries.FOLD
    fed = {"a": 0, "b": 0, "gone": 0}
    for chunk in (1, fold - 2, 1, 1, 3 * fold + 7, 150, 90):      # scraped between: a fold's edges and either side
        for _ in range(chunk):
            w = str(rng.choice(["a", "b", "gone"]))
            fed[w] += 1
            s = _Stats(rng)
            metrics.frame_applied(w, s, s.queue_s, s.server_s)
            frames.labels(w, "ok").inc()
            for k, g in gauges.items():
                g.labels(w).set(getattr(s, k))
            for k, c in counters.items():
                c.labels(w).inc(getattr(s, k))
            for phase, value in zip(PHASES, (s.queue_s, s.validate_s, s.rasterize_s, s.apply_s, s.merge_s,
                                             s.total_s, s.server_s)):
                latency.labels(w, phase).observe(value)
        same()
    assert min(fed.values()) > 2 * fold
    for w, outcome in (("a", "invalid_argument"), (None, "not_found"), ("gone", "invalid_argument")):
        metrics.frame_rejected(w, outcome)
        frames.labels(w or "_unknown", outcome).inc()
    for _ in range(5):                                  # the deleted world's last frames still pending
        s = _Stats(rng)
        metrics.frame_applied("gone", s, s.queue_s, s.server_s)
    metrics.world_deleted("gone", 2)
    for m in (frames, latency, *gauges.values(), *counters.values()):
        m.remove_by_labels({"world": "gone"})
    assert 'world="gone"' not in same()


def test_occupancy_series_are_computed_from_the_latest_sample_when_scraped():
    """sapgrid_occupied_cells and sapgrid_cell_objects_max / _mean / _p99: the occupied cells of each world's
    latest sample, by numpy, as gauges; a world whose cells are all empty reads 0; a deleted world has none."""
    metrics = Metrics(process=False)
    names = ("sapgrid_occupied_cells", "sapgrid_cell_objects_max", "sapgrid_cell_objects_mean",
             "sapgrid_cell_objects_p99")

    def read(world):
        text = generate_latest(metrics.registry).decode()
        assert all(f"# TYPE {n} gauge" in text for n in names)
        return [metric_value(text, n, world=world) for n in names]

    rng = np.random.default_rng(3)
    for k in range(5):
        per_cell = rng.integers(0, 40, 64) * (rng.random(64) < 0.5)
        metrics.set_occupancy("w", per_cell)
        metrics.set_occupancy("empty", np.zeros(16, np.int64))
        occupied = per_cell[per_cell > 0]
        assert read("w") == pytest.approx([len(occupied), occupied.max(), occupied.mean(),
                                           np.percentile(occupied, 99)], rel=1e-12)
        assert read("empty") == [0.0, 0.0, 0.0, 0.0]
    metrics.world_deleted("w", 1)
    assert read("w") == [None] * 4 and read("empty") == [0.0] * 4


def test_heavy_frames_run_on_a_lower_priority_thread():
    """A world at or above the size runs its frames on the heavy-frame thread, its nice value raised (Linux);
    a smaller world's frames run on the calling thread; refusals come back to the caller all the same."""
    from sapcore import World, WorldConfig

    seen = {}

    def factory(cfg):
        world = World(cfg)
        step = world.step

        def recording_step(**kw):
            tid = threading.get_native_id()
            seen.setdefault(cfg.bounds[2], []).append((tid, os.getpriority(os.PRIO_PROCESS, tid),
                                                       os.sched_getscheduler(0)))
            return step(**kw)
        world.step = recording_step
        return world

    heavy = HeavyFrames(min_objects=50, nice=5)
    registry = Registry(Metrics(process=False), world_factory=factory, heavy=heavy)
    try:
        small = registry.create("small", WorldConfig(dims=2, bounds=(0, 0, 10, 10), cells=(2, 2)))
        big = registry.create("big", WorldConfig(dims=2, bounds=(0, 0, 20, 20), cells=(2, 2)))
        rng = np.random.default_rng(1)

        def boxes(n):
            c = rng.uniform(0, 10, (n, 2)).astype(np.float32)
            return np.concatenate([c, c + 1], axis=1)

        caller = Caller()
        small.apply(dict(add_ids=np.arange(1, 11, dtype=np.uint64), add_boxes=boxes(10)), 1, 0.0, caller)
        big.apply(dict(add_ids=np.arange(1, 61, dtype=np.uint64), add_boxes=boxes(60)), 1, 0.0, caller)   # 0 + 60 adds
        big.apply(dict(update_ids=np.arange(1, 61, dtype=np.uint64), update_boxes=boxes(60)), 2, 0.0, caller)
        with pytest.raises(Exception, match="unknown|not live|99"):
            big.apply(dict(remove_ids=np.array([99], np.uint64)), 3, 0.0, caller)
        assert big.frames == 2 and big.objects == 60 and small.frames == 1
        me = threading.get_native_id()
        base = os.getpriority(os.PRIO_PROCESS, me)
        assert seen[10.0] == [(me, base, os.sched_getscheduler(0))]
        assert len(seen[20.0]) == 3
        for tid, nice, policy in seen[20.0]:
            assert tid != me and tid in heavy.native_ids
            if os.uname().sysname == "Linux":
                assert nice == min(19, base + 5) == heavy.thread_nice
                assert policy == os.SCHED_IDLE == heavy.thread_policy          # the default policy, "idle"
        assert os.getpriority(os.PRIO_PROCESS, me) == base                # the caller's priority is unchanged
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        heavy.shutdown()


def _on_linux():
    if os.uname().sysname != "Linux":
        pytest.skip("thread priorities and the nudges are Linux only")


def test_heavy_frames_policy_nice_lowers_the_nice_value_alone():
    _on_linux()
    heavy = HeavyFrames(min_objects=1, nice=3, threads=1, policy="nice")
    try:
        tid, nice, policy = heavy.run(lambda: (threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0),
                                               os.sched_getscheduler(0)))
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert policy == os.SCHED_OTHER == heavy.thread_policy and nice == min(19, base + 3) == heavy.thread_nice
        assert heavy.lowered or base + 3 > 19
    finally:
        heavy.shutdown()


def _wakes(tid: int) -> int:
    """How often a thread of this process has gone to sleep so far (its voluntary context switches)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def _wakes_in(ids, seconds: float) -> dict:
    before = {core: _wakes(tid) for core, tid in ids.items()}
    time.sleep(seconds)
    return {core: _wakes(tid) - before[core] for core, tid in ids.items()}


def test_nudge_threads_wake_on_each_core_only_while_a_heavy_frame_runs():
    """While a heavy frame runs on a lowered thread, one nudge thread per core (pinned to it) wakes about every
    NUDGE_S; once no heavy frame runs they stop within NUDGE_TICKS wake-ups; shutdown ends them."""
    _on_linux()
    from sapgrid.server import heavy as heavy_mod

    heavy = HeavyFrames(min_objects=1, nice=1, threads=1)
    release = threading.Event()
    callers = ThreadPoolExecutor(1)
    try:
        assert heavy.run(lambda: 1) == 1 and heavy.lowered        # the thread started, its priority lowered
        running = callers.submit(heavy.run, release.wait)
        deadline = time.monotonic() + 30
        cores = sorted(os.sched_getaffinity(os.getpid()))
        while len(heavy.nudge_ids) < len(cores) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(heavy.nudge_ids) == cores
        for core, tid in heavy.nudge_ids.items():
            assert os.sched_getaffinity(tid) == {core}
        wakes = _wakes_in(heavy.nudge_ids, 0.2)
        assert all(n >= 0.2 / heavy_mod.NUDGE_S / 10 for n in wakes.values()), wakes   # ~200 each; 20 under load
        release.set()
        assert running.result(30) is True
        deadline = time.monotonic() + 30
        while any(_wakes_in(heavy.nudge_ids, 0.1).values()) and time.monotonic() < deadline:
            pass                              # the last NUDGE_TICKS wake-ups of each
        assert not any(_wakes_in(heavy.nudge_ids, 0.2).values())          # and then no more
        ids = dict(heavy.nudge_ids)
    finally:
        release.set()
        callers.shutdown()
        heavy.shutdown()
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/self/task/{tid}") for tid in ids.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(os.path.exists(f"/proc/self/task/{tid}") for tid in ids.values())


def test_no_nudges_where_the_priority_could_not_be_lowered(monkeypatch):
    """A heavy-frame thread whose priority the OS refused to lower runs heavy frames at the server's priority,
    and nothing nudges for it; refused SCHED_IDLE alone leaves the raised nice value (and the nudges)."""
    _on_linux()

    def refused(*args):
        raise PermissionError("refused")

    monkeypatch.setattr(os, "setpriority", refused)
    monkeypatch.setattr(os, "sched_setscheduler", refused)
    heavy = HeavyFrames(min_objects=1, nice=5, threads=1)
    try:
        assert heavy.run(lambda: os.sched_getscheduler(0)) == os.SCHED_OTHER
        assert heavy.run(lambda: 2) == 2
        assert not heavy.lowered and heavy.nudge_ids == {} and heavy.thread_policy == os.SCHED_OTHER
    finally:
        heavy.shutdown()
    monkeypatch.undo()
    monkeypatch.setattr(os, "sched_setscheduler", refused)
    heavy = HeavyFrames(min_objects=1, nice=5, threads=1)
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert heavy.run(lambda: (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))) == (
            os.SCHED_OTHER, min(19, base + 5))
        assert heavy.lowered == (base < 19) and heavy.thread_policy == os.SCHED_OTHER
    finally:
        heavy.shutdown()


def test_heavy_frames_without_nudges_where_their_loop_cannot_be_built(monkeypatch, caplog):
    """The nudges only shorten waits: where their compiled loop cannot be built, heavy frames still run
    (lowered), without nudge threads, and the server says so."""
    _on_linux()
    from sapgrid.server import heavy as heavy_mod

    def broken(us, n):
        raise RuntimeError("no usleep here")

    monkeypatch.setattr(heavy_mod, "_ticks", broken)
    heavy = HeavyFrames(min_objects=1, nice=1, threads=1)
    try:
        assert heavy.run(lambda: 3) == 3 and heavy.run(lambda: 4) == 4
        assert heavy.lowered and heavy.nudge_ids == {}
        assert "without nudge threads" in caplog.text
    finally:
        heavy.shutdown()


def test_heavy_frames_give_way_only_while_a_small_world_streams(monkeypatch):
    """A heavy world's frames go to the niced threads only within SMALL_ACTIVE_S of a small world's frame:
    alone, they run on their call's thread at the default priority."""
    from sapgrid.server import heavy as heavy_mod

    clock = [1000.0]
    monkeypatch.setattr(heavy_mod.time, "monotonic", lambda: clock[0])
    heavy = HeavyFrames(min_objects=50, nice=1, threads=1)
    try:
        assert not heavy.takes(100)                      # no small world has streamed yet
        assert not heavy.takes(10)                       # a small frame: on its caller, stamps the time
        assert heavy.takes(100) and heavy.takes(50)
        clock[0] += heavy_mod.SMALL_ACTIVE_S - 0.01
        assert heavy.takes(100)
        clock[0] += 0.02                                 # the small world went quiet
        assert not heavy.takes(100)
    finally:
        heavy.shutdown()


def test_heavy_frames_of_different_worlds_run_side_by_side():
    """Two heavy frames at once (two worlds' callers) run on two heavy threads, not one after the other:
    each waits at a barrier for the other, which a single thread would never reach (BrokenBarrierError)."""
    heavy = HeavyFrames(min_objects=1, nice=1, threads=2)
    barrier = threading.Barrier(2, timeout=30)
    try:
        def frame():
            barrier.wait()
            return threading.get_native_id()

        with ThreadPoolExecutor(2) as callers:
            tids = list(callers.map(lambda _: heavy.run(frame), range(2)))
        assert len(set(tids)) == 2 and set(tids) == heavy.native_ids
    finally:
        heavy.shutdown()


def test_heavy_frame_flags_are_checked():
    assert ServerConfig().heavy_frame_objects > 0 and ServerConfig().heavy_frame_nice == 10
    assert ServerConfig(heavy_frame_objects=0).heavy_frame_objects == 0
    import argparse

    from sapgrid.server.config import add_arguments, from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flag, value in (("--heavy-frame-objects", "-1"), ("--heavy-frame-nice", "-1"), ("--heavy-frame-nice", "20"),
                        ("--heavy-frame-nice", "x"), ("--heavy-frame-policy", "fifo"), ("--heavy-frame-policy", "")):
        with pytest.raises(ValueError, match=flag):
            from_args(parser.parse_args([flag, value]), env={})
    assert from_args(parser.parse_args(["--heavy-frame-nice", "3"]), env={}).heavy_frame_nice == 3
    assert ServerConfig().heavy_frame_policy == "idle"
    assert from_args(parser.parse_args(["--heavy-frame-policy", "nice"]), env={}).heavy_frame_policy == "nice"
    assert from_args(None, env={"SAPGRID_HEAVY_FRAME_POLICY": "nice"}).heavy_frame_policy == "nice"
    with pytest.raises(ValueError):
        HeavyFrames(0, 10)
    with pytest.raises(ValueError, match="policy"):
        HeavyFrames(1, 10, policy="fifo")


def test_fill_stats_gives_every_field_of_the_frame_zero_or_not():
    """fill_stats sets the fields that are zero only when they are not: the message (and its bytes) is the
    one built from every field, whichever of them are zero."""
    from sapcore.types import FrameStats

    from sapgrid.v1 import world_pb2

    rng = np.random.default_rng(2)
    for _ in range(300):
        counts = [int(x) * (rng.random() < 0.5) for x in rng.integers(1, 2**40, 7)]
        seconds = [float(x) * (rng.random() < 0.5) for x in rng.exponential(1e-3, 7)]
        s = FrameStats(*counts, *seconds[:5])
        want = world_pb2.FrameStats(
            objects=s.objects, pairs=s.pairs, created=s.created, deleted=s.deleted, swaps=s.swaps,
            cells_touched=s.cells_touched, cell_overflows=s.cell_overflows, validate_seconds=s.validate_s,
            rasterize_seconds=s.rasterize_s, apply_seconds=s.apply_s, merge_seconds=s.merge_s,
            engine_seconds=s.total_s, queue_seconds=seconds[5], server_seconds=seconds[6])
        got = protocol.fill_stats(world_pb2.FrameStats(), s, seconds[5], seconds[6])
        assert got == want and got.SerializeToString() == want.SerializeToString()


@pytest.mark.parametrize("created,deleted", [(0, 0), (5, 0), (0, 3), (2047, 2048), (2048, 2048), (5000, 0),
                                             (0, 5000), (9000, 7000)])
def test_delta_bytes_are_what_protobuf_serializes(created, deleted):
    """Small deltas pass through the message, large ones are framed around it: the same bytes either way."""
    from sapcore.types import Delta, FrameStats

    from sapgrid.layout import U64, to_bytes
    from sapgrid.server.registry import Applied
    from sapgrid.v1 import frame_pb2, world_pb2

    rng = np.random.default_rng(created + 7 * deleted)
    pairs = [np.sort(rng.integers(0, 2**64, (n, 2), dtype=np.uint64), axis=1) for n in (created, deleted)]
    stats = FrameStats(100, 5, created, deleted, 30, 4, 0, 0.0, 1e-6, 1e-5, 0.0, 2e-5)
    applied = Applied("w-1", 2**63 + 5, 77, Delta(pairs[0], pairs[1], stats), 1e-6, 5e-5, None,
                      digest=int(rng.integers(0, 2**63)))
    want = frame_pb2.Delta(seq=applied.seq, world=applied.world, frame=applied.frame, created=to_bytes(pairs[0], U64),
                           deleted=to_bytes(pairs[1], U64),
                           stats=protocol.fill_stats(world_pb2.FrameStats(), stats, 1e-6, 5e-5),
                           pairs_digest=applied.digest).SerializeToString()
    got = protocol.delta_bytes(applied)
    assert got == want and protocol.delta_bytes(applied) is got                  # made once
    resp = pb.StreamFramesResponse.FromString(protocol.stream_response(applied.seq, applied))
    assert resp.seq == applied.seq and resp.delta.SerializeToString() == want


def test_the_digest_of_a_large_delta_is_the_contract_digest():
    """A delta of NOGIL_PAIRS pairs or more takes the kernel twin that releases the GIL: the same value."""
    from sapgrid import layout
    from sapgrid.server import digest

    rng = np.random.default_rng(11)
    for n_created, n_deleted in ((digest.NOGIL_PAIRS, 0), (0, digest.NOGIL_PAIRS), (30_000, 25_000),
                                 (digest.NOGIL_PAIRS - 1, 0)):
        created = rng.integers(0, 2**64, (n_created, 2), dtype=np.uint64)
        deleted = rng.integers(0, 2**64, (n_deleted, 2), dtype=np.uint64)
        value = int(rng.integers(0, 2**63))
        assert digest.digest_step(value, created, deleted) == layout.digest_step(value, created, deleted)


def test_the_bench_heavy_neighbour_streams_from_its_own_process(make_server):
    """The neighbour measure: the small world's round trips beside a heavy world whose client runs in a
    process of its own, and the heavy world's own frames counted (its frames reach the server's heavy thread)."""
    from sapgrid.tools import bench_worlds

    server = make_server(echo=True, metrics_port=-1, heavy_frame_objects=1500)
    r = bench_worlds.measure(server.address, [os.getpid()], 1, 50, 10.0, 1.0, 2000)
    assert 0 < r["small_p99_alone_ms"] and 0 < r["small_p99_with_heavy_ms"], r
    assert r["heavy_frames_per_s"] > 0 and r["heavy_objects"] == 2000, r
    assert server.app.registry.heavy.native_ids      # the heavy world's frames ran on its thread


def _delta_of_size(seq: int, size: int):
    """A Delta (and its bytes) of exactly ``size`` bytes, its world name the padding (none for 0)."""
    from sapgrid.v1 import frame_pb2

    if not size:
        return frame_pb2.Delta(), b""
    for k in range(1, size + 1):
        delta = frame_pb2.Delta(seq=seq, world="w" * k, frame=7)
        raw = delta.SerializeToString()
        if len(raw) == size:
            return delta, raw
    raise AssertionError(f"no Delta of {size} bytes")


@pytest.mark.parametrize("seq", [0, 1, 127, 128, 16383, 16384, (1 << 40) + 3])
@pytest.mark.parametrize("size", [0, 20, 127, 128, 16383, 16384, 20000])
def test_stream_response_is_protobufs_message_of_the_seq_and_the_delta(seq, size):
    """A frame's answer on a stream, framed by hand around the Delta's bytes: the same bytes as protobuf's
    StreamFramesResponse of that seq (omitted when 0) and Delta, for one- and several-byte varints of the
    seq and of the Delta's length."""
    from types import SimpleNamespace

    delta, raw = _delta_of_size(seq, size)
    got = protocol.stream_response(seq, SimpleNamespace(encoded=raw))
    assert got == pb.StreamFramesResponse(seq=seq, delta=delta).SerializeToString()
    assert got == protocol.wrap(2, raw, protocol.varint_field(1, seq))
    back = pb.StreamFramesResponse.FromString(got)
    assert back.seq == seq and back.delta == delta
