"""``python -m sapgrid.tools.bench_transport``: paced echo streams through the product's sync server and a
bare ``grpc.aio`` echo server, in turns; every message asked is answered (an idle machine, 1 s)."""
from __future__ import annotations

import json

import pytest

from sapgrid.tools import bench_transport


def test_both_servers_answer_the_schedule(capsys):
    assert bench_transport.main(["--streams", "3", "--hz", "10", "--seconds", "1", "--rounds", "1", "--bytes",
                                 "2000", "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert [r["server"] for r in result["runs"]] == ["sync", "aio"]
    for r in result["runs"]:
        assert r["asked"] == 30 and 0 < r["delivered"] <= r["asked"], r
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
        assert r["server_cpu_ms"] > 0 and r["generator_cpu_ms"] > 0 and r["others_cores"] >= 0, r


def test_the_aio_echo_refuses_a_reply_beyond_its_limit():
    import grpc

    from sapgrid.v1 import echo_service_pb2 as echo_pb
    from sapgrid.v1 import echo_service_pb2_grpc as echo_grpc

    server = bench_transport._AioServer(4096)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = echo_grpc.EchoServiceStub(channel)
            assert stub.Echo(echo_pb.EchoRequest(payload=b"abc"), timeout=30).payload == b"abc"
            with pytest.raises(grpc.RpcError) as err:
                stub.Echo(echo_pb.EchoRequest(reply_bytes=5000), timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "5000" in err.value.details()
    finally:
        server.stop()


@pytest.mark.parametrize("argv", [["--streams", "0"], ["--rounds", "0"], ["--hz", "0"], ["--seconds", "-1"]])
def test_bad_arguments_name_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_transport.main(argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err
