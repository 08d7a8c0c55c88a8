"""Shared fixtures of the service tests: real sapgrid servers on free loopback ports.

``ServerThread`` runs a server (``sapgrid.server.app.build_server``; its calls are served by its own
loop thread and call pool) in the test process; ``server`` is one shared instance per session, ``make_server``
builds extra ones with config overrides (small queues, small message limits...) and stops them at
the end of the test. Tests create uniquely named worlds (``world_name``) so they never interfere.
"""
from __future__ import annotations

import re
import time
import uuid

import numpy as np
import pytest

from sapgrid.client import Client
from sapgrid.server.app import build_server
from sapgrid.server.config import from_args


class ServerThread:
    """A sapgrid server on 127.0.0.1:<free port> with /metrics on a free port, in this test process."""

    def __init__(self, world_factory=None, **overrides):
        overrides.setdefault("listen", "127.0.0.1:0")
        overrides.setdefault("metrics_port", 0)
        overrides.setdefault("grace_seconds", 5.0)
        self.cfg = from_args(env={}, **overrides)
        self.app = build_server(self.cfg, world_factory=world_factory)
        self.app.start()
        self.address = self.app.address
        self.metrics_url = f"http://127.0.0.1:{self.app.metrics_port}/metrics"
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.app.stop(grace=2.0)


@pytest.fixture(scope="session")
def server():
    s = ServerThread()
    yield s
    s.stop()


@pytest.fixture
def make_server():
    made = []

    def make(**overrides) -> ServerThread:
        s = ServerThread(**overrides)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def late_subscribers(monkeypatch):
    """Every server of this test registers each subscriber 0.5 s late: a client's subscribe must wait for
    the registration (Subscribe's response headers) or miss the frames sent meanwhile."""
    from sapgrid.server import registry

    register = registry.WorldRunner.subscribe

    def late(self, region=None):
        time.sleep(0.5)
        return register(self, region)

    monkeypatch.setattr(registry.WorldRunner, "subscribe", late)


@pytest.fixture
def client(server):
    with Client(server.address, timeout=120) as c:
        yield c


@pytest.fixture
def world_name(request):
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:40]
    return f"t-{safe}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def rng():
    return np.random.default_rng(12345)

