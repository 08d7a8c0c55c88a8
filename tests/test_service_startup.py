"""``sapgrid serve`` refuses a bad configuration or a busy port with one line naming it, exit code 2,
no traceback and nothing half-started (no world created, no port left bound)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def _serve(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sapgrid.server", *flags], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture
def busy_port():
    """A loopback port held by a listening socket of this test."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


def _one_line_refusal(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for w in words:
        assert w in lines[0], lines[0]
    assert "created" not in proc.stdout + proc.stderr and "listening" not in proc.stdout


def test_busy_grpc_port(busy_port):
    _one_line_refusal(_serve("--listen", f"127.0.0.1:{busy_port}", "--metrics-port", "-1"), "--listen",
                      str(busy_port))


def test_busy_metrics_port(busy_port):
    proc = _serve("--listen", "127.0.0.1:0", "--metrics-port", str(busy_port))
    _one_line_refusal(proc, "--metrics-port", str(busy_port))


def test_bad_durability_security_and_cluster_options(tmp_path):
    """The new options: each refusal is one line naming the flag (or variable), exit 2, nothing started."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    bad_toml = tmp_path / "auth.toml"
    bad_toml.write_text("[[tokens]\nname = \n")
    members = tmp_path / "members"
    members.write_text("127.0.0.1:7001, nowhere\n")
    self_ = ["--cluster-self", "127.0.0.1:7001"]
    cases = [
        (["--data-dir", str(a_file)], {}, ["--data-dir", str(a_file), "Not a directory"]),
        (["--data-dir", str(tmp_path / "d"), "--fsync", "bogus"], {}, ["--fsync", "bogus"]),
        ([], {"SAPGRID_FSYNC": "bogus"}, ["SAPGRID_FSYNC", "bogus"]),
        (["--data-dir", str(tmp_path / "d"), "--snapshot-bytes", "-1"], {}, ["--snapshot-bytes", ">= 4096"]),
        (["--tls-cert", str(tmp_path / "missing.crt"), "--tls-key", str(a_file)], {}, ["--tls-cert", "cannot read"]),
        (["--tls-cert", str(a_file)], {}, ["--tls-key", "go together"]),
        (["--auth-file", str(bad_toml)], {}, ["--auth-file", "not valid TOML"]),
        (["--auth-file", str(tmp_path / "none.toml")], {}, ["--auth-file", "cannot read"]),
        (["--cluster-members", f"@{tmp_path / 'missing'}", *self_], {}, ["--cluster-members", "cannot read"]),
        (["--cluster-members", f"@{members}", *self_], {}, ["--cluster-members", "'nowhere'"]),
        (["--cluster-members", "127.0.0.1:7001,x"], {}, ["--cluster-members", "--cluster-self"]),
        (self_, {}, ["--cluster-self", "go together"]),
        ([], {"SAPGRID_CLUSTER_MEMBERS": "127.0.0.1:7001,bad", "SAPGRID_CLUSTER_SELF": "127.0.0.1:7001"},
         ["SAPGRID_CLUSTER_MEMBERS", "'bad'"]),
        ([], {"SAPGRID_DATA_DIR": str(a_file)}, ["--data-dir", "Not a directory", "set by SAPGRID_DATA_DIR"]),
        ([], {"SAPGRID_AUTH_FILE": str(bad_toml)}, ["--auth-file", "set by SAPGRID_AUTH_FILE"]),
        ([], {"SAPGRID_TLS_CERT": str(tmp_path / "none.crt"), "SAPGRID_TLS_KEY": str(a_file)},
         ["--tls-cert", "set by SAPGRID_TLS_CERT)"]),
    ]
    for flags, env, words in cases:
        _one_line_refusal(_serve("--listen", "127.0.0.1:0", "--metrics-port", "-1", *flags, env=env), *words)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("flags, env, words", [
    (["--default-world-bounds", "0,0,10"], {}, ["--default-world", "bounds"]),
    (["--default-world-cells", "0,4"], {}, ["--default-world", "cells"]),
    ([], {"SAPGRID_QUEUE_SIZE": "abc"}, ["SAPGRID_QUEUE_SIZE", "not an integer"]),
    ([], {"SAPGRID_QUEUE_SIZE": "0"}, ["SAPGRID_QUEUE_SIZE", ">= 1"]),
    (["--queue-size", "x"], {}, ["--queue-size", "not an integer"]),
    (["--listen", "nowhere"], {}, ["--listen", "HOST:PORT"]),
    (["--metrics-port", "70000"], {}, ["--metrics-port"]),
    (["--in-loop-frame-bytes", "-1"], {}, ["--in-loop-frame-bytes", "[0, 16 MiB]"]),
    ([], {"SAPGRID_IN_LOOP_FRAME_BYTES": "99999999"}, ["SAPGRID_IN_LOOP_FRAME_BYTES", "[0, 16 MiB]"]),
])
def test_bad_configuration(flags, env, words):
    _one_line_refusal(_serve("--listen", "127.0.0.1:0", *flags, env=env), *words)


def test_version():
    from sapgrid import __version__

    proc = subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"sapgrid {__version__}"


def test_json_logs_one_object_per_line_with_the_call_fields():
    """--log-format json: every log line is one JSON object; a stream's end and a failed call are logged
    with call, peer, world, status and duration_ms; failures of one peer are sampled (at most one a second)."""
    import json

    from sapgrid.client import Client
    from sapgrid.client.errors import NotFound
    from sapgrid.tools.spawn import SpawnedServer

    proc = subprocess.Popen([sys.executable, "-m", "sapgrid.server", "--listen", "127.0.0.1:0", "--metrics-port", "-1",
                             "--log-format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        address = line.split("listening on ", 1)[1].split()[0]
        with Client(address) as c:
            with c.stream("default") as s:
                s.step(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]])
            for _ in range(20):
                with pytest.raises(NotFound):
                    c.get_world("no-such-world")
    finally:
        proc.terminate()
        err = proc.communicate(timeout=60)[1]
    records = [json.loads(x) for x in err.splitlines() if x.strip()]      # every line is a JSON object
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    stream = [r for r in records if r.get("call", "").endswith("/StreamFrames")]
    assert stream and stream[0]["status"] in ("OK", "CANCELLED")         # the client's close() cancels the call
    assert stream[0]["world"] == "default" and stream[0]["duration_ms"] > 0
    assert stream[0]["peer"].startswith("ipv4:127.0.0.1")
    failed = [r for r in records if r.get("call", "").endswith("/GetWorld")]
    assert failed and failed[0]["status"] == "NOT_FOUND"
    assert len(failed) < 20                                                 # sampled, not one line per refusal


def test_the_server_reports_its_version(server):
    from sapgrid import __version__
    from sapgrid.client import Client

    with Client(server.address) as c:
        assert c.server_version() == __version__
