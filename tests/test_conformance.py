"""The shared conformance vectors (conformance/vectors/*.json): the committed files are exactly what
conformance/generate.py produces (engine deltas checked against tests/naive.py, errors as the server
answers them), and the Python runner (conformance/runner.py, raw stubs: the bytes on the wire) replays
every one against a real server and matches it byte for byte.

Strict: every pairs_digest must match (the server's and the runner's own, kept from the deltas).
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))

import generate  # noqa: E402
import runner  # noqa: E402

from sapgrid.v1 import sapgrid_service_pb2_grpc as pb_grpc  # noqa: E402

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
            if "created" in s["expect"] and s["expect"]["created"] and s["expect"]["deleted"]]
    assert both, "no frame that creates and deletes pairs"


def _writer_steps(vector):
    """(index, step) of the steps with a writer."""
    return [(i, s) for i, s in enumerate(vector["steps"]) if s["frame"]["writer"]]


def test_vectors_cover_exactly_once_frames():
    vectors = runner.load()
    errors = {(s["expect"]["error"]["code"], s["expect"]["error"]["field"])
              for v in vectors for _, s in _writer_steps(v) if "error" in s["expect"]}
    for expected in [(9, "seq"), (3, "seq"), (3, "writer"), (3, "update_boxes"), (9, "add_boxes")]:
        assert expected in errors
    duplicates, refused_then_applied, content_differs, after_other_frames = 0, 0, 0, 0
    for v in vectors:
        steps = v["steps"]
        for i, s in _writer_steps(v):
            if "same_as_step" in s["expect"]:
                k = s["expect"]["same_as_step"]
                first = steps[k]
                assert 0 <= k < i and "created" in first["expect"]
                assert (first["frame"]["writer"], first["frame"]["seq"]) == (s["frame"]["writer"], s["frame"]["seq"])
                duplicates += 1
                content_differs += any(first["frame"][key] != s["frame"][key] for key in runner.BULK_FIELDS)
                after_other_frames += any("created" in t["expect"] for t in steps[k + 1:i])
            elif "error" in s["expect"] and s["expect"]["error"]["field"] not in ("seq", "writer"):
                nxt = steps[i + 1]
                if (nxt["frame"]["writer"], nxt["frame"]["seq"]) == (s["frame"]["writer"], s["frame"]["seq"]):
                    refused_then_applied += "created" in nxt["expect"]
    assert duplicates >= 5 and content_differs and after_other_frames and refused_then_applied >= 2
    seqs = [s["frame"]["seq"] for v in vectors for s in v["steps"]]
    assert max(seqs) < 2 ** 53, "a seq a JSON double cannot hold"


@pytest.mark.parametrize("path", sorted(generate.VECTORS.glob("*.json")), ids=lambda p: p.stem)
def test_python_runner_matches_the_server(stub, path):
    vector = json.loads(path.read_text())
    assert runner.replay(stub, vector) == []


def test_runner_reports_every_kind_of_mismatch(stub):
    vector = json.loads((generate.VECTORS / "errors-2d.json").read_text())
    assert runner.replay(stub, vector) == []
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


def test_runner_checks_a_duplicate_byte_for_byte(stub):
    vector = json.loads((generate.VECTORS / "writers-2d.json").read_text())
    assert runner.replay(stub, vector) == []
    dup = next(i for i, s in enumerate(vector["steps"]) if s["expect"].get("same_as_step", 0) > 0)
    k = vector["steps"][dup]["expect"]["same_as_step"]
    tampered = copy.deepcopy(vector)
    tampered["steps"][dup]["expect"]["same_as_step"] = k - 1          # an earlier delta, not this seq's
    assert any(f"step {dup}: a Delta other than step {k - 1}'s" in m for m in runner.replay(stub, tampered))
    tampered = copy.deepcopy(vector)
    tampered["steps"][dup]["expect"]["same_as_step"] = dup           # not an earlier step
    assert any(f"step {dup}: same_as_step {dup}: not an earlier step" in m for m in runner.replay(stub, tampered))
    tampered = copy.deepcopy(vector)
    tampered["steps"][dup]["frame"]["writer"] = "other"               # a new writer: applied, not answered again
    found = "\n".join(runner.replay(stub, tampered))
    assert f"step {dup}: a Delta other than step {k}'s" in found, found


def test_generator_refuses_an_error_the_server_does_not_answer(server):
    s = generate.Scenario("wrong", "a documented error the server does not answer", 2, (0, 0, 10, 10), (1, 1))
    s.frame(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [2, 0, 1, 1]], error=(3, "add_boxes", 0))   # it is row 1
    with pytest.raises(SystemExit, match="documented error"):
        generate.build(s, generate.server_answers(server.address, s))


def _writer_scenario(**last):
    s = generate.Scenario("wrong", "writers", 2, (0, 0, 10, 10), (1, 1))
    s.frame(writer="m", seq=4, add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [0, 0, 2, 2]])
    s.frame(writer="m", seq=5, update_ids=[2], update_boxes=[[5, 5, 6, 6]])
    s.frame(writer="m", **last)
    return s


@pytest.mark.parametrize("last, match", [
    (dict(seq=5, same_as=0), "the writers' rules make it duplicate 1"),        # documented as the wrong step
    (dict(seq=5), "the writers' rules make it duplicate 1"),                   # a duplicate documented applied
    (dict(seq=6, same_as=1), "the writers' rules make it apply"),              # applied documented a duplicate
    (dict(seq=7, remove_ids=[1]), "must be documented FAILED_PRECONDITION"),   # a gap documented applied
    (dict(seq=3, remove_ids=[1], error=(3, "seq", -1)), "must be documented FAILED_PRECONDITION"),  # older
    (dict(seq=0, remove_ids=[1], error=(9, "seq", -1)), "must be documented INVALID_ARGUMENT"),
    (dict(seq=7, remove_ids=[1], error=(9, "writer", -1)), "documented error"),   # the server names seq
])
def test_generator_refuses_a_writer_step_documented_wrong(server, last, match):
    s = _writer_scenario(**last)
    with pytest.raises(SystemExit, match=match):
        generate.build(s, generate.server_answers(server.address, s))


def test_generator_refuses_a_duplicate_the_server_answers_anew(server):
    s = _writer_scenario(seq=5, same_as=1)
    answers = generate.server_answers(server.address, s)
    assert answers[2] == answers[1]                                  # the server answers the very Delta
    assert generate.build(s, answers)["steps"][2]["expect"] == {"same_as_step": 1}
    from sapgrid.v1 import frame_pb2

    anew = frame_pb2.Delta.FromString(answers[1])
    anew.stats.engine_seconds += 1e-6                                      # the same pairs, computed again
    with pytest.raises(SystemExit, match="not the Delta of step 1 byte for byte"):
        generate.build(s, answers[:2] + [anew.SerializeToString()])


def test_stale_check_names_changed_missing_and_extra_files(tmp_path):
    files = {"a.json": "{}\n", "b.json": "{\"x\": 1}\n", "c.json": "[]\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert generate.stale(files, tmp_path) == []
    (tmp_path / "b.json").write_text("{\"x\": 2}\n")
    (tmp_path / "c.json").unlink()
    (tmp_path / "old.json").write_text("{}\n")
    assert generate.stale(files, tmp_path) == ["b.json", "c.json", "old.json"]
