"""Seeded random frame generators for the sapcore tests (numpy only, no hypothesis).

``SceneGen`` makes valid frames for the current state of a ``NaiveWorld``: an initial fill, then motion
(small moves), teleports, removes and adds (new ids and ids used before) in the same frame. Coordinates
are biased towards the hard cases: cell borders and bounds (the wrap seam), faces of live boxes (exact
touching), whole-world aliases, far-away boxes, zero-size and huge boxes, float64 values that round.
"""
from __future__ import annotations

import numpy as np

from sapcore import WorldConfig


class SceneGen:
    """Random valid frames for ``cfg`` from ``rng``; ``adversarial`` in [0, 1] is the share of biased values."""

    def __init__(self, cfg: WorldConfig, rng: np.random.Generator, adversarial: float = 0.5,
                 extent: float = 0.5, filters: bool = True):
        self.cfg, self.rng, self.adv, self.filters = cfg, rng, adversarial, filters
        d = cfg.dims
        b = np.asarray(cfg.bounds, np.float64)
        self.lo, self.hi = b[:d], b[d:]
        self.size = self.hi - self.lo
        self.cs = self.size / np.asarray(cfg.cells)
        self.extent = extent  # typical box side, in cells
        self.next_id = 1
        self.retired: list[int] = []  # ids removed earlier, to be reused

    def _coords(self, n: int, live_boxes: np.ndarray) -> np.ndarray:
        """n float64 box mins [n, dims]."""
        rng, d = self.rng, self.cfg.dims
        out = self.lo - 0.1 * self.size + rng.random((n, d)) * 1.2 * self.size
        kind = rng.integers(0, 6, size=(n, d))
        biased = rng.random((n, d)) < self.adv
        for axis in range(d):
            cells = self.cfg.cells[axis]
            k = rng.integers(-1, cells + 2, size=n)
            border = self.lo[axis] + k * self.cs[axis]
            sel = biased[:, axis]
            m = sel & (kind[:, axis] <= 1)  # cell borders and bounds (k == cells is the seam)
            out[m, axis] = border[m]
            if len(live_boxes):  # a live box's max face: exact touching
                j = rng.integers(0, len(live_boxes), size=n)
                m = sel & (kind[:, axis] == 2)
                out[m, axis] = live_boxes[j[m], d + axis]
            m = sel & (kind[:, axis] == 3)  # far away (1e6), aliasing somewhere
            out[m, axis] += rng.choice([-1.0e6, 1.0e6], size=int(m.sum()))
            m = sel & (kind[:, axis] == 4)  # whole world sizes away: the same cells
            out[m, axis] += rng.integers(-50, 50, size=int(m.sum())) * self.size[axis]
            m = sel & (kind[:, axis] == 5)  # float64 just off a border: rounds in float32
            out[m, axis] = border[m] + rng.choice([-1.0, 1.0], size=int(m.sum())) * 1.0e-9 * np.maximum(1.0, np.abs(border[m]))
        return out

    def boxes(self, n: int, live_boxes: np.ndarray) -> np.ndarray:
        """n float64 boxes [n, 2*dims]."""
        rng, d = self.rng, self.cfg.dims
        mins = self._coords(n, live_boxes)
        side = rng.random((n, d)) * 2 * self.extent * self.cs
        shape = rng.random(n)
        side[shape < 0.08] = 0.0  # points
        whole = (shape > 0.08) & (shape < 0.12)
        side[whole] = rng.integers(1, 4, size=(int(whole.sum()), 1)) * self.cs  # exactly k cells
        huge = shape > 0.995
        side[huge] = self.size * rng.choice([1.0, 2.5, 1.0e3])
        out = np.concatenate([mins, mins + side], axis=1)
        if len(live_boxes):  # some identical to a live box
            same = shape < 0.02
            out[same] = live_boxes[rng.integers(0, len(live_boxes), size=int(same.sum()))]
        return out

    def _new_ids(self, n: int, exclude: set) -> np.ndarray:
        out = []
        rng = self.rng
        while len(out) < n:
            if self.retired and rng.random() < 0.4:
                x = self.retired.pop(int(rng.integers(0, len(self.retired))))
                if x in exclude:
                    self.retired.append(x)
                    continue
            else:
                x = self.next_id
                self.next_id += int(rng.integers(1, 4))
            out.append(x)
        return np.array(out, np.uint64)

    def _filters(self, n: int) -> dict:
        if not self.filters:
            return {}
        rng = self.rng
        bits = np.array([0xFFFFFFFF, 0xFFFFFFFF, 1, 2, 3, 0x80000001], np.uint32)
        return {"add_category": bits[rng.integers(0, len(bits), n)],
                "add_mask": bits[rng.integers(0, len(bits), n)],
                "add_static": rng.random(n) < 0.2}

    def fill(self, oracle, n: int) -> dict:
        live = oracle.boxes(oracle.ids())
        ids = self._new_ids(n, set(oracle.objects))
        return {"add_ids": ids, "add_boxes": self.boxes(n, live), **self._filters(n)}

    def frame(self, oracle, move=0.3, teleport=0.02, remove=0.03, add=0.03) -> dict:
        """One frame: a share ``move`` of the live objects moves a little, ``teleport`` jumps anywhere,
        ``remove`` are removed and about ``add`` * live objects are added."""
        rng, d = self.rng, self.cfg.dims
        ids = oracle.ids()
        n = len(ids)
        f = {}
        r = rng.random(n)
        removed = ids[r < remove]
        moved = rng.permutation(ids[(r >= remove) & (r < remove + move + teleport)])
        tele = rng.random(len(moved)) < teleport / max(move + teleport, 1e-9)
        if len(removed):
            f["remove_ids"] = rng.permutation(removed)
            self.retired.extend(removed.tolist())
        if len(moved):
            cur = oracle.boxes(moved).astype(np.float64)
            step = (rng.random((len(moved), d)) - 0.5) * self.cs * rng.choice([0.05, 0.5, 1.5], size=(len(moved), 1))
            new = cur + np.tile(step, 2)
            new[tele] = self.boxes(int(tele.sum()), cur)
            f["update_ids"], f["update_boxes"] = moved, new
        k = int(rng.poisson(add * max(n, 10)))
        if k:
            live = oracle.boxes(ids)
            exclude = set(oracle.objects)
            f["add_ids"] = self._new_ids(k, exclude)
            f["add_boxes"] = self.boxes(k, live)
            f.update(self._filters(k))
        return f
