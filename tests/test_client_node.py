"""The Node.js client (client/node) against a real sapgrid server.

Runs the package's own tests (``node --test``) with the server's address in ``SAPGRID_ADDRESS``: the
codec and digest, every call of the client, the conformance vectors, and a scenario recorded here with
the Python client (random frames with adds, moves, removes, filters, static objects, ids past 2^53 and
refused frames) whose every answer and final pair list the Node client must reproduce byte for byte.
Then the resuming writer streams (client/node/test/durable.test.mjs), against servers with a data
directory that the node tests start, cut off (a TCP relay) and kill themselves (``SAPGRID_SERVE``), and
TLS with tokens against one with an auth file and a certificate made here (trustme).
Node.js and the package's npm dependencies come from scripts/setup.d/50-node-client.sh; without them the
test is skipped, and fails under CI=true.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import trustme

from sapgrid.client import Client
from sapgrid.client.errors import SapgridError
from sapgrid.layout import digest_step
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
NODE_DIR = ROOT / "client" / "node"
FIELDS = ("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static", "update_ids",
          "update_boxes")
# What the build reads: a newer one than dist/index.js means the package is rebuilt before the tests.
BUILD_INPUTS = ("src/*.ts", "examples/*.ts", "scripts/build.mjs", "tsconfig.json", "package-lock.json")


def _missing() -> str | None:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} not found: run ./scripts/setup.sh (scripts/setup.d/50-node-client.sh installs Node.js)"
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        return "client/node has no node_modules: run ./scripts/setup.sh (npm ci in client/node)"
    return None


def _build_if_stale() -> None:
    built = NODE_DIR / "dist" / "index.js"
    inputs = [p for pattern in BUILD_INPUTS for p in NODE_DIR.glob(pattern)]
    inputs += list((ROOT / "proto" / "sapgrid" / "v1").glob("*.proto"))
    if built.exists() and all(p.stat().st_mtime <= built.stat().st_mtime for p in inputs):
        return
    run = subprocess.run(["npm", "run", "build"], cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"npm run build failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


def record_vector(client: Client, name: str, world: dict, frames: list[dict], digests: bool = True) -> dict:
    """Run frames (dicts of seq and field bytes) through the Python client on a fresh world and return
    a conformance vector (conformance/vectors format) of what it answered. digests: the server fills
    Delta.pairs_digest (record it); the digest the Python client keeps from the deltas is recorded always."""
    wname = f"py-{name}-{uuid.uuid4().hex[:6]}"
    client.create_world(wname, dims=world["dims"], bounds=world["bounds"], cells=world.get("cells"))
    steps, digest = [], 0
    try:
        with client.stream(wname) as s:
            for f in frames:
                s.send_message(frame_pb2.Frame(world=wname, seq=f["seq"], **{k: f[k] for k in FIELDS if k in f}))
            for f in frames:
                try:
                    d = s.recv()
                except SapgridError as e:
                    expect = {"error": {"code": e.code.value[0], "field": e.field, "index": e.index}}
                else:
                    digest = digest_step(digest, d.created, d.deleted)
                    expect = {"created": d.created.tobytes().hex(), "deleted": d.deleted.tobytes().hex(),
                              "frame": d.frame, "objects": d.stats.objects, "pairs": d.stats.pairs,
                              "mirror_digest": str(digest)}
                    if digests:
                        expect["pairs_digest"] = str(d.pairs_digest)
                steps.append({"frame": {"seq": f["seq"], "writer": "",
                                        **{k: f[k].hex() for k in FIELDS if f.get(k)}}, "expect": expect})
        final = client.pairs(wname).tobytes().hex()
    finally:
        client.delete_world(wname)
    return {"name": name, "description": "recorded with the Python client", "world": world, "steps": steps,
            "final_pairs": final}


def parity_frames(rng: np.random.Generator, dims: int = 2, n_start: int = 300, n_frames: int = 30) -> list[dict]:
    """Random frames of a world 200 units wide: ids past 2^53, moves of 30% of the objects, removes and
    adds with category/mask/static, and three refused frames (a live id added, an unknown id moved, a box
    with min > max) that must change nothing."""
    base = np.uint64(1 << 60)
    size = 8 if dims == 2 else 20

    def boxes(n):
        lo = rng.uniform(0, 190, (n, dims)).astype(np.float32)
        return np.concatenate([lo, lo + rng.uniform(1, size, (n, dims)).astype(np.float32)], axis=1)

    live = list(range(n_start))
    next_id = n_start
    frames = [{"seq": 1, "add_ids": (base + np.arange(n_start, dtype=np.uint64)).tobytes(),
               "add_boxes": boxes(n_start).tobytes()}]
    for seq in range(2, n_frames + 1):
        f: dict = {"seq": seq}
        if seq == 7:      # adds a live id: refused, add_ids[1]
            f["add_ids"] = (base + np.array([next_id, live[0]], np.uint64)).tobytes()
            f["add_boxes"] = boxes(2).tobytes()
        elif seq == 13:   # moves an unknown id: refused, update_ids[2]
            f["update_ids"] = (base + np.array([live[3], live[4], 10**6], np.uint64)).tobytes()
            f["update_boxes"] = boxes(3).tobytes()
        elif seq == 19:   # min > max: refused, update_boxes[1]
            bad = boxes(2)
            bad[1, 0] = bad[1, dims] + 1
            f["update_ids"] = (base + np.array(live[5:7], np.uint64)).tobytes()
            f["update_boxes"] = bad.tobytes()
        else:
            moved = rng.choice(live, size=len(live) * 3 // 10, replace=False)
            gone = rng.choice(np.setdiff1d(live, moved), size=8, replace=False)
            f["remove_ids"] = (base + gone.astype(np.uint64)).tobytes()
            f["update_ids"] = (base + moved.astype(np.uint64)).tobytes()
            f["update_boxes"] = boxes(len(moved)).tobytes()
            new = np.arange(next_id, next_id + 10, dtype=np.uint64)
            next_id += 10
            f["add_ids"] = (base + new).tobytes()
            f["add_boxes"] = boxes(10).tobytes()
            f["add_category"] = rng.choice(np.array([1, 2, 3], np.uint32), 10).tobytes()
            f["add_mask"] = rng.choice(np.array([1, 2, 0xFFFFFFFF], np.uint32), 10).tobytes()
            f["add_static"] = (rng.random(10) < 0.3).astype(np.uint8).tobytes()
            live = sorted(set(live) - set(gone.tolist())) + new.astype(int).tolist()
        frames.append(f)
    return frames


def _server_sends_digests(address: str) -> bool:
    """Whether the server fills Delta.pairs_digest (a frame with one pair gets a non-zero digest)."""
    name = f"digest-probe-{uuid.uuid4().hex[:6]}"
    with Client(address, timeout=60) as c:
        c.create_world(name, dims=2, bounds=(0, 0, 10, 10), cells=(1, 1))
        try:
            resp = c.stub.ApplyFrame(pb.ApplyFrameRequest(frame=frame_pb2.Frame(
                world=name, seq=1, add_ids=np.array([1, 2], np.uint64).tobytes(),
                add_boxes=np.array([0, 0, 2, 2, 1, 1, 3, 3], np.float32).tobytes())), timeout=60)
        finally:
            c.delete_world(name)
    return resp.delta.pairs_digest != 0


def _tap_counts(out: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M)}


def _run_node_tests(files: list[str], env: dict) -> str:
    """node --test on client/node/test/FILES; asserts every test passed (none skipped); returns the TAP output."""
    run = subprocess.run(["node", "--test", "--test-reporter=tap", "--test-concurrency=1", *files],
                         cwd=NODE_DIR / "test", capture_output=True, text=True, timeout=900, env=dict(os.environ, **env))
    out = run.stdout + run.stderr
    counts = _tap_counts(run.stdout)
    assert run.returncode == 0 and counts.get("fail") == 0, out[-6000:]
    assert counts.get("skipped") == 0 and counts.get("todo") == 0 and counts.get("cancelled") == 0, out[-6000:]
    assert counts.get("pass", 0) >= 1, out[-6000:]
    return run.stdout


def _need_node() -> None:
    missing = _missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    _build_if_stale()


def test_node_client_against_a_real_server(server, tmp_path):
    _need_node()
    worlds = {2: {"dims": 2, "bounds": [0.0, 0.0, 200.0, 200.0], "cells": [8, 8]},
              3: {"dims": 3, "bounds": [0.0, 0.0, 0.0, 200.0, 200.0, 200.0], "cells": [4, 4, 4]}}
    digests = _server_sends_digests(server.address)
    for dims, world in worlds.items():
        with Client(server.address, timeout=120) as c:
            vector = record_vector(c, f"python-parity-{dims}d", world,
                                   parity_frames(np.random.default_rng(2024 + dims), dims), digests)
        errors = [s["expect"]["error"] for s in vector["steps"] if "error" in s["expect"]]
        assert [(e["field"], e["index"]) for e in errors] == [("add_ids", 1), ("update_ids", 2), ("update_boxes", 1)]
        assert len(vector["final_pairs"]) > 20 * 32 and vector["steps"][0]["expect"]["created"]
        (tmp_path / f"python-parity-{dims}d.json").write_text(json.dumps(vector))
    env = {"SAPGRID_ADDRESS": server.address, "SAPGRID_VECTORS": str(tmp_path)}
    if not digests:
        env["SAPGRID_ALLOW_ZERO_DIGEST"] = "1"     # a server from before Delta.pairs_digest
    out = _run_node_tests(["codec.test.mjs", "client.test.mjs", "conformance.test.mjs", "subscribe.test.mjs"], env)
    assert _tap_counts(out)["pass"] >= 19, out[-3000:]
    for name in ("python-parity-2d", "python-parity-3d", "node-basic-2d"):
        assert re.search(rf"^ok \d+ - vector {name}$", out, re.M), out[-3000:]


def test_node_subscription_is_ready_once_the_server_registered_it(make_server, late_subscribers):
    """``await sub.ready`` against a server that registers subscribers 0.5 s late: a frame sent as soon as
    it resolves is still the subscription's first delta (client/node/test/subscribe.test.mjs)."""
    _need_node()
    srv = make_server(default_world="")
    out = _run_node_tests(["subscribe.test.mjs"], {"SAPGRID_ADDRESS": srv.address})
    assert _tap_counts(out)["pass"] == 2, out[-3000:]


def test_node_client_resumes_writer_streams(tmp_path):
    """Resuming writer streams against servers the node tests start, cut off and kill (--data-dir)."""
    _need_node()
    sapgrid = Path(sys.executable).with_name("sapgrid")
    helped = subprocess.run([str(sapgrid), "serve", "--help"], capture_output=True, text=True, timeout=60)
    if "--data-dir" not in helped.stdout:
        pytest.skip("this server has no durable worlds (sapgrid serve --data-dir): resume needs them")
    # A throwaway CA and a server certificate for localhost (the TLS test).
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    for extra in cert.cert_chain_pems[1:]:
        with open(tmp_path / "server.pem", "ab") as f:
            f.write(extra.bytes())
    out = _run_node_tests(["durable.test.mjs"], {"SAPGRID_SERVE": str(sapgrid), "SAPGRID_TLS_DIR": str(tmp_path)})
    assert _tap_counts(out)["pass"] == 8, out[-3000:]
