"""gRPC health check of a sapgrid server (grpc.health.v1): exit 0 if SERVING, 1 otherwise.

    python healthcheck.py [HOST:PORT] [SERVICE]

Without an address it checks 127.0.0.1 on the port of SAPGRID_HEALTH_LISTEN if set (a server with TLS
serves plaintext health there), else of SAPGRID_LISTEN (default 50051), so inside the server's
container it needs no arguments. SERVICE defaults to "" (the whole server). A server
shutting down answers NOT_SERVING.
"""
from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def default_address(env=os.environ) -> str:
    """127.0.0.1 on the port of SAPGRID_HEALTH_LISTEN (the plaintext health port of a TLS server) if set,
    else of SAPGRID_LISTEN."""
    listen = env.get("SAPGRID_HEALTH_LISTEN") or env.get("SAPGRID_LISTEN", "127.0.0.1:50051")
    return f"127.0.0.1:{listen.rsplit(':', 1)[1]}"


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """The status name (SERVING, NOT_SERVING, ...), or the gRPC error code name if the call failed."""
    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else default_address()
    status = check(address, argv[2] if len(argv) > 2 else "")
    print(f"{address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
