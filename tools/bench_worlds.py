"""``sapgrid bench --server HOST:PORT|spawn --worlds W --objects N --hz H``: many small worlds.

1. Many worlds: W worlds of N objects, one frame stream each, every object moving a little every
   frame, each stream paced at H frames/s for ``--seconds``; reports frames asked and delivered, round
   trip p50 / p99 (send -> delta, measured by the load generator), the server's CPU per frame and
   the load generator's own CPU, and the p50 of the engine's and the server's seconds of a frame in the
   server (each Delta's stats: what the same work costs among the server's other streams, against
   ``sapgrid bench``'s in-process figures). The streams' ticks are spread evenly over one period (stream k of W
   first sends k / (W * H) s after the start), as independent clients' ticks fall; ``--aligned``
   sends every stream's frame at the same instants instead (a burst of W frames each tick). Each
   stream first opens its call and sends ``WARMUP`` frames, untimed and uncounted (the call's set-up
   and the server's first work for it: up to ~80 ms for the first frame of 32 streams opened at
   once, and the engine's first frames of each kind, which load its compiled kernels in a fresh
   server); the schedule starts once every stream has, and the CPU figures (the server's,
   the load generator's, the other processes') are read from then on.
2. Echo baseline: the same schedule over bare ``EchoService`` streams carrying the same bytes: the
   transport alone (delivered, p50 / p99) and the server's CPU per message, so
   ``server_cpu_ms_per_frame / echo_cpu_ms_per_frame`` is the service's own cost per frame over gRPC's.
   The two take turns in halves of ``--seconds``, frames, echo, echo, frames (``HALVES``): a change of
   the machine's speed during the measure falls on both alike (one run of each in turn read ratios
   from 1.34x to 1.76x on the 2-core VM within the hour); every figure is over both halves.
3. Heavy neighbour: a world of 100-object frames streams alone at H frames/s (p99 alone), then again
   while a heavy world (``--heavy-objects``, frames sent back to back, every object moving) streams in
   the same server from a load generator process of its own (its multi-megabyte messages would
   otherwise hold up the timed stream's event loop); reports the small world's p99 with the neighbour /
   alone and the heavy world's own frames/s. With replicas, once more with the heavy world on another
   replica than the small one: the machine's shared cores without a server in common.

With ``--server spawn --replicas R`` (R > 1) the server is what one host runs to use more than one core:
R replica processes sharding the worlds by the cluster's ring behind Debian's HAProxy (``SpawnedCluster``,
the configuration of ``deploy/proxy/``); every stream goes through the proxy, which routes it by the world
named in its ``x-sapgrid-world`` header, so the worlds spread over the replicas as a cluster's do. The server's
CPU is then the replicas' and the proxy's together, the echo streams take the same routes, and the heavy
neighbour's two worlds are named so that one replica owns both (a neighbour in the same server).

The load generator is one asyncio loop with raw stubs and frames encoded before the timed part; every
stream names its world in the ``x-sapgrid-world`` header, as the Python client does.
Server CPU is read from /proc/PID/stat, so it needs the server's PID: ``spawn``, or ``--server-pid``.
With ``--json`` the last line is one JSON object of every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time

import grpc
import numpy as np

from sapgrid.client import Client, channel_options
from sapgrid.client.codec import encode_frame
from sapgrid.server.cluster import HEADER
from sapgrid.v1 import echo_service_pb2 as echo_pb
from sapgrid.v1 import echo_service_pb2_grpc as echo_grpc
from sapgrid.v1 import sapgrid_service_pb2 as pb
from sapgrid.v1 import sapgrid_service_pb2_grpc as pb_grpc

CYCLE = 30                         # distinct frames per world; positions return to the start after a cycle
WARMUP = 3                         # frames (echo messages) a stream sends, untimed, before its schedule starts
HALVES = ("frames", "echo", "echo", "frames")      # the measures of --seconds / 2 each, in this order
TARGETS = dict(delivered_fraction=0.99, p99_ms=10.0, cpu_ratio=1.5, neighbour_ratio=3.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worlds", type=int, default=0, help="server bench: many-worlds mode, W worlds/streams")
    parser.add_argument("--objects", type=int, default=1000, help="many-worlds mode: objects per world")
    parser.add_argument("--hz", type=float, default=30.0, help="many-worlds mode: frames/s per stream")
    parser.add_argument("--seconds", type=float, default=10.0, help="many-worlds mode: seconds per measure")
    parser.add_argument("--heavy-objects", type=int, default=100_000,
                        help="many-worlds mode: the heavy neighbour's objects (0: skip that measure)")
    parser.add_argument("--server-pid", type=int, default=0, help="PID of a server given by address (its CPU)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="many-worlds mode with --server spawn: R replica processes behind HAProxy (the cluster's "
                             "sharding on one host, to use more than one core); 1: one server process")
    parser.add_argument("--aligned", action="store_true",
                        help="many-worlds mode: every stream sends at the same instants (a burst of W frames each "
                             "tick) instead of at phases spread evenly over the tick")


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads, in nanoseconds' precision (Linux /proc/PID/task/*/schedstat;
    /proc/PID/stat counts in clock ticks of 10 ms, too coarse for a short measure). The server's threads
    live as long as the server once its start is over (the engine's kernels loaded, ``server/kernels.py``:
    a spawned server is measured only then), so no thread's time is lost between two readings."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):     # a thread that ended meanwhile
            continue
    return total / 1e9


def _moving_frames(world: str, n: int, rng: np.random.Generator, side: float = 1000.0) -> tuple:
    """(the add request, CYCLE update requests): n boxes drifting on circles, back at the start after CYCLE."""
    ids = np.arange(1, n + 1, dtype=np.uint64)
    centre = rng.uniform(0, side, size=(n, 2))
    half = rng.uniform(1.0, 4.0, size=(n, 2))
    phase = rng.uniform(0, 2 * np.pi, size=n)
    radius = rng.uniform(2.0, 8.0, size=n)

    def boxes(t: int) -> np.ndarray:
        a = phase + 2 * np.pi * t / CYCLE
        c = centre + radius[:, None] * np.stack([np.cos(a), np.sin(a)], axis=1)
        return np.concatenate([c - half, c + half], axis=1).astype(np.float32)

    add = pb.StreamFramesRequest()
    encode_frame(world, 0, add_ids=ids, add_boxes=boxes(0), into=add.frame)
    updates = []
    for t in range(1, CYCLE + 1):
        req = pb.StreamFramesRequest()
        encode_frame(world, t, update_ids=ids, update_boxes=boxes(t), into=req.frame)
        updates.append(req)
    return add, updates


def _aio_channel(address: str):
    """An asyncio channel with the credentials the command was given (--tls-ca/--token or SAPGRID_*)."""
    from sapgrid.client._channel import credentials, open_channel

    return open_channel(address, channel_options(), aio=True, **credentials())


class _Start:
    """The streams' common schedule: each stream opens its call and sends ``WARMUP`` messages first
    (unpaced, untimed: the call's set-up and the server's first work for it); once every stream has,
    the schedule starts (``_phases``), and ``mark`` (if any) is called: ``_measured``'s CPU figures count
    from there. Stream k awaits ``at(k)`` for its first send time."""

    def __init__(self, streams: int, hz: float, aligned: bool, mark=None):
        self.streams, self.hz, self.aligned, self.mark = streams, hz, aligned, mark
        self._waiting = streams
        self._ready = asyncio.Event()
        self._starts: list[float] = []

    async def at(self, k: int) -> float:
        self._waiting -= 1
        if not self._waiting:
            if self.mark is not None:
                self.mark()
            self._starts = _phases(time.perf_counter() + 0.05, self.streams, self.hz, self.aligned)
            self._ready.set()
        await self._ready.wait()
        return self._starts[k]


async def _paced_stream(stub, world: str, requests: list, hz: float, seconds: float, start: _Start, k: int,
                        rtts: list, stats: list | None = None) -> int:
    """After ``WARMUP`` frames, send requests[(WARMUP + i) % len] at start + i/hz until start + seconds,
    each answered before the next; return the frames answered in the schedule. A stream that falls
    behind its schedule sends at once (no catch-up burst). The call names ``world`` in its header (a
    cluster's proxy routes it by that). ``stats``: each timed frame's engine and server seconds (its
    Delta's stats) are appended to it."""
    call = stub.StreamFrames(metadata=((HEADER, world),))

    async def one(request):
        await call.write(request)
        resp = await call.read()
        if resp is grpc.aio.EOF or resp.WhichOneof("result") != "delta":
            raise RuntimeError(f"frame refused: {resp}")
        return resp

    done = 0
    try:
        for i in range(WARMUP):
            await one(requests[i % len(requests)])
        t_start = await start.at(k)
        i, end = 0, t_start + seconds
        while True:
            due = t_start + i / hz
            if due >= end or time.perf_counter() >= end:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t0 = time.perf_counter()
            resp = await one(requests[(WARMUP + i) % len(requests)])
            rtts.append(time.perf_counter() - t0)
            if stats is not None:
                s = resp.delta.stats
                stats.append((s.engine_seconds, s.server_seconds))
            done += 1
            i += 1
    finally:
        await call.done_writing()
    return done


_NO_ECHO = (" (the server does not serve the bench-only EchoService: start it with `sapgrid serve --echo`, "
            "or use --server spawn)")


async def _echo_served(stub) -> None:
    """Ask the EchoService once with a unary call before opening its streams. A stream's first write to a
    server without the service races with the call's end: grpc.aio then reports the call as INTERNAL
    ("Internal error from Core") instead of the server's UNIMPLEMENTED (grpc/grpc#36066); a unary
    call carries its request with the call itself, so its status is the server's."""
    from sapgrid.client.errors import make_error

    try:
        await stub.Echo(echo_pb.EchoRequest(), timeout=60)
    except grpc.aio.AioRpcError as e:
        hint = _NO_ECHO if e.code() == grpc.StatusCode.UNIMPLEMENTED else ""
        raise make_error(e.code(), f"Echo: {e.details()}{hint}") from None


async def _echo_stream(stub, world: str, payload: bytes, reply: int, hz: float, seconds: float, start: _Start,
                       k: int, rtts: list) -> int:
    """The frames' schedule (``_paced_stream``) over the bare EchoService: the transport alone (named by
    ``world``'s header, so a cluster's proxy sends it to the replica of that world's frames)."""
    from sapgrid.client.errors import make_error

    call = stub.EchoStream(metadata=((HEADER, world),))
    request = echo_pb.EchoStreamRequest(payload=payload, reply_bytes=reply)
    i = 0
    try:
        for _ in range(WARMUP):
            await call.write(request)
            await call.read()
        t_start = await start.at(k)
        end = t_start + seconds
        while t_start + i / hz < end and time.perf_counter() < end:
            delay = t_start + i / hz - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t0 = time.perf_counter()
            await call.write(request)
            await call.read()
            rtts.append(time.perf_counter() - t0)
            i += 1
        await call.done_writing()
    except asyncio.InvalidStateError:          # the call ended (e.g. UNIMPLEMENTED: a server without --echo)
        code = await call.code()
        hint = _NO_ECHO if code == grpc.StatusCode.UNIMPLEMENTED else ""
        raise make_error(code, f"EchoStream: {await call.details()}{hint}") from None
    return i


def _setup_worlds(address: str, names: list[str], n: int, seed: int) -> dict:
    """Create the worlds and add their objects; return name -> update requests."""
    rng = np.random.default_rng(seed)
    frames = {}
    with Client(address, timeout=600) as c:
        for name in names:
            c.create_world(name, dims=2, bounds=(0, 0, 1000, 1000), expected_objects=n)
            add, updates = _moving_frames(name, n, rng)
            with c.stream(name) as s:
                s.send_request(add)
                s.recv()
            frames[name] = updates
    return frames


def _drop_worlds(address: str, names: list[str]) -> None:
    with Client(address, timeout=600) as c:
        for name in names:
            c.delete_world(name)


def _phases(start: float, streams: int, hz: float, aligned: bool) -> list[float]:
    """Each stream's first send: all at ``start`` (aligned: a burst of every stream's frame each tick), or
    spread evenly over one tick, as independent clients' ticks fall (each stream still sends at hz)."""
    return [start if aligned else start + k / (streams * hz) for k in range(streams)]


async def _many(address: str, frames: dict, hz: float, seconds: float, aligned: bool = False,
                mark=None, stats: list | None = None) -> tuple[int, list]:
    async with _aio_channel(address) as channel:
        stub = pb_grpc.SapgridServiceStub(channel)
        rtts: list[float] = []
        start = _Start(len(frames), hz, aligned, mark)
        done = await asyncio.gather(*(_paced_stream(stub, world, reqs, hz, seconds, start, k, rtts, stats)
                                      for k, (world, reqs) in enumerate(frames.items())))
    return sum(done), rtts


async def _echo(address: str, frames: dict, hz: float, seconds: float, aligned: bool = False,
                mark=None) -> tuple[int, list]:
    sample = next(iter(frames.values()))[0]
    payload, reply = sample.SerializeToString(), 120            # a delta of a moving 1k world is ~100 B
    async with _aio_channel(address) as channel:
        stub = echo_grpc.EchoServiceStub(channel)
        await _echo_served(stub)
        start = _Start(len(frames), hz, aligned, mark)
        rtts: list[float] = []
        done = await asyncio.gather(*(_echo_stream(stub, world, payload, reply, hz, seconds, start, k, rtts)
                                      for k, world in enumerate(frames)))
    return sum(done), rtts


class _Signalled:
    """A heavy client's start: after its warm-up it sets ``ready`` and waits for ``go`` (process events)."""

    def __init__(self, ready, go):
        self.ready, self.go = ready, go

    async def at(self, k: int) -> float:
        self.ready.set()
        await asyncio.get_running_loop().run_in_executor(None, self.go.wait, HEAVY_START_S)
        return time.perf_counter()


HEAVY_START_S = 300.0              # at most this long for the heavy client's process to start and warm up


def _heavy_client(address: str, world: str, n: int, seed: int, seconds: float, ready, go, answered) -> None:
    """In a process of its own: the heavy world's frames (every object moving) back to back for ``seconds``
    once ``go`` is set; ``answered.value``: the frames answered meanwhile. Its own process, so encoding and
    decoding its multi-megabyte messages never delays the small world's timed stream in the generator."""
    _, updates = _moving_frames(world, n, np.random.default_rng(seed))

    async def run() -> int:
        async with _aio_channel(address) as channel:
            return await _paced_stream(pb_grpc.SapgridServiceStub(channel), world, updates, 1e6, seconds,
                                       _Signalled(ready, go), 0, [])
    answered.value = asyncio.run(run())


def _neighbour(address: str, small: tuple, heavy: tuple | None, hz: float, seconds: float) -> tuple[list, int]:
    """The small world's (``(name, requests)``) round trips at hz, while the heavy world (if any: (name,
    objects, seed)) streams frames back to back from a process of its own; and the heavy world's frames
    answered meanwhile."""
    async def timed() -> list:
        async with _aio_channel(address) as channel:
            rtts: list[float] = []
            await _paced_stream(pb_grpc.SapgridServiceStub(channel), *small, hz, seconds, _Start(1, hz, True), 0,
                                rtts)
        return rtts

    if heavy is None:
        return asyncio.run(timed()), 0
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")          # no fork of a process with gRPC's threads
    ready, go, answered = ctx.Event(), ctx.Event(), ctx.Value("q", -1)
    proc = ctx.Process(target=_heavy_client, args=(address, *heavy, seconds, ready, go, answered), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + HEAVY_START_S
        while not ready.wait(0.5):
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the heavy world's client did not start (exit code {proc.exitcode})")
        go.set()
        rtts = asyncio.run(timed())
        proc.join(seconds + 60)
        if answered.value < 0:
            raise RuntimeError(f"the heavy world's client failed (exit code {proc.exitcode})")
        return rtts, answered.value
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)


def _ms(rtts: list, q: float) -> float:
    return float(np.percentile(np.asarray(rtts) * 1e3, q)) if rtts else float("nan")


def _busy_seconds() -> float:
    """CPU seconds this machine's processes have run, all of them (Linux /proc/stat: user, nice, system,
    irq, softirq, and steal: what the hypervisor gave to other machines), in clock ticks of 10 ms."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _measured(pids, work, marked: bool = False):
    """(result of work(), the server's CPU seconds (its processes ``pids`` together), this process's CPU
    seconds, the cores every other process of the machine used meanwhile on average: the load the measure
    shared the machine with). Without the server's PIDs, the server's CPU and the others' cores are NaN.
    With ``marked``, work is called with a function that starts the figures again when called (at the
    schedule's start, after the warm-up: ``_Start``); else they count from the call."""
    pids = list(pids)

    def server_cpu() -> float:
        return sum(_cpu_seconds(p) for p in pids) if pids else float("nan")

    base: list[float] = []

    def mark() -> None:
        base[:] = server_cpu(), time.process_time(), _busy_seconds(), time.perf_counter()

    mark()
    out = work(mark) if marked else work()
    s0, g0, b0, w0 = base
    server = server_cpu() - s0
    gen = time.process_time() - g0
    others = (_busy_seconds() - b0 - server - gen) / (time.perf_counter() - w0)
    return out, server, gen, max(others, 0.0) if pids else float("nan")


def _neighbour_names(owner=None, same: bool = True) -> tuple[str, str]:
    """The heavy-neighbour measure's two worlds; with ``owner`` (world -> replica), named so that one
    replica owns both (``same``: the neighbour is in the same server) or two different ones do."""
    small = heavy = f"bench-small-{os.getpid()}"
    i = 0
    while heavy == small or (owner is not None and (owner(heavy) == owner(small)) != same):
        heavy = f"bench-heavy-{os.getpid()}" + (f"-{i}" if i else "")
        i += 1
    return small, heavy


def _held(members, prefix: str) -> list[int]:
    """How many worlds named ``prefix``... each replica holds (asked of each replica itself)."""
    held = []
    for m in members:
        with Client(m, timeout=60) as c:
            held.append(sum(1 for w in c.list_worlds() if w.name.startswith(prefix)))
    return held


def measure(address: str, pids, worlds: int, objects: int, hz: float, seconds: float, heavy_objects: int,
            seed: int = 1, aligned: bool = False, cluster=None) -> dict:
    """The three measures against the server at ``address`` whose processes are ``pids`` (empty: unknown);
    ``cluster``: a ``SpawnedCluster`` behind that address (the worlds' spread over its replicas is
    reported, the neighbour's worlds share a replica)."""
    prefix = f"bench-w-{os.getpid()}-"
    names = [f"{prefix}{i:03d}" for i in range(worlds)]
    frames = _setup_worlds(address, names, objects, seed)
    try:
        held = _held(cluster.members, prefix) if cluster is not None else [worlds]
        half, stats = seconds / 2, []          # stats: the frames' engine and server seconds (their Deltas')
        runs = {"frames": functools.partial(_many, stats=stats), "echo": _echo}
        got = {kind: [0, [], 0.0, 0.0, 0.0] for kind in runs}       # answered, rtts, server, generator, others
        for kind in HALVES:
            (done, rtts), server, gen, others = _measured(
                pids, lambda mark, run=runs[kind]: asyncio.run(run(address, frames, hz, half, aligned, mark)),
                marked=True)
            g = got[kind]
            g[0] += done
            g[1] += rtts
            g[2] += server
            g[3] += gen
            g[4] += others / HALVES.count(kind)     # (its halves' mean: each as long)
    finally:
        _drop_worlds(address, names)
    (delivered, rtts, server_cpu, gen_cpu, others), (echoed, echo_rtts, echo_cpu, _, echo_others) = got.values()
    asked = int(sum(HALVES.count("frames") * np.ceil(half * hz) for _ in names))
    out = dict(worlds=worlds, objects=objects, hz=hz, seconds=seconds, aligned=aligned, frames_asked=asked,
               frames_delivered=delivered, frames_per_s=delivered / seconds, p50_ms=_ms(rtts, 50),
               p99_ms=_ms(rtts, 99), server_cpu_ms_per_frame=server_cpu * 1e3 / max(delivered, 1),
               echo_delivered=echoed, echo_p50_ms=_ms(echo_rtts, 50), echo_p99_ms=_ms(echo_rtts, 99),
               echo_cpu_ms_per_frame=echo_cpu * 1e3 / max(echoed, 1),
               engine_ms_p50=_ms([e for e, _ in stats], 50), server_ms_p50=_ms([v for _, v in stats], 50),
               generator_cpu_ms_per_frame=gen_cpu * 1e3 / max(delivered, 1), others_cores=others,
               echo_others_cores=echo_others, cores=os.cpu_count(),
               replicas=len(cluster.members) if cluster is not None else 1, worlds_per_replica=held)
    if cluster is not None:          # what the ring gives each replica: what the proxy must have routed there
        out["ring_worlds_per_replica"] = [sum(1 for n in names if cluster.owner(n) == i)
                                          for i in range(len(cluster.members))]
    if heavy_objects:
        small, heavy = _neighbour_names(cluster.owner if cluster is not None else None)
        frames = _setup_worlds(address, [small], 100, seed + 1)
        frames.update(_setup_worlds(address, [heavy], heavy_objects, seed + 2))
        try:
            if cluster is not None:
                out.update(neighbour_replica=[i for i, n in enumerate(_held(cluster.members, "bench-")) if n])
            (alone, _), _, _, alone_others = _measured(pids, lambda: _neighbour(
                address, (small, frames[small]), None, hz, seconds))
            (beside, heavy_done), _, _, beside_others = _measured(pids, lambda: _neighbour(
                address, (small, frames[small]), (heavy, heavy_objects, seed + 3), hz, seconds))
        finally:
            _drop_worlds(address, [heavy])
        try:
            if cluster is not None:
                # the same heavy stream from a world another replica owns: what the machine's cores shared with
                # the heavy stream do to the small world, with no server in common
                _, elsewhere = _neighbour_names(cluster.owner, same=False)
                _setup_worlds(address, [elsewhere], heavy_objects, seed + 2)
                try:
                    (apart, _), _, _, _ = _measured(pids, lambda: _neighbour(
                        address, (small, frames[small]), (elsewhere, heavy_objects, seed + 3), hz, seconds))
                finally:
                    _drop_worlds(address, [elsewhere])
                out.update(small_p99_heavy_elsewhere_ms=_ms(apart, 99))
        finally:
            _drop_worlds(address, [small])
        out.update(small_p99_alone_ms=_ms(alone, 99), small_p99_with_heavy_ms=_ms(beside, 99),
                   heavy_objects=heavy_objects, heavy_frames_per_s=heavy_done / seconds,
                   alone_others_cores=alone_others, beside_others_cores=beside_others)
    return out


def run(args: argparse.Namespace) -> int:
    spawned = cluster = None
    address, pid = args.server, int(getattr(args, "server_pid", 0) or 0)
    pids = [pid] if pid else []
    replicas = int(getattr(args, "replicas", 1))
    if replicas < 1:
        raise SystemExit(f"sapgrid bench: --replicas must be >= 1, not {replicas}")
    if replicas > 1 and address != "spawn":
        raise SystemExit("sapgrid bench: --replicas needs --server spawn (the bench starts the replicas and the "
                         "proxy itself)")
    flags = ("--default-world", "", "--echo", "--max-worlds", str(max(256, args.worlds + 8)))
    if address == "spawn":
        from sapgrid.tools.spawn import SpawnedCluster, SpawnedServer

        if replicas > 1:
            cluster = SpawnedCluster(replicas, *flags)
            address, pids = cluster.address, cluster.pids
        else:
            spawned = SpawnedServer(*flags, metrics_port=-1)
            address, pids = spawned.address, [spawned.proc.pid]
    try:
        if spawned is not None or cluster is not None:      # their load's CPU is not a frame's (an external
            (spawned or cluster).wait_kernels()              # server's: at its start)
        where = f"{replicas} replicas behind HAProxy at {address}" if cluster is not None else address
        print(f"sapgrid bench --server {where}: {args.worlds} worlds x {args.objects} objects x {args.hz:g} Hz "
              f"for {args.seconds:g} s, {'aligned' if getattr(args, 'aligned', False) else 'spread'} phases...",
              flush=True)
        r = measure(address, pids, args.worlds, args.objects, args.hz, args.seconds, args.heavy_objects,
                    int(getattr(args, "seed", 1) or 1), bool(getattr(args, "aligned", False)), cluster)
    finally:
        if spawned is not None:
            spawned.stop()
        if cluster is not None:
            cluster.stop()
    cpu_ratio = (r["server_cpu_ms_per_frame"] / r["echo_cpu_ms_per_frame"] if pids and r["echo_cpu_ms_per_frame"]
                 else float("nan"))
    r["cpu_ratio"] = cpu_ratio
    fraction = r["frames_delivered"] / r["frames_asked"]

    def ok(good: bool) -> str:
        return "ok" if good else "MISSED"

    print()
    print("| measure | value | target | |")
    print("|---|---:|---:|---|")
    print(f"| frames delivered / asked | {r['frames_delivered']} / {r['frames_asked']} ({fraction:.1%}) | >= 99% "
          f"| {ok(fraction >= TARGETS['delivered_fraction'])} |")
    print(f"| frames/s | {r['frames_per_s']:.0f} | | |")
    if r["replicas"] > 1:
        spread = " / ".join(map(str, r["worlds_per_replica"]))
        print(f"| replicas behind HAProxy: worlds each | {r['replicas']}: {spread} | | |")
    print(f"| the transport alone (EchoService, same schedule and bytes): delivered, p50 / p99 | "
          f"{r['echo_delivered'] / r['frames_asked']:.1%}, {r['echo_p50_ms']:.2f} / {r['echo_p99_ms']:.2f} ms | | |")
    print(f"| round trip p50 / p99 | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms | p99 < 10 ms "
          f"| {ok(r['p99_ms'] < TARGETS['p99_ms'])} |")
    served = "replicas' and proxy's CPU" if r["replicas"] > 1 else "server CPU"
    print(f"| {served} per frame / per echo message | {r['server_cpu_ms_per_frame']:.3f} / "
          f"{r['echo_cpu_ms_per_frame']:.3f} ms ({cpu_ratio:.2f}x) | <= 1.5x | {ok(cpu_ratio <= TARGETS['cpu_ratio'])} |")
    print(f"| in the server, a frame's engine / server time p50 (its Delta's stats) | {r['engine_ms_p50']:.3f} / "
          f"{r['server_ms_p50']:.3f} ms | | |")
    print(f"| load generator CPU per frame | {r['generator_cpu_ms_per_frame']:.3f} ms | | |")
    if "small_p99_alone_ms" in r:
        ratio = r["small_p99_with_heavy_ms"] / r["small_p99_alone_ms"]
        r["neighbour_ratio"] = ratio
        print(f"| 100-object world p99 alone / beside a {r['heavy_objects']}-object world | "
              f"{r['small_p99_alone_ms']:.2f} / {r['small_p99_with_heavy_ms']:.2f} ms ({ratio:.2f}x) | <= 3x "
              f"| {ok(ratio <= TARGETS['neighbour_ratio'])} |")
        print(f"| the heavy world's own frames/s meanwhile | {r['heavy_frames_per_s']:.1f} | | |")
        if "small_p99_heavy_elsewhere_ms" in r:
            print(f"| the same, the heavy world on another replica (no server in common) | "
                  f"{r['small_p99_heavy_elsewhere_ms']:.2f} ms "
                  f"({r['small_p99_heavy_elsewhere_ms'] / r['small_p99_alone_ms']:.2f}x) | | |")
    if pids:
        during = f"frames {r['others_cores']:.2f}, echo {r['echo_others_cores']:.2f}"
        if "small_p99_alone_ms" in r:
            during += f", alone {r['alone_others_cores']:.2f}, beside {r['beside_others_cores']:.2f}"
        print(f"| other processes' CPU during each measure (cores of {r['cores']}) | {during} | | |")
    if getattr(args, "json", False):
        print(json.dumps(dict(bench="sapgrid-worlds", **r)))
    return 0
