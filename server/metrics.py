"""Prometheus metrics of one server, in a dedicated CollectorRegistry (several servers per process in tests).

Names follow https://prometheus.io/docs/practices/naming/: ``sapgrid_`` prefix, base units
(``_seconds``), ``_total`` on counters. The ``world`` label is bounded by the server's max_worlds and
every series of a world is removed when the world is deleted. Frames naming an unknown world are
counted under ``world="_unknown"`` so client input never creates series.
"""
from __future__ import annotations

import gc
import threading
import time
from bisect import bisect_left

import numpy as np
from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, Info, PlatformCollector,
                               ProcessCollector, disable_created_metrics, start_http_server)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

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
            reg.register(GcPauses())
            reg.register(KernelsLoaded())
        w = ["world"]
        Info("sapgrid_build", "The server's version", registry=reg).info({"version": __version__})
        self.worlds = Gauge("sapgrid_worlds", "Worlds held by the server", registry=reg)
        # the series every frame updates: counted by FrameSeries in plain Python, exported when scraped
        self.frame_series = FrameSeries()
        reg.register(self.frame_series)
        self.queue_depth = Gauge("sapgrid_world_queue_depth", "Frames and queries waiting per world", w, registry=reg)
        self.subscribers = Gauge("sapgrid_world_subscribers", "Active Subscribe streams per world", w, registry=reg)
        self.subscribers_dropped = Counter("sapgrid_subscribers_dropped_total",
                                           "Subscribers dropped for falling too far behind (deltas or bytes)", w,
                                           registry=reg)
        self.occupancy = Occupancy()
        reg.register(self.occupancy)
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
        self._per_world = (self.queue_depth, self.subscribers, self.subscribers_dropped)
        self._depth: dict = {}
        self._http = None
        self.client_refusals = Counter("sapgrid_client_refusals_total", "Calls refused or ended per client (token "
                                       "name, or peer): unauthenticated, permission_denied, the quota (calls, "
                                       "worlds, objects), or a stream ended idle/stalled",
                                       ["client", "reason"], registry=reg)

    # ---- updates ----------------------------------------------------------------------------
    def world_created(self, world: str, count: int) -> None:
        self.worlds.set(count)
        self.frame_series.world(world)               # its objects, pairs and counters have a sample (0) at once
        self.queue_depth.labels(world).set(0)        # a sample from the start, not after the first change
        self.subscribers.labels(world).set(0)

    def world_deleted(self, world: str, count: int) -> None:
        self.worlds.set(count)
        self._depth.pop(world, None)
        self.frame_series.remove(world)
        self.occupancy.remove(world)
        for m in self._per_world:
            _remove(m, world)

    def frame_applied(self, world: str, s, queue_s: float, server_s: float) -> None:
        """s: the sapcore.FrameStats of an applied frame; queue_s / server_s: its seconds in line / in the server."""
        self.frame_series.applied(world, s, queue_s, server_s)

    def frame_rejected(self, world: str | None, outcome: str) -> None:
        self.frame_series.rejected(world or UNKNOWN_WORLD, outcome)

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
        """A world's objects per grid cell (an array the caller no longer changes), exported when scraped."""
        self.occupancy.set(world, per_cell)

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


class _WorldFrames:
    """One world's per-frame counts: frames applied, objects, pairs, pair and swap counters, and per phase
    the frames in each latency bucket (not cumulative; the last one is +Inf) and their seconds' sum."""

    __slots__ = ("lock", "ok", "objects", "pairs", "created", "deleted", "swaps", "overflows", "buckets", "sums",
                 "pending")

    def __init__(self):
        self.lock = threading.Lock()
        self.ok = self.objects = self.pairs = self.created = self.deleted = self.swaps = self.overflows = 0
        self.buckets = [[0] * (len(LATENCY_BUCKETS) + 1) for _ in PHASES]
        self.sums = [0.0] * len(PHASES)
        self.pending: list = []         # frames not yet counted (``FrameSeries.applied``), FrameSeries.FOLD at most

    def applied(self, s, queue_s: float, server_s: float) -> None:
        """A frame applied (s: its sapcore.FrameStats): its numbers kept pending (a tuple of numbers, which
        the garbage collector leaves alone after its first pass), counted with ``FrameSeries.FOLD`` frames
        of the world at once, or when scraped."""
        frame = (s.objects, s.pairs, s.created, s.deleted, s.swaps, s.cell_overflows,      # (``fold``)
                 queue_s, s.validate_s, s.rasterize_s, s.apply_s, s.merge_s, s.total_s, server_s)
        with self.lock:
            pending = self.pending
            pending.append(frame)
            if len(pending) >= FrameSeries.FOLD:
                self.fold()

    def fold(self) -> None:
        """Count the pending frames (under ``lock``): one tight loop for many frames, where each frame's own
        count ran among a busy server's other work at a few times the cost."""
        pending, self.pending = self.pending, []
        columns = tuple(zip(*pending))
        self.ok += len(pending)
        self.objects, self.pairs = pending[-1][:2]          # the last frame's
        self.created += sum(columns[2])
        self.deleted += sum(columns[3])
        self.swaps += sum(columns[4])
        self.overflows += sum(columns[5])
        first, bounds = LATENCY_BUCKETS[0], LATENCY_BUCKETS
        for i, values in enumerate(columns[6:]):
            counts = self.buckets[i]
            for value in values:
                # the first bucket whose le >= value: most of a small frame's phases are in the first one
                counts[0 if value <= first else bisect_left(bounds, value)] += 1
            self.sums[i] += sum(values)


class FrameSeries:
    """The series each applied frame updates, as a custom collector (prometheus_client's documented way
    to export values kept elsewhere): ``sapgrid_frames_total``, ``sapgrid_world_objects``,
    ``sapgrid_world_pairs``, ``sapgrid_pairs_created_total``, ``sapgrid_pairs_deleted_total``,
    ``sapgrid_endpoint_swaps_total``, ``sapgrid_cell_overflows_total`` and
    ``sapgrid_frame_duration_seconds`` by phase. A frame adds to plain integers and bucket counts under
    its world's lock (a few microseconds, where the library's 7 histogram observations and 6 counter
    and gauge updates, each under a lock of its own, took ~9 us a frame); the families are built when
    Prometheus scrapes. The series and their values are those the library's Counter / Gauge / Histogram
    exported before."""

    _HELP = {
        "frames": "Frames by outcome (ok or the gRPC status code name)",
        "objects": "Live objects per world",
        "pairs": "Active overlapping pairs per world",
        "created": "Pairs created (reported in deltas)",
        "deleted": "Pairs deleted (reported in deltas)",
        "swaps": "Endpoint swaps of the incremental sorts",
        "overflows": "Cells whose pair-event buffer overflowed and were recomputed",
        "latency": "Frame latency by phase: queue wait, engine validate/rasterize/apply/merge, engine total, "
                   "total server time",
    }
    _EDGES = tuple(floatToGoString(b) for b in LATENCY_BUCKETS) + ("+Inf",)
    #: Frames of a world kept pending before they are counted (a scrape counts the pending ones first).
    FOLD = 64

    def __init__(self):
        self._worlds: dict[str, _WorldFrames] = {}
        self._rejected: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def world(self, world: str) -> _WorldFrames:
        w = self._worlds.get(world)
        if w is None:
            with self._lock:
                w = self._worlds.setdefault(world, _WorldFrames())
        return w

    def remove(self, world: str) -> None:
        with self._lock:
            self._worlds.pop(world, None)
            for key in [k for k in self._rejected if k[0] == world]:
                del self._rejected[key]

    def applied(self, world: str, s, queue_s: float, server_s: float) -> None:
        """A frame of ``world`` applied (``_WorldFrames.applied``; a world's runner keeps its record and
        calls that itself)."""
        (self._worlds.get(world) or self.world(world)).applied(s, queue_s, server_s)

    def rejected(self, world: str, outcome: str) -> None:
        with self._lock:
            key = (world, outcome)
            self._rejected[key] = self._rejected.get(key, 0) + 1

    def _families(self):
        h = self._HELP
        return dict(
            frames=CounterMetricFamily("sapgrid_frames_total", h["frames"], labels=["world", "outcome"]),
            objects=GaugeMetricFamily("sapgrid_world_objects", h["objects"], labels=["world"]),
            pairs=GaugeMetricFamily("sapgrid_world_pairs", h["pairs"], labels=["world"]),
            created=CounterMetricFamily("sapgrid_pairs_created_total", h["created"], labels=["world"]),
            deleted=CounterMetricFamily("sapgrid_pairs_deleted_total", h["deleted"], labels=["world"]),
            swaps=CounterMetricFamily("sapgrid_endpoint_swaps_total", h["swaps"], labels=["world"]),
            overflows=CounterMetricFamily("sapgrid_cell_overflows_total", h["overflows"], labels=["world"]),
            latency=HistogramMetricFamily("sapgrid_frame_duration_seconds", h["latency"], labels=["world", "phase"]))

    def describe(self):
        return list(self._families().values())

    def collect(self):
        f = self._families()
        with self._lock:
            worlds = list(self._worlds.items())
            rejected = list(self._rejected.items())
        for name, w in worlds:
            with w.lock:
                if w.pending:
                    w.fold()
                ok, objects, pairs, counts = w.ok, w.objects, w.pairs, (w.created, w.deleted, w.swaps, w.overflows)
                buckets, sums = [list(b) for b in w.buckets], list(w.sums)
            if ok:
                f["frames"].add_metric([name, "ok"], ok)
            f["objects"].add_metric([name], objects)
            f["pairs"].add_metric([name], pairs)
            for key, value in zip(("created", "deleted", "swaps", "overflows"), counts):
                f[key].add_metric([name], value)
            if ok:
                for phase, counts_, total in zip(PHASES, buckets, sums):
                    f["latency"].add_metric([name, phase], _cumulative(self._EDGES, counts_), total)
        for (name, outcome), n in rejected:
            f["frames"].add_metric([name, outcome], n)
        return list(f.values())


class Occupancy:
    """``sapgrid_occupied_cells`` and ``sapgrid_cell_objects_max`` / ``_mean`` / ``_p99`` (over the occupied
    cells) of each world, from its latest sample of objects per cell (a frame about once a second, see
    registry.py), computed when Prometheus scrapes: a sample costs its frame the array, not numpy's
    percentile (~20 us). The series are those prometheus_client's Gauge exported before."""

    _NAMES = (("sapgrid_occupied_cells", "Grid cells holding at least one object"),
              ("sapgrid_cell_objects_max", "Most objects in one cell"),
              ("sapgrid_cell_objects_mean", "Mean objects per occupied cell"),
              ("sapgrid_cell_objects_p99", "99th percentile of objects per occupied cell"))

    def __init__(self):
        self._samples: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def set(self, world: str, per_cell: np.ndarray) -> None:
        with self._lock:
            self._samples[world] = per_cell

    def remove(self, world: str) -> None:
        with self._lock:
            self._samples.pop(world, None)

    def describe(self):
        return [GaugeMetricFamily(name, text, labels=["world"]) for name, text in self._NAMES]

    def collect(self):
        families = self.describe()
        with self._lock:
            samples = list(self._samples.items())
        for world, per_cell in samples:
            occupied = per_cell[per_cell > 0]
            values = ((len(occupied), int(occupied.max()), float(occupied.mean()), float(np.percentile(occupied, 99)))
                      if len(occupied) else (0, 0, 0.0, 0.0))
            for family, value in zip(families, values):
                family.add_metric([world], value)
        return families


def _cumulative(edges: tuple, counts: list) -> list:
    """A histogram's (edge, count of values <= edge) pairs from its counts per bucket."""
    out, acc = [], 0
    for edge, n in zip(edges, counts):
        acc += n
        out.append((edge, acc))
    return out


#: Seconds of one pass of the garbage collector: ~0.02-0.2 ms over the young objects; ~50 ms over every
#: object of a server's start (imports, gRPC, the engine's kernels) were they not frozen (``app.serve``).
GC_BUCKETS = (0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2,
              0.5, 1.0)


class GcPauses:
    """The garbage collector's passes in this process: the seconds each one held the interpreter (every
    call's Python work, and so every world's frames, waits meanwhile) by generation, and the objects the
    server froze at its start (``gc.freeze``: in no later pass). One callback per process counts the
    passes for every registry that exports them; it takes no lock (a pass may start in any thread, a
    scrape's own included) and allocates nothing the collector tracks."""

    _EDGES = tuple(floatToGoString(b) for b in GC_BUCKETS) + ("+Inf",)
    _buckets = [[0] * (len(GC_BUCKETS) + 1) for _ in range(3)]
    _sums = [0.0, 0.0, 0.0]
    _started = [0.0]
    _installed = False

    def __init__(self):
        if not GcPauses._installed:
            GcPauses._installed = True
            gc.callbacks.append(GcPauses._pass)

    @staticmethod
    def _pass(phase: str, info: dict, clock=time.perf_counter, bucket=bisect_left, edges=GC_BUCKETS,
              buckets=_buckets, sums=_sums, started=_started) -> None:
        # (everything it reads is bound here: a pass may run while the interpreter tears the modules down)
        if phase == "start":
            started[0] = clock()
            return
        seconds = clock() - started[0]
        generation = info["generation"]
        buckets[generation][bucket(edges, seconds)] += 1     # the first bucket whose le >= it
        sums[generation] += seconds

    def describe(self):
        return self.collect()

    def collect(self):
        pauses = HistogramMetricFamily("sapgrid_gc_pause_seconds", "Seconds one pass of the garbage collector "
                                       "held the interpreter (every world's frames wait), by generation",
                                       labels=["generation"])
        for generation, counts in enumerate(self._buckets):
            pauses.add_metric([str(generation)], _cumulative(self._EDGES, list(counts)), self._sums[generation])
        frozen = GaugeMetricFamily("sapgrid_gc_frozen_objects", "Objects of the server's start left out of every "
                                   "pass of the garbage collector (gc.freeze)", value=gc.get_freeze_count())
        return [pauses, frozen]


class KernelsLoaded:
    """Whether the engine's kernels of each number of dims are loaded in this process (``kernels.py``: in
    the background as the server starts; compiled into an empty cache after an upgrade, minutes). Until
    then that many dims' frames are applied in threads of the call pool, never in the server's loop."""

    def describe(self):
        return self.collect()

    def collect(self):
        from . import kernels

        loaded = GaugeMetricFamily("sapgrid_engine_kernels_loaded", "1 once the engine's kernels of worlds of "
                                   "these dims are loaded (0 while they load or compile)", labels=["dims"])
        for dims in kernels.DIMS:
            loaded.add_metric([str(dims)], 1.0 if kernels.ready(dims) else 0.0)
        return [loaded]


def _remove(metric, world: str) -> None:
    """Remove every series of a world (its label is always the first)."""
    if hasattr(metric, "remove_by_labels"):
        metric.remove_by_labels({"world": world})
        return
    with metric._lock:  # noqa: SLF001 - prometheus_client < 0.22 has no remove_by_labels
        keys = [k for k in metric._metrics if k and k[0] == world]  # noqa: SLF001
    for k in keys:
        metric.remove(*k)

