"""OpenTelemetry traces: off by default; on, a server span per call (the standard gRPC instrumentation)
and a ``sapgrid.frame`` span with one child per engine phase for every applied frame."""
from __future__ import annotations

import pytest

from sapgrid.server import tracing


@pytest.mark.parametrize("env, on", [
    ({}, False), ({"OTEL_TRACES_EXPORTER": "none"}, False), ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}, False)])
def test_on_only_with_the_usual_variables(env, on):
    assert tracing.enabled(env) is on


def test_spans_of_calls_and_frame_phases(make_server, monkeypatch):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from sapgrid.client import Client

    exporter = InMemorySpanExporter()
    real = tracing.setup
    monkeypatch.setattr(tracing, "setup", lambda: real(exporter=exporter))
    try:
        srv = make_server()
        with Client(srv.address) as c:
            c.create_world("traced", dims=2, bounds=(0, 0, 10, 10), cells=(2, 2))
            with c.stream("traced") as s:
                s.step(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]])
            c.step("traced", 9, update_ids=[2], update_boxes=[[5, 5, 6, 6]])
        srv.stop()
        spans = exporter.get_finished_spans()
        names = [sp.name for sp in spans]
        assert any(n.endswith("CreateWorld") for n in names) and any(n.endswith("ApplyFrame") for n in names)
        # in the world's frame order (a stream's frame span may end after a later unary call's)
        frames = sorted((sp for sp in spans if sp.name == "sapgrid.frame"), key=lambda sp: sp.attributes["sapgrid.frame"])
        assert len(frames) == 2
        assert frames[1].attributes["sapgrid.world"] == "traced" and frames[1].attributes["sapgrid.seq"] == 9
        assert frames[0].attributes["sapgrid.created"] == 1 and frames[1].attributes["sapgrid.deleted"] == 1
        for f in frames:
            phases = [sp for sp in spans if sp.parent is not None and sp.parent.span_id == f.context.span_id]
            assert [p.name for p in phases] == [f"sapgrid.frame.{x}" for x in ("validate", "rasterize", "apply", "merge")]
            assert all(f.start_time <= p.start_time <= p.end_time <= f.end_time for p in phases)
    finally:
        tracing.setup()                       # off again for the other tests (no OTEL_* variables here)
