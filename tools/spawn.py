"""Start a sapgrid server in a subprocess (for ``demo --spawn-server`` and ``bench --server spawn``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading


class SpawnedServer:
    """``python -m sapgrid.server`` on a free loopback port; ``address`` once ready; ``stop()`` = SIGTERM."""

    def __init__(self, *extra: str, listen: str = "127.0.0.1:0", metrics_port: int = 0, timeout: float = 120.0):
        cmd = [sys.executable, "-m", "sapgrid.server", "--listen", listen, "--metrics-port", str(metrics_port), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.address = self.metrics_url = None
        self.lines: list[str] = []
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
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(timeout) or self.address is None:
            self.stop()
            raise RuntimeError("the spawned sapgrid server did not start:\n" + "\n".join(self.lines))

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
