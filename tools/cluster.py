"""``sapgrid cluster``: the proxy's configuration from the member list, the replicas' status, and the
move of worlds when members change (see deploy/proxy/)."""
from __future__ import annotations

import argparse
import string
import sys
from pathlib import Path

from sapgrid.server.cluster import Ring, parse_members, server_name

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "proxy" / "haproxy.cfg.in"


def proxy_config(members, bind: str, map_path: str, template: Path = TEMPLATE) -> str:
    """HAProxy's configuration for these members (one backend of one h2 server per replica)."""
    ring = Ring(members)
    backends = "\n".join(f"backend {server_name(i)}\n    server {server_name(i)} {m} proto h2\n"
                         for i, m in enumerate(ring.members))
    return string.Template(template.read_text()).substitute(bind=bind, map=map_path, backends=backends)


def write_proxy_config(members, bind: str, directory: Path, map_path: str | None = None) -> Path:
    """Write haproxy.cfg and buckets.map into directory; map_path is where the proxy will read the map
    (default: the written file). Returns the config's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "buckets.map").write_text(Ring(members).bucket_map())
    cfg = directory / "haproxy.cfg"
    cfg.write_text(proxy_config(members, bind, map_path or str(directory / "buckets.map")))
    return cfg


def status(members, out=sys.stdout) -> int:
    """Every replica, its worlds, objects and frames/s (two reads one second apart)."""
    import time

    from sapgrid.client import Client
    from sapgrid.client.errors import SapgridError

    members = parse_members(members)
    first = {}
    clients = {m: Client(m, timeout=5.0) for m in members}
    try:
        for m, c in clients.items():
            try:
                first[m] = {w.name: w.frames for w in c.list_worlds()}
            except SapgridError as exc:
                first[m] = exc
        t0 = time.perf_counter()
        time.sleep(1.0)
        bad = 0
        for m, c in clients.items():
            if isinstance(first[m], Exception):
                print(f"{m}  DOWN  {first[m]}", file=out)
                bad += 1
                continue
            try:
                worlds = c.list_worlds()
            except SapgridError as exc:
                print(f"{m}  DOWN  {exc}", file=out)
                bad += 1
                continue
            dt = time.perf_counter() - t0
            rate = sum(w.frames - first[m].get(w.name, w.frames) for w in worlds) / dt
            print(f"{m}  up  worlds={len(worlds)} objects={sum(w.objects for w in worlds)} frames/s={rate:.1f}",
                  file=out)
            for w in sorted(worlds, key=lambda w: w.name):
                print(f"    {w.name}  objects={w.objects} frames={w.frames}", file=out)
    finally:
        for c in clients.values():
            c.close()
    return 1 if bad else 0


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="a cluster of replicas behind the proxy: status, proxy-config")
    csub = p.add_subparsers(dest="cluster_command", required=True)
    s = csub.add_parser("status", help="every replica, its worlds, objects, frames/s")
    s.add_argument("--members", required=True, help="HOST:PORT,HOST:PORT,...")
    c = csub.add_parser("proxy-config", help="write HAProxy's haproxy.cfg and buckets.map for the members")
    c.add_argument("--members", required=True, help="HOST:PORT,HOST:PORT,...")
    c.add_argument("--bind", default=":8443", help="the proxy's listen address (default :8443)")
    c.add_argument("--out", default=".", help="directory to write into (default .)")
    c.add_argument("--map-path", default=None, help="where the proxy reads buckets.map (default: the written file)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        if args.cluster_command == "status":
            return status(args.members)
        if args.cluster_command == "proxy-config":
            print(write_proxy_config(args.members, args.bind, Path(args.out), args.map_path))
            return 0
    except ValueError as exc:
        print(f"sapgrid cluster: {exc}", file=sys.stderr)
        return 2
    return 2
