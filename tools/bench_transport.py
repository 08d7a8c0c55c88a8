"""``python -m sapgrid.tools.bench_transport``: what gRPC alone does with many paced streams, no engine.

S streams of B-byte messages, each paced at H messages/s (``--aligned``: every stream at the same
instants; else their ticks spread evenly over one period), answered with 120 bytes (a small Delta's
size), through two echo servers measured in turns on the same machine:

* ``sync``: ``sapgrid serve --echo``, the product's server (gRPC's thread-per-call server with its
  interceptors), serving the bench-only ``EchoService``;
* ``aio``: a bare ``grpc.aio`` server (one event loop) of the same ``EchoService`` (``--serve-aio``
  starts one and prints ``listening on HOST:PORT``).

For each: messages delivered of those asked (a stream that falls behind its schedule sends at once
and stops at the end), round trip p50 / p99, server CPU per message and the load generator's CPU per
message (one asyncio loop with ``grpc.aio``, ``sapgrid.tools.bench_worlds``'s echo streams, each
sending its warm-up messages before the schedule starts), and the cores the machine's other processes
used meanwhile. This is
the floor under ``sapgrid bench --server spawn --worlds W``: a frame cannot cost less than its echo.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys

import grpc
import numpy as np

from sapgrid.tools.bench_worlds import _echo_stream, _measured, _ms, _Start
from sapgrid.v1 import echo_service_pb2 as echo_pb
from sapgrid.v1 import echo_service_pb2_grpc as echo_grpc

REPLY_BYTES = 120
KINDS = ("sync", "aio")


async def _serve_aio(listen: str, limit: int) -> None:
    from sapgrid.server.errors import InvalidInput
    from sapgrid.server.servicer import EchoServicer

    class AioEcho(EchoServicer):
        """EchoServicer's answers on the event loop."""

        async def Echo(self, request, context):
            try:
                return echo_pb.EchoResponse(payload=self._reply(request.payload, request.reply_bytes))
            except InvalidInput as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

        async def EchoStream(self, request_iterator, context):
            async for request in request_iterator:
                try:
                    reply = self._reply(request.payload, request.reply_bytes)
                except InvalidInput as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                yield echo_pb.EchoStreamResponse(payload=reply)

    server = grpc.aio.server(options=[("grpc.max_send_message_length", limit),
                                      ("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)])
    echo_grpc.add_EchoServiceServicer_to_server(AioEcho(limit), server)
    port = server.add_insecure_port(listen)
    if not port:
        raise SystemExit(f"bench_transport --serve-aio {listen}: cannot listen there")
    await server.start()
    print(f"listening on {listen.rsplit(':', 1)[0]}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


class _AioServer:
    """``--serve-aio`` in a subprocess: ``address`` and ``proc`` once it listens; ``stop()`` = SIGTERM."""

    def __init__(self, limit: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "sapgrid.tools.bench_transport", "--serve-aio",
                                      "127.0.0.1:0", "--max-message-bytes", str(limit)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the grpc.aio echo server did not start: {line!r}")
        self.address = line.split()[2]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


async def _streams(address: str, streams: int, size: int, hz: float, seconds: float, aligned: bool):
    payload = bytes(size)
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", -1),
                                                           ("grpc.max_send_message_length", -1)]) as channel:
        stub = echo_grpc.EchoServiceStub(channel)
        rtts: list[float] = []
        start = _Start(streams, hz, aligned)
        done = await asyncio.gather(*(_echo_stream(stub, f"echo-{k}", payload, REPLY_BYTES, hz, seconds, start, k,
                                                   rtts) for k in range(streams)))
    return sum(done), rtts


def measure_one(address: str, pid: int, streams: int, size: int, hz: float, seconds: float, aligned: bool) -> dict:
    """One run of the paced echo streams against one server: delivered, p50 / p99, CPU per message."""
    (delivered, rtts), server_cpu, gen_cpu, others = _measured(
        [pid] if pid else [], lambda: asyncio.run(_streams(address, streams, size, hz, seconds, aligned)))
    asked = int(streams * np.ceil(seconds * hz))
    return dict(asked=asked, delivered=delivered, p50_ms=_ms(rtts, 50), p99_ms=_ms(rtts, 99),
                server_cpu_ms=server_cpu * 1e3 / max(delivered, 1), generator_cpu_ms=gen_cpu * 1e3 / max(delivered, 1),
                others_cores=others)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sapgrid.tools.bench_transport", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64, help="paced streams (default 64)")
    ap.add_argument("--bytes", type=int, default=24_030, help="bytes a message (default: a 1,000-object frame's)")
    ap.add_argument("--hz", type=float, default=30.0, help="messages/s per stream (default 30)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per measure (default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the servers in turn (default 2)")
    ap.add_argument("--aligned", action="store_true", help="every stream sends at the same instants")
    ap.add_argument("--json", action="store_true", help="end the output with one JSON line of every run")
    ap.add_argument("--serve-aio", metavar="HOST:PORT", help="only serve the grpc.aio echo server there")
    ap.add_argument("--max-message-bytes", type=int, default=64 << 20, help="with --serve-aio: message limit")
    args = ap.parse_args(argv)
    if args.serve_aio:
        asyncio.run(_serve_aio(args.serve_aio, args.max_message_bytes))
        return 0
    for flag, value in (("--streams", args.streams), ("--bytes", args.bytes), ("--rounds", args.rounds)):
        if value < 1:
            ap.error(f"{flag} {value}: must be at least 1")
    if not (args.hz > 0 and args.seconds > 0):
        ap.error("--hz and --seconds must be positive")
    from sapgrid.tools.spawn import SpawnedServer

    limit = max(64 << 20, args.bytes + 1024)
    sync = SpawnedServer("--default-world", "", "--echo", "--metrics-port", "-1", "--max-message-bytes", str(limit),
                         "--worker-threads", str(max(256, args.streams + 8)))
    servers = {"sync": (sync.address, sync.proc.pid)}
    try:
        sync.wait_kernels()             # (the load's threads end: their CPU would leave the measure's readings)
        aio = _AioServer(limit)
    except BaseException:
        sync.stop()
        raise
    servers["aio"] = (aio.address, aio.proc.pid)
    runs = []
    print(f"bench_transport: {args.streams} streams x {args.bytes} B x {args.hz:g} Hz for {args.seconds:g} s, "
          f"{'aligned' if args.aligned else 'spread'} phases, {args.rounds} rounds", flush=True)
    print("| round | server | delivered / asked | p50 / p99 ms | server CPU ms/msg | generator CPU ms/msg "
          "| other processes' cores |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    try:
        for r in range(args.rounds):
            for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):       # who goes first alternates
                out = dict(round=r + 1, server=kind, **measure_one(*servers[kind], args.streams, args.bytes,
                                                                   args.hz, args.seconds, args.aligned))
                runs.append(out)
                share = out['delivered'] / out['asked']
                print(f"| {r + 1} | {kind} | {out['delivered']} / {out['asked']} ({share:.1%}) "
                      f"| {out['p50_ms']:.2f} / {out['p99_ms']:.2f} | {out['server_cpu_ms']:.3f} "
                      f"| {out['generator_cpu_ms']:.3f} | {out['others_cores']:.2f} |", flush=True)
    finally:
        aio.stop()
        sync.stop()
    if args.json:
        print(json.dumps(dict(bench="sapgrid-transport", streams=args.streams, bytes=args.bytes, hz=args.hz,
                              seconds=args.seconds, aligned=args.aligned, runs=runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
