"""The wire contract: buf lint passes, generated code is fresh, health and reflection are served."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_proto  # noqa: E402


def _buf() -> str:
    cand = Path(sys.executable).parent / "buf"
    if cand.exists():
        return str(cand)
    found = shutil.which("buf")
    if not found:
        pytest.fail("buf not found: install the test extras (pip install -e '.[test]', PyPI buf-bin)")
    return found


def test_buf_lint_passes():
    proc = subprocess.run([_buf(), "lint"], cwd=ROOT / "proto", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"buf lint failed:\n{proc.stdout}\n{proc.stderr}"


def test_generated_code_is_not_stale(tmp_path):
    gen_proto.generate(tmp_path)
    fresh = gen_proto.generated_files(tmp_path / "sapgrid" / "v1")
    committed = gen_proto.generated_files(ROOT / "proto" / "python" / "sapgrid" / "v1")
    assert fresh, "protoc generated nothing"
    assert sorted(fresh) == sorted(committed), "generated file set differs: run scripts/gen_proto.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated code {stale}: run .venv/bin/python scripts/gen_proto.py"


def test_generated_modules_import_as_sapgrid_v1():
    from sapgrid.v1 import frame_pb2, sapgrid_service_pb2_grpc

    assert frame_pb2.Frame.DESCRIPTOR.full_name == "sapgrid.v1.Frame"
    assert hasattr(sapgrid_service_pb2_grpc, "SapgridServiceStub")


def test_health_reports_serving(server):
    with grpc.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "sapgrid.v1.SapgridService"):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_services(server):
    with grpc.insecure_channel(server.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                              timeout=10)
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"sapgrid.v1.SapgridService", "grpc.health.v1.Health"} <= names
    assert "sapgrid.v1.EchoService" not in names                       # bench-only: off by default
