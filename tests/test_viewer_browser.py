"""sapgrid view in a real browser: a server, a running demo world, a fixed world and the viewer
(all started here), the page opened in Debian's headless chromium through playwright-core."""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sapgrid.client import Client
from sapgrid.tools.spawn import free_port

ROOT = Path(__file__).resolve().parent.parent
BROWSER_DIR = ROOT / "tests" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (scripts/setup.d/60-browser.sh installs it)"
    if shutil.which("node") is None:
        return "node is missing (scripts/setup.d/60-browser.sh)"
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        return "playwright-core is missing: run scripts/setup.d/60-browser.sh (npm ci in tests/browser)"
    return None


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"viewer exited: {proc.stdout.read()}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# fixed world: a 10x6 lattice of 3x3 boxes every 4 units (no overlaps) plus overlapping pairs
FIXED_LO = np.array([[4.0 * i + 2, 4.0 * j + 2] for j in range(6) for i in range(10)])
FIXED_BOXES = np.concatenate([FIXED_LO, FIXED_LO + 3.0], axis=1)
FIXED_BOXES = np.concatenate([FIXED_BOXES, [[20.5, 30.0, 23.0, 32.0], [21.5, 31.0, 25.0, 33.0]]])
QUERY = (9.5, 5.5, 18.5, 13.5)  # world rectangle on axes x, y


def _brute_query(boxes, rect):
    x0, y0, x1, y1 = rect
    hit = (boxes[:, 0] <= x1) & (boxes[:, 2] >= x0) & (boxes[:, 1] <= y1) & (boxes[:, 3] >= y0)
    return sorted(int(i) + 1 for i in np.nonzero(hit)[0])


def test_viewer_in_headless_chromium(server, tmp_path):
    missing = _missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    fixed = f"fixed-{os.getpid()}"
    with Client(server.address) as c:
        c.create_world(fixed, dims=2, bounds=(0.0, 0.0, 44.0, 40.0), cells=(11, 10))
        ids = np.arange(1, len(FIXED_BOXES) + 1, dtype=np.uint64)
        c.step(fixed, add_ids=ids, add_boxes=FIXED_BOXES.astype(np.float32))
    demo_world = f"demo-{os.getpid()}"
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    demo = subprocess.Popen([sys.executable, "-m", "sapgrid.tools.cli", "demo", "--server", server.address,
                             "--world", demo_world, "--objects", "600", "--fps", "20", "--ticks", "3000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    viewer = None
    try:
        end = time.monotonic() + 30
        with Client(server.address) as c:
            while demo_world not in {w.name for w in c.list_worlds()}:
                assert time.monotonic() < end and demo.poll() is None, "demo world did not appear"
                time.sleep(0.2)
        viewer = subprocess.Popen([sys.executable, "-m", "sapgrid.tools.cli", "view", "--server", server.address,
                                   "--world", demo_world, "--listen", f"127.0.0.1:{port}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        url = f"http://127.0.0.1:{port}/"
        _wait_http(url, viewer)
        shot = tmp_path / "viewer.png"
        pick = FIXED_BOXES[13]
        argv = ["node", str(BROWSER_DIR / "viewer_check.js"), url, str(shot), fixed, *map(str, QUERY),
                str((pick[0] + pick[2]) / 2), str((pick[1] + pick[3]) / 2)]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(env, CHROMIUM=CHROMIUM))
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout)
    finally:
        _stop(demo)
        if viewer is not None:
            _stop(viewer)
        with Client(server.address) as c:
            for w in (fixed, demo_world):
                if w in {x.name for x in c.list_worlds()}:
                    c.delete_world(w)
    assert not out.get("pageErrors"), out.get("pageErrors")
    d = out["demo"]
    assert d["world"] == demo_world and d["sent"] == d["total"] == 600
    assert d["pairs"] > 0 and d["stats"]["objects"] == 600 and d["stats"]["fps"] > 0
    assert d["bluePixels"] > 1000 and d["orangePixels"] > 50  # boxes and pairs really drawn
    assert "frames/s" in d["statsText"]
    assert shot.stat().st_size > 10_000
    expected = _brute_query(FIXED_BOXES, QUERY)
    assert len(expected) >= 4
    assert out["query"]["ids"] == expected and out["query"]["count"] == len(expected)
    assert out["pick"]["id"] == 14 and out["pick"]["box"] == [float(v) for v in pick] and out["pick"]["pairs"] == []
    if os.environ.get("SAPGRID_VIEWER_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["SAPGRID_VIEWER_SCREENSHOT"])
