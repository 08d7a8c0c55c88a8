"""A cluster on loopback as it runs in production: replicas are `sapgrid serve` processes (so one can be
killed with SIGKILL), Debian's HAProxy from the project's setup in front of them with the configuration
`sapgrid cluster proxy-config` writes, and clients that only know the proxy's address.

- 3 replicas, 30 worlds: the worlds land on all three, each on its owner only; every stream's frames
  are applied by that owner (its frame counters equal the frames sent) and the pairs equal the oracle.
- kill -9 of one durable replica (``--data-dir``) while frames are in flight: only its worlds are
  UNAVAILABLE, the other worlds' streams go on; restarted, it recovers its worlds and their resuming
  writer streams continue exactly once (frame counters and writers' seqs equal the frames sent, pairs
  and digests equal the oracle's).
"""
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest

from naive import brute_force_pairs, pairs_to_array
from sapgrid.server.cluster import Ring
from sapgrid.tools.cluster import ProxyAdmin, write_proxy_config
from sapgrid.tools.spawn import SpawnedServer, free_port

HAPROXY = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
if not HAPROXY and os.environ.get("CI") != "true":
    pytest.skip("haproxy not installed (scripts/setup.d/70-haproxy.sh)", allow_module_level=True)

SIDE = 100.0


class Cluster:
    """Replica processes on fixed loopback ports reading their member list from one file, and one HAProxy
    (runtime API on a unix socket) routing by the ring of ``routing`` members."""

    def __init__(self, n: int, durable: bool = False):
        self.dir = tempfile.mkdtemp(prefix="sgc-", dir="/tmp")     # short: a unix socket path is < 108 bytes
        self.members = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.members_file = os.path.join(self.dir, "members")
        self.durable = durable            # each replica with a --data-dir of its own
        self.replicas: dict = {}
        self.proxy = None
        self.old_proxies: list = []
        self.admin = os.path.join(self.dir, "admin.sock")
        self.bind = f"127.0.0.1:{free_port()}"
        self.set_members(self.members)
        try:
            for m in self.members:
                self.start(m)
        except BaseException:
            self.close()
            raise

    def set_members(self, members) -> None:
        """Rewrite the member file every replica reads (atomically: write then rename)."""
        tmp = self.members_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(members) + "\n")
        os.replace(tmp, self.members_file)

    def start(self, member: str, *extra: str) -> SpawnedServer:
        r = SpawnedServer("--default-world", "", "--cluster-members", "@" + self.members_file,
                          "--cluster-self", member, *self.data_args(member), *extra, listen=member, metrics_port=-1)
        self.replicas[member] = r
        return r

    def data_args(self, member: str) -> tuple:
        return ("--data-dir", os.path.join(self.dir, "data-" + member.rsplit(":", 1)[1])) if self.durable else ()

    def start_proxy(self, members, map_from=None) -> None:
        """Start HAProxy (or reload it: a new process takes over with -sf) with this configuration."""
        cfg = write_proxy_config(members, self.bind, os.path.join(self.dir, "proxy"), admin=self.admin,
                                 map_from=map_from)
        cmd = [HAPROXY, "-db", "-f", str(cfg)]
        if self.proxy is not None:
            cmd += ["-sf", str(self.proxy.pid)]       # the old process ends once its connections end
            self.old_proxies.append(self.proxy)
        self.proxy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:  # up when its runtime API answers as this process (a reloaded proxy's old one lingers)
            try:
                if f"Pid: {self.proxy.pid}\n" in ProxyAdmin.command(self.admin, "show info"):
                    return
            except OSError:
                pass
            assert self.proxy.poll() is None, self.proxy.stdout.read().decode()
            assert time.monotonic() < deadline, "haproxy did not start"
            time.sleep(0.05)

    def close(self) -> None:
        for p in [*self.old_proxies, self.proxy]:
            if p is not None:
                p.terminate()
                p.wait(10)
        for r in self.replicas.values():
            if r.proc.poll() is None:
                r.stop(timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)


class Mover:
    """One world's frames: COUNT boxes added, then every box moved a little per frame; keeps the boxes
    of the frames answered so far, for the oracle."""

    COUNT = 40

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.ids = np.arange(1, self.COUNT + 1, dtype=np.uint64)
        lo = self.rng.uniform(0, SIDE - 8, size=(self.COUNT, 2))
        self.boxes = np.hstack([lo, lo + self.rng.uniform(2, 8, size=(self.COUNT, 2))]).astype(np.float32)
        self.sent = 0            # frames answered (applied)
        self.pending = None

    def frame(self) -> dict:
        """The next frame's arrays (the first adds the boxes)."""
        if self.sent == 0:
            self.pending = self.boxes
            return dict(add_ids=self.ids, add_boxes=self.boxes)
        step = self.rng.normal(0, 1.5, size=(self.COUNT, 2))
        lo = np.clip(self.boxes[:, :2] + step, 0, SIDE - 8)
        self.pending = np.hstack([lo, lo + (self.boxes[:, 2:] - self.boxes[:, :2])]).astype(np.float32)
        return dict(update_ids=self.ids, update_boxes=self.pending)

    def answered(self) -> None:
        self.boxes, self.pending = self.pending, None
        self.sent += 1

    def oracle(self) -> np.ndarray:
        n = self.COUNT
        return pairs_to_array(brute_force_pairs(self.ids, self.boxes, np.full(n, 0xFFFFFFFF, np.uint32),
                                                np.full(n, 0xFFFFFFFF, np.uint32), np.zeros(n, bool)))


def _held(member: str) -> dict:
    """name -> frames of every world a replica holds (asked directly, not through the proxy)."""
    from sapgrid.client import Client

    with Client(member, timeout=30) as c:
        return {w.name: w.frames for w in c.list_worlds()}


@pytest.fixture
def cluster3():
    """3 durable replicas (each with its own --data-dir) behind the proxy."""
    assert HAPROXY, "haproxy is not installed: run scripts/setup.d/70-haproxy.sh"
    c = Cluster(3, durable=True)
    try:
        c.start_proxy(c.members)
        yield c
    finally:
        c.close()


def test_thirty_worlds_over_three_replicas_and_kill_9_of_one(cluster3):
    from sapgrid.client import Client
    from sapgrid.client.errors import Unavailable
    from sapgrid.layout import pairs_digest

    c = cluster3
    ring = Ring(c.members)
    movers = [Mover(f"arena-{i:02d}", seed=i) for i in range(30)]
    owner = {m.name: ring.owner(m.name) for m in movers}
    assert set(owner.values()) == set(c.members)             # the 30 worlds land on all three

    with Client(c.bind, timeout=30) as client:
        for m in movers:
            client.create_world(m.name, bounds=(0, 0, SIDE, SIDE), cells=(4, 4))
        streams = {m.name: client.stream(m.name, writer="game", resume=True, resume_deadline=60) for m in movers}

        def round_(which) -> None:
            for m in which:
                streams[m.name].send(**m.frame())
            for m in which:
                assert streams[m.name].recv().frame == m.sent + 1    # one world per stream, in order, once
                m.answered()

        try:
            for _ in range(5):
                round_(movers)
            # each stream stuck to its owner: the owner applied every frame, no other replica has the world
            held = {r: _held(r) for r in c.members}
            for m in movers:
                assert {r for r in c.members if m.name in held[r]} == {owner[m.name]}
                assert held[owner[m.name]][m.name] == m.sent == 5
                assert np.array_equal(client.pairs(m.name), m.oracle()), m.name

            victim = c.members[1]
            lost = [m for m in movers if owner[m.name] == victim]
            kept = [m for m in movers if owner[m.name] != victim]
            for m in lost:                                        # in flight when the replica dies
                streams[m.name].send(**m.frame())
            c.replicas[victim].proc.kill()                        # kill -9
            c.replicas[victim].wait(10)
            with Client(c.bind, timeout=10) as probe:             # only the victim's worlds are unavailable
                for m in lost:
                    with pytest.raises(Unavailable):
                        probe.get_world(m.name)
            for _ in range(3):                                    # the other replicas' streams go on
                round_(kept)
            for r in c.members:
                if r != victim:
                    assert _held(r) == {m.name: 8 for m in kept if owner[m.name] == r}

            # restarted on its address with its data directory: its worlds come back, and their streams
            # continue where they stood (the frame in flight applied exactly once)
            c.start(victim)
            for m in lost:
                assert streams[m.name].recv().frame == m.sent + 1
                m.answered()
                assert streams[m.name].reconnects >= 1
            for _ in range(2):
                round_(movers)
        finally:
            for s in streams.values():
                s.close()
        for m in movers:
            info = _world_info(owner[m.name], m.name)
            oracle = m.oracle()
            assert (info.frames, info.writers) == (m.sent, {"game": m.sent}), m.name
            assert info.pairs_digest == pairs_digest(oracle)
            assert np.array_equal(client.pairs(m.name), oracle), m.name


def _world_info(member: str, name: str):
    from sapgrid.client import Client

    with Client(member, timeout=30) as c:
        return c.get_world(name)
