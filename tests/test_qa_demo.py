"""``sapgrid demo``: its untimed warm-up tick moves every box, so the first timed tick does not pay for
loading the kernels of a moving frame; the demo's world is deleted at the end."""
from __future__ import annotations

import numpy as np

from sapgrid.tools import cli


def test_the_warm_up_tick_moves_every_box(make_server, capsys):
    from sapcore import World

    steps = []

    class Recording(World):
        def step(self, *args, **kwargs):
            steps.append({k: None if v is None else np.array(v, copy=True) for k, v in kwargs.items()})
            return super().step(*args, **kwargs)

    srv = make_server(world_factory=Recording, metrics_port=-1)
    steps.clear()                                     # the default world's creation, if it stepped
    assert cli.main(["demo", "--server", srv.address, "--ticks", "2", "--objects", "200", "--world", "qa-demo"]) == 0
    first, warm_up, timed = [s for s in steps if s.get("add_ids") is not None or s.get("update_ids") is not None][:3]
    assert len(first["add_ids"]) == 200
    moved = np.any(warm_up["update_boxes"] != first["add_boxes"], axis=1)
    assert len(warm_up["update_ids"]) == 200 and moved.mean() > 0.9      # boxes with |v| > 0 moved
    assert np.any(timed["update_boxes"] != warm_up["update_boxes"])
    assert "done: 2 ticks" in capsys.readouterr().out
