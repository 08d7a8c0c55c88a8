"""Server configuration: one frozen dataclass, built from command-line flags and SAPGRID_* environment variables.

Precedence: flag > environment variable > default. Every field has an environment variable named
``SAPGRID_<FIELD>`` in upper case (e.g. ``SAPGRID_LISTEN=0.0.0.0:50051``).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields

from sapgrid import DEFAULT_ADDRESS

MIB = 1 << 20
#: --heavy-frame-policy's values (server/heavy.py): SCHED_IDLE plus the nice value, or the nice value alone
HEAVY_FRAME_POLICIES = ("idle", "nice")


@dataclass(frozen=True)
class ServerConfig:
    """Configuration of one sapgrid server.

    listen : gRPC listen address ``HOST:PORT`` (port 0 picks a free port).
    metrics_port : Prometheus ``/metrics`` port on the same host as ``metrics_host``; 0 picks a free
        port, -1 disables the metrics endpoint.
    metrics_host : address the metrics HTTP server binds.
    worker_threads : long calls served at once (open frame streams, subscriptions, pair streams, frame
        and query calls), and the call pool's threads for them: a call other than a frame stream runs in
        one, which also does its engine work, and holds it while open (a frame stream's small frames are
        applied in the server's loop). One more is answered RESOURCE_EXHAUSTED. Short calls (world
        management) have threads of their own beyond these; the health check is answered in the loop
        (server/admission.py).
    engine_threads : numba threads per world for the parallel cell apply (0: numba default).
    max_message_bytes : largest gRPC message accepted or sent, both directions (a 100k-object frame
        is ~3 MB).
    queue_size : frames and queries that may wait per world; one more is answered RESOURCE_EXHAUSTED.
    subscriber_queue : deltas buffered per subscriber before a slow subscriber is dropped.
    max_worlds : worlds the server holds at most.
    default_world : name of a 2D world created at start ("" for none).
    default_world_dims, default_world_bounds, default_world_cells : its configuration.
    grace_seconds : how long a graceful shutdown waits for in-flight calls and queued frames.
    keepalive_seconds : server keepalive ping interval (fit for long streams behind load balancers).
    validate : call World.validate() after every frame (slow; for debugging).
    echo : serve the bench-only EchoService (off by default; replies bounded by max_message_bytes).
    tls_cert, tls_key, tls_client_ca : TLS of the gRPC port (files re-read when they change); with the
        client CA, mutual TLS. metrics_tls_cert, metrics_tls_key : HTTPS for /metrics.
    auth_file : tokens and certificate subjects with roles (server/auth.py); without it the server
        listens only on loopback unless ``insecure``. reflection : "on" or "off". health_listen : a
        plaintext port of the health service alone (probes that cannot speak TLS).
    max_calls_per_client, max_worlds_per_client, max_objects_per_client : per-client quotas (0: none).
    stream_idle_seconds, subscriber_stall_seconds : end idle frame streams and stalled server streams (0: never).
    heavy_frame_objects, heavy_frame_nice, heavy_frame_policy : frames of worlds of at least this many
        objects, while a smaller world streams, run on heavy-frame threads whose nice value is raised by
        heavy_frame_nice and, with the policy "idle", under SCHED_IDLE (server/heavy.py; 0 objects: off).
    in_loop_frame_bytes : a stream's frame of at most this many bytes is applied in the server's event
        loop when its world is free (server/aio.py); a bigger one in a thread of the call pool (0: all).
    """

    listen: str = DEFAULT_ADDRESS
    metrics_port: int = 9464
    metrics_host: str = "127.0.0.1"
    worker_threads: int = 256
    engine_threads: int = 0
    max_message_bytes: int = 64 * MIB
    queue_size: int = 64
    subscriber_queue: int = 1024
    subscriber_queue_bytes: int = 64 * MIB
    max_world_bytes: int = 4096 * MIB
    max_server_bytes: int = 0
    max_worlds: int = 256
    default_world: str = "default"
    default_world_dims: int = 2
    default_world_bounds: tuple = (0.0, 0.0, 1000.0, 1000.0)
    default_world_cells: tuple = (8, 8)
    grace_seconds: float = 10.0
    keepalive_seconds: float = 30.0
    validate: bool = False
    echo: bool = False
    log_format: str = "text"
    cluster_members: str = ""
    cluster_self: str = ""
    data_dir: str = ""
    fsync: str = "everysec"
    snapshot_bytes: int = 64 * MIB
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    metrics_tls_cert: str = ""
    metrics_tls_key: str = ""
    auth_file: str = ""
    health_listen: str = ""
    insecure: bool = False
    reflection: str = "on"
    max_calls_per_client: int = 0
    max_worlds_per_client: int = 0
    max_objects_per_client: int = 0
    stream_idle_seconds: float = 300.0
    subscriber_stall_seconds: float = 60.0
    heavy_frame_objects: int = 32768
    heavy_frame_nice: int = 10
    heavy_frame_policy: str = "idle"
    in_loop_frame_bytes: int = 64 * 1024

    def __post_init__(self):
        def bad(field: str, message: str):
            exc = ValueError(message)
            exc.field = field                 # from_args names the flag or variable it came from
            raise exc

        if ":" not in self.listen:
            bad("listen", f"must be HOST:PORT, got {self.listen!r}")
        if self.fsync not in ("always", "everysec", "no"):
            bad("fsync", f"must be always, everysec or no, got {self.fsync!r}")
        if self.snapshot_bytes < 4096:
            bad("snapshot_bytes", "must be >= 4096")
        if self.log_format not in ("text", "json"):
            bad("log_format", f"must be text or json, got {self.log_format!r}")
        if not -1 <= self.metrics_port <= 65535:
            bad("metrics_port", "must be a port (0: a free one, -1: off)")
        if not 2 <= self.worker_threads <= 4096:
            bad("worker_threads", "must be in [2, 4096]")
        if not 0 <= self.in_loop_frame_bytes <= 16 * MIB:
            bad("in_loop_frame_bytes", "must be in [0, 16 MiB] (0: every frame in a thread of the call pool)")
        if not 4 * 1024 <= self.max_message_bytes <= 2**31 - 1:
            bad("max_message_bytes", "must be in [4 KiB, 2 GiB)")
        for name in ("queue_size", "subscriber_queue", "subscriber_queue_bytes", "max_worlds"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        object.__setattr__(self, "default_world_bounds", tuple(float(x) for x in self.default_world_bounds))
        object.__setattr__(self, "default_world_cells", tuple(int(x) for x in self.default_world_cells))
        if bool(self.tls_cert) != bool(self.tls_key):
            bad("tls_key" if self.tls_cert else "tls_cert", "--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            bad("tls_client_ca", "mutual TLS needs the server's own --tls-cert and --tls-key")
        if bool(self.metrics_tls_cert) != bool(self.metrics_tls_key):
            bad("metrics_tls_key" if self.metrics_tls_cert else "metrics_tls_cert",
                "--metrics-tls-cert and --metrics-tls-key go together")
        if self.health_listen and ":" not in self.health_listen:
            bad("health_listen", f"must be HOST:PORT, got {self.health_listen[:80]!r}")
        if self.reflection not in ("on", "off"):
            bad("reflection", f"must be on or off, got {self.reflection[:40]!r}")
        for name in ("max_calls_per_client", "max_worlds_per_client", "max_objects_per_client",
                     "stream_idle_seconds", "subscriber_stall_seconds"):
            if not getattr(self, name) >= 0:
                bad(name, "must be >= 0 (0: off)")
        if self.heavy_frame_objects < 0:
            bad("heavy_frame_objects", "must be >= 0 (0: off)")
        if not 0 <= self.heavy_frame_nice <= 19:
            bad("heavy_frame_nice", "must be in [0, 19]")
        if self.heavy_frame_policy not in HEAVY_FRAME_POLICIES:
            bad("heavy_frame_policy", f"must be {' or '.join(HEAVY_FRAME_POLICIES)}, got "
                                      f"{self.heavy_frame_policy[:40]!r}")
        from .cluster import from_config
        try:
            from_config(self.cluster_members, self.cluster_self)  # raises on a bad member list
        except ValueError as exc:
            bad("cluster_members" if self.cluster_members else "cluster_self", str(exc))


def _floats(text: str) -> tuple:
    return tuple(float(x) for x in text.replace(",", " ").split())


def _ints(text: str) -> tuple:
    return tuple(int(x) for x in text.replace(",", " ").split())


def _bool(text: str) -> bool:
    return str(text).strip().lower() in ("1", "true", "yes", "on")


_PARSERS = {int: int, float: float, str: str, bool: _bool}
_TUPLES = {"default_world_bounds": _floats, "default_world_cells": _ints}
_HELP = {
    "listen": f"gRPC listen address HOST:PORT (default {DEFAULT_ADDRESS}; port 0 = free port)",
    "metrics_port": "Prometheus /metrics port (default 9464; 0 = free port, -1 = off)",
    "metrics_host": "address of the metrics HTTP server (default 127.0.0.1)",
    "worker_threads": "long calls served at once (frame streams, subscriptions, frame/query calls), and the "
                      "call pool's threads for them (a stream's small frames are applied in the server's "
                      "loop); health checks and world management never wait for one (default 256)",
    "engine_threads": "numba threads per world for the cell apply (default 0 = numba default)",
    "in_loop_frame_bytes": "a stream's frame of at most this many bytes is applied in the server's event loop "
                           "when its world is free, a bigger one in a thread of the call pool (default 65536, "
                           "~2,300 moving boxes; 0: every frame in a thread)",
    "max_message_bytes": "largest gRPC message, both directions (default 64 MiB)",
    "queue_size": "frames/queries waiting per world before RESOURCE_EXHAUSTED (default 64)",
    "subscriber_queue": "deltas buffered per subscriber before it is dropped (default 1024)",
    "subscriber_queue_bytes": "bytes of deltas buffered per subscriber before it is dropped (default 64 MiB)",
    "max_world_bytes": "memory budget of one world, bytes (its grid at CreateWorld, its objects in frames; "
                       "default 4 GiB; 0: none)",
    "max_server_bytes": "memory budget of all worlds together, bytes (default 0: 3/4 of the machine's memory)",
    "max_worlds": "most worlds the server holds (default 256)",
    "default_world": 'name of the 2D world created at start, "" for none (default "default")',
    "default_world_dims": "dims of the default world (default 2)",
    "default_world_bounds": 'bounds of the default world, "xmin,ymin,xmax,ymax" (default 0,0,1000,1000)',
    "default_world_cells": 'cells per axis of the default world, "cx,cy" (default 8,8)',
    "grace_seconds": "graceful shutdown: wait this long for in-flight calls (default 10)",
    "keepalive_seconds": "server keepalive ping interval (default 30)",
    "validate": "validate the world's invariants after every frame (slow)",
    "log_format": "log lines as plain text or as JSON objects, one per line: text or json (default text)",
    "echo": "also serve the bench-only EchoService (the transport baseline of `sapgrid bench --server`); off by "
            "default, and its replies are bounded by --max-message-bytes",
    "cluster_members": "the cluster's replicas HOST:PORT,HOST:PORT,... (the proxy's ring); worlds the ring "
                       "gives to another replica are refused (default: not in a cluster); @PATH: the list in a "
                       "file, read again whenever the file changes",
    "cluster_self": "this replica's HOST:PORT in --cluster-members",
    "data_dir": "keep worlds durable in this directory: a write-ahead log of each world's frames and periodic "
                "snapshots, recovered on start (default: none, worlds live in memory only)",
    "fsync": "with --data-dir: always (a frame is answered once its log record is on disk), everysec (fsync at "
             "most a second behind; default) or no (the OS decides)",
    "snapshot_bytes": "with --data-dir: snapshot a world and cut its log when the log passes this many bytes "
                      "(default 64 MiB)",
    "tls_cert": "serve gRPC over TLS with this certificate (PEM; re-read when the file changes)",
    "tls_key": "the private key of --tls-cert (PEM)",
    "tls_client_ca": "mutual TLS: require client certificates signed by this CA (PEM)",
    "metrics_tls_cert": "serve /metrics over HTTPS with this certificate (PEM)",
    "metrics_tls_key": "the private key of --metrics-tls-cert (PEM)",
    "auth_file": "tokens and client certificates with their roles on worlds (TOML; reloaded on SIGHUP); "
                 "without it every caller may do everything, and only a loopback --listen is allowed",
    "health_listen": "also serve the health service alone, in plaintext, on HOST:PORT (for probes that cannot speak "
                     "TLS, e.g. Kubernetes' gRPC probes; default: none)",
    "insecure": "allow a non-loopback --listen without --auth-file (anyone who reaches the port may do anything)",
    "reflection": "serve gRPC server reflection: on or off (default on)",
    "max_calls_per_client": "long calls one client (token name, or peer address without auth) may hold at once "
                            "(default 0: no per-client limit)",
    "max_worlds_per_client": "worlds one client may have created and hold (default 0: no limit)",
    "max_objects_per_client": "live objects in the worlds one client created (default 0: no limit)",
    "stream_idle_seconds": "end a frame stream that sends no frame for this long, freeing its slot "
                           "(default 300; 0: never)",
    "subscriber_stall_seconds": "end a subscription (or any server stream) whose client takes no message for this "
                                "long, freeing its slot (default 60; 0: never)",
    "heavy_frame_objects": "frames of worlds of at least this many objects run, while a smaller world streams, on "
                           "heavy-frame threads at a lower CPU priority (see --heavy-frame-nice and "
                           "--heavy-frame-policy), so small worlds' frames go first (default 32768; 0: every frame "
                           "on its call's thread)",
    "heavy_frame_nice": "how much lower those threads' priority is: their nice value is raised by this much, "
                        "0-19 (default 10; Linux)",
    "heavy_frame_policy": "those threads' scheduling: idle (SCHED_IDLE as well as the nice value: any other "
                          "thread's wake-up preempts them; default) or nice (the nice value alone: a heavy world "
                          "keeps a share of the cores that small worlds keep busy; Linux)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per ServerConfig field (defaults None: unset flags fall back to env, then default)."""
    for f in fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_const", const=True, default=None, help=_HELP[f.name])
        else:
            parser.add_argument(flag, default=None, metavar=f.name.upper(), help=_HELP[f.name])


def from_args(args: argparse.Namespace | None = None, env: dict | None = None, **overrides) -> ServerConfig:
    """Build the config: explicit overrides > flags > SAPGRID_* environment variables > defaults."""
    env = os.environ if env is None else env
    values, sources = {}, {}
    for f in fields(ServerConfig):
        raw, source = overrides.get(f.name), f.name
        if raw is None and args is not None:
            raw, source = getattr(args, f.name, None), "--" + f.name.replace("_", "-")
        if raw is None:
            source = "SAPGRID_" + f.name.upper()
            raw = env.get(source)
        if raw is None:
            continue
        if isinstance(raw, str):
            parse = _TUPLES.get(f.name) or _PARSERS[type(f.default)]
            try:
                raw = parse(raw)
            except ValueError:
                kind = {int: "an integer", float: "a number"}.get(type(f.default), "a comma-separated list")
                raise ValueError(f"{source}={raw[:80]!r}: not {kind}") from None
        values[f.name] = raw
        sources[f.name] = source
    try:
        return ServerConfig(**values)
    except ValueError as exc:
        field = getattr(exc, "field", "")
        raise ValueError(f"{sources.get(field, field)}: {exc}" if field in sources else str(exc)) from None
