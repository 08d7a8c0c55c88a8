"""Building and running a sapgrid server (STYLE 14: building is separate from running).

    app = build_server(cfg)     # bound (port 0 -> a free port), default world created, not started
    app.start()
    ...
    app.stop()                  # NOT_SERVING, stop(grace): in-flight calls and waiting frames finish

``serve(cfg)`` does all of it in the foreground and stops gracefully on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio as grpc_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer
from grpc_reflection.v1alpha import reflection

from sapgrid.v1 import echo_service_pb2, echo_service_pb2_grpc, sapgrid_service_pb2

from . import aio, kernels, logs, tracing
from .logs import CallLog
from .admission import RESERVED_THREADS, Admission
from . import auth, quota, tls
from .config import ServerConfig
from .heavy import HeavyFrames
from .metrics import Metrics
from .registry import Registry
from . import cluster
from .servicer import EchoServicer, EchoServicerInLoop, SapgridServicer, add_to_server

log = logging.getLogger("sapgrid.server")

SAPGRID_SERVICE = sapgrid_service_pb2.DESCRIPTOR.services_by_name["SapgridService"].full_name
ECHO_SERVICE = echo_service_pb2.DESCRIPTOR.services_by_name["EchoService"].full_name


def grpc_options(cfg: ServerConfig) -> list[tuple[str, int]]:
    """Channel arguments of the server: bounded message sizes, keepalive for long-lived streams."""
    return [
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.keepalive_time_ms", int(cfg.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.so_reuseport", 0),
    ]


@dataclass
class App:
    """A built server and everything it owns."""

    cfg: ServerConfig
    server: grpc_aio.Server           # gRPC's asyncio server, running in ``io``'s loop (aio.py)
    port: int
    health: HealthServicer
    registry: Registry
    metrics: Metrics
    pool: ThreadPoolExecutor          # the call pool: methods written for threads, frames the loop hands on
    io: aio.EventLoop
    calls: aio.CallContexts           # the outermost interceptor (it refuses new calls once stopping)
    metrics_port: int = -1
    storage: Any = None               # storage.Storage with --data-dir
    default_world: Any = None         # its sapcore.WorldConfig, created at start when there is none
    recovered: Any = None             # storage.Recovered: what recovery found at start
    authenticator: "auth.Authenticator | None" = None
    watchdog: "quota.Watchdog | None" = None
    health_server: "grpc.Server | None" = None    # --health-listen: plaintext health only (threads of its own)
    health_port: int = -1
    certificates: "tls.CertificateFiles | None" = None
    quotas: "quota.ClientQuotas | None" = None

    @property
    def address(self) -> str:
        return f"{self.cfg.listen.rsplit(':', 1)[0]}:{self.port}"

    @property
    def services(self) -> tuple[str, ...]:
        """The services this server offers (the EchoService only with --echo)."""
        return (SAPGRID_SERVICE, ECHO_SERVICE) if self.cfg.echo else (SAPGRID_SERVICE,)

    def start(self) -> None:
        """Start serving. With a data directory, health is NOT_SERVING (and world calls UNAVAILABLE) until
        every world in it is recovered."""
        for name in ("", *self.services):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        kernels.load_all()              # in the background; until then frames are applied in the pool
        self.io.run(self.server.start())
        if self.health_server is not None:
            self.health_server.start()
        if self.watchdog is not None:
            self.watchdog.start()
        if self.storage is not None:
            self.recovered = self.storage.recover(self.registry)
            self.registry.recovering = False
        if self.default_world is not None and self.cfg.default_world not in self.registry.worlds:
            self.registry.create(self.cfg.default_world, self.default_world)
        for name in ("", *self.services):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float | None = None) -> None:
        """Graceful stop: NOT_SERVING, refuse new calls, let in-flight calls and waiting frames finish
        (at most ``grace`` seconds; then the calls still open are cancelled)."""
        if self.io.loop.is_closed():               # stopped already
            return
        grace = self.cfg.grace_seconds if grace is None else grace
        self.health.enter_graceful_shutdown()
        self.calls.refuse("the server is shutting down")      # new calls: UNAVAILABLE (a client tries another)
        # the calls still open when the grace period ends are cancelled (gRPC's stop, which would also refuse
        # new calls itself, but a call arriving as it begins could be answered CANCELLED)
        at_grace = asyncio.run_coroutine_threadsafe(_stop_after(self.server, grace), self.io.loop)
        self.registry.close(grace + 5.0)           # open frame calls end, worlds finish their jobs
        at_grace.cancel()
        try:
            self.io.run(self.server.stop(1.0), 15.0)
        except FutureTimeout:
            log.warning("the server's calls had not all ended 15 s after the shutdown grace period")
        self.io.close()
        if self.storage is not None:
            self.storage.close()                   # snapshots finish, every log is fsynced
        if self.health_server is not None:
            self.health_server.stop(0)
        self.metrics.stop_http()
        self.pool.shutdown(wait=False)
        if self.registry.heavy is not None:
            self.registry.heavy.shutdown()
        if self.watchdog is not None:
            self.watchdog.stop()

    def reload_auth(self) -> bool:
        """Re-read the auth file (SIGHUP); on any error the previous one stays in force."""
        return self.authenticator.reload() if self.authenticator is not None else False


async def _stop_after(server, seconds: float) -> None:
    await asyncio.sleep(seconds)
    # once begun, gRPC's stop runs to its end: cancelled in its midst (``App.stop`` cancels this task once
    # the worlds are closed), it would cancel the server's shared completion future, and the stop that
    # follows would fail with CancelledError (as 3 of 40 stops with grace 0 and an open stream did)
    await asyncio.shield(server.stop(0))


def build_server(cfg: ServerConfig, *, world_factory=None, metrics: Metrics | None = None) -> App:
    """Build (and bind) a server for cfg and create its default world; ``start()`` starts it.

    world_factory: callable(sapcore.WorldConfig) -> world (default sapcore.World); a test seam.
    The server is gRPC's asyncio server in a thread of its own (aio.py): a stream's small frames are
    received, applied and answered in its loop; every other call runs in a thread of the call pool,
    which also runs the call's engine work. Long calls (streams, subscriptions, frame and query calls)
    take one of ``cfg.worker_threads`` slots (one more is answered RESOURCE_EXHAUSTED); the pool has
    ``RESERVED_THREADS`` more threads for short calls, and the health check is answered in the loop, so
    it is answered however many streams are open (admission.py).
    """
    from sapcore import WorldConfig
    from sapcore.errors import ConfigError

    default_world = None
    if cfg.default_world:                       # checked before anything is bound or started
        try:
            default_world = WorldConfig(dims=cfg.default_world_dims, bounds=cfg.default_world_bounds,
                                        cells=cfg.default_world_cells, threads=cfg.engine_threads or None)
        except ConfigError as exc:
            raise StartupError(f"--default-world-*: the default world's configuration: {exc}") from None
    authenticator, certificates = _security(cfg)
    metrics = metrics or Metrics()
    quotas = quota.ClientQuotas(cfg.max_calls_per_client, cfg.max_worlds_per_client, cfg.max_objects_per_client,
                                on_refused=metrics.client_refused)
    registry = Registry(metrics, queue_size=cfg.queue_size, subscriber_limit=cfg.subscriber_queue,
                        subscriber_bytes=cfg.subscriber_queue_bytes,
                        budget=quota.QuotaBudget(cfg.max_world_bytes, cfg.max_server_bytes or _three_quarters_of_memory(),
                                                 quotas),
                        max_worlds=cfg.max_worlds, engine_threads=cfg.engine_threads, validate=cfg.validate,
                        world_factory=world_factory,
                        heavy=HeavyFrames(cfg.heavy_frame_objects, cfg.heavy_frame_nice, policy=cfg.heavy_frame_policy)
                        if cfg.heavy_frame_objects else None)
    admission = Admission(cfg.worker_threads, on_change=metrics.set_call_slots_in_use,
                          on_refused=metrics.call_refused)
    metrics.set_call_slots(cfg.worker_threads)
    quotas.registry = registry
    threads = cfg.worker_threads + RESERVED_THREADS
    pool = ThreadPoolExecutor(threads, thread_name_prefix="sapgrid-call")
    # Calls beyond the threads wait for one (a refused long call gives its thread back at once); the health
    # check is answered in the loop, so it is never refused nor waits behind them.
    io = aio.EventLoop(pool)
    watchdog = quota.Watchdog(cfg.stream_idle_seconds, cfg.subscriber_stall_seconds, on_timeout=metrics.client_refused)
    guards = []
    if authenticator is not None:
        guards.append(auth.AuthInterceptor(authenticator, _request_classes(), on_refused=metrics.client_refused))
    guards.append(auth.AuditCalls(_request_classes()))
    traced = tracing.setup()
    interceptors = (quota.HealthInLoop(), *traced, CallLog(), *guards, quota.ClientCalls(quotas), admission, watchdog)
    calls = aio.CallContexts()
    server = io.call(lambda: grpc_aio.server(migration_thread_pool=pool, options=grpc_options(cfg),
                                             interceptors=(calls, *(aio.Threaded(i) for i in interceptors))))
    ownership = cluster.from_config(cfg.cluster_members, cfg.cluster_self)
    # With tracing on, every method runs in a thread: OpenTelemetry's interceptor wraps methods of one kind.
    add_to_server(SapgridServicer(registry, metrics, ownership, quotas=quotas,
                                  in_loop_frame_bytes=cfg.in_loop_frame_bytes), server, in_loop=not traced)
    if cfg.echo:
        echo = (EchoServicer if traced else EchoServicerInLoop)(cfg.max_message_bytes)
        echo_service_pb2_grpc.add_EchoServiceServicer_to_server(echo, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    services = (SAPGRID_SERVICE, ECHO_SERVICE) if cfg.echo else (SAPGRID_SERVICE,)
    if cfg.reflection == "on":
        reflection.enable_server_reflection((*services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                             reflection.SERVICE_NAME), server)

    def release() -> None:
        """Start-up failed: release what was made so far (nothing was started)."""
        io.run(server.stop(0))
        io.close()
        pool.shutdown(wait=False)

    port = 0
    if _bindable(cfg.listen):                   # else gRPC would log its own error line before failing
        try:
            if certificates is not None:
                port = io.call(server.add_secure_port, cfg.listen, tls.server_credentials(certificates))
            else:
                port = io.call(server.add_insecure_port, cfg.listen)
        except RuntimeError:                     # grpcio: "Failed to bind to address ..."
            port = 0
    if port == 0:
        release()
        raise StartupError(f"--listen {cfg.listen}: cannot listen there (the port is in use, or the address is "
                           f"not this machine's)")
    storage = None
    if cfg.data_dir:
        from .storage import Storage
        try:
            storage = Storage(cfg.data_dir, cfg.fsync, cfg.snapshot_bytes, metrics=metrics)
        except (OSError, ValueError) as exc:
            release()
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise StartupError(f"--data-dir {cfg.data_dir}: {reason}") from None
        registry.storage = storage
        registry.recovering = True
    app = App(cfg, server, port, health, registry, metrics, pool, io, calls, authenticator=authenticator,
              watchdog=watchdog, certificates=certificates, quotas=quotas, storage=storage)

    def abandon() -> None:
        """A later start-up step failed: release what was made so far (nothing was started)."""
        if app.health_server is not None:
            app.health_server.stop(0)
        release()
        if storage is not None:
            storage.close()

    if cfg.health_listen:
        app.health_server, app.health_port = _health_server(cfg.health_listen, health)
        if app.health_port == 0:
            abandon()
            raise StartupError(f"--health-listen {cfg.health_listen}: cannot listen there (the port is in use, or "
                               f"the address is not this machine's)")
    if cfg.metrics_port >= 0:
        try:
            app.metrics_port = metrics.serve_http(cfg.metrics_host, cfg.metrics_port, cfg.metrics_tls_cert,
                                                  cfg.metrics_tls_key)
        except OSError as exc:
            abandon()
            raise StartupError(f"--metrics-port {cfg.metrics_port} (--metrics-host {cfg.metrics_host}): cannot serve "
                               f"metrics there ({exc.strerror or exc})") from None
    # In a cluster, the default world is created only by the replica the ring gives it to.
    if default_world is not None and (ownership is None or ownership.ring.owner(cfg.default_world)
                                      == ownership.self_member):
        if storage is None:
            registry.create(cfg.default_world, default_world)
        else:                                   # after recovery (it may be in the data directory)
            app.default_world = default_world
    return app


def _security(cfg: ServerConfig):
    """(Authenticator or None, CertificateFiles or None) of cfg, checked before anything is bound; a
    non-loopback --listen needs --auth-file or --insecure."""
    authenticator = certificates = None
    if cfg.auth_file:
        try:
            authenticator = auth.Authenticator(cfg.auth_file)
        except auth.AuthFileError as exc:
            raise StartupError(f"--auth-file: {exc}") from None
    elif not cfg.insecure and not is_loopback(cfg.listen):
        raise StartupError(f"--listen {cfg.listen}: without --auth-file anyone who reaches this address could do "
                           f"anything; give --auth-file (see `sapgrid auth token`), listen on 127.0.0.1, or pass "
                           f"--insecure")
    try:
        if cfg.tls_cert:
            certificates = tls.CertificateFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
            tls.check_pair(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
        if cfg.metrics_tls_cert:
            tls.check_pair(cfg.metrics_tls_cert, cfg.metrics_tls_key, flags=("--metrics-tls-cert", "--metrics-tls-key", ""))
    except tls.TLSFileError as exc:
        raise StartupError(str(exc)) from None
    return authenticator, certificates


def _health_server(listen: str, health: HealthServicer) -> tuple[grpc.Server, int]:
    """A plaintext server of the health service alone (for probes that cannot speak TLS, such as
    Kubernetes' gRPC probes): it tells whether the server is serving, and nothing else (two threads of
    its own)."""
    server = grpc.server(ThreadPoolExecutor(2, thread_name_prefix="sapgrid-health"))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = 0
    if _bindable(listen):
        try:
            port = server.add_insecure_port(listen)
        except RuntimeError:
            port = 0
    return server, port


def is_loopback(listen: str) -> bool:
    """Is HOST of HOST:PORT a loopback address (127.0.0.0/8, ::1, localhost)?"""
    import ipaddress

    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _request_classes() -> dict:
    from google.protobuf import message_factory

    service = sapgrid_service_pb2.DESCRIPTOR.services_by_name["SapgridService"]
    return {m.name: message_factory.GetMessageClass(m.input_type) for m in service.methods}


_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def _three_quarters_of_memory() -> int:
    """3/4 of the memory this process may use (the server's default memory budget): the machine's
    physical memory, or the container's cgroup limit when lower (a pod's limit, not the node's RAM);
    0 where unknown."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        limit = 0
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and (not limit or int(text) < limit):
            limit = int(text)
    return limit * 3 // 4


def _bindable(listen: str) -> bool:
    """Can a listening socket be bound to HOST:PORT now (port 0: always)?"""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        if int(port) == 0:
            return True
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, OSError):
        return False
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as gRPC does
            try:
                s.bind(addr)
            except OSError:
                return False
    return True


def security_summary(cfg: ServerConfig) -> str:
    """One line saying how callers are authenticated and whether the port is encrypted."""
    transport = ("mutual TLS (client certificates required)" if cfg.tls_client_ca else "TLS") if cfg.tls_cert \
        else "plaintext (no TLS)"
    if cfg.auth_file:
        who = f"auth: tokens and certificates of {cfg.auth_file} (SIGHUP reloads it)"
    elif cfg.insecure and not is_loopback(cfg.listen):
        who = "NO AUTH (--insecure): anyone who reaches this address may do anything"
    else:
        who = "no auth: loopback only (give --auth-file to listen on other addresses)"
    return f"{transport}; {who}"


class StartupError(Exception):
    """The server cannot start as configured; the message is one line naming the flag at fault."""


def serve(cfg: ServerConfig, ready=None, from_env: dict | None = None) -> int:
    """Run a server in the foreground until SIGTERM/SIGINT, then stop gracefully. ``ready(app)`` is
    called once serving. ``from_env``: flag -> the SAPGRID_* variable that set it, named in a refusal."""
    logs.configure(cfg.log_format)
    auth.configure_audit()
    try:
        app = build_server(cfg)
    except StartupError as exc:
        import re

        message = str(exc)
        named = [var for flag, var in (from_env or {}).items() if re.search(rf"(?<![\w-]){flag}(?![\w-])", message)]
        print(f"sapgrid serve: {message}" + (f" (set by {', '.join(named)})" if named else ""), file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if app.authenticator is not None:
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=app.reload_auth, daemon=True).start())
    app.start()
    # the start's objects (imports, gRPC, the recovered worlds: ~120k) out of every later pass of the
    # garbage collector: a full pass over them holds the interpreter, and so every world's frames, ~50 ms
    gc.collect()
    gc.freeze()
    scheme = "https" if cfg.metrics_tls_cert else "http"
    metrics = f"{scheme}://{cfg.metrics_host}:{app.metrics_port}/metrics" if app.metrics_port >= 0 else "off"
    print(f"sapgrid: listening on {app.address} (metrics {metrics}; worlds: "
          f"{', '.join(r.name for r in app.registry.list()) or 'none'})", flush=True)
    print(f"sapgrid: {security_summary(cfg)}", flush=True)

    def loaded():                       # (a bench waits for this line before it measures)
        t0 = time.monotonic()
        if kernels.wait_all():
            print(f"sapgrid: engine kernels loaded ({time.monotonic() - t0:.1f} s after serving)", flush=True)

    threading.Thread(target=loaded, name="sapgrid-kernels-wait", daemon=True).start()
    if ready is not None:
        ready(app)
    while not stop.wait(1.0):
        pass
    print("sapgrid: shutting down (finishing queued frames)", flush=True)
    app.stop()
    print("sapgrid: stopped", flush=True)
    return 0
