"""The ``sapgrid`` command's client credentials (--tls-ca/--tls-cert/--tls-key/--token and SAPGRID_*):
a missing or bad file, or a certificate without its key, is one line naming the flag or variable, exit
code 2, before any call; a server that cannot be trusted or a wrong token is one line, exit code 1; never
a traceback nor gRPC's own log lines."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from security_helpers import auth_file, make_certs


def _cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SAPGRID_", "GRPC_"))}
    return subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", *argv], capture_output=True, text=True,
                          timeout=120, env={**base, **(env or {})})


def _one_line(proc, code: int, *words: str) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "pki")


@pytest.mark.parametrize("command", [["worlds", "--server", "127.0.0.1:1"],
                                     ["worlds", "create", "w", "--server", "127.0.0.1:1"],
                                     ["demo", "--ticks", "1", "--server", "127.0.0.1:1"],
                                     ["cluster", "status", "--members", "127.0.0.1:1"]])
def test_a_missing_ca_file_is_one_line_naming_the_flag(command, tmp_path):
    missing = str(tmp_path / "missing.pem")
    _one_line(_cli(*command, "--tls-ca", missing), 2, "--tls-ca", missing, "cannot read it")


def test_credential_files_from_variables_are_named_by_the_variable(tmp_path):
    not_pem = tmp_path / "empty.pem"
    not_pem.write_text("")
    _one_line(_cli("worlds", "--server", "127.0.0.1:1", env={"SAPGRID_TLS_CA": str(not_pem)}), 2,
              "SAPGRID_TLS_CA", "not a PEM file")
    _one_line(_cli("worlds", "--server", "127.0.0.1:1", env={"SAPGRID_TLS_KEY": str(tmp_path / "none.key")}), 2,
              "SAPGRID_TLS_KEY", "cannot read it")


def test_a_client_certificate_without_its_key(certs):
    crt, _ = certs.client("alice")
    _one_line(_cli("worlds", "--server", "127.0.0.1:1", "--tls-ca", certs.ca_file, "--tls-cert", crt), 2,
              "--tls-cert and --tls-key go together")


def test_an_untrusted_server_and_a_wrong_token_are_one_line_each(make_server, certs, tmp_path):
    crt, key = certs.server()
    tokens = auth_file(tmp_path / "auth.toml", {"ops": ("admin", "*"), "look": ("reader", "*")})
    srv = make_server(tls_cert=crt, tls_key=key, auth_file=str(tmp_path / "auth.toml"), metrics_port=-1)
    other = make_certs(tmp_path / "other")
    _one_line(_cli("worlds", "--server", srv.address, "--tls-ca", other.ca_file, "--token", tokens["ops"]), 1,
              "UNAVAILABLE", "CERTIFICATE_VERIFY_FAILED")
    _one_line(_cli("worlds", "--server", srv.address, "--tls-ca", certs.ca_file, "--token", "sg_wrong"), 1,
              "UNAUTHENTICATED")
    line = _one_line(_cli("worlds", "create", "cli-nope", "--server", srv.address,
                          env={"SAPGRID_TLS_CA": certs.ca_file, "SAPGRID_TOKEN": tokens["look"]}), 1,
                     "PERMISSION_DENIED", "admin")
    assert tokens["look"] not in line
    ok = _cli("worlds", "--server", srv.address, env={"SAPGRID_TLS_CA": certs.ca_file, "SAPGRID_TOKEN": tokens["ops"]})
    assert ok.returncode == 0 and "cli-nope" not in ok.stdout, ok.stderr
