"""The contract travels with the package: the wheel holds the .proto files and the LICENSE, and
importlib.resources finds the protos of the installed sapgrid; the version comes from one place."""
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = sorted(p.name for p in (ROOT / "proto" / "sapgrid" / "v1").glob("*.proto"))


def test_installed_package_exposes_the_protos():
    found = sorted(p.name for p in resources.files("sapgrid.proto").joinpath("sapgrid", "v1").iterdir()
                   if p.name.endswith(".proto"))
    assert found == PROTOS and "sapgrid_service.proto" in found


def test_wheel_holds_protos_license_and_version(tmp_path):
    from sapgrid import __version__

    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("sapgrid-*.whl")
    assert wheel.name.startswith(f"sapgrid-{__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for proto in PROTOS:
        assert f"sapgrid/proto/sapgrid/v1/{proto}" in names
    assert "sapgrid/proto/grpc/health/v1/health.proto" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_cli_reports_the_version():
    from sapgrid import __version__

    out = subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"sapgrid {__version__}"


def test_proto_archive_holds_the_contract_and_google_rpc(tmp_path):
    import tarfile

    from sapgrid import __version__

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "proto_archive.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    archive = tmp_path / f"sapgrid-proto-{__version__}.tar.gz"
    names = set(tarfile.open(archive).getnames())
    prefix = f"sapgrid-proto-{__version__}/"
    for proto in PROTOS:
        assert prefix + f"sapgrid/v1/{proto}" in names
    for proto in ("status", "error_details", "code"):
        assert prefix + f"google/rpc/{proto}.proto" in names
    assert prefix + "grpc/health/v1/health.proto" in names


def test_the_shipped_health_proto_is_the_one_the_server_serves(tmp_path):
    """proto/grpc/health/v1/health.proto, compiled, declares the messages and methods of the installed
    grpc_health (what the server answers), field by field."""
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_health.v1 import health_pb2
    from grpc_tools import protoc

    out = tmp_path / "health.binpb"
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"-I{well_known}", f"--descriptor_set_out={out}",
                        "grpc/health/v1/health.proto"]) == 0
    shipped = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    served = descriptor_pb2.FileDescriptorProto.FromString(health_pb2.DESCRIPTOR.serialized_pb)
    assert shipped.package == served.package == "grpc.health.v1"
    def by_name(messages):
        out = {}
        for m in messages:
            m = type(m).FromString(m.SerializeToString())
            for f in [*m.field, *(f for n in m.nested_type for f in n.field)]:
                f.ClearField("json_name")         # protoc fills it in, the Python gencode leaves it out
            m.ClearField("options")
            out[m.name] = m.SerializeToString(deterministic=True)
        return out

    assert by_name(shipped.message_type) == by_name(served.message_type)
    assert by_name(shipped.message_type)   # (the comparison above compared something)
    assert {m.name: m.SerializeToString(deterministic=True) for m in shipped.service[0].method} == \
        {m.name: m.SerializeToString(deterministic=True) for m in served.service[0].method}
