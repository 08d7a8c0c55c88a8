"""The real HAProxy (from the project's setup) in front of replicas on loopback: every call reaches the
replica the ring gives its world to (HAProxy's crc32 bucket equals ours), streams stick to it, and a
down replica makes only its own worlds UNAVAILABLE."""
import io
import os
import shutil
import subprocess

import numpy as np
import pytest

from sapgrid.server import cluster
from sapgrid.server.app import build_server
from sapgrid.server.config import ServerConfig
from sapgrid.tools.cluster import status, write_proxy_config
from sapgrid.tools.spawn import free_port, wait_port

HAPROXY = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
if not HAPROXY and os.environ.get("CI") != "true":
    pytest.skip("haproxy not installed (scripts/setup.d/70-haproxy.sh)", allow_module_level=True)


@pytest.fixture
def cluster2(tmp_path):
    assert HAPROXY, "haproxy is not installed: run scripts/setup.d/70-haproxy.sh"
    members = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    apps = []
    for m in members:
        app = build_server(ServerConfig(listen=m, metrics_port=-1, default_world="",
                                        cluster_members=",".join(members), cluster_self=m))
        app.start()
        apps.append(app)
    bind = f"127.0.0.1:{free_port()}"
    cfg = write_proxy_config(members, bind, tmp_path)
    proxy = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_port(bind, proxy)
        yield members, apps, bind
    finally:
        proxy.terminate()
        proxy.wait(10)
        for app in apps:
            app.stop(0)


def test_worlds_land_on_their_owner_through_haproxy(cluster2):
    from sapgrid.client import Client
    from sapgrid.client.errors import Unavailable

    members, apps, bind = cluster2
    ring = cluster.Ring(members)
    names = [f"match-{i}" for i in range(12)]
    ids = np.array([1, 2], dtype=np.uint64)
    boxes = np.array([[0, 0, 2, 2], [1, 1, 3, 3]], dtype=np.float64)
    with Client(bind, timeout=10) as c:
        for n in names:
            c.create_world(n)  # refused by a replica that is not the owner: so HAProxy routed it right
        streams = [c.stream(n) for n in names]
        for s in streams:
            s.send(add_ids=ids, add_boxes=boxes)
        for s in streams:
            assert len(s.recv().created) == 1
        for s in streams:
            s.close()
        for app, m in zip(apps, members):
            held = sorted(w.name for w in app.registry.list())
            assert held == sorted(n for n in names if ring.owner(n) == m)
        assert {ring.owner(n) for n in names} == set(members)
        out = io.StringIO()
        assert status(members, out) == 0
        text = out.getvalue()
        for m in members:
            mine = [n for n in names if ring.owner(n) == m]
            assert f"{m}  up  worlds={len(mine)} objects={2 * len(mine)}" in text, text
        # one replica down: its worlds are UNAVAILABLE, the other's go on (no fail-over)
        apps[1].stop(0)
        for n in names:
            if ring.owner(n) == members[1]:
                with pytest.raises(Unavailable):
                    c.step(n, remove_ids=ids)
            else:
                assert len(c.step(n, remove_ids=ids).deleted) == 1
    out = io.StringIO()
    assert status(members, out) == 1
    assert f"{members[1]}  DOWN" in out.getvalue() and f"{members[0]}  up" in out.getvalue()
