"""The layout's promises, checked by running code rather than by reading it:

- the Python client works with grpcio, protobuf and numpy only: a process in which the engine
  (sapcore, numba), the server and the tools cannot be imported still runs every kind of call;
- the server never imports the client or the tools;
- the base distribution needs no engine; the server and the engine are its ``server`` extra.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run first in the child: any import of these names (or their submodules) fails.
_BLOCK = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{{name}} must not be imported here")
        return None
sys.meta_path.insert(0, Blocker())
"""


def _run(blocked: list[str], body: str, *args: str) -> str:
    code = _BLOCK.format(blocked=blocked) + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_the_client_runs_without_the_engine_server_or_tools(server):
    out = _run(["sapcore", "numba", "llvmlite", "sapgrid.server", "sapgrid.tools", "prometheus_client"], """
        import asyncio, sys
        import numpy as np
        from sapgrid.client import AsyncClient, Client
        from sapgrid.client.errors import InvalidArgument

        address = sys.argv[1]
        with Client(address) as c:
            c.create_world("layout-client", dims=2, bounds=(0, 0, 10, 10), cells=(2, 2))
            sub = c.subscribe("layout-client")
            with c.stream("layout-client") as s:
                d = s.step(add_ids=[1, 2, 3], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3], [8, 8, 9, 9]])
                assert d.created.tolist() == [[1, 2]], d.created
                try:
                    s.step(update_ids=[99], update_boxes=[[0, 0, 1, 1]])
                    raise SystemExit("an unknown id was accepted")
                except InvalidArgument as err:
                    assert err.field == "update_ids" and err.index == 0, err
            assert next(iter(sub)).created.tolist() == [[1, 2]]
            sub.cancel()
            assert c.step("layout-client", 7, update_ids=[3], update_boxes=[[1, 1, 2, 2]]).created.tolist() == \\
                [[1, 3], [2, 3]]
            assert c.query("layout-client", [0, 0, 1, 1]).tolist() == [1, 2, 3]
            assert c.pairs("layout-client").tolist() == [[1, 2], [1, 3], [2, 3]]
            assert c.get_world("layout-client").frames == 2

        async def main():
            async with AsyncClient(address) as c:
                assert (await c.pairs("layout-client")).shape == (3, 2)
                assert [w.name for w in await c.list_worlds()].count("layout-client") == 1
                await c.delete_world("layout-client")

        asyncio.run(main())
        engine = [m for m in sys.modules if m.split(".")[0] in ("sapcore", "numba")]
        print("engine modules:", engine)
        """, server.address)
    assert "engine modules: []" in out


def test_the_server_never_imports_the_client_or_the_tools():
    out = _run(["sapgrid.client", "sapgrid.tools"], """
        from sapgrid.server.app import build_server
        from sapgrid.server.config import from_args

        app = build_server(from_args(env={}, listen="127.0.0.1:0", metrics_port=-1))
        app.start()
        app.stop(grace=1.0)
        print("served on", app.address)
        """)
    assert "served on 127.0.0.1:" in out


def test_the_base_distribution_needs_no_engine():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    assert "numba" not in base and "prometheus" not in base
    assert any(d.startswith("numba") for d in project["optional-dependencies"]["server"])


def test_the_command_works_without_the_engine(server):
    """With the client-only install the sapgrid command manages worlds, and the commands that need the
    engine or the server say what to install instead of a traceback."""
    # what the client-only install lacks: the server extra's packages (sapgrid.server's own files are there)
    out = _run(["sapcore", "numba", "llvmlite", "prometheus_client", "grpc_health", "grpc_reflection"], """
        import contextlib, io, sys
        from sapgrid.tools import cli

        address = sys.argv[1]
        assert cli.main(["worlds", "create", "layout-cli", "--server", address]) == 0
        assert cli.main(["worlds", "delete", "layout-cli", "--server", address]) == 0
        for argv in (["replay", "x.npz"], ["bench"], ["serve"]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = cli.main(argv)
            assert rc == 2 and "pip install 'sapgrid[server]'" in err.getvalue(), (argv, rc, err.getvalue())
        print("ok")
        """, server.address)
    assert out.strip().endswith("ok")
