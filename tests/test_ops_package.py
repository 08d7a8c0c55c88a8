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
