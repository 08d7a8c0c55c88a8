"""The shared conformance vectors (conformance/vectors/*.json): the committed files are exactly what
conformance/generate.py produces (engine deltas checked against tests/naive.py, errors as the server
answers them), and the Python runner (conformance/runner.py, raw stubs: the bytes on the wire) replays
every one against a real server and matches it byte for byte.

Strict by default: every pairs_digest must match. ``SAPGRID_CONFORMANCE_ALLOW_ZERO_DIGEST=1`` accepts a
server's 0 for a non-empty pair set (servers from before Delta.pairs_digest was on the wire).
"""
from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))

import generate  # noqa: E402
import runner  # noqa: E402

from sapgrid.v1 import sapgrid_service_pb2_grpc as pb_grpc  # noqa: E402

ALLOW_ZERO_DIGEST = os.environ.get("SAPGRID_CONFORMANCE_ALLOW_ZERO_DIGEST") == "1"


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.SapgridServiceStub(channel)


def test_committed_vectors_equal_the_generator_output(server):
    files = generate.generate(server.address)
    assert generate.stale(files) == [], "run: .venv/bin/python conformance/generate.py"
    assert set(files) == {p.name for p in generate.VECTORS.glob("*.json")}


def test_vectors_are_small_and_cover_the_cases():
    paths = sorted(generate.VECTORS.glob("*.json"))
    assert sum(p.stat().st_size for p in paths) < 200_000
    vectors = runner.load()
    assert {v["world"]["dims"] for v in vectors} == {2, 3}
    errors = {(s["expect"]["error"]["code"], s["expect"]["error"]["field"], s["expect"]["error"]["index"])
              for v in vectors for s in v["steps"] if "error" in s["expect"]}
    for expected in [(3, "add_boxes", 2), (3, "update_boxes", 1), (3, "add_ids", 2), (3, "update_ids", 1),
                     (3, "remove_ids", 1), (3, "add_ids", 1), (3, "add_ids", -1), (9, "add_boxes", -1)]:
        assert expected in errors
    ids = b"".join(bytes.fromhex(s["frame"]["add_ids"]) for v in vectors for s in v["steps"])
    assert any(ids[i + 7] & 0x80 for i in range(0, len(ids), 8)), "no id above 2^63"
    both = [s for v in vectors for s in v["steps"]
            if "error" not in s["expect"] and s["expect"]["created"] and s["expect"]["deleted"]]
    assert both, "no frame that creates and deletes pairs"


@pytest.mark.parametrize("path", sorted(generate.VECTORS.glob("*.json")), ids=lambda p: p.stem)
def test_python_runner_matches_the_server(stub, path):
    vector = json.loads(path.read_text())
    assert runner.replay(stub, vector, allow_zero_digest=ALLOW_ZERO_DIGEST) == []


def test_runner_reports_every_kind_of_mismatch(stub):
    vector = json.loads((generate.VECTORS / "errors-2d.json").read_text())
    assert runner.replay(stub, vector, allow_zero_digest=ALLOW_ZERO_DIGEST) == []
    good = next(i for i, s in enumerate(vector["steps"]) if "error" not in s["expect"] and s["expect"]["created"])
    bad_error = next(i for i, s in enumerate(vector["steps"]) if "error" in s["expect"])
    tampered = copy.deepcopy(vector)
    created = tampered["steps"][good]["expect"]["created"]
    tampered["steps"][good]["expect"]["created"] = created[:-2] + ("00" if created[-2:] != "00" else "01")
    tampered["steps"][good]["expect"]["objects"] += 1
    tampered["steps"][good]["expect"]["pairs_digest"] = "12345"
    tampered["steps"][bad_error]["expect"]["error"]["index"] += 1
    tampered["final_pairs"] = "00" * 16 + tampered["final_pairs"]
    found = "\n".join(runner.replay(stub, tampered))
    for what in (f"step {good}: created", f"step {good}: objects", f"step {good}: client pairs_digest",
                 f"step {bad_error}: error", "ListPairs"):
        assert what in found, found


def test_generator_refuses_an_error_the_server_does_not_answer(server):
    s = generate.Scenario("wrong", "a documented error the server does not answer", 2, (0, 0, 10, 10), (1, 1))
    s.frame(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [2, 0, 1, 1]], error=(3, "add_boxes", 0))   # it is row 1
    with pytest.raises(SystemExit, match="documented error"):
        generate.build(s, generate.server_errors(server.address, s))


def test_stale_check_names_changed_missing_and_extra_files(tmp_path):
    files = {"a.json": "{}\n", "b.json": "{\"x\": 1}\n", "c.json": "[]\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert generate.stale(files, tmp_path) == []
    (tmp_path / "b.json").write_text("{\"x\": 2}\n")
    (tmp_path / "c.json").unlink()
    (tmp_path / "old.json").write_text("{}\n")
    assert generate.stale(files, tmp_path) == ["b.json", "c.json", "old.json"]
