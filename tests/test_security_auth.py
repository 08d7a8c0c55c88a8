"""Authentication and authorization: token roles on world patterns, refusals that change nothing,
ListWorlds' filter, audit lines, the auth file's reload (SIGHUP), ``sapgrid auth token``, startup."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sapgrid.client import Client
from sapgrid.client.errors import PermissionDenied, Unauthenticated
from sapgrid.server import auth

from security_helpers import auth_file

CFG = dict(dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
ROLES = {"ops": ("admin", "*"), "game": ("writer", "match-*"), "look": ("reader", "*")}


@pytest.fixture
def secured(make_server, tmp_path):
    path = tmp_path / "auth.toml"
    tokens = auth_file(path, ROLES)
    srv = make_server(auth_file=str(path), default_world="")
    srv.tokens, srv.auth_path = tokens, path
    with Client(srv.address, token=tokens["ops"]) as ops:
        for name in ("match-1", "lobby"):
            ops.create_world(name, **CFG)
            with ops.stream(name) as s:
                s.step(add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
    return srv


def _state(srv, name):
    """A world's full observable state: pairs, objects, frames (compared before and after a refusal)."""
    r = srv.app.registry.get(name)
    return r.world.pairs().tolist(), r.objects, r.frames, r.generation


def test_the_auth_file_holds_hashes_only(secured):
    text = secured.auth_path.read_text()
    for token in secured.tokens.values():
        assert token not in text
        assert hashlib.sha256(token.encode()).hexdigest() in text


def test_no_credentials_or_an_unknown_token_is_unauthenticated_and_health_stays_open(secured):
    before = {n: _state(secured, n) for n in ("match-1", "lobby")}
    for token in (None, "sg_not-a-token", secured.tokens["ops"] + "x"):
        with Client(secured.address, token=token) as c:
            with pytest.raises(Unauthenticated):
                c.list_worlds()
            with pytest.raises(Unauthenticated):
                c.create_world("intruder", **CFG)
            with pytest.raises(Unauthenticated):
                c.step("match-1", 9, add_ids=[7], add_boxes=[[0, 0, 1, 1]])
            with c.stream("match-1") as s, pytest.raises(Unauthenticated):
                s.step(add_ids=[8], add_boxes=[[0, 0, 1, 1]])
            with pytest.raises(Unauthenticated):
                next(iter(c.subscribe("match-1")))
    with grpc.insecure_channel(secured.address) as ch:
        check = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING    # no credentials needed
        with pytest.raises(grpc.RpcError) as err:                          # another scheme than Bearer
            ch.unary_unary("/sapgrid.v1.SapgridService/ListWorlds")(b"", metadata=(("authorization", "Basic x"),),
                                                                    timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in err.value.details()
    assert {n: _state(secured, n) for n in ("match-1", "lobby")} == before
    assert "intruder" not in secured.app.registry.worlds


def test_reader_reads_everything_and_changes_nothing(secured):
    before = {n: _state(secured, n) for n in ("match-1", "lobby")}
    with Client(secured.address, token=secured.tokens["look"]) as c:
        assert [w.name for w in c.list_worlds()] == ["lobby", "match-1"]
        assert c.get_world("lobby").objects == 2
        assert c.query("match-1", [0, 0, 5, 5]).tolist() == [1, 2]
        assert c.pairs("lobby").tolist() == [[1, 2]]
        assert c.list_pairs("lobby")[0].tolist() == [[1, 2]]
        with pytest.raises(PermissionDenied, match="'look' has no admin role on world 'new'"):
            c.create_world("new", **CFG)
        with pytest.raises(PermissionDenied):
            c.delete_world("lobby")
        with pytest.raises(PermissionDenied, match="no writer role on world 'lobby'"):
            c.step("lobby", 5, update_ids=[1], update_boxes=[[50, 50, 51, 51]])
        with c.stream("match-1") as s, pytest.raises(PermissionDenied):
            s.step(remove_ids=[1])
    assert {n: _state(secured, n) for n in ("match-1", "lobby")} == before
    assert "new" not in secured.app.registry.worlds


def test_writer_sends_frames_only_to_its_worlds_each_frame_checked(secured):
    with Client(secured.address, token=secured.tokens["game"]) as c:
        assert [w.name for w in c.list_worlds()] == ["match-1"]          # only what it may read
        lobby = _state(secured, "lobby")
        with c.stream() as s:                     # one stream naming two worlds: each frame is checked
            d = s.step(world="match-1", update_ids=[2], update_boxes=[[50, 50, 51, 51]])
            assert d.deleted.tolist() == [[1, 2]]
            with pytest.raises(PermissionDenied, match="'game' has no writer role on world 'lobby'"):
                s.step(world="lobby", remove_ids=[1])
            d = s.step(world="match-1", update_ids=[2], update_boxes=[[1, 1, 3, 3]])   # the stream goes on
            assert d.created.tolist() == [[1, 2]]
        assert _state(secured, "lobby") == lobby
        with pytest.raises(PermissionDenied):
            c.get_world("lobby")
        with pytest.raises(PermissionDenied):
            c.pairs("lobby")
        with pytest.raises(PermissionDenied):
            next(iter(c.subscribe("lobby")))
        with pytest.raises(PermissionDenied):
            c.create_world("match-2", **CFG)                               # creating is admin's
        with pytest.raises(PermissionDenied):
            c.step("ghost", 1, add_ids=[1], add_boxes=[[0, 0, 1, 1]])     # no hint whether it exists
    assert secured.app.registry.get("match-1").frames == 3
    assert "match-2" not in secured.app.registry.worlds


def test_admin_creates_and_deletes_and_every_event_is_audited_by_name(secured, caplog):
    caplog.set_level(logging.INFO, logger="sapgrid.audit")
    with Client(secured.address, token=secured.tokens["ops"]) as c:
        c.create_world("match-9", **CFG)
        c.delete_world("match-9")
    with Client(secured.address, token=secured.tokens["look"]) as c, pytest.raises(PermissionDenied):
        c.delete_world("lobby")
    with Client(secured.address, token="sg_wrong") as c, pytest.raises(Unauthenticated):
        c.list_worlds()
    with Client(secured.address, token=secured.tokens["game"]) as c, c.stream() as s, \
            pytest.raises(PermissionDenied):
        s.step(world="lobby", remove_ids=[1])                              # a frame refused in its slot
    records = [r.audit for r in caplog.records if r.name == "sapgrid.audit"]
    events = [(r["audit"], r["identity"], r.get("world"), r.get("status")) for r in records]
    assert ("world_created", "ops", "match-9", None) in events
    assert ("world_deleted", "ops", "match-9", None) in events
    assert ("refused", "look", "lobby", "PERMISSION_DENIED") in events
    assert any(e[0] == "refused" and e[3] == "UNAUTHENTICATED" for e in events)
    assert ("refused", "game", "lobby", "PERMISSION_DENIED") in events
    text = "\n".join(json.dumps(r) for r in records) + "\n".join(r.getMessage() for r in caplog.records)
    for token in secured.tokens.values():
        assert token not in text                                           # names only, never a token
    for r in records:
        json.dumps(r)                                                      # one JSON object each


def test_the_auth_file_is_reloaded_and_a_bad_file_keeps_the_old_one(secured):
    new = auth.append_token(str(secured.auth_path), "late", "reader", "lobby")
    with Client(secured.address, token=new) as c, pytest.raises(Unauthenticated):
        c.list_worlds()                                                    # not loaded yet
    assert secured.app.reload_auth()
    with Client(secured.address, token=new) as c:
        assert [w.name for w in c.list_worlds()] == ["lobby"]
    good = secured.auth_path.read_text()
    secured.auth_path.write_text(good + "\n[[tokens]]\nname = 'x'\nsha256 = 'nothex'\nrole = 'admin'\n")
    assert not secured.app.reload_auth()                                   # refused: the old table stays
    with Client(secured.address, token=new) as c:
        assert [w.name for w in c.list_worlds()] == ["lobby"]
    lines = [line for line in good.splitlines(keepends=True)]
    start = max(i for i, line in enumerate(lines) if line.startswith("[[tokens]]"))
    secured.auth_path.write_text("".join(lines[:start]))                   # 'late' removed
    assert secured.app.reload_auth()
    with Client(secured.address, token=new) as c, pytest.raises(Unauthenticated):
        c.list_worlds()


@pytest.mark.parametrize("bad, message", [
    ("[[tokens]]\nname = 'a'\nsha256 = 'abc'\nrole = 'admin'\n", "64 lower-case hex"),
    ("[[tokens]]\nname = 'a'\nsha256 = '" + "a" * 64 + "'\nrole = 'root'\n", "admin, writer or reader"),
    ("[[tokens]]\nsha256 = '" + "a" * 64 + "'\nrole = 'admin'\n", "needs a name"),
    ("[[users]]\nname = 'a'\n", "unknown table"),
    ("[[tokens]\n", "not valid TOML"),
    ("[[subjects]]\nname = 'a'\nsubject = 'nobody'\nrole = 'reader'\n", "certificate subject"),
])
def test_bad_auth_files_are_refused_with_the_entry_named(tmp_path, bad, message):
    path = tmp_path / "auth.toml"
    path.write_text(bad)
    with pytest.raises(auth.AuthFileError, match=message):
        auth.load(str(path))
    with pytest.raises(auth.AuthFileError):
        auth.append_token(str(path), "b", "admin", "*")                   # never appends to a bad file
    assert path.read_text() == bad


def test_sapgrid_auth_token_appends_a_hash_and_prints_the_token_last(tmp_path):
    path = tmp_path / "auth.toml"
    cli = [sys.executable, "-m", "sapgrid.tools.cli", "auth", "token", "--file", str(path)]
    out = subprocess.run([*cli, "--name", "ci", "--role", "writer", "--worlds", "match-*"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    token = out.stdout.split()[-1]
    table = auth.load(str(path))
    ident = table.by_token(token)
    assert ident is not None and ident.name == "ci" and ident.may("writer", "match-3")
    assert not ident.may("writer", "lobby") and not ident.may("admin", "match-3")
    assert token not in path.read_text()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    bad = subprocess.run([*cli, "--name", "x", "--role", "root"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--role" in bad.stderr
    assert len(auth.load(str(path)).tokens) == 1


def test_serve_reloads_on_sighup_and_says_how_it_is_secured(tmp_path):
    path = tmp_path / "auth.toml"
    tokens = auth_file(path, {"ops": ("admin", "*")})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPGRID_")}
    proc = subprocess.Popen([sys.executable, "-m", "sapgrid.server", "--listen", "127.0.0.1:0", "--metrics-port",
                             "-1", "--auth-file", str(path), "--reflection", "off"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert "listening on 127.0.0.1:" in lines[0], lines
        assert "auth: tokens and certificates of" in lines[1] and "plaintext" in lines[1]
        address = lines[0].split("listening on ")[1].split()[0]
        late = auth.append_token(str(path), "late", "reader", "*")
        with Client(address, token=late) as c:
            with pytest.raises(Unauthenticated):
                c.list_worlds()
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60
            while True:                                                     # bounded: the reload is async
                try:
                    assert [w.name for w in c.list_worlds()] == ["default"]
                    break
                except Unauthenticated:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
        with grpc.insecure_channel(address) as ch:                         # reflection is off
            from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                               metadata=(("authorization", f"Bearer {tokens['ops']}"),), timeout=10))
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err_text = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    audit = [json.loads(line) for line in err_text.splitlines() if line.startswith('{"audit"')]
    assert any(a["audit"] == "auth_reloaded" for a in audit), err_text[-2000:]


def test_without_auth_the_server_says_it_is_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPGRID_")}
    proc = subprocess.Popen([sys.executable, "-m", "sapgrid.server", "--listen", "127.0.0.1:0", "--metrics-port",
                             "-1", "--default-world", ""], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert "no auth: loopback only" in lines[1], lines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    refused = subprocess.run([sys.executable, "-m", "sapgrid.server", "--listen", "0.0.0.0:0", "--metrics-port", "-1"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2 and "--insecure" in refused.stderr


def test_token_identities_unit():
    ident = auth.Identity("x", (auth.Grant("writer", "match-*"), auth.Grant("reader", "*")))
    assert ident.may("reader", "lobby") and ident.may("writer", "match-1")
    assert not ident.may("writer", "lobby") and not ident.may("admin", "match-1")
    assert np.all([auth.RANK[r] for r in ("reader", "writer", "admin")] == np.array([1, 2, 3]))


def test_frames_refused_by_role_count_in_the_per_client_refusal_metric(secured):
    from service_helpers import metric_value, scrape

    def refused():
        return metric_value(scrape(secured.metrics_url), "sapgrid_client_refusals_total", client="game",
                            reason="permission_denied") or 0

    before = refused()
    with Client(secured.address, token=secured.tokens["game"]) as c:
        with c.stream() as s:                     # refused by the servicer's check of each frame's world
            for _ in range(3):
                with pytest.raises(PermissionDenied):
                    s.step(world="lobby", remove_ids=[1])
            s.step(world="match-1", update_ids=[2], update_boxes=[[1, 1, 3, 3]])      # allowed: not counted
        with pytest.raises(PermissionDenied):
            c.step("lobby", 1, remove_ids=[1])    # ApplyFrame, the same check
    assert refused() == before + 4
