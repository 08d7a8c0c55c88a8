"""OpenTelemetry traces of calls and of frame phases: off by default, on with the usual OTEL_* variables.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter other than ``none``, or an OTLP endpoint
is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and
``OTEL_SDK_DISABLED`` is not ``true``. Then every call gets a server span from OpenTelemetry's gRPC
instrumentation, and every applied frame a span ``sapgrid.frame`` (world, seq, objects, pairs,
created, deleted) with one child span per engine phase (validate, rasterize, apply, merge), exported by
the OTLP exporter as the OTEL_EXPORTER_OTLP_* variables configure it (service name: OTEL_SERVICE_NAME,
default ``sapgrid``). Off, nothing of OpenTelemetry is imported and frames pay nothing.
"""
from __future__ import annotations

import os
import time

_tracer = None           # the tracer of frame spans, when tracing is on


def enabled(env=os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup(exporter=None, env=os.environ) -> list:
    """Start tracing if it is on (or an ``exporter`` is given: tests); return the server interceptors."""
    global _tracer
    if exporter is None and not enabled(env):
        _tracer = None
        return []
    from opentelemetry.instrumentation.grpc import server_interceptor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "sapgrid")}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracer = provider.get_tracer("sapgrid.server")
    return [server_interceptor(tracer_provider=provider)]


def frame(applied) -> None:
    """Spans of an applied frame (registry.Applied), timed from its engine phases; no-op when off."""
    if _tracer is None:
        return
    s = applied.delta.stats
    end = time.time_ns()
    start = end - int(s.total_s * 1e9)
    span = _tracer.start_span("sapgrid.frame", start_time=start, attributes={
        "sapgrid.world": applied.world, "sapgrid.seq": applied.seq, "sapgrid.frame": applied.frame,
        "sapgrid.objects": s.objects, "sapgrid.pairs": s.pairs, "sapgrid.created": s.created,
        "sapgrid.deleted": s.deleted, "sapgrid.queue_seconds": applied.queue_s})
    from opentelemetry import trace

    ctx = trace.set_span_in_context(span)
    t = start
    for name, seconds in (("validate", s.validate_s), ("rasterize", s.rasterize_s), ("apply", s.apply_s),
                          ("merge", s.merge_s)):
        child = _tracer.start_span(f"sapgrid.frame.{name}", context=ctx, start_time=t)
        t += int(seconds * 1e9)
        child.end(end_time=t)
    span.end(end_time=end)
