"""``sapgrid cluster``: the proxy's configuration from the member list, the replicas' status, and the
move of worlds when members change (see deploy/proxy/ and the README's "Clustering").

``rebalance --from OLD --to NEW`` moves every world whose owner changes, one ring bucket at a time
(all worlds of a bucket move together, since the proxy routes by bucket):

1. freeze each of the bucket's worlds on its old owner (frames answered UNAVAILABLE "moving", reads
   still served), snapshot it, restore it on its new owner (objects, frame counter, writers' seqs);
2. point the bucket at the new owner in every proxy given by ``--proxy-admin`` (HAProxy's runtime API,
   ``set map``), so the clients that reconnect reach the new owner;
3. delete the worlds from the old owner.

A failure before step 3 (a restore refused, a replica or a proxy unreachable) undoes the bucket's move:
the copies already restored are deleted from the new owner, the proxies point the bucket back at the
old owner, and the worlds are unfrozen there; nothing of the old owner is deleted.
"""
from __future__ import annotations

import argparse
import socket
import string
import sys
import time
from collections import defaultdict
from pathlib import Path

from sapgrid.server.cluster import Ring, bucket, parse_members, server_name

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "proxy" / "haproxy.cfg.in"
STOP_AFTER_FAILURES = 3         # buckets failing in a row that stop a rebalance (a cause common to all)


def _stats_line(admin: str | None) -> str:
    """HAProxy's runtime API socket: a unix socket path, or HOST:PORT (TCP), or none."""
    if not admin:
        return ""
    if admin.startswith("/"):
        return f"    stats socket {admin} mode 600 level admin\n"
    host, _, port = admin.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--admin must be a unix socket path or HOST:PORT, got {admin!r}")
    return f"    stats socket ipv4@{host}:{port} level admin\n"


def proxy_config(members, bind: str, map_path: str, template: Path = TEMPLATE, admin: str | None = None,
                 extra_members=()) -> str:
    """HAProxy's configuration for these members (one backend of one h2 server per replica, named by
    the member); extra_members get backends too (the members of the other ring during a rebalance)."""
    ring = Ring(members)
    every = list(ring.members) + [m for m in parse_members(extra_members) if m not in ring.members]
    backends = "\n".join(f"backend {server_name(m)}\n    server {server_name(m)} {m} proto h2\n" for m in every)
    return string.Template(template.read_text()).substitute(bind=bind, map=map_path, backends=backends,
                                                            default=server_name(ring.members[0]),
                                                            stats=_stats_line(admin))


def write_proxy_config(members, bind: str, directory: Path, map_path: str | None = None, admin: str | None = None,
                       map_from=None) -> Path:
    """Write haproxy.cfg and buckets.map into directory; map_path is where the proxy will read the map
    (default: the written file); admin: the runtime API's socket (a path or HOST:PORT; none by default).
    map_from: route by this (old) member list's ring while backends exist for both lists (the proxy's
    configuration during a rebalance). Returns the config's path."""
    directory = Path(directory)
    routing = Ring(map_from) if map_from else Ring(members)
    text = proxy_config(members, bind, map_path or str(directory / "buckets.map"), admin=admin,
                        extra_members=routing.members)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "buckets.map").write_text(routing.bucket_map())
    cfg = directory / "haproxy.cfg"
    cfg.write_text(text)
    return cfg


def status(members, out=sys.stdout) -> int:
    """Every replica, its worlds, objects and frames/s (two reads one second apart)."""
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
                print(f"    {w.name}  objects={w.objects} frames={w.frames}{'  frozen' if w.frozen else ''}", file=out)
    finally:
        for c in clients.values():
            c.close()
    return 1 if bad else 0


# ---- rebalance ----------------------------------------------------------------------------------

class ProxyAdmin:
    """One HAProxy's runtime API (``stats socket ... level admin``): a unix socket path or HOST:PORT."""

    def __init__(self, address: str, timeout: float = 5.0):
        self.address = address
        self.timeout = timeout
        self.map = self._the_map()

    def command(self, line: str) -> str:
        """One command's answer (also callable as ``ProxyAdmin.command(address, line)``)."""
        address, timeout = (self, 5.0) if isinstance(self, str) else (self.address, self.timeout)
        if address.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target = address
        else:
            host, _, port = address.rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            target = (host, int(port))
        with sock:
            sock.settimeout(timeout)
            sock.connect(target)
            sock.sendall(line.encode() + b"\n")
            parts = []
            while chunk := sock.recv(65536):         # non-interactive mode: the proxy closes after answering
                parts.append(chunk)
        return b"".join(parts).decode(errors="replace")

    def _the_map(self) -> str:
        """The file name of the proxy's bucket map (the one map the generated configuration loads)."""
        names = [line.split("(", 1)[1].split(")", 1)[0] for line in self.command("show map").splitlines()
                 if line[:1].isdigit() and "(" in line]
        if len(names) != 1:
            raise RuntimeError(f"proxy {self.address}: expected one map (the buckets), found {names}")
        return names[0]

    def route(self, bucket_: int, member: str) -> None:
        answer = self.command(f"set map {self.map} {bucket_} {server_name(member)}").strip()
        if answer:
            raise RuntimeError(f"proxy {self.address}: set map {bucket_} {server_name(member)}: {answer}")


class _Replica:
    """Direct calls to one replica (not through the proxy), with the Python client."""

    def __init__(self, member: str, timeout: float):
        from sapgrid.client import Client

        self.member = member
        self.client = Client(member, timeout=timeout)

    def worlds(self) -> dict:
        """name -> WorldInfo of every world the replica holds."""
        return {w.name: w for w in self.client.list_worlds()}

    def freeze(self, world: str, frozen: bool) -> None:
        self.client.freeze(world, frozen)

    def snapshot(self, world: str) -> bytes:
        return self.client.snapshot(world)

    def restore(self, world: str, data: bytes) -> None:
        self.client.restore(data, name=world)

    def delete(self, world: str) -> None:
        self.client.delete_world(world)

    def close(self) -> None:
        self.client.close()


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _move_bucket(b: int, moves: list, replicas: dict, proxies: list, out) -> bool:
    """Move one bucket's worlds [(world, src, dst)]; on a failure before the deletes, undo. True if moved."""
    frozen, restored, routed = [], [], []
    t0 = time.perf_counter()
    try:
        for world, src, dst in moves:
            frozen.append((world, src))        # before the call: one that fails may still have frozen it
            replicas[src].freeze(world, True)
            data = replicas[src].snapshot(world)
            replicas[dst].restore(world, data)
            restored.append((world, dst))
        dst = moves[0][2]
        for p in proxies:
            p.route(b, dst)
            routed.append(p)
    except Exception as exc:  # noqa: BLE001 - any failure undoes the bucket's move
        print(f"bucket {b}: move failed ({_why(exc)}); the worlds stay on their old owner", file=out)
        undo_ok = True
        for p in routed:
            try:
                p.route(b, moves[0][1])
            except Exception as exc2:  # noqa: BLE001
                undo_ok = False
                print(f"    proxy {p.address}: could not route bucket {b} back: {_why(exc2)}", file=out)
        for world, dst in restored:
            try:
                replicas[dst].delete(world)
                print(f"    {world}: its copy on {dst} deleted", file=out)
            except Exception as exc2:  # noqa: BLE001
                undo_ok = False
                print(f"    {world}: the copy on {dst} could not be deleted: {_why(exc2)}", file=out)
        for world, src in frozen:
            try:
                replicas[src].freeze(world, False)
            except Exception as exc2:  # noqa: BLE001
                undo_ok = False
                print(f"    {world}: could not be unfrozen on {src}: {_why(exc2)}", file=out)
        if undo_ok:
            print(f"    bucket {b} undone: {', '.join(w for w, _, _ in moves)} on {moves[0][1]}, not frozen", file=out)
        return False
    for world, src, dst in moves:
        try:
            replicas[src].delete(world)
        except Exception as exc:  # noqa: BLE001 - the world is served by dst; the frozen copy is left over
            print(f"{world}: moved to {dst}, but its frozen copy on {src} could not be deleted: {_why(exc)}",
                  file=out)
            continue
        print(f"{world}: {src} -> {dst} (frozen {1e3 * (time.perf_counter() - t0):.0f} ms)", file=out)
    return True


def plan(from_members, to_members, held: dict) -> dict:
    """bucket -> [(world, src, dst)] for every world held (member -> names) whose owner in the new ring
    is not the member that holds it."""
    new = Ring(to_members)
    moves: dict = defaultdict(list)
    for src, names in held.items():
        for world in names:
            dst = new.owner(world)
            if dst != src:
                moves[bucket(world)].append((world, src, dst))
    return {b: sorted(m) for b, m in moves.items()}           # a bucket's worlds move in name order


def _finish_earlier_moves(moves: dict, held: dict, replicas: dict, proxies: list, out) -> int:
    """Worlds held by both their old replica and their new owner, left by a move that was interrupted
    (the tool stopped between the restore and the delete). A copy frozen on the old replica is that
    move's source, and the new owner's copy was restored from it after it froze: the bucket is routed
    to the new owner and the frozen copy deleted. An unfrozen one took frames the other copy lacks (or
    the names collide): reported, and its whole bucket stays where it is (the proxy routes by bucket),
    counted as a failure. Removes what it handled from moves."""
    failed = 0
    for b in list(moves):
        both = [(w, src, dst) for w, src, dst in moves[b] if w in held[dst]]
        if not both:
            continue
        clash = [(w, src, dst) for w, src, dst in both if not held[src][w].frozen]
        if clash:
            failed += 1
            for w, src, dst in clash:
                print(f"{w}: held by both {src} and its new owner {dst}, and not frozen on {src}: bucket {b} "
                      f"not moved (keep one of the two, delete the other, run rebalance again)", file=out)
            del moves[b]
            continue
        try:
            for p in proxies:
                p.route(b, both[0][2])
            for w, src, dst in both:
                replicas[src].delete(w)
                print(f"{w}: {src} -> {dst} (the end of an earlier move: the frozen copy deleted)", file=out)
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"bucket {b}: an earlier move could not be finished: {_why(exc)}", file=out)
            del moves[b]
            continue
        moves[b] = [(w, src, dst) for w, src, dst in moves[b] if w not in held[dst]]
        if not moves[b]:
            del moves[b]
    return failed


def rebalance(from_members, to_members, proxy_admin=(), out=sys.stdout, timeout: float = 60.0,
              passes: int = 3) -> int:
    """Move every world whose owner changes from the ring of from_members to that of to_members (see the
    module's docstring). Returns 0 when every world moved, 1 when some did not (said on out), 2 when
    nothing could start (a replica or a proxy unreachable)."""
    old, new = Ring(from_members), Ring(to_members)
    every = list(old.members) + [m for m in new.members if m not in old.members]
    replicas = {m: _Replica(m, timeout) for m in every}
    try:
        try:
            proxies = [ProxyAdmin(a) for a in proxy_admin]
        except (OSError, RuntimeError) as exc:
            print(f"sapgrid cluster rebalance: proxy runtime API: {exc}; nothing moved", file=out)
            return 2
        failed = 0
        for _ in range(passes):  # again: worlds created on an old owner while its buckets moved
            held = {}
            for m in every:
                try:
                    held[m] = replicas[m].worlds()
                except Exception as exc:  # noqa: BLE001
                    print(f"sapgrid cluster rebalance: replica {m} unreachable ({_why(exc)}); "
                          f"nothing more moved", file=out)
                    return 2
            moves = plan(old.members, new.members, held)
            failed = _finish_earlier_moves(moves, held, replicas, proxies, out)
            if not moves:
                break
            in_a_row = 0
            for b in sorted(moves):
                ok = _move_bucket(b, moves[b], replicas, proxies, out)
                failed += not ok
                in_a_row = 0 if ok else in_a_row + 1
                if in_a_row == STOP_AFTER_FAILURES:   # e.g. a new replica without the new member list
                    print(f"{in_a_row} buckets in a row failed: stopping, the other buckets stay where they are",
                          file=out)
                    break
            if failed:
                break
        moved_buckets = sum(o != n for o, n in zip(old.owners, new.owners))
        print(f"rebalance: {moved_buckets} of {len(new.owners)} buckets change owner; "
              f"{'some worlds did not move' if failed else 'every world is on its owner'}", file=out)
        if not proxies:
            print("no --proxy-admin: reload the proxy with the new map now "
                  "(sapgrid cluster proxy-config --members ...)", file=out)
        return 1 if failed else 0
    finally:
        for r in replicas.values():
            r.close()


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="a cluster of replicas behind the proxy: status, proxy-config, rebalance")
    csub = p.add_subparsers(dest="cluster_command", required=True)
    s = csub.add_parser("status", help="every replica, its worlds, objects, frames/s")
    s.add_argument("--members", required=True, help="HOST:PORT,HOST:PORT,...")
    c = csub.add_parser("proxy-config", help="write HAProxy's haproxy.cfg and buckets.map for the members")
    c.add_argument("--members", required=True, help="HOST:PORT,HOST:PORT,...")
    c.add_argument("--bind", default=":8443", help="the proxy's listen address (default :8443)")
    c.add_argument("--out", default=".", help="directory to write into (default .)")
    c.add_argument("--map-path", default=None, help="where the proxy reads buckets.map (default: the written file)")
    c.add_argument("--admin", default=None,
                   help="the proxy's runtime API socket, for rebalance --proxy-admin: a unix socket path or "
                        "HOST:PORT (default: none)")
    c.add_argument("--map-from", default=None, metavar="MEMBERS",
                   help="route by this (old) member list's ring, with backends for both lists: the proxy's "
                        "configuration while replicas are added or removed")
    r = csub.add_parser("rebalance", help="move the worlds whose owner changes from one member list to another")
    r.add_argument("--from", dest="from_members", required=True, help="the members before: HOST:PORT,...")
    r.add_argument("--to", dest="to_members", required=True, help="the members after: HOST:PORT,...")
    r.add_argument("--proxy-admin", default="",
                   help="every proxy's runtime API (unix socket path or HOST:PORT), comma-separated: each moved "
                        "bucket is pointed at its new owner before the old copy is deleted")
    r.add_argument("--timeout", type=float, default=60.0, help="deadline of each call, seconds (default 60)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        if args.cluster_command == "status":
            return status(args.members)
        if args.cluster_command == "proxy-config":
            print(write_proxy_config(args.members, args.bind, Path(args.out), args.map_path, args.admin,
                                     args.map_from))
            return 0
        if args.cluster_command == "rebalance":
            admins = [a.strip() for a in args.proxy_admin.split(",") if a.strip()]
            return rebalance(args.from_members, args.to_members, admins, timeout=args.timeout)
    except ValueError as exc:
        print(f"sapgrid cluster: {exc}", file=sys.stderr)
        return 2
    return 2
