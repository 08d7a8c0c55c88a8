"""``sapgrid bench --worlds``: the streams' schedule (spread or aligned ticks, warm-up before the start)
and the figures it reports, against a server in this process."""
from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest

from sapgrid.client import Client
from sapgrid.server import kernels
from sapgrid.tools import bench_worlds, cli


def test_spread_ticks_divide_one_period_and_aligned_ones_coincide():
    assert bench_worlds._phases(10.0, 4, 20.0, aligned=True) == [10.0] * 4
    spread = bench_worlds._phases(10.0, 4, 20.0, aligned=False)
    assert spread == pytest.approx([10.0, 10.0125, 10.025, 10.0375])


def test_the_schedule_starts_once_every_stream_is_warmed_up():
    async def scenario():
        order = []
        start = bench_worlds._Start(3, 10.0, aligned=False, mark=lambda: order.append(("mark", None)))

        async def stream(k, warm_up_s):
            await asyncio.sleep(warm_up_s)
            order.append(("ready", k))
            t = await start.at(k)
            order.append(("start", k))
            return t

        times = await asyncio.gather(stream(0, 0.0), stream(1, 0.05), stream(2, 0.01))
        return order, times

    order, times = asyncio.run(scenario())
    # the CPU figures start again once, when the last stream is warm, before any stream's schedule
    assert [e for e, _ in order[:3]] == ["ready"] * 3 and order[3][0] == "mark"
    assert [e for e, _ in order[4:]] == ["start"] * 3
    assert times[1] - times[0] == pytest.approx(1 / 30) and times[2] - times[0] == pytest.approx(2 / 30)


@pytest.mark.parametrize("aligned", [False, True])
def test_the_json_reports_the_frames_and_the_transport_alone(make_server, capsys, aligned):
    server = make_server(echo=True, metrics_port=-1)
    assert kernels.wait_all(600)              # (their load's CPU, in this process, is not the frames')
    argv = ["bench", "--server", server.address, "--server-pid", str(os.getpid()), "--worlds", "3", "--objects",
            "50", "--hz", "10", "--seconds", "1", "--heavy-objects", "0", "--json"] + (["--aligned"] if aligned else [])
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    r = json.loads(out.strip().splitlines()[-1])
    assert r["aligned"] is aligned and r["frames_asked"] == 30
    assert 0 < r["frames_delivered"] <= 30 and 0 < r["echo_delivered"] <= 30, r
    assert 0 < r["p50_ms"] <= r["p99_ms"] and 0 < r["echo_p50_ms"] <= r["echo_p99_ms"], r
    assert r["server_cpu_ms_per_frame"] > 0 and r["echo_cpu_ms_per_frame"] > 0, r
    assert r["others_cores"] >= 0 and r["echo_others_cores"] >= 0 and r["cores"] == os.cpu_count(), r
    assert 0 < r["engine_ms_p50"] <= r["server_ms_p50"] <= r["p50_ms"], r     # within each frame's round trip
    assert "| other processes' CPU during each measure (cores of " in out
    assert "| in the server, a frame's engine / server time p50 (its Delta's stats) |" in out
    assert ("aligned phases" if aligned else "spread phases") in out
    assert "| the transport alone (EchoService, same schedule and bytes)" in out
    with Client(server.address, timeout=60) as c:          # the warm-up frames went to the bench's own worlds
        assert not [w.name for w in c.list_worlds() if w.name.startswith("bench-")]


def test_the_cpu_of_the_server_and_of_other_processes_is_told_apart():
    """A spinning 'server' is the server's CPU; a second spinning process is the others' (cores)."""
    import subprocess
    import sys
    import time

    spin = [sys.executable, "-c", "while True: pass"]
    server, other = subprocess.Popen(spin), subprocess.Popen(spin)
    try:
        time.sleep(0.3)
        _, server_cpu, gen_cpu, others = bench_worlds._measured([server.pid], lambda: time.sleep(1.5))
    finally:
        for p in (server, other):
            p.kill()
            p.wait()
    assert server_cpu > 0.3 and gen_cpu < 0.2, (server_cpu, gen_cpu)
    assert others > 0.3, others
    _, server_cpu, _, others = bench_worlds._measured([], lambda: None)    # no PID: nothing to tell apart
    assert server_cpu != server_cpu and others != others                   # NaN


def test_the_cpu_figures_count_from_the_mark():
    """With ``marked``, the server's CPU (and the generator's) counts from the work's call of its mark (the
    schedule's start, after the warm-up), not from the call of ``_measured``."""
    import subprocess
    import sys
    import time

    def work(mark, spin_before: float, wait_after: float):
        end = time.perf_counter() + spin_before
        while time.perf_counter() < end:       # the generator's own CPU, before the mark
            pass
        mark()
        time.sleep(wait_after)
        return "done"

    server = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        out, whole, gen_whole, _ = bench_worlds._measured([server.pid], lambda: work(lambda: None, 1.0, 0.5))
        out, marked, gen_marked, _ = bench_worlds._measured([server.pid], lambda mark: work(mark, 1.0, 0.5),
                                                            marked=True)
    finally:
        server.kill()
        server.wait()
    assert out == "done"
    assert whole > 0.9 and 0.1 < marked < 0.8, (whole, marked)
    assert gen_whole > 0.5 and gen_marked < 0.2, (gen_whole, gen_marked)


def test_a_server_without_the_echo_service_is_told_by_its_own_status(make_server):
    """Many echo streams opened at once against a server without ``--echo``: a stream's first write races
    with the call's end, and grpc.aio then reports INTERNAL (about a third of such streams on this machine
    class); the bench asks the service with one unary call first, so the error is always UNIMPLEMENTED."""
    import grpc

    from sapgrid.client import SapgridError

    server = make_server(metrics_port=-1)
    frames = {k: [bench_worlds.echo_pb.EchoStreamRequest()] for k in range(64)}
    for _ in range(5):
        with pytest.raises(SapgridError) as err:
            asyncio.run(bench_worlds._echo(server.address, frames, 10.0, 1.0))
        assert err.value.code == grpc.StatusCode.UNIMPLEMENTED, err.value
        assert "sapgrid serve --echo" in str(err.value)


HAPROXY = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
needs_haproxy = pytest.mark.skipif(not HAPROXY and os.environ.get("CI") != "true",
                                   reason="haproxy not installed (scripts/setup.d/70-haproxy.sh)")


@needs_haproxy
def test_a_spawned_cluster_routes_each_world_to_its_owner_and_stops_every_process():
    from sapgrid.tools.spawn import SpawnedCluster

    with SpawnedCluster(2, "--default-world", "") as cluster:
        assert len(cluster.members) == 2 and len(cluster.pids) == 3
        names = [f"route-{i}" for i in range(12)]
        with Client(cluster.address, timeout=120) as c:
            for name in names:
                c.create_world(name, dims=2, bounds=(0, 0, 100, 100))
        for i, member in enumerate(cluster.members):
            with Client(member, timeout=60) as c:
                held = sorted(w.name for w in c.list_worlds())
            assert held == sorted(n for n in names if cluster.owner(n) == i), (member, held)
        pids = cluster.pids
    for pid in pids:                         # the proxy and both replicas are gone (and reaped)
        assert not os.path.exists(f"/proc/{pid}"), pid


@needs_haproxy
def test_replicas_spread_the_worlds_and_keep_the_neighbours_on_one_replica(capsys):
    argv = ["bench", "--server", "spawn", "--replicas", "2", "--worlds", "16", "--objects", "50", "--hz", "10",
            "--seconds", "1", "--heavy-objects", "2000", "--json"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    r = json.loads(out.strip().splitlines()[-1])
    assert r["replicas"] == 2 and r["frames_asked"] == 160, r
    # each replica holds exactly the worlds the ring gives it: the proxy routed every create by its header
    assert r["worlds_per_replica"] == r["ring_worlds_per_replica"] and sum(r["worlds_per_replica"]) == 16, r
    assert min(r["worlds_per_replica"]) > 0, r
    assert 0 < r["frames_delivered"] <= 160 and 0 < r["echo_delivered"] <= 160, r
    assert r["server_cpu_ms_per_frame"] > 0 and r["echo_cpu_ms_per_frame"] > 0, r
    assert len(r["neighbour_replica"]) == 1, r          # the small and the heavy world share one replica
    assert r["small_p99_alone_ms"] > 0 and r["small_p99_with_heavy_ms"] > 0 and r["heavy_frames_per_s"] > 0, r
    assert r["small_p99_heavy_elsewhere_ms"] > 0, r       # the heavy world once more, on the other replica
    assert "| the same, the heavy world on another replica (no server in common) |" in out
    assert "| replicas behind HAProxy: worlds each | 2: " in out and "replicas' and proxy's CPU per frame" in out


@pytest.mark.parametrize("argv, message", [
    (["--server", "127.0.0.1:1", "--worlds", "4", "--replicas", "2"], "--replicas needs --server spawn"),
    (["--server", "spawn", "--worlds", "4", "--replicas", "0"], "--replicas must be >= 1"),
    (["--server", "spawn", "--replicas", "2"], "--replicas is for the many-worlds mode"),
    (["--replicas", "2"], "--replicas is for the many-worlds mode"),
])
def test_replicas_outside_a_spawned_many_worlds_bench_are_refused(argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *argv])
    assert message in str(e.value)


def test_the_frames_and_the_echo_take_turns_in_halves(monkeypatch):
    """Frames, echo, echo, frames, each for half of ``--seconds``: every figure is over both halves of its
    kind (answered, round trips, the server's CPU, the other processes' cores)."""
    calls = []

    def paced(kind, answered, rtt):
        async def run(address, frames, hz, seconds, aligned, mark, stats=None):
            calls.append((kind, seconds))
            mark()
            if kind == "frames":            # each frame's engine and server seconds, from its Delta
                stats += [(1e-5 * len(calls), 4e-5)] * 3
            return answered[sum(k == kind for k, _ in calls) - 1], [rtt] * 4
        return run

    cpu = iter([0.5, 0.2, 0.4, 0.7])                 # the server's CPU seconds of each half, in turn
    monkeypatch.setattr(bench_worlds, "_setup_worlds", lambda address, names, n, seed: {name: [] for name in names})
    monkeypatch.setattr(bench_worlds, "_drop_worlds", lambda address, names: None)
    monkeypatch.setattr(bench_worlds, "_many", paced("frames", (100, 300), 0.002))
    monkeypatch.setattr(bench_worlds, "_echo", paced("echo", (200, 200), 0.001))
    monkeypatch.setattr(bench_worlds, "_measured",
                        lambda pids, work, marked=False: (work(lambda: None), next(cpu), 0.1, 0.25))
    r = bench_worlds.measure("127.0.0.1:1", [1], worlds=2, objects=10, hz=20.0, seconds=3.0, heavy_objects=0)
    assert calls == [("frames", 1.5), ("echo", 1.5), ("echo", 1.5), ("frames", 1.5)]
    assert r["frames_delivered"] == 400 and r["echo_delivered"] == 400
    assert r["frames_asked"] == 2 * 2 * 30                     # two worlds, two halves of ceil(1.5 s x 20 Hz)
    assert r["server_cpu_ms_per_frame"] == pytest.approx((0.5 + 0.7) * 1e3 / 400)
    assert r["echo_cpu_ms_per_frame"] == pytest.approx((0.2 + 0.4) * 1e3 / 400)
    assert r["p50_ms"] == pytest.approx(2.0) and r["echo_p50_ms"] == pytest.approx(1.0)
    assert r["others_cores"] == pytest.approx(0.25) and r["echo_others_cores"] == pytest.approx(0.25)
    assert r["engine_ms_p50"] == pytest.approx(0.025) and r["server_ms_p50"] == pytest.approx(0.04)  # both halves
