"""The cluster ring: which replica owns a world.

A world's bucket is ``crc32(name) mod BUCKETS`` (the same value HAProxy computes with
``req.hdr(x-sapgrid-world),crc32,mod(BUCKETS)``), and each bucket belongs to the member with the
highest rendezvous score (blake2b of ``"<bucket>|<member>"``): adding or removing a member moves only the
buckets that member gains or loses (~1/N of them). The proxy configuration is generated from the same
member list (``bucket_map``), so the proxy and every replica agree exactly on a world's owner.

A replica learns a new member list (a replica added or removed) from a file: ``--cluster-members
@PATH`` reads the list from PATH and reads it again whenever the file changes (checked at each create
and restore, the only calls the ring decides), so an operator rewrites the file (or a Kubernetes
ConfigMap) on every replica before ``sapgrid cluster rebalance`` moves the worlds. A file that no
longer parses keeps the last good list (and says so in the log).
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import zlib

import grpc

from .errors import ServiceError

BUCKETS = 1024
HEADER = "x-sapgrid-world"
log = logging.getLogger("sapgrid.server")


class NotOwner(ServiceError):
    """The ring gives this world to another replica."""

    code = grpc.StatusCode.FAILED_PRECONDITION


def parse_members(text) -> tuple:
    """``"HOST:PORT,HOST:PORT"`` (or a list) -> a tuple of distinct members, in the given order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    members = tuple(m.strip() for m in items if m.strip())
    for m in members:
        host, _, port = m.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"cluster member must be HOST:PORT, got {m!r}")
    if len(set(members)) != len(members):
        raise ValueError(f"cluster members repeat: {','.join(members)}")
    return members


def _score(bucket_: int, member: str) -> bytes:
    """Rendezvous score of a member for a bucket (a well-mixed hash; crc32 is linear and would not spread)."""
    return hashlib.blake2b(f"{bucket_}|{member}".encode(), digest_size=8).digest()


def bucket(world: str) -> int:
    """The world's bucket: crc32 (IEEE, as HAProxy's ``crc32`` converter) of its UTF-8 name mod BUCKETS."""
    return zlib.crc32(world.encode("utf-8")) % BUCKETS


class Ring:
    """The members and the owner of every bucket."""

    def __init__(self, members):
        self.members = parse_members(members)
        if not self.members:
            raise ValueError("a cluster needs at least one member")
        self.owners = tuple(max(self.members, key=lambda m: (_score(b, m), m)) for b in range(BUCKETS))

    def owner(self, world: str) -> str:
        return self.owners[bucket(world)]

    def bucket_map(self) -> str:
        """HAProxy map file: one ``bucket backend`` line per bucket (a backend is named by its member)."""
        return "".join(f"{b} {server_name(m)}\n" for b, m in enumerate(self.owners))


def server_name(member: str) -> str:
    """The proxy's backend (and server) name of a member: its HOST:PORT itself (HAProxy names allow
    letters, digits, '-', '_', '.' and ':'), so a name never changes when other members come or go."""
    return member


def read_members(path: str) -> tuple:
    """The member list written in a file: HOST:PORT entries separated by commas, spaces or new lines;
    ``#`` starts a comment."""
    with open(path, encoding="utf-8") as f:
        text = " ".join(line.split("#", 1)[0] for line in f)
    return parse_members(text.replace(",", " ").split())


class Ownership:
    """A replica's ownership check: refuses to create or restore a world the ring gives to another.

    members: ``HOST:PORT,...`` or ``@PATH`` (the list in a file, read again when the file changes)."""

    def __init__(self, members, self_member: str):
        self.self_member = self_member.strip()
        self.path = members[1:] if isinstance(members, str) and members.startswith("@") else None
        self._lock = threading.Lock()
        self._stamp = None
        if self.path is not None:
            try:
                self._stamp = self._file_stamp()
                self.ring = Ring(read_members(self.path))
            except OSError as exc:
                raise ValueError(f"cannot read the member list {self.path!r}: {exc.strerror or exc}") from None
        else:
            self.ring = Ring(members)
        if self.self_member not in self.ring.members:
            raise ValueError(f"--cluster-self {self_member!r} is not one of --cluster-members "
                             f"{','.join(self.ring.members)}")

    def _file_stamp(self) -> tuple:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size, st.st_ino

    def current(self) -> Ring:
        """The ring, after reading the member file again if it changed since the last read."""
        if self.path is None:
            return self.ring
        with self._lock:
            try:
                stamp = self._file_stamp()
                if stamp != self._stamp:
                    self._stamp = stamp
                    ring = Ring(read_members(self.path))
                    if ring.members != self.ring.members:
                        log.info("cluster members now %s (from %s)%s", ",".join(ring.members), self.path,
                                 "" if self.self_member in ring.members
                                 else f"; {self.self_member} is not one of them: it owns no world")
                    self.ring = ring
            except (OSError, ValueError) as exc:
                log.error("cluster member list %s not read again, keeping %s: %s", self.path,
                          ",".join(self.ring.members), getattr(exc, "strerror", None) or exc)
            return self.ring

    def check(self, world: str) -> None:
        owner = self.current().owner(world)
        if owner != self.self_member:
            raise NotOwner(f"world {world!r} belongs to replica {owner} (this is {self.self_member})",
                           field="name")


def from_config(members: str, self_member: str) -> Ownership | None:
    """The ownership check of a server config (None when the server is not in a cluster)."""
    if not members and not self_member:
        return None
    if not members or not self_member:
        raise ValueError("--cluster-members and --cluster-self go together")
    return Ownership(members, self_member)


class WrongWorld(ServiceError):
    """A frame names another world than the one its stream is bound to."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, world: str, bound: str):
        super().__init__(f"frame for world {world!r} on a stream bound to world {bound!r} ({HEADER})", field="world")


def stream_world(context) -> str:
    """The world a call names in its ``x-sapgrid-world`` metadata ("" if none)."""
    for key, value in context.invocation_metadata() or ():
        if key == HEADER:
            return value
    return ""
