"""The C++ example client (client/cpp): built with CMake and Debian's gRPC C++ packages into build/cpp
(reused across runs), then run against a real server: the example streams a few hundred frames of
moving boxes and checks its pairs (also as an exactly-once writer that sends its last frame again), the
conformance runner replays conformance/vectors/*.json through StreamFrames and through the unary
ApplyFrame (errors read from the status's google.rpc.BadRequest detail).

The toolchain comes from scripts/setup.d/40-cpp-client.sh; without it these tests skip, and fail
under CI=true. Every pairs_digest must match.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sapgrid.client import Client
from sapgrid.client.errors import NotFound

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "client" / "cpp"
BUILD = ROOT / "build" / "cpp"
VECTORS = sorted((ROOT / "conformance" / "vectors").glob("*.json"))


def _missing_toolchain() -> list[str]:
    missing = [tool for tool in ("cmake", "make", "g++", "pkg-config", "protoc", "grpc_cpp_plugin")
               if shutil.which(tool) is None]
    if shutil.which("pkg-config") and subprocess.run(["pkg-config", "--exists", "grpc++"]).returncode != 0:
        missing.append("grpc++ (libgrpc++-dev)")
    if not Path("/usr/include/nlohmann/json.hpp").is_file():
        missing.append("nlohmann/json.hpp (nlohmann-json3-dev)")
    return missing


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    missing = _missing_toolchain()
    if missing:
        message = f"C++ toolchain missing ({', '.join(missing)}): run scripts/setup.sh as root"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    configure = subprocess.run(["cmake", "-S", str(SOURCE), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release",
                                f"-DSAPGRID_PYTHON={sys.executable}"],
                               capture_output=True, text=True, timeout=600)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    build = subprocess.run(["cmake", "--build", str(BUILD), "-j2"], capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-8000:]
    return {"example": BUILD / "sapgrid_example", "conformance": BUILD / "sapgrid_conformance"}


def _run(args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def test_generated_code_is_built_not_committed(binaries):
    gen = BUILD / "gen" / "sapgrid" / "v1"
    for name in ("frame.pb.h", "world.pb.h", "sapgrid_service.pb.h", "sapgrid_service.grpc.pb.h"):
        assert (gen / name).is_file()
    for name in ("status.pb.h", "error_details.pb.h"):                   # google.rpc, from googleapis-common-protos
        assert (BUILD / "gen" / "google" / "rpc" / name).is_file()
    sources = [p.name for p in SOURCE.rglob("*") if p.is_file()]
    assert "CMakeLists.txt" in sources and not [name for name in sources if ".pb." in name]


def test_example_streams_moving_boxes_and_checks_its_pairs(binaries, server, world_name):
    out = _run([binaries["example"], "--server", server.address, "--frames", 300, "--objects", 200,
                "--world", world_name])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sapgrid_example: ok: 300 frames of 200 moving boxes" in out.stdout
    assert "ListPairs == deltas == brute force" in out.stdout
    assert "subscription: 300 deltas == the stream's answers, byte for byte" in out.stdout
    with Client(server.address) as c, pytest.raises(NotFound):
        c.get_world(world_name)                                  # the example deleted its world


def test_example_subscription_sees_every_frame_however_late_the_server_registers_it(binaries, make_server,
                                                                                     late_subscribers, world_name):
    """``Client::subscribe`` returns once the server has registered the subscriber (its response headers):
    against a server that registers it 0.5 s late, the example's first frames are still in it."""
    srv = make_server(default_world="")
    out = _run([binaries["example"], "--server", srv.address, "--frames", 40, "--objects", 50, "--world", world_name])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "subscription: 40 deltas == the stream's answers, byte for byte" in out.stdout


def test_example_reports_bad_arguments_and_failed_calls(binaries, server, world_name):
    out = _run([binaries["example"], "--server", server.address, "--frames", "many"])
    assert out.returncode == 2 and "--frames must be an integer" in out.stderr
    out = _run([binaries["example"]])
    assert out.returncode == 2 and "--server is required" in out.stderr
    with Client(server.address) as c:
        c.create_world(world_name, dims=3)                       # the name is taken: CreateWorld fails
        out = _run([binaries["example"], "--server", server.address, "--world", world_name, "--frames", 5])
        assert out.returncode == 1 and "CreateWorld" in out.stderr and "code 6" in out.stderr, out.stderr
        assert c.get_world(world_name).frames == 0        # nothing was sent to it
        c.delete_world(world_name)


def test_example_streams_as_a_writer_and_its_last_frame_sent_again_is_answered_not_applied(binaries, server,
                                                                                          world_name):
    out = _run([binaries["example"], "--server", server.address, "--frames", 120, "--objects", 150,
                "--world", world_name, "--writer", "match-42", "--keep-world"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sapgrid_example: ok: 120 frames of 150 moving boxes" in out.stdout
    assert "writer match-42: frame 120 sent again: the identical Delta" in out.stdout
    assert "world still at 120 frames" in out.stdout
    assert "subscription: 120 deltas == the stream's answers" in out.stdout      # the frame sent again: no delta
    with Client(server.address) as c:
        info = c.get_world(world_name)                           # kept: seen from the Python client too
        assert info.frames == 120 and info.writers == {"match-42": 120}
        with c.stream(world_name, writer="match-42") as s:        # the writer goes on where the C++ one stopped
            d = s.step(update_ids=np.array([], np.uint64), update_boxes=np.zeros((0, 4), np.float32))
        assert d.seq == 121 and d.frame == 121 and c.get_world(world_name).writers == {"match-42": 121}
        c.delete_world(world_name)


def test_example_reports_a_bad_writer_with_its_field_and_deletes_its_world(binaries, server, world_name):
    out = _run([binaries["example"], "--server", server.address, "--world", world_name, "--frames", 5,
                "--writer", "bad name"])
    assert out.returncode == 1 and "(code 3, field writer)" in out.stderr, out.stdout + out.stderr
    with Client(server.address) as c, pytest.raises(NotFound):
        c.get_world(world_name)


@pytest.mark.parametrize("mode", [[], ["--unary"]], ids=["stream", "unary"])
def test_conformance_runner_matches_every_vector(binaries, server, mode):
    assert VECTORS
    out = _run([binaries["conformance"], "--server", server.address, *mode, *VECTORS])
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(VECTORS)}/{len(VECTORS)} vectors match" in out.stdout
    assert out.stdout.count("ok   ") == len(VECTORS)


def test_unary_errors_carry_the_field_and_index_of_the_bad_request_detail(binaries, server, tmp_path):
    """Through ApplyFrame a refused frame has no FrameError: the C++ client's Error takes its field and
    index from the status's google.rpc.BadRequest detail, as the Python client's errors do."""
    vector = json.loads((ROOT / "conformance" / "vectors" / "errors-2d.json").read_text())
    rows = [i for i, s in enumerate(vector["steps"]) if s["expect"].get("error", {}).get("index", -1) >= 0]
    whole = next(i for i, s in enumerate(vector["steps"]) if s["expect"].get("error", {}).get("index") == -1)
    vector["steps"][rows[0]]["expect"]["error"]["index"] += 1
    vector["steps"][whole]["expect"]["error"]["field"] = "remove_ids"
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(vector))
    out = _run([binaries["conformance"], "--server", server.address, "--unary", path])
    assert out.returncode == 1, out.stdout + out.stderr
    want = vector["steps"][rows[0]]["expect"]["error"]
    got = f"error {want['code']} {want['field']}[{want['index'] - 1}] != "
    assert f"step {rows[0]}: {got}" in out.stdout, out.stdout
    assert f"step {whole}: error " in out.stdout and "ApplyFrame: " in out.stdout, out.stdout
    assert out.stdout.count(": error ") == 2, out.stdout                     # every other step still matches


def test_conformance_runner_reports_mismatches(binaries, server, tmp_path):
    vector = json.loads((ROOT / "conformance" / "vectors" / "errors-2d.json").read_text())
    good = next(i for i, s in enumerate(vector["steps"]) if "error" not in s["expect"] and s["expect"]["created"])
    bad_error = next(i for i, s in enumerate(vector["steps"]) if "error" in s["expect"])
    created = vector["steps"][good]["expect"]["created"]
    vector["steps"][good]["expect"]["created"] = created[:-2] + ("00" if created[-2:] != "00" else "01")
    vector["steps"][good]["expect"]["objects"] += 1
    vector["steps"][good]["expect"]["pairs_digest"] = "12345"
    vector["steps"][bad_error]["expect"]["error"]["field"] = "update_boxes"
    vector["final_pairs"] = "00" * 16 + vector["final_pairs"]
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(vector))
    out = _run([binaries["conformance"], "--server", server.address, path])
    assert out.returncode == 1, out.stdout + out.stderr
    for what in (f"step {good}: created", f"step {good}: objects", f"step {good}: client pairs_digest",
                 f"step {bad_error}: error", "ListPairs",
                 "0/1 vectors match"):
        assert what in out.stdout, out.stdout
    (tmp_path / "broken.json").write_text("{not json")
    out = _run([binaries["conformance"], "--server", server.address, tmp_path / "broken.json"])
    assert out.returncode == 2 and "broken.json" in out.stderr
