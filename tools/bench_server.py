"""``sapgrid bench --server HOST:PORT``: benchmark the service over loopback gRPC.

1. Round trip, crowd2d-10k (every object moves every tick): one stream, one frame at a time;
   per tick the wall time from sending the frame to receiving its delta. Median and p99.
2. Throughput, crowd2d-100k: all ticks pipelined over one stream (``--window`` frames in flight);
   frames per second sustained.
3. Transport baseline: the same frame bytes over the bench-only ``EchoService.EchoStream`` (reply of
   the same size as the frame's answer), interleaved tick by tick with step 1 so both see the same
   machine. Reports median(round trip - engine time) / median(echo round trip).

4. Security's cost (with ``--server spawn``): a second server with TLS and an auth file is spawned,
   and each tick of step 1 is also sent over TLS with a bearer token to it (interleaved, same machine);
   reports median round trip over TLS+token / plaintext without auth.

Targets (printed as ok / MISSED): 10k median < 8 ms, p99 < 16 ms; 100k >= 20 frames/s; overhead
ratio <= 1.25; TLS+token / plaintext <= 1.15. ``--server spawn`` starts the servers in subprocesses first. Frames are encoded before
the timed loop (what is timed is the service, not numpy -> bytes in this client).
"""
from __future__ import annotations

import argparse
import json
import queue
import sys
import time

import numpy as np

from sapgrid.client import Client
from sapgrid.client.codec import encode_frame
from sapgrid.v1 import echo_service_pb2 as echo_pb
from sapgrid.v1 import echo_service_pb2_grpc as echo_grpc
from sapgrid.v1 import sapgrid_service_pb2 as pb

_END = object()
TARGETS = dict(rtt_median_ms=8.0, rtt_p99_ms=16.0, fps=20.0, overhead_ratio=1.25, tls_ratio=1.15)


def _add_once(parser, *flags, **kw):
    if not any(f in parser._option_string_actions for f in flags):
        parser.add_argument(*flags, **kw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``sapgrid bench --server`` (shared ones are added only if missing)."""
    _add_once(parser, "--server", default=None, metavar="HOST:PORT",
              help='benchmark the server at HOST:PORT ("spawn": start one in a subprocess)')
    _add_once(parser, "--ticks", type=int, default=100, help="ticks per trace (default 100)")
    _add_once(parser, "--seed", type=int, default=1, help="trace seed (default 1)")
    _add_once(parser, "--json", action="store_true", help="end the output with one JSON line of results")
    _add_once(parser, "--rtt-objects", type=int, default=10_000, help="server bench: round-trip world size")
    _add_once(parser, "--fps-objects", type=int, default=100_000, help="server bench: throughput world size")
    _add_once(parser, "--fps-ticks", type=int, default=60, help="server bench: throughput ticks (default 60)")
    _add_once(parser, "--window", type=int, default=4, help="server bench: frames in flight (default 4)")
    _add_once(parser, "--data-dir-compare", action="store_true",
              help="with --server spawn: what durable worlds cost (sapgrid.tools.bench_durable): servers in memory, "
                   "--data-dir --fsync everysec and always, in turn; snapshot, restore, recovery after kill -9")
    _add_once(parser, "--durable-rounds", type=int, default=2,
              help="--data-dir-compare: rounds of the servers in turn (default 2)")


def _trace(n: int, ticks: int, seed: int) -> dict:
    """crowd2d-N: every object moves every tick (sapgrid.tools.traces)."""
    from sapgrid.tools import traces

    return traces.generate(f"crowd2d-{n}", ticks=ticks, seed=seed)


def _frames(tr: dict, world: str) -> tuple[pb.StreamFramesRequest, list[pb.StreamFramesRequest]]:
    init = pb.StreamFramesRequest()
    encode_frame(world, 0, add_ids=tr["init_ids"], add_boxes=tr["init_boxes"], into=init.frame)
    out = []
    off = tr["upd_off"]
    for t in range(int(tr["ticks"])):
        s, e = off[t], off[t + 1]
        req = pb.StreamFramesRequest()
        encode_frame(world, t + 1, update_ids=tr["upd_ids"][s:e], update_boxes=tr["upd_boxes"][s:e], into=req.frame)
        out.append(req)
    return init, out


def _q(a, p) -> float:
    return float(np.percentile(np.asarray(a), p)) if len(a) else float("nan")


def _world(client: Client, name: str, tr: dict) -> None:
    try:
        client.delete_world(name)
    except Exception:
        pass
    client.create_world(name, dims=int(tr["dims"]), bounds=tuple(float(x) for x in tr["bounds"]),
                        expected_objects=len(tr["init_ids"]))


def bench_rtt(client: Client, n: int, ticks: int, seed: int, secure: Client | None = None) -> tuple[dict, dict]:
    """Round trips of frames and, interleaved tick by tick (same conditions), of the echo baseline and
    (``secure``: a client over TLS with a token to a second server) of the same frame over TLS."""
    tr = _trace(n, ticks + 10, seed)
    name = f"bench-rtt-{n}"
    _world(client, name, tr)
    init, frames = _frames(tr, name)
    stream = client.stream(name)
    echo_q: queue.SimpleQueue = queue.SimpleQueue()
    echo_calls = echo_grpc.EchoServiceStub(client.channel).EchoStream(iter(echo_q.get, _END))
    tls_stream = None
    if secure is not None:
        _world(secure, name, tr)
        tls_stream = secure.stream(name)
    try:
        stream.send_request(init)
        stream.recv()
        if tls_stream is not None:
            tls_stream.send_request(init)
            tls_stream.recv()
        rtt, engine, server, echo, sizes, replies, tls = [], [], [], [], [], [], []
        def tls_tick(i, f):
            t4 = time.perf_counter()
            tls_stream.send_request(f)
            tls_stream.recv()
            if i >= 10:
                tls.append(time.perf_counter() - t4)

        for i, f in enumerate(frames):
            if tls_stream is not None and i % 2:       # the two runs alternate which goes first
                tls_tick(i, f)
            t0 = time.perf_counter()
            stream.send_request(f)
            d = stream.recv()
            t1 = time.perf_counter()
            if tls_stream is not None and not i % 2:
                tls_tick(i, f)
            # the echo gets the frame's bytes and answers as many bytes as the delta answer had
            reply = 16 * (len(d.created) + len(d.deleted)) + 120
            req = echo_pb.EchoStreamRequest(payload=f.SerializeToString(), reply_bytes=reply)
            t2 = time.perf_counter()
            echo_q.put(req)
            next(echo_calls)
            t3 = time.perf_counter()
            if i >= 10:                      # the first ticks warm up JIT paths and connection windows
                rtt.append(t1 - t0)
                engine.append(d.stats.total_s)
                server.append(d.server_s)
                echo.append(t3 - t2)
                sizes.append(f.ByteSize())
                replies.append(reply)
    finally:
        echo_q.put(_END)
        echo_calls.cancel()
        stream.close()
        client.delete_world(name)
        if tls_stream is not None:
            tls_stream.close()
            secure.delete_world(name)
    rtt_ms, eng_ms, echo_ms = np.array(rtt) * 1e3, np.array(engine) * 1e3, np.array(echo) * 1e3
    return (dict(objects=n, ticks=len(rtt), frame_bytes=int(np.median(sizes)), reply_bytes=int(np.median(replies)),
                 rtt_median_ms=_q(rtt_ms, 50), rtt_p99_ms=_q(rtt_ms, 99), engine_median_ms=_q(eng_ms, 50),
                 server_median_ms=_q(np.array(server) * 1e3, 50), overhead_median_ms=_q(rtt_ms - eng_ms, 50),
                 tls_token_median_ms=_q(np.array(tls) * 1e3, 50), tls_token_p99_ms=_q(np.array(tls) * 1e3, 99)),
            dict(echo_median_ms=_q(echo_ms, 50), echo_p99_ms=_q(echo_ms, 99)))


def pipelined(stream, requests, window: int):
    """Send ready ``requests`` over a frame ``stream`` with at most ``window`` in flight; yield each answer,
    in order."""
    sent = 0
    for _ in range(len(requests)):
        while sent < len(requests) and stream.in_flight < window:
            stream.send_request(requests[sent])
            sent += 1
        yield stream.recv()


def bench_fps(client: Client, n: int, ticks: int, seed: int, window: int) -> dict:
    tr = _trace(n, ticks, seed)
    name = f"bench-fps-{n}"
    _world(client, name, tr)
    init, frames = _frames(tr, name)
    stream = client.stream(name)
    try:
        stream.send_request(init)
        stream.recv()
        warm = min(3, len(frames) // 4)
        for f in frames[:warm]:
            stream.send_request(f)
            stream.recv()
        timed = frames[warm:]
        t0 = time.perf_counter()
        engine = [d.stats.total_s for d in pipelined(stream, timed, window)]
        elapsed = time.perf_counter() - t0
    finally:
        stream.close()
        client.delete_world(name)
    return dict(objects=n, ticks=len(timed), seconds=elapsed, fps=len(timed) / elapsed,
                engine_median_ms=_q(np.array(engine) * 1e3, 50), frame_mb=timed[0].ByteSize() / 1e6)


def _ok(good: bool) -> str:
    return "ok" if good else "MISSED"


def _secure_server(directory: str):
    """A spawned server with TLS (a throwaway CA made with trustme) and an auth file with one admin
    token; returns (server, Client over TLS with the token)."""
    import os

    import trustme

    from sapgrid.server.auth import append_token
    from sapgrid.tools.spawn import SpawnedServer

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {k: os.path.join(directory, k) for k in ("ca.pem", "server.pem", "server.key", "auth.toml")}
    ca.cert_pem.write_to_path(paths["ca.pem"])
    cert.private_key_pem.write_to_path(paths["server.key"])
    with open(paths["server.pem"], "wb") as f:
        f.write(b"".join(p.bytes() for p in cert.cert_chain_pems))
    token = append_token(paths["auth.toml"], "bench", "admin", "*")
    server = SpawnedServer("--default-world", "", "--tls-cert", paths["server.pem"], "--tls-key", paths["server.key"],
                           "--auth-file", paths["auth.toml"])
    server.wait_kernels()
    return server, Client(server.address, timeout=600, ca_file=paths["ca.pem"], token=token)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "data_dir_compare", False):
        from sapgrid.tools import bench_durable

        args.rounds = args.durable_rounds
        return bench_durable.run(args)
    import tempfile

    spawned = secure_server = secure = None
    address = args.server
    tmp = tempfile.TemporaryDirectory(prefix="sapgrid-bench-")
    if address == "spawn":
        from sapgrid.tools.spawn import SpawnedServer

        spawned = SpawnedServer("--default-world", "", "--echo")
        spawned.wait_kernels()          # (measured once the server's start is over)
        address = spawned.address
        secure_server, secure = _secure_server(tmp.name)
    try:
        with Client(address, timeout=600) as client:
            client.wait_ready(30)
            ticks = max(20, int(getattr(args, "ticks", 100) or 100))
            seed = int(getattr(args, "seed", 1) or 1)
            print(f"sapgrid bench --server {address}: crowd2d-{args.rtt_objects} round trip ({ticks} ticks"
                  f"{'; plaintext, echo and TLS+token interleaved' if secure else ''})...", flush=True)
            rtt, echo = bench_rtt(client, args.rtt_objects, ticks, seed, secure)
            ratio = rtt["overhead_median_ms"] / echo["echo_median_ms"]
            print(f"crowd2d-{args.fps_objects} throughput ({args.fps_ticks} ticks, window {args.window})...",
                  flush=True)
            fps = bench_fps(client, args.fps_objects, args.fps_ticks, seed, args.window)
    finally:
        if secure is not None:
            secure.close()
        for s in (spawned, secure_server):
            if s is not None:
                s.stop()
        tmp.cleanup()
    tls_ratio = rtt["tls_token_median_ms"] / rtt["rtt_median_ms"] if secure is not None else None
    checks = dict(rtt_median=rtt["rtt_median_ms"] < TARGETS["rtt_median_ms"],
                  rtt_p99=rtt["rtt_p99_ms"] < TARGETS["rtt_p99_ms"], fps=fps["fps"] >= TARGETS["fps"],
                  overhead=ratio <= TARGETS["overhead_ratio"])
    if tls_ratio is not None:
        checks["tls"] = tls_ratio <= TARGETS["tls_ratio"]
    n1, n2 = args.rtt_objects, args.fps_objects
    print()
    print("| measure | value | target | |")
    print("|---|---:|---:|---|")
    print(f"| crowd2d-{n1} round trip median | {rtt['rtt_median_ms']:.2f} ms | < 8 ms | {_ok(checks['rtt_median'])} |")
    print(f"| crowd2d-{n1} round trip p99 | {rtt['rtt_p99_ms']:.2f} ms | < 16 ms | {_ok(checks['rtt_p99'])} |")
    print(f"| crowd2d-{n1} engine median | {rtt['engine_median_ms']:.2f} ms | | |")
    print(f"| crowd2d-{n1} round trip - engine, median | {rtt['overhead_median_ms']:.2f} ms | | |")
    print(f"| echo of the same bytes ({rtt['frame_bytes'] / 1e3:.0f} kB in, {rtt['reply_bytes']} B out), median "
          f"| {echo['echo_median_ms']:.2f} ms | | |")
    print(f"| (round trip - engine) / echo | {ratio:.2f}x | <= 1.25x | {_ok(checks['overhead'])} |")
    if tls_ratio is not None:
        print(f"| crowd2d-{n1} round trip over TLS with a token, median (p99) | {rtt['tls_token_median_ms']:.2f} ms "
              f"({rtt['tls_token_p99_ms']:.2f}) | | |")
        print(f"| TLS+token / plaintext without auth, median | {tls_ratio:.2f}x | <= 1.15x | {_ok(checks['tls'])} |")
    print(f"| crowd2d-{n2} frames/s over one stream ({fps['frame_mb']:.1f} MB/frame) | {fps['fps']:.1f} | >= 20 "
          f"| {_ok(checks['fps'])} |")
    print(f"| crowd2d-{n2} engine median | {fps['engine_median_ms']:.2f} ms | | |")
    if getattr(args, "json", False):
        print(json.dumps(dict(bench="sapgrid-server", rtt=rtt, echo=echo, overhead_ratio=ratio, fps=fps,
                              tls_ratio=tls_ratio, checks=checks)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sapgrid bench --server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args(argv)
    if not args.server:
        ap.error("--server HOST:PORT (or spawn) is required")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
