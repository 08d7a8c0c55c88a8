"""The cluster ring and the replicas' ownership check (server/cluster.py)."""
import io
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


def test_calls_carry_the_world_header_and_a_stream_is_bound_to_its_world(monkeypatch):
    import numpy as np

    from sapgrid.client import Client
    from sapgrid.client.errors import FailedPrecondition
    from sapgrid.server import aio

    seen = []
    outermost = aio.CallContexts.intercept_service

    async def recording(self, continuation, details):      # every call's metadata, as the server got it
        seen.append((details.method.rsplit("/", 1)[1], dict(details.invocation_metadata).get(cluster.HEADER)))
        return await outermost(self, continuation, details)

    monkeypatch.setattr(aio.CallContexts, "intercept_service", recording)
    app = build(ServerConfig(listen="127.0.0.1:0", metrics_port=-1, default_world=""))
    app.start()
    try:
        with Client(f"127.0.0.1:{app.port}") as c:
            c.create_world("a")
            c.create_world("b")
            c.get_world("a")
            ids = np.array([1, 2], dtype=np.uint64)
            boxes = np.array([[0, 0, 2, 2], [1, 1, 3, 3]], dtype=np.float64)
            c.step("a", add_ids=ids, add_boxes=boxes)
            c.query("a", [0, 0, 10, 10])
            c.list_pairs("a")
            c.pairs("a")
            with c.stream("b") as s:
                s.send(add_ids=ids, add_boxes=boxes)
                assert len(s.recv().created) == 1
                s.send(world="a", remove_ids=ids)
                with pytest.raises(FailedPrecondition, match="bound to world 'b'"):
                    s.recv()
                s.send(remove_ids=ids)  # the stream goes on
                assert len(s.recv().deleted) == 1
            assert len(c.pairs("a")) == 1  # the refused frame changed nothing
            c.delete_world("b")
    finally:
        app.stop(0)
    named = [m for m, w in seen if m not in ("ListWorlds",)]
    assert named and all(w in ("a", "b") for m, w in seen if m in named), seen
    assert ("StreamFrames", "b") in seen and ("DeleteWorld", "b") in seen and ("StreamPairs", "a") in seen


@pytest.mark.parametrize("where,members,admin", [
    ("compose", "sapgrid-0:50051,sapgrid-1:50051,sapgrid-2:50051", "0.0.0.0:9999"),
    ("k8s", "sapgrid-0.sapgrid:50051,sapgrid-1.sapgrid:50051,sapgrid-2.sapgrid:50051", "127.0.0.1:9999")])
def test_deployed_proxy_configs_are_the_generated_ones(tmp_path, where, members, admin):
    """deploy/proxy/{compose,k8s} are `sapgrid cluster proxy-config` output for the deployed member lists
    (the same ring the replicas check), and those lists are the ones the replicas are given."""
    from pathlib import Path

    from sapgrid.tools.cluster import write_proxy_config

    root = Path(__file__).resolve().parent.parent / "deploy"
    write_proxy_config(members, ":8443", tmp_path, "/usr/local/etc/haproxy/buckets.map", admin)
    for name in ("haproxy.cfg", "buckets.map"):
        assert (root / "proxy" / where / name).read_text() == (tmp_path / name).read_text(), name
    if where == "compose":                    # the replicas read the member file mounted from deploy/cluster-members
        compose = (root / "compose.cluster.yaml").read_text()
        assert compose.count('"./cluster-members:/etc/sapgrid/members:ro"') == 3
        assert 'SAPGRID_CLUSTER_MEMBERS: "@/etc/sapgrid/members/members"' in compose
        assert cluster.read_members(str(root / "cluster-members" / "members")) == cluster.parse_members(members)
    else:
        assert members in (root / "k8s/cluster/proxy-replicas.yaml").read_text()


def test_member_list_file_is_read_again_when_it_changes(tmp_path, caplog):
    path = tmp_path / "members"
    path.write_text("# the cluster\n" + "\n".join(MEMBERS[:2]) + "\n")
    own = cluster.Ownership(f"@{path}", MEMBERS[0])
    ring2, ring3 = cluster.Ring(MEMBERS[:2]), cluster.Ring(MEMBERS)
    # a world that moves to the third member when it joins
    w = next(f"w{i}" for i in range(1000) if ring2.owner(f"w{i}") == MEMBERS[0] and ring3.owner(f"w{i}") == MEMBERS[2])
    own.check(w)
    path.write_text(",".join(MEMBERS) + "\n")
    with pytest.raises(cluster.NotOwner, match=MEMBERS[2]):
        own.check(w)
    assert own.ring.members == MEMBERS
    # a file that does not parse keeps the last good list, and says so
    path.write_text("not-a-member\n")
    with pytest.raises(cluster.NotOwner):
        own.check(w)
    assert own.ring.members == MEMBERS
    assert "not read again" in caplog.text
    # a list without this replica: it owns nothing
    path.write_text(",".join(MEMBERS[1:]) + "\n")
    mine = next(f"w{i}" for i in range(1000) if ring3.owner(f"w{i}") == MEMBERS[0])
    with pytest.raises(cluster.NotOwner):
        own.check(mine)


@pytest.mark.parametrize("members", ["@/nonexistent/members", "@"])
def test_member_list_file_must_exist_at_start(members):
    with pytest.raises(ValueError, match="cannot read the member list"):
        ServerConfig(cluster_members=members, cluster_self=MEMBERS[0])


def test_replica_refuses_to_restore_a_world_it_does_not_own():
    from sapgrid.client import Client
    from sapgrid.client.errors import FailedPrecondition

    ring = cluster.Ring(MEMBERS)
    me = next(m for m in MEMBERS if m != ring.owner(""))     # a restore without a name is checked by its snapshot's
    mine = next(f"w{i}" for i in range(100) if ring.owner(f"w{i}") == me)
    other = next(f"w{i}" for i in range(100) if ring.owner(f"w{i}") != me)
    app = build(ServerConfig(listen="127.0.0.1:0", metrics_port=-1, default_world="",
                             cluster_members=",".join(MEMBERS), cluster_self=me))
    app.start()
    try:
        with Client(f"127.0.0.1:{app.port}") as c:
            c.create_world(mine)
            data = c.snapshot(mine)
            with pytest.raises(FailedPrecondition) as err:
                c.restore(data, name=other)
            assert ring.owner(other) in err.value.message
            c.delete_world(mine)
            c.restore(data)                           # under its own name, which this replica owns
            assert [w.name for w in c.list_worlds()] == [mine]
    finally:
        app.stop(0)


def test_proxy_config_during_a_change_routes_by_the_old_ring(tmp_path):
    from sapgrid.tools.cluster import write_proxy_config

    new = MEMBERS + ("127.0.0.1:7004",)
    cfg = write_proxy_config(new, "127.0.0.1:8443", tmp_path, admin=str(tmp_path / "admin.sock"),
                             map_from=MEMBERS).read_text()
    for m in new:                                       # a backend for every member of both lists
        assert f"backend {m}\n    server {m} {m} proto h2\n" in cfg
    assert f"stats socket {tmp_path / 'admin.sock'} mode 600 level admin" in cfg
    assert (tmp_path / "buckets.map").read_text() == cluster.Ring(MEMBERS).bucket_map()
    write_proxy_config(new, "127.0.0.1:8443", tmp_path, admin="127.0.0.1:9999")
    assert (tmp_path / "buckets.map").read_text() == cluster.Ring(new).bucket_map()
    assert "stats socket ipv4@127.0.0.1:9999 level admin" in (tmp_path / "haproxy.cfg").read_text()


@pytest.mark.parametrize("argv,message", [
    (["cluster", "rebalance", "--from", "127.0.0.1:7001", "--to", "nohost"], "HOST:PORT"),
    (["cluster", "rebalance", "--from", "127.0.0.1:7001", "--to", ""], "at least one member"),
    (["cluster", "proxy-config", "--members", "127.0.0.1:7001", "--admin", "nowhere"], "--admin"),
    (["cluster", "proxy-config", "--members", "127.0.0.1:7001", "--map-from", "a:1,a:1"], "repeat"),
])
def test_cluster_commands_refuse_bad_input(argv, message, capsys, tmp_path):
    from sapgrid.tools.cli import main

    assert main(argv + (["--out", str(tmp_path)] if argv[1] == "proxy-config" else [])) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())                 # nothing written


def test_rebalance_stops_before_anything_when_a_proxy_does_not_answer(tmp_path):
    from sapgrid.tools.cluster import rebalance

    out = io.StringIO()
    assert rebalance(MEMBERS, MEMBERS[:2], [str(tmp_path / "no.sock")], out=out) == 2
    assert "proxy runtime API" in out.getvalue() and "nothing moved" in out.getvalue()
