"""Replay the conformance vectors (conformance/vectors/*.json) against a sapgrid server, in Python.

For each vector: create a uniquely named world from "world", send every step's frame (its seq as given,
the world's name filled in, the bulk fields' exact bytes) through one StreamFrames stream, and compare
each answer with "expect": the delta's created/deleted bytes exactly, its frame, objects, pairs and
pairs_digest (the server's, and the runner's own kept from the deltas), or the error's code, field and
index, or for a writer's duplicate ``{"same_as_step": K}`` the answer's Delta, serialized, byte for byte
the Delta of step K (timings included: the first answer itself, not a new one; the runner's own digest
does not move). Then ListPairs (every page, small pages) must give exactly "final_pairs". The world is
deleted at the end. Raw generated stubs are used, so the bytes compared are the bytes on the wire.

    python conformance/runner.py --server 127.0.0.1:50051 [VECTOR.json ...]

Exit status 0 when every vector matches, 1 otherwise (each mismatch printed on a line).
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

import grpc

from sapgrid.layout import digest_step, pairs_array
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc, world_pb2

VECTORS = Path(__file__).resolve().parent / "vectors"
BULK_FIELDS = ("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static",
               "update_ids", "update_boxes")
PAGE_SIZE = 4          # small pages, so a runner walks next_page_token


def load(paths=None) -> list[dict]:
    """The vectors of ``paths`` (default: every conformance/vectors/*.json, by name)."""
    paths = sorted(VECTORS.glob("*.json")) if not paths else [Path(p) for p in paths]
    return [json.loads(Path(p).read_text()) for p in paths]


def frame_message(raw: dict, world: str) -> frame_pb2.Frame:
    """The Frame of a vector step (missing keys: empty)."""
    return frame_pb2.Frame(world=world, seq=int(raw.get("seq", 0)), writer=raw.get("writer", ""),
                           **{key: bytes.fromhex(raw.get(key, "")) for key in BULK_FIELDS})


def list_pairs(stub, world: str, page_size: int = PAGE_SIZE) -> bytes:
    """Every active pair of ``world``, the pages' bytes joined."""
    out, token = [], ""
    for _ in range(1_000_000):
        page = stub.ListPairs(pb.ListPairsRequest(world=world, page_size=page_size, page_token=token), timeout=60)
        out.append(page.pairs)
        token = page.next_page_token
        if not token:
            return b"".join(out)
    raise RuntimeError("ListPairs: no last page after 1,000,000 pages")


def replay(stub: pb_grpc.SapgridServiceStub, vector: dict) -> list[str]:
    """Replay one vector on a fresh world; the mismatches (empty: the server conforms)."""
    name = f"conf-{vector['name']}-{uuid.uuid4().hex[:8]}"[:64]
    w = vector["world"]
    stub.CreateWorld(pb.CreateWorldRequest(name=name, config=world_pb2.WorldConfig(
        dims=w["dims"], bounds=w["bounds"], cells=w["cells"])), timeout=60)
    bad = []
    try:
        steps = vector["steps"]
        requests = [pb.StreamFramesRequest(frame=frame_message(step["frame"], name)) for step in steps]
        answers = list(stub.StreamFrames(iter(requests), timeout=900))
        if len(answers) != len(steps):
            bad.append(f"{len(answers)} answers to {len(steps)} frames")
        digest = [0]
        for i, (step, resp) in enumerate(zip(steps, answers)):
            bad += [f"step {i}: {m}" for m in compare(step, resp, digest, answers[:i])]
        final = list_pairs(stub, name)
        if final.hex() != vector["final_pairs"]:
            bad.append(f"ListPairs: {final.hex()!r} != {vector['final_pairs']!r}")
    finally:
        stub.DeleteWorld(pb.DeleteWorldRequest(name=name), timeout=60)
    return [f"{vector['name']}: {m}" for m in bad]


def compare(step: dict, resp: pb.StreamFramesResponse, digest: list, earlier: list) -> list[str]:
    """The mismatches of one answer. ``digest[0]``: the client's own pair digest, kept from the deltas
    (``sapgrid.layout.digest_step``) and checked against the vector's too. ``earlier``: the answers to
    the steps before this one (a duplicate's Delta must be one of them, byte for byte)."""
    expect, seq = step["expect"], int(step["frame"].get("seq", 0))
    bad = [] if resp.seq == seq else [f"seq {resp.seq} != {seq}"]
    kind = resp.WhichOneof("result")
    if "same_as_step" in expect:
        k = int(expect["same_as_step"])
        if not 0 <= k < len(earlier) or earlier[k].WhichOneof("result") != "delta":
            return bad + [f"same_as_step {k}: not an earlier step answered with a delta"]
        if kind != "delta":
            return bad + [f"error {resp.error.code} {resp.error.field}[{resp.error.index}] ({resp.error.message}) "
                          f"where the Delta of step {k} was expected again"]
        if resp.delta.SerializeToString() != earlier[k].delta.SerializeToString():
            bad.append(f"a Delta other than step {k}'s (frame {resp.delta.frame}, "
                       f"created {resp.delta.created.hex()!r})")
        return bad                  # answered again, not applied again: the pair digest does not move
    if "error" in expect:
        if kind != "error":
            return bad + [f"a delta where the error {expect['error']} was expected"]
        got = {"code": resp.error.code, "field": resp.error.field, "index": resp.error.index}
        return bad + ([] if got == expect["error"] else [f"error {got} != {expect['error']} ({resp.error.message})"])
    if kind != "delta":
        return bad + [f"error {resp.error.code} {resp.error.field}[{resp.error.index}] ({resp.error.message}) "
                      f"where a delta was expected"]
    d = resp.delta
    for key, got in (("created", d.created.hex()), ("deleted", d.deleted.hex()), ("frame", d.frame),
                     ("objects", d.stats.objects), ("pairs", d.stats.pairs)):
        if got != expect[key]:
            bad.append(f"{key} {got!r} != {expect[key]!r}")
    want = int(expect["pairs_digest"])
    if d.pairs_digest != want:
        bad.append(f"pairs_digest {d.pairs_digest} != {want}")
    digest[0] = digest_step(digest[0], pairs_array(d.created), pairs_array(d.deleted))
    if digest[0] != want:
        bad.append(f"client pairs_digest {digest[0]} != {want}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Replay the conformance vectors against a sapgrid server.")
    ap.add_argument("--server", required=True, help="HOST:PORT")
    ap.add_argument("vectors", nargs="*", help="vector files (default: conformance/vectors/*.json)")
    args = ap.parse_args(argv)
    vectors = load(args.vectors)
    failures = 0
    with grpc.insecure_channel(args.server) as channel:
        stub = pb_grpc.SapgridServiceStub(channel)
        for vector in vectors:
            bad = replay(stub, vector)
            print(f"{'ok  ' if not bad else 'FAIL'} {vector['name']} ({len(vector['steps'])} frames)")
            for line in bad:
                print("    " + line)
            failures += bool(bad)
    print(f"{len(vectors) - failures}/{len(vectors)} vectors match")
    return 1 if failures or not vectors else 0


if __name__ == "__main__":
    sys.exit(main())
