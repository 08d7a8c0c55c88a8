"""Build sapgrid-proto-VERSION.tar.gz: the contract's .proto files (sapgrid/v1, buf.yaml) with the
google.rpc protos a client needs to read rich errors (status, error_details, code), taken from the
installed googleapis-common-protos, and gRPC's health protocol (grpc/health/v1/health.proto, kept in
proto/ as gRPC publishes it; tests/test_ops_package.py checks it against the installed grpc_health).

    python scripts/proto_archive.py [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
import tarfile
from importlib import resources
from pathlib import Path

GOOGLE_RPC = ("status.proto", "error_details.proto", "code.proto")
HEALTH = "grpc/health/v1/health.proto"


def build(out_dir: Path) -> Path:
    from sapgrid import __version__

    name = f"sapgrid-proto-{__version__}"
    contract = resources.files("sapgrid.proto")
    rpc = resources.files("google.rpc")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.tar.gz"
    with tarfile.open(target, "w:gz") as tar:
        members = [("buf.yaml", contract / "buf.yaml")]
        members += [(f"sapgrid/v1/{p.name}", p) for p in sorted(contract.joinpath("sapgrid", "v1").iterdir(),
                                                                key=lambda p: p.name) if p.name.endswith(".proto")]
        members += [(f"google/rpc/{n}", rpc / n) for n in GOOGLE_RPC]
        members += [(HEALTH, contract / HEALTH)]
        for arcname, src in members:
            with resources.as_file(src) as path:
                tar.add(path, arcname=f"{name}/{arcname}")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("dist"), help="directory for the archive (default dist)")
    args = ap.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
