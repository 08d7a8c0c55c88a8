"""Start a sapgrid server in a subprocess (for ``demo --spawn-server`` and ``bench --server spawn``)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


#: the line of ``sapgrid serve`` once the engine's kernels are loaded
KERNELS_LOADED = "sapgrid: engine kernels loaded"


class SpawnedServer:
    """``python -m sapgrid.server`` on a free loopback port; ``address`` once ready; ``stop()`` = SIGTERM.
    ``kernels_loaded``: set once the server says the engine's kernels are loaded (``server/kernels.py``).
    ``lines``: its output, read to the end by a thread; with ``logs``, its log (stderr) too."""

    def __init__(self, *extra: str, listen: str = "127.0.0.1:0", metrics_port: int = 0, timeout: float = 120.0,
                 logs: bool = False):
        cmd = [sys.executable, "-m", "sapgrid.server", "--listen", listen, "--metrics-port", str(metrics_port), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if logs else subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.address = self.metrics_url = None
        self.lines: list[str] = []
        self.kernels_loaded = threading.Event()
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("sapgrid: listening on "):
                    rest = line[len("sapgrid: listening on "):]
                    self.address = rest.split()[0]
                    if "metrics http" in rest:
                        self.metrics_url = rest.split("metrics ", 1)[1].split(";")[0]
                    ready.set()
                elif line.startswith(KERNELS_LOADED):
                    self.kernels_loaded.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(timeout) or self.address is None:
            self.stop()
            raise RuntimeError("the spawned sapgrid server did not start:\n" + "\n".join(self.lines))

    def wait_kernels(self, timeout: float = 1800.0) -> None:
        """Wait until the server has loaded the engine's kernels (from numba's cache ~1 s; compiled into an
        empty cache, ~8 minutes on 2 cores): what a measure of its frames' CPU must not include.
        RuntimeError if it does not say so in time."""
        end = time.monotonic() + timeout
        while not self.kernels_loaded.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError("the spawned sapgrid server did not load the engine's kernels:\n"
                                   + "\n".join(self.lines))

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit and for its output to be read into ``lines``."""
        rc = self.proc.wait(timeout)
        self._pump.join(timeout)
        return rc

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(address: str, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Wait until the proxy ``proc`` accepts connections on ``address``; RuntimeError if it exits first (with
    what it printed, when its output is a pipe) or time runs out."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            exited = proc.poll() is not None
            if exited or time.monotonic() > deadline:
                said = proc.stdout.read().decode(errors="replace") if exited and proc.stdout else ""
                raise RuntimeError(f"haproxy did not start on {address}" + (f": {said}" if said else "")) from None
            time.sleep(0.05)


class SpawnedCluster:
    """``replicas`` sapgrid server processes on loopback, sharding worlds by the cluster's ring
    (``--cluster-members`` / ``--cluster-self``), behind Debian's HAProxy with the configuration of
    ``deploy/proxy/`` (``sapgrid cluster proxy-config``): what one host runs to use more than one core.
    ``address``: the proxy's; ``members``: the replicas'; ``pids``: the replicas' and the proxy's;
    ``extra``: more ``sapgrid serve`` flags for every replica. ``stop()`` stops the proxy, then the replicas."""

    def __init__(self, replicas: int, *extra: str, timeout: float = 120.0):
        from sapgrid.server.cluster import Ring
        from sapgrid.tools.cluster import write_proxy_config

        if replicas < 1:
            raise ValueError(f"a cluster needs at least one replica, not {replicas}")
        haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
        if haproxy is None:
            raise RuntimeError("a spawned cluster needs HAProxy (Debian: apt install haproxy; "
                               "scripts/setup.sh installs it)")
        self.ring = Ring([f"127.0.0.1:{free_port()}" for _ in range(replicas)])
        self.members = list(self.ring.members)
        self.servers: list[SpawnedServer] = []
        self.proxy: subprocess.Popen | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="sapgrid-cluster-")
        try:
            for m in self.members:
                self.servers.append(SpawnedServer(*extra, "--cluster-members", ",".join(self.members),
                                                  "--cluster-self", m, listen=m, metrics_port=-1, timeout=timeout))
            self.address = f"127.0.0.1:{free_port()}"
            config = write_proxy_config(self.members, self.address, self._tmp.name)
            self.proxy = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
            wait_port(self.address, self.proxy)
        except BaseException:
            self.stop()
            raise

    def wait_kernels(self, timeout: float = 1800.0) -> None:
        """``SpawnedServer.wait_kernels`` of every replica."""
        for server in self.servers:
            server.wait_kernels(timeout)

    @property
    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.servers] + ([self.proxy.pid] if self.proxy is not None else [])

    def owner(self, world: str) -> int:
        """Index in ``members`` of the replica that owns ``world``."""
        return self.ring.members.index(self.ring.owner(world))

    def stop(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            try:
                self.proxy.wait(10)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait()
        for s in self.servers:
            s.stop()
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
