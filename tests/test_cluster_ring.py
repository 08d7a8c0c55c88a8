"""The cluster ring and the replicas' ownership check (server/cluster.py)."""
import zlib

import pytest

from sapgrid.server import cluster
from sapgrid.server.app import build_server as build
from sapgrid.server.config import ServerConfig

MEMBERS = ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")


def test_bucket_is_crc32_mod_buckets():
    assert cluster.bucket("w1") == zlib.crc32(b"w1") % cluster.BUCKETS
    assert cluster.bucket("\u00e9t\u00e9") == zlib.crc32("\u00e9t\u00e9".encode()) % cluster.BUCKETS


def test_ring_spreads_and_moves_little_when_a_member_joins():
    ring3 = cluster.Ring(MEMBERS)
    counts = {m: ring3.owners.count(m) for m in MEMBERS}
    assert all(cluster.BUCKETS / 3 * 0.75 < c < cluster.BUCKETS / 3 * 1.25 for c in counts.values()), counts
    ring4 = cluster.Ring(MEMBERS + ("127.0.0.1:7004",))
    moved = [b for b in range(cluster.BUCKETS) if ring3.owners[b] != ring4.owners[b]]
    # only buckets that go to the new member move
    assert all(ring4.owners[b] == "127.0.0.1:7004" for b in moved)
    assert cluster.BUCKETS / 4 * 0.75 < len(moved) < cluster.BUCKETS / 4 * 1.25
    # the order the members are given in does not change the owners
    assert cluster.Ring(tuple(reversed(MEMBERS))).owners == ring3.owners


@pytest.mark.parametrize("bad", ["", "nohost", "h:0", "h:x", "a:1,a:1"])
def test_bad_member_lists_are_refused(bad):
    with pytest.raises(ValueError):
        cluster.Ring(bad)


def test_config_checks_self_is_a_member():
    with pytest.raises(ValueError, match="not one of"):
        ServerConfig(cluster_members=",".join(MEMBERS), cluster_self="127.0.0.1:9999")
    with pytest.raises(ValueError, match="go together"):
        ServerConfig(cluster_members=",".join(MEMBERS))


def test_replica_refuses_a_world_it_does_not_own():
    from sapgrid.client import Client
    from sapgrid.client.errors import FailedPrecondition

    ring = cluster.Ring(MEMBERS)
    me = MEMBERS[0]
    mine = next(f"w{i}" for i in range(100) if ring.owner(f"w{i}") == me)
    other = next(f"w{i}" for i in range(100) if ring.owner(f"w{i}") != me)
    app = build(ServerConfig(listen="127.0.0.1:0", metrics_port=-1, default_world="",
                             cluster_members=",".join(MEMBERS), cluster_self=me))
    app.start()
    try:
        with Client(f"127.0.0.1:{app.port}") as c:
            c.create_world(mine)
            with pytest.raises(FailedPrecondition) as err:
                c.create_world(other)
            assert err.value.field == "name"
            assert ring.owner(other) in err.value.message
            assert [w.name for w in c.list_worlds()] == [mine]
    finally:
        app.stop(0)
