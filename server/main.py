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
    from .app import serve

    return serve(cfg)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
