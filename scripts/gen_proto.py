#!/usr/bin/env python3
"""Generate the Python code of the sapgrid wire contract: proto/sapgrid/v1/*.proto -> proto/python/sapgrid/v1/.

    .venv/bin/python scripts/gen_proto.py            # regenerate proto/python/sapgrid/v1/*_pb2*.py(i)
    .venv/bin/python scripts/gen_proto.py --out DIR  # generate into DIR/sapgrid/v1 instead (the stale check)

Uses grpc_tools.protoc with --python_out, --grpc_python_out and --pyi_out. Modules import as
``sapgrid.v1.xxx_pb2`` (the package ``sapgrid.v1`` is the directory proto/python/sapgrid/v1/). Never edit the
generated files by hand; tests/test_service_contract.py fails if they differ from a fresh run.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_DIR = PROTO_ROOT / "sapgrid" / "v1"
TARGET = ROOT / "proto" / "python" / "sapgrid" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc on every proto/sapgrid/v1/*.proto; return the files written under out_root/sapgrid/v1."""
    from grpc_tools import protoc
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_DIR.glob("*.proto"))
    out_root.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
            f"--python_out={out_root}", f"--grpc_python_out={out_root}", f"--pyi_out={out_root}", *protos]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return sorted((out_root / "sapgrid" / "v1").glob("*"))


def generated_files(directory: Path) -> dict[str, bytes]:
    """Generated files of a directory by name (what the stale check compares)."""
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*"))
            if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="generate into OUT/sapgrid/v1 instead of proto/python/sapgrid/v1")
    args = ap.parse_args(argv)
    if args.out is not None:
        generate(args.out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        for old in TARGET.glob("*"):
            if old.is_file() and old.name.endswith(GENERATED_SUFFIXES):
                old.unlink()
        for f in files:
            if f.name.endswith(GENERATED_SUFFIXES):
                shutil.copyfile(f, TARGET / f.name)
                print(f"wrote {(TARGET / f.name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
