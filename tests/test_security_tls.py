"""TLS of the gRPC and metrics ports, mutual TLS, certificate rotation, the clients' TLS options.

Certificates are made at test time with trustme (a CA, a server certificate for 127.0.0.1, client
certificates); every server listens on 127.0.0.1.
"""
from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sapgrid.client import Client
from sapgrid.client.errors import PermissionDenied, Unauthenticated, Unavailable
from sapgrid.server.app import StartupError, build_server
from sapgrid.server.config import from_args

from security_helpers import auth_file, make_certs

CFG = dict(dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "pki")


def _health(channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def _fresh(options=()):
    """Channel options that never share a connection with another channel (gRPC's global subchannel pool)."""
    return [("grpc.use_local_subchannel_pool", 1), *options]


def test_tls_serves_clients_that_trust_its_ca_and_refuses_the_others(make_server, certs, tmp_path):
    crt, key = certs.server()
    srv = make_server(tls_cert=crt, tls_key=key)
    with Client(srv.address, ca_file=certs.ca_file) as c:
        c.create_world("tls-w", **CFG)
        with c.stream("tls-w") as s:
            d = s.step(add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
        assert d.created.tolist() == [[1, 2]]
    with Client(srv.address, timeout=5) as plain, pytest.raises(Unavailable):
        plain.list_worlds()                                    # plaintext against a TLS port
    other = make_certs(tmp_path / "other")                     # a CA the server's certificate is not from
    with Client(srv.address, ca_file=other.ca_file, timeout=5) as c, pytest.raises(Unavailable):
        c.list_worlds()
    assert srv.app.registry.get("tls-w").frames == 1


def test_mutual_tls_requires_a_client_certificate_and_its_subject_is_an_identity(make_server, certs, tmp_path):
    crt, key = certs.server()
    obs_crt, obs_key = certs.client("observer")
    adm_crt, adm_key = certs.client("ops")
    stranger_crt, stranger_key = certs.client("stranger")
    path = tmp_path / "auth.toml"
    auth_file(path, {}, {"observer": ("CN=observer", "reader", "*"), "ops": ("CN=ops", "admin", "*")})
    srv = make_server(tls_cert=crt, tls_key=key, tls_client_ca=certs.ca_file, auth_file=str(path))
    with Client(srv.address, ca_file=certs.ca_file, timeout=5) as c, pytest.raises(Unavailable):
        c.list_worlds()                                        # no client certificate: no TLS session
    with Client(srv.address, ca_file=certs.ca_file, cert_file=adm_crt, key_file=adm_key) as ops:
        ops.create_world("mtls-w", **CFG)
        with ops.stream("mtls-w") as s:
            s.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
    with Client(srv.address, ca_file=certs.ca_file, cert_file=obs_crt, key_file=obs_key) as obs:
        assert [w.name for w in obs.list_worlds()] == ["default", "mtls-w"]
        assert obs.query("mtls-w", [0, 0, 5, 5]).tolist() == [1]
        with pytest.raises(PermissionDenied, match="'observer' has no admin role"):
            obs.delete_world("mtls-w")
        with obs.stream("mtls-w") as s, pytest.raises(PermissionDenied, match="no writer role"):
            s.step(add_ids=[2], add_boxes=[[0, 0, 1, 1]])
    with Client(srv.address, ca_file=certs.ca_file, cert_file=stranger_crt, key_file=stranger_key) as c:
        with pytest.raises(Unauthenticated, match="not in the auth file"):
            c.list_worlds()                                    # a valid certificate nobody listed
    world = srv.app.registry.get("mtls-w")
    assert (world.frames, world.objects) == (1, 1)


def test_rotated_certificate_files_are_used_for_new_connections_and_open_streams_go_on(make_server, tmp_path):
    old, new = make_certs(tmp_path / "old"), make_certs(tmp_path / "new")
    crt, key = old.server()
    srv = make_server(tls_cert=crt, tls_key=key)
    with Client(srv.address, ca_file=old.ca_file) as c:
        c.create_world("rot", **CFG)
        stream = c.stream("rot")
        stream.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
        new_crt, new_key = new.server("rotated")
        for src, dst in ((new_crt, crt), (new_key, key)):      # cert-manager writes the new pair in place
            data = open(src, "rb").read()
            with open(dst, "wb") as f:
                f.write(data)
        future = time.time_ns() + 5_000_000_000                # a changed mtime even on coarse clocks
        for p in (crt, key):
            os.utime(p, ns=(future, future))
        ca_new = grpc.ssl_channel_credentials(open(new.ca_file, "rb").read())
        with grpc.secure_channel(srv.address, ca_new, options=_fresh()) as ch:
            assert _health(ch) == health_pb2.HealthCheckResponse.SERVING      # a new connection: new cert
        ca_old = grpc.ssl_channel_credentials(open(old.ca_file, "rb").read())
        with grpc.secure_channel(srv.address, ca_old, options=_fresh()) as ch, pytest.raises(grpc.RpcError) as err:
            _health(ch)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        d = stream.step(add_ids=[2], add_boxes=[[0.5, 0.5, 2, 2]])   # the open stream was never dropped
        assert d.created.tolist() == [[1, 2]]
        stream.close()
    assert srv.app.certificates.loads == 2


def test_half_written_certificate_keeps_the_previous_one(make_server, certs):
    crt, key = certs.server()
    srv = make_server(tls_cert=crt, tls_key=key)
    good = open(crt, "rb").read()
    with open(crt, "wb") as f:
        f.write(good[: len(good) // 2])                        # caught mid-write
    with Client(srv.address, ca_file=certs.ca_file) as c:
        assert [w.name for w in c.list_worlds()] == ["default"]
    assert srv.app.certificates.loads == 1


def test_metrics_over_https(make_server, certs):
    crt, key = certs.server("metrics")
    srv = make_server(metrics_tls_cert=crt, metrics_tls_key=key)
    context = ssl.create_default_context(cafile=certs.ca_file)
    url = f"https://127.0.0.1:{srv.app.metrics_port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=30) as r:
        assert "sapgrid_worlds" in r.read().decode()
    with pytest.raises(Exception):                             # noqa: B017 - plain HTTP gets no page
        urllib.request.urlopen(f"http://127.0.0.1:{srv.app.metrics_port}/metrics", timeout=10).read()


def test_bad_tls_files_and_an_open_listen_without_auth_refuse_to_start(certs, tmp_path):
    crt, key = certs.server()
    other_crt, other_key = certs.server("other")
    cases = [
        (dict(tls_cert=crt, tls_key=other_key), "do not load together"),
        (dict(tls_cert=str(tmp_path / "missing.crt"), tls_key=key), "cannot read it"),
        (dict(tls_cert=crt, tls_key=key, tls_client_ca=key), "not a CA certificate|not a PEM"),
        (dict(listen="0.0.0.0:0"), "without --auth-file"),
        (dict(listen="10.1.2.3:0", auth_file=str(tmp_path / "none.toml")), "--auth-file.*cannot read"),
    ]
    for overrides, message in cases:
        cfg = from_args(env={}, **{"listen": "127.0.0.1:0", "metrics_port": -1, **overrides})
        with pytest.raises(StartupError, match=message):
            build_server(cfg)
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        from_args(env={}, tls_cert=crt)


def test_cli_commands_take_tls_and_token_options_and_variables(make_server, certs, tmp_path):
    crt, key = certs.server()
    path = tmp_path / "auth.toml"
    tokens = auth_file(path, {"ops": ("admin", "*")})
    srv = make_server(tls_cert=crt, tls_key=key, auth_file=str(path))
    cli = [sys.executable, "-m", "sapgrid.tools.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPGRID_")}
    made = subprocess.run([*cli, "worlds", "create", "cli-w", "--server", srv.address, "--tls-ca", certs.ca_file,
                           "--token", tokens["ops"]], capture_output=True, text=True, timeout=120, env=env)
    assert made.returncode == 0, made.stderr
    listed = subprocess.run([*cli, "worlds", "--server", srv.address], capture_output=True, text=True, timeout=120,
                            env=dict(env, SAPGRID_TLS_CA=certs.ca_file, SAPGRID_TOKEN=tokens["ops"]))
    assert listed.returncode == 0 and "cli-w" in listed.stdout, listed.stderr
    refused = subprocess.run([*cli, "worlds", "--server", srv.address, "--tls-ca", certs.ca_file],
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    assert tokens["ops"] not in refused.stderr


def test_async_client_over_tls_with_a_token(make_server, certs, tmp_path):
    import asyncio

    from sapgrid.client import AsyncClient

    crt, key = certs.server()
    path = tmp_path / "auth.toml"
    tokens = auth_file(path, {"ops": ("admin", "*"), "look": ("reader", "*")})
    srv = make_server(tls_cert=crt, tls_key=key, auth_file=str(path))

    async def run():
        async with AsyncClient(srv.address, ca_file=certs.ca_file, token=tokens["ops"]) as c:
            await c.create_world("aio-w", **CFG)
            async with c.stream("aio-w") as s:
                d = await s.step(add_ids=np.array([1, 2], np.uint64),
                                 add_boxes=np.array([[0, 0, 2, 2], [1, 1, 3, 3]], np.float32))
            assert d.created.tolist() == [[1, 2]]
            assert (await c.pairs("aio-w")).tolist() == [[1, 2]]
        async with AsyncClient(srv.address, ca_file=certs.ca_file, token=tokens["look"]) as c:
            with pytest.raises(PermissionDenied):
                await c.delete_world("aio-w")
        async with AsyncClient(srv.address, ca_file=certs.ca_file) as c:
            with pytest.raises(Unauthenticated):
                await c.list_worlds()

    asyncio.run(run())
    assert srv.app.registry.get("aio-w").frames == 1


def test_tls_true_uses_the_system_roots(make_server, certs):
    plain = make_server()
    with Client(plain.address, tls=True, timeout=5) as c, pytest.raises(Unavailable):
        c.list_worlds()                                        # it speaks TLS: a plaintext port cannot answer
    crt, key = certs.server()
    srv = make_server(tls_cert=crt, tls_key=key)
    with Client(srv.address, tls=True, timeout=5) as c, pytest.raises(Unavailable):
        c.list_worlds()                                        # the test CA is not among the system's roots
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        Client(srv.address, ca_file=certs.ca_file, cert_file=crt)


def test_health_listen_answers_plaintext_probes_of_a_tls_server(make_server, certs):
    import socket
    from pathlib import Path

    with socket.socket() as sock:                                      # a free loopback port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    crt, key = certs.server()
    srv = make_server(tls_cert=crt, tls_key=key, health_listen=f"127.0.0.1:{port}")
    script = Path(__file__).resolve().parent.parent / "deploy" / "healthcheck.py"
    env = dict(os.environ, SAPGRID_LISTEN=srv.address, SAPGRID_HEALTH_LISTEN=f"0.0.0.0:{port}")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and f"127.0.0.1:{port}: SERVING" in out.stdout, out.stdout + out.stderr
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=_fresh()) as ch:
        assert _health(ch) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:                      # nothing but health there
            ch.unary_unary("/sapgrid.v1.SapgridService/ListWorlds")(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        srv.app.health.enter_graceful_shutdown()
        assert _health(ch) == health_pb2.HealthCheckResponse.NOT_SERVING
