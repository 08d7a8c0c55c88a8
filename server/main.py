"""``sapgrid serve`` / ``python -m sapgrid.server``: parse the server's flags and run it."""
from __future__ import annotations

import argparse
import sys

from .config import add_arguments, from_args


def build_parser(prog: str = "sapgrid serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="run a sapgrid server (flags override SAPGRID_* env)")
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        cfg = from_args(args)
    except ValueError as exc:
        print(f"sapgrid serve: {exc}", file=sys.stderr)
        return 2
    import os
    from dataclasses import fields

    from .app import serve
    from .config import ServerConfig

    from_env = {"--" + f.name.replace("_", "-"): "SAPGRID_" + f.name.upper() for f in fields(ServerConfig)
                if getattr(args, f.name, None) is None and os.environ.get("SAPGRID_" + f.name.upper()) is not None}
    return serve(cfg, from_env=from_env)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
