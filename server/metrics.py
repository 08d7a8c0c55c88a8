"""Prometheus metrics of one server, in a dedicated CollectorRegistry (several servers per process in tests).

Names follow https://prometheus.io/docs/practices/naming/: ``sapgrid_`` prefix, base units
(``_seconds``), ``_total`` on counters. The ``world`` label is bounded by the server's max_worlds and
every series of a world is removed when the world is deleted. Frames naming an unknown world are
counted under ``world="_unknown"`` so client input never creates series.
"""
from __future__ import annotations

import numpy as np
from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, Info, PlatformCollector,
                               ProcessCollector, disable_created_metrics, start_http_server)

from sapgrid import __version__

# Counters and histograms export no extra ``_created`` series (a timestamp per series, which doubles the
# series count and which Prometheus' own functions do not need).
disable_created_metrics()

UNKNOWN_WORLD = "_unknown"
PHASES = ("queue", "validate", "rasterize", "apply", "merge", "engine", "total")
#: Frames take 0.05-20 ms: buckets at 1-1.5-2-3-5-7 steps there, so a p99 read from them is within
#: about a third of the true value, not at a coarse bucket edge; coarser beyond.
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0005, 0.0007, 0.001, 0.0015, 0.002, 0.003, 0.005,
                   0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """All metrics of a server. Thread-safe (prometheus_client locks); per-frame updates are a few cached children."""

    def __init__(self, registry: CollectorRegistry | None = None, process: bool = True):
        self.registry = reg = registry if registry is not None else CollectorRegistry()
        if process:
            ProcessCollector(registry=reg)
            PlatformCollector(registry=reg)
            GCCollector(registry=reg)
        w = ["world"]
        Info("sapgrid_build", "The server's version", registry=reg).info({"version": __version__})
        self.worlds = Gauge("sapgrid_worlds", "Worlds held by the server", registry=reg)
        self.objects = Gauge("sapgrid_world_objects", "Live objects per world", w, registry=reg)
        self.pairs = Gauge("sapgrid_world_pairs", "Active overlapping pairs per world", w, registry=reg)
        self.created = Counter("sapgrid_pairs_created_total", "Pairs created (reported in deltas)", w, registry=reg)
        self.deleted = Counter("sapgrid_pairs_deleted_total", "Pairs deleted (reported in deltas)", w, registry=reg)
        self.swaps = Counter("sapgrid_endpoint_swaps_total", "Endpoint swaps of the incremental sorts", w,
                             registry=reg)
        self.overflows = Counter("sapgrid_cell_overflows_total",
                                 "Cells whose pair-event buffer overflowed and were recomputed", w, registry=reg)
        self.frames = Counter("sapgrid_frames_total", "Frames by outcome (ok or the gRPC status code name)",
                              ["world", "outcome"], registry=reg)
        self.latency = Histogram("sapgrid_frame_duration_seconds",
                                 "Frame latency by phase: queue wait, engine validate/rasterize/apply/merge, "
                                 "engine total, total server time", ["world", "phase"], buckets=LATENCY_BUCKETS,
                                 registry=reg)
        self.queue_depth = Gauge("sapgrid_world_queue_depth", "Frames and queries waiting per world", w, registry=reg)
        self.subscribers = Gauge("sapgrid_world_subscribers", "Active Subscribe streams per world", w, registry=reg)
        self.subscribers_dropped = Counter("sapgrid_subscribers_dropped_total",
                                           "Subscribers dropped for falling too far behind (deltas or bytes)", w,
                                           registry=reg)
        self.occupied_cells = Gauge("sapgrid_occupied_cells", "Grid cells holding at least one object", w,
                                    registry=reg)
        self.cell_objects_max = Gauge("sapgrid_cell_objects_max", "Most objects in one cell", w, registry=reg)
        self.cell_objects_mean = Gauge("sapgrid_cell_objects_mean", "Mean objects per occupied cell", w,
                                       registry=reg)
        self.cell_objects_p99 = Gauge("sapgrid_cell_objects_p99", "99th percentile of objects per occupied cell",
                                      w, registry=reg)
        self.call_slots = Gauge("sapgrid_call_slots", "Slots for long calls (streams, subscriptions, frame and "
                                "query calls): --worker-threads", registry=reg)
        self.call_slots_in_use = Gauge("sapgrid_call_slots_in_use", "Long calls open (each holds a slot)",
                                       registry=reg)
        self.calls_refused = Counter("sapgrid_calls_refused_total", "Long calls refused because every slot was "
                                     "in use", registry=reg)
        # durability (--data-dir): failures that refuse frames or let a log grow, and the fsyncs' latency
        self.log_write_failures = Counter("sapgrid_log_write_failures_total",
                                          "Frames refused because their log record could not be written", registry=reg)
        self.fsync_failures = Counter("sapgrid_fsync_failures_total", "fsyncs of a world's log that failed",
                                      registry=reg)
        self.fsync_seconds = Histogram("sapgrid_fsync_duration_seconds", "Seconds of one fsync of a world's log",
                                       buckets=LATENCY_BUCKETS, registry=reg)
        self.snapshots = Counter("sapgrid_snapshots_total", "Snapshots written to the data directory, by outcome "
                                 "(ok or failed)", ["outcome"], registry=reg)
        self.worlds_unrecovered = Gauge("sapgrid_worlds_unrecovered", "Worlds of the data directory that could "
                                        "not be recovered at start (not served)", registry=reg)
        self._per_world = (self.objects, self.pairs, self.created, self.deleted, self.swaps, self.overflows,
                           self.queue_depth, self.subscribers, self.subscribers_dropped, self.occupied_cells, self.cell_objects_max,
                           self.cell_objects_mean, self.cell_objects_p99)
        self._children: dict[str, tuple] = {}
        self._depth: dict = {}
        self._http = None
        self.client_refusals = Counter("sapgrid_client_refusals_total", "Calls refused or ended per client (token "
                                       "name, or peer): unauthenticated, permission_denied, the quota (calls, "
                                       "worlds, objects), or a stream ended idle/stalled",
                                       ["client", "reason"], registry=reg)

    # ---- updates ----------------------------------------------------------------------------
    def world_created(self, world: str, count: int) -> None:
        self.worlds.set(count)
        for m in (self.objects, self.pairs, self.created, self.deleted, self.swaps, self.overflows):
            m.labels(world)
        self.queue_depth.labels(world).set(0)        # a sample from the start, not after the first change
        self.subscribers.labels(world).set(0)

    def world_deleted(self, world: str, count: int) -> None:
        self.worlds.set(count)
        self._children.pop(world, None)
        self._depth.pop(world, None)
        for m in self._per_world:
            _remove(m, world)
        for m in (self.frames, self.latency):
            _remove(m, world)

    def _bound(self, world: str) -> tuple:
        """The world's labelled children, looked up once (labels() takes a lock and builds keys)."""
        b = self._children.get(world)
        if b is None:
            b = (self.frames.labels(world, "ok"), self.objects.labels(world), self.pairs.labels(world),
                 self.created.labels(world), self.deleted.labels(world), self.swaps.labels(world),
                 self.overflows.labels(world), tuple(self.latency.labels(world, p) for p in PHASES))
            self._children[world] = b
        return b

    def frame_applied(self, world: str, s, queue_s: float, server_s: float) -> None:
        """s: the sapcore.FrameStats of an applied frame; queue_s / server_s: its seconds in line / in the server."""
        ok, objects, pairs, created, deleted, swaps, overflows, lat = self._bound(world)
        ok.inc()
        objects.set(s.objects)
        pairs.set(s.pairs)
        created.inc(s.created)
        deleted.inc(s.deleted)
        swaps.inc(s.swaps)
        if s.cell_overflows:
            overflows.inc(s.cell_overflows)
        for h, value in zip(lat, (queue_s, s.validate_s, s.rasterize_s, s.apply_s, s.merge_s, s.total_s, server_s)):
            h.observe(value)

    def frame_rejected(self, world: str | None, outcome: str) -> None:
        self.frames.labels(world or UNKNOWN_WORLD, outcome).inc()

    def set_call_slots(self, n: int) -> None:
        self.call_slots.set(n)

    def set_call_slots_in_use(self, n: int) -> None:
        self.call_slots_in_use.set(n)

    def call_refused(self) -> None:
        self.calls_refused.inc()

    def set_queue_depth(self, world: str, depth: int) -> None:
        child = self._depth.get(world)
        if child is None:
            child = self._depth[world] = self.queue_depth.labels(world)
        child.set(depth)

    def subscriber_dropped(self, world: str) -> None:
        self.subscribers_dropped.labels(world).inc()

    def set_subscribers(self, world: str, n: int) -> None:
        self.subscribers.labels(world).set(n)

    def set_occupancy(self, world: str, per_cell: np.ndarray) -> None:
        occupied = per_cell[per_cell > 0]
        self.occupied_cells.labels(world).set(len(occupied))
        self.cell_objects_max.labels(world).set(int(occupied.max()) if len(occupied) else 0)
        self.cell_objects_mean.labels(world).set(float(occupied.mean()) if len(occupied) else 0.0)
        self.cell_objects_p99.labels(world).set(float(np.percentile(occupied, 99)) if len(occupied) else 0.0)

    # ---- HTTP endpoint ----------------------------------------------------------------------
    def client_refused(self, client: str, reason: str) -> None:
        self.client_refusals.labels(client[:128], reason).inc()

    def serve_http(self, host: str, port: int, certfile: str = "", keyfile: str = "") -> int:
        """Start /metrics on host:port (0: free port) in a daemon thread, over HTTPS with a certificate;
        return the bound port."""
        tls = dict(certfile=certfile, keyfile=keyfile) if certfile else {}
        server, thread = start_http_server(port, addr=host, registry=self.registry, **tls)
        self._http = (server, thread)
        return server.server_port

    def stop_http(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._http = None


def _remove(metric, world: str) -> None:
    """Remove every series of a world (its label is always the first)."""
    if hasattr(metric, "remove_by_labels"):
        metric.remove_by_labels({"world": world})
        return
    with metric._lock:  # noqa: SLF001 - prometheus_client < 0.22 has no remove_by_labels
        keys = [k for k in metric._metrics if k and k[0] == world]  # noqa: SLF001
    for k in keys:
        metric.remove(*k)

