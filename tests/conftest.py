"""Shared fixtures of the service tests: real sapgrid servers on free loopback ports.

``ServerThread`` runs a server (``sapgrid.server.app.build_server``) on its own event loop in a
background thread of the test process; ``server`` is one shared instance per session, ``make_server``
builds extra ones with config overrides (small queues, small message limits...) and stops them at
the end of the test. Tests create uniquely named worlds (``world_name``) so they never interfere.
"""
from __future__ import annotations

import asyncio
import re
import threading
import uuid

import numpy as np
import pytest

from sapgrid.client import Client
from sapgrid.server.app import build_server
from sapgrid.server.config import from_args


class ServerThread:
    """A sapgrid server on 127.0.0.1:<free port> with /metrics on a free port, in a background thread."""

    def __init__(self, world_factory=None, **overrides):
        overrides.setdefault("listen", "127.0.0.1:0")
        overrides.setdefault("metrics_port", 0)
        overrides.setdefault("grace_seconds", 5.0)
        self.cfg = from_args(env={}, **overrides)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sapgrid-test-server", daemon=True)
        self.thread.start()
        self.app = self.call(build_server(self.cfg, world_factory=world_factory))
        self.call(self.app.start())
        self.address = self.app.address
        self.metrics_url = f"http://127.0.0.1:{self.app.metrics_port}/metrics"

    def call(self, coro, timeout: float = 300.0):
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.call(self.app.stop(grace=2.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


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

