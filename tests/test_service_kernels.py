"""The engine's kernels are loaded in the background before the server's loop applies a frame itself
(``sapgrid.server.kernels``): a kernel loaded in the loop would hold every stream of every world.

The coverage test runs a server in a fresh Python process (kernels are loaded once per process): once
``kernels.wait`` returns for 2 and 3 dims, a varied workload of real clients over gRPC (frames of every
shape through streams and unary calls, queries, pairs, snapshots, restores, subscriptions) must load no
further kernel: every numba dispatcher of the engine and the server keeps the overloads it had.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from sapcore import World
from sapgrid.client import Client
from sapgrid.server import kernels
from sapgrid.tools.spawn import KERNELS_LOADED, SpawnedServer
from service_helpers import assert_same_pairs, metric_value, random_boxes, scrape
from test_service_concurrency import CFG, ThreadsOfSteps

WORKLOAD = textwrap.dedent(r'''
    import importlib, json, pkgutil, sys, threading
    import numpy as np
    from numba.core.registry import CPUDispatcher
    import sapcore.kernels
    from sapgrid.client import Client
    from sapgrid.server import app, config, digest, kernels

    def overloads():
        mods = [importlib.import_module(f"sapcore.kernels.{m.name}")
                for m in pkgutil.iter_modules(sapcore.kernels.__path__)]
        out = {}
        for mod in mods + [digest]:
            for k, v in vars(mod).items():
                if isinstance(v, CPUDispatcher):
                    out[f"{mod.__name__}.{k}"] = sorted(str(s) for s in v.signatures)
        return out

    srv = app.build_server(config.from_args(env={}, listen="127.0.0.1:0", metrics_port=-1, default_world=""))
    srv.start()
    rng = np.random.default_rng(int(sys.argv[1]))
    try:
        with Client(srv.address, timeout=300) as c:
            for dims in (2, 3):
                c.create_world(f"first-{dims}d", dims=dims, bounds=(0,) * dims + (100,) * dims)
                assert kernels.wait(dims, 600), dims
            before = overloads()

            def boxes(n, dims, side):
                lo = rng.uniform(0, side, (n, dims)).astype(np.float32)
                return np.concatenate([lo, lo + rng.uniform(0.1, side / 20, (n, dims)).astype(np.float32)], 1)

            for w, (dims, n, big_ids) in enumerate([(2, 1, False), (2, 60, True), (3, 250, False), (2, 700, False),
                                                    (3, 2500, True), (2, 4000, False)]):
                name, side = f"w{w}", 100.0
                c.create_world(name, dims=dims, bounds=(0,) * dims + (side,) * dims)
                base = (1 << 50) if big_ids else 1
                ids = rng.permutation(np.arange(base, base + 4 * n, dtype=np.uint64))[:n]
                b = boxes(n, dims, side)
                m = max(1, n // 7)
                with c.stream(name) as s:
                    s.step(add_ids=ids[:m], add_boxes=b[:m], add_category=np.full(m, 3, np.uint32),
                           add_mask=np.full(m, 5, np.uint32), add_static=np.arange(m) % 2 == 0)
                    s.step(add_ids=ids[m:], add_boxes=b[m:])
                    for t in range(6):
                        b = b + rng.normal(0, 0.4, (n, 1)).astype(np.float32)
                        s.step(update_ids=ids, update_boxes=b)
                    s.step(update_ids=ids, update_boxes=b)
                    order = rng.permutation(n)
                    s.step(update_ids=ids[order], update_boxes=b[order])
                    part = order[: max(1, n // 3)]
                    s.step(update_ids=ids[part], update_boxes=b[part] + 1)
                    s.step(remove_ids=ids[:m], update_ids=ids[m:], update_boxes=b[m:])
                    s.step(add_ids=ids[:m], add_boxes=b[:m])
                c.step(name, update_ids=ids, update_boxes=b - 1)
                c.query(name, (0,) * dims + (50,) * dims, include_boxes=True)
                c.list_pairs(name, page_size=10)
                c.pairs(name)
                sub = c.subscribe(name, timeout=60, region=(0,) * dims + (30,) * dims)
                got = threading.Thread(target=next, args=(iter(sub),))
                got.start()
                while got.is_alive():            # (frames until the subscription, opened meanwhile, has one)
                    c.step(name, update_ids=ids, update_boxes=b)
                    got.join(0.05)
                sub.cancel()
                c.restore(c.snapshot(name), name=f"{name}-copy")
                c.step(f"{name}-copy", remove_ids=ids)
        after = overloads()
    finally:
        srv.stop(1.0)
    new = {k: sorted(set(v) - set(before.get(k, []))) for k, v in after.items()}
    print(json.dumps({k: v for k, v in new.items() if v}))
''')


def test_after_the_kernels_are_loaded_no_frame_query_or_snapshot_loads_another():
    """A fresh server process: everything its clients ask after ``kernels.wait(2)`` and ``kernels.wait(3)``
    runs on kernels already loaded (were one missing, its first frame would load it in the loop)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(__file__),
                                                                   os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", WORKLOAD, "7"], capture_output=True, text=True, timeout=1200, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    loaded_later = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded_later == {}, f"kernels loaded by the workload, not by kernels.load: {loaded_later}"


def test_until_the_kernels_are_loaded_a_small_frame_is_applied_in_the_pool(make_server, rng, monkeypatch):
    """While ``kernels.ready(dims)`` is False a stream's small frame goes to a thread of the call pool (not
    the server's loop); once they are loaded, to the loop; the answers are the engine's either way."""
    worlds = []

    def factory(cfg):
        worlds.append(ThreadsOfSteps(cfg))
        return worlds[-1]

    srv = make_server(world_factory=factory, default_world="")
    local = World(CFG)
    ids = np.arange(40)
    boxes = random_boxes(rng, 40)
    with Client(srv.address) as c:
        c.create_world("w", CFG)
        assert kernels.wait(2, 600)
        monkeypatch.setitem(kernels._ready, 2, False)        # as it stands while they load
        with c.stream("w") as s:
            d = s.step(add_ids=ids, add_boxes=boxes)
            assert_same_pairs(d.created, local.step(add_ids=ids, add_boxes=boxes).created)
            assert worlds[0].threads[-1].startswith("sapgrid-call")
            monkeypatch.setitem(kernels._ready, 2, True)
            moved = random_boxes(rng, 40)
            d = s.step(update_ids=ids, update_boxes=moved)
            want = local.step(update_ids=ids, update_boxes=moved)
            assert_same_pairs(d.created, want.created)
            assert_same_pairs(d.deleted, want.deleted)
            assert worlds[0].threads[-1] == "sapgrid-io"


def test_a_failed_load_leaves_every_frame_in_the_pool_and_says_so(monkeypatch, caplog):
    """A scratch world that fails (the engine's bug) is logged; the dims stay not ready (frames in the pool)."""
    def broken(dims, seed=0):
        raise RuntimeError("scratch world failed")

    monkeypatch.setattr(kernels, "exercise", broken)
    try:
        with caplog.at_level("ERROR", logger="sapgrid.server"):
            assert kernels.wait(5, 60) is False
        assert not kernels.ready(5)
        assert kernels.wait(5, 60) is False             # not tried again: the same engine would fail the same way
    finally:
        kernels._loading.pop(5, None)
    assert caplog.text.count("loading the kernels of 5D worlds failed") == 1
    assert "scratch world failed" in caplog.text


def test_sapgrid_serve_says_when_the_kernels_are_loaded():
    """The line a bench waits for before it measures a spawned server's CPU (``SpawnedServer.wait_kernels``)."""
    srv = SpawnedServer("--default-world", "")
    try:
        srv.wait_kernels(600)
        assert any(line.startswith(KERNELS_LOADED) for line in srv.lines), srv.lines
    finally:
        srv.stop()


def test_the_metrics_say_which_kernels_are_loaded(make_server, monkeypatch):
    """``sapgrid_engine_kernels_loaded{dims}``: 1 once loaded, 0 while they load (frames then in the pool)."""
    srv = make_server(default_world="")
    assert kernels.wait_all(600)
    text = scrape(srv.metrics_url)
    assert metric_value(text, "sapgrid_engine_kernels_loaded", dims="2") == 1
    assert metric_value(text, "sapgrid_engine_kernels_loaded", dims="3") == 1
    monkeypatch.setitem(kernels._ready, 3, False)
    text = scrape(srv.metrics_url)
    assert metric_value(text, "sapgrid_engine_kernels_loaded", dims="3") == 0
    assert metric_value(text, "sapgrid_engine_kernels_loaded", dims="2") == 1
