"""Broadphase workload traces: generation, loading, and an exact numpy oracle.

This is sapgrid's own copy of the rules of the benchmark kit's ``tracegen.py``
(the kit is the spec; the project does not depend on it at runtime). Given the
same name, tick count and seed, :func:`generate` returns arrays byte-identical
to the kit's, so traces written here and there are interchangeable.

Scenarios (``SCEN-N``: N initial objects; every box has per-axis half-extents
uniform in [0.5, 1.5]; objects move with a constant velocity, |v| uniform in
[0, 0.2] per tick, bouncing off the walls so box centres stay in range):

==========  ====  ============================================================
crowd2d     2D    centres uniform in a square of side sqrt(8(N-1)); all move
flat3d      3D    x, z like crowd2d, y in [0, 4]; all move
sparse3d    3D    cube of side (32(N-1))^(1/3); a fixed 10% subset moves
churn2d     2D    like crowd2d; per tick remove 1%, move the rest, add 1% (new ids)
teleport2d  2D    like crowd2d; per tick 1% jump to a uniform random spot
==========  ====  ============================================================

Randomness: ``numpy.random.default_rng([seed, scenario_index, N])``.

Trace arrays (``.npz`` keys; boxes are float32 rows ``mins[dims] + maxs[dims]``):
``format_version`` int32, ``scenario`` str, ``seed`` int64, ``dims`` int32,
``ticks`` int32 (T), ``bounds`` float32 [2*dims], ``init_ids`` uint32 [N],
``init_boxes`` float32 [N, 2*dims], and per kind ``upd``/``rem``/``add`` an
offset array int64 [T+1] (``*_off``) into ``*_ids`` uint32 and, for ``upd``
and ``add``, ``*_boxes`` float32 [K, 2*dims]. Tick t applies removes, then
updates, then adds.

Pair keys are uint64 ``(min_id << 32) | max_id``; ``final_pairs_sha256`` is
the sha256 of the sorted keys as little-endian bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import NamedTuple

import numpy as np

FORMAT_VERSION = 1
SCENARIOS = ("crowd2d", "flat3d", "sparse3d", "churn2d", "teleport2d")
MAX_SPEED = 0.2          # world units per tick
HALF_MIN, HALF_MAX = 0.5, 1.5


# --------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------
def scenario_dims(scen: str) -> int:
    """2 or 3: the dimension of a scenario."""
    return 3 if scen in ("flat3d", "sparse3d") else 2


def _world_side(n: int, dims: int) -> float:
    """Side of a square/cube world in which a uniformly placed box overlaps
    ~2 others on average (per axis the overlap window of two boxes is
    2*(h1+h2), mean 4, so P(overlap) ~= 4**k / L**k over the k spread axes)."""
    n = max(n, 2)
    if dims == 2:
        return float(np.sqrt(16.0 * (n - 1) / 2.0))
    return float((64.0 * (n - 1) / 2.0) ** (1.0 / 3.0))


class _Sim:
    """Float64 simulation state of one scenario; emits float32 boxes.

    ids uint32 [L], c/h/v float64 [L, dims] (centre, half-extent, velocity)."""

    def __init__(self, scen: str, n: int, seed: int):
        self.scen, self.n = scen, n
        self.rng = np.random.default_rng([seed, SCENARIOS.index(scen), n])
        self.dims = d = scenario_dims(scen)
        if scen == "flat3d":
            side = _world_side(n, 2)                 # x, z spread like crowd2d
            self.cmin = np.array([0.0, 0.0, 0.0])    # allowed centre range
            self.cmax = np.array([side, 4.0, side])  # y (axis 1) in [0, 4]
        elif d == 3:
            side = _world_side(n, 3)
            self.cmin = np.zeros(3)
            self.cmax = np.full(3, side)
        else:
            side = _world_side(n, 2)
            self.cmin = np.zeros(2)
            self.cmax = np.full(2, side)
        # every box stays inside: centre range +/- the largest half-extent
        self.bounds = np.concatenate([self.cmin - HALF_MAX, self.cmax + HALF_MAX]).astype(np.float32)
        self.next_id = 0
        self.ids = np.zeros(0, np.uint32)
        self.c = np.zeros((0, d))
        self.h = np.zeros((0, d))
        self.v = np.zeros((0, d))
        self._spawn(n)
        self.dynamic = None                          # sparse3d: fixed moving subset
        if scen == "sparse3d":
            k = max(1, n // 10)
            self.dynamic = np.sort(self.rng.choice(n, size=k, replace=False))

    def _new_objects(self, k: int):
        d = self.dims
        h = self.rng.uniform(HALF_MIN, HALF_MAX, size=(k, d))
        c = self.rng.uniform(self.cmin, self.cmax, size=(k, d))
        direction = self.rng.normal(size=(k, d))
        direction /= np.maximum(np.linalg.norm(direction, axis=1, keepdims=True), 1e-12)
        speed = self.rng.uniform(0.0, MAX_SPEED, size=(k, 1))
        return c, h, direction * speed

    def _spawn(self, k: int):
        c, h, v = self._new_objects(k)
        new_ids = np.arange(self.next_id, self.next_id + k, dtype=np.uint32)
        self.next_id += k
        self.ids = np.concatenate([self.ids, new_ids])
        self.c = np.concatenate([self.c, c])
        self.h = np.concatenate([self.h, h])
        self.v = np.concatenate([self.v, v])
        return new_ids, self.boxes(slice(len(self.ids) - k, None))

    def boxes(self, sel=slice(None)) -> np.ndarray:
        """float32 [K, 2*dims] boxes of the selected live objects."""
        return np.concatenate([self.c[sel] - self.h[sel], self.c[sel] + self.h[sel]], axis=1).astype(np.float32)

    def _move(self, idx):
        c = self.c[idx] + self.v[idx]
        v = self.v[idx]
        lo, hi = self.cmin, self.cmax
        below, above = c < lo, c > hi                # bounce off the walls
        c = np.where(below, 2 * lo - c, c)
        c = np.where(above, 2 * hi - c, c)
        v = np.where(below | above, -v, v)
        self.c[idx] = np.clip(c, lo, hi)
        self.v[idx] = v

    def tick(self):
        """Advance one tick; return (upd_ids, upd_boxes, rem_ids, add_ids, add_boxes)."""
        n_live = len(self.ids)
        rem_ids = np.zeros(0, np.uint32)
        if self.scen == "churn2d":
            k = max(1, n_live // 100)
            gone = self.rng.choice(n_live, size=k, replace=False)
            rem_ids = np.sort(self.ids[gone])
            keep = np.ones(n_live, bool)
            keep[gone] = False
            self.ids, self.c, self.h, self.v = self.ids[keep], self.c[keep], self.h[keep], self.v[keep]
            n_live = len(self.ids)
        idx = self.dynamic if self.dynamic is not None else np.arange(n_live)
        self._move(idx)
        if self.scen == "teleport2d":
            k = max(1, n_live // 100)
            tp = self.rng.choice(n_live, size=k, replace=False)
            self.c[tp] = self.rng.uniform(self.cmin, self.cmax, size=(k, self.dims))
        upd_ids = self.ids[idx]
        upd_boxes = self.boxes(idx)
        add_ids = np.zeros(0, np.uint32)
        add_boxes = np.zeros((0, 2 * self.dims), np.float32)
        if self.scen == "churn2d":
            add_ids, add_boxes = self._spawn(max(1, self.n // 100))
        return upd_ids, upd_boxes, rem_ids, add_ids, add_boxes


def parse_name(name: str) -> tuple[str, int]:
    """``"crowd2d-10000"`` -> ``("crowd2d", 10000)``; ValueError if malformed."""
    scen, _, n = name.rpartition("-")
    if scen not in SCENARIOS or not n.isdigit() or int(n) < 2:
        raise ValueError(f"bad trace name {name!r}: expected SCEN-N with SCEN in {SCENARIOS} and N >= 2")
    return scen, int(n)


def generate(name: str, ticks: int = 100, seed: int = 1) -> dict:
    """Generate trace ``SCEN-N`` -> dict of the ``.npz`` arrays (see module doc)."""
    scen, n = parse_name(name)
    sim = _Sim(scen, n, seed)
    d = sim.dims
    init_ids, init_boxes = sim.ids.copy(), sim.boxes()
    kinds = ("upd_ids", "upd_boxes", "rem_ids", "add_ids", "add_boxes")
    parts = {k: [] for k in kinds}
    for _ in range(ticks):
        for k, arr in zip(kinds, sim.tick()):
            parts[k].append(arr)

    def offsets(lst):
        off = np.zeros(ticks + 1, np.int64)
        np.cumsum([len(a) for a in lst], out=off[1:])
        return off

    def cat(lst, dtype, width=None):
        if not lst:
            return np.zeros((0,) if width is None else (0, width), dtype)
        return np.concatenate(lst).astype(dtype, copy=False)

    return dict(
        format_version=np.int32(FORMAT_VERSION),
        scenario=np.array(scen), seed=np.int64(seed),
        dims=np.int32(d), ticks=np.int32(ticks), bounds=sim.bounds,
        init_ids=init_ids.astype(np.uint32), init_boxes=init_boxes,
        upd_off=offsets(parts["upd_ids"]), upd_ids=cat(parts["upd_ids"], np.uint32),
        upd_boxes=cat(parts["upd_boxes"], np.float32, 2 * d),
        rem_off=offsets(parts["rem_ids"]), rem_ids=cat(parts["rem_ids"], np.uint32),
        add_off=offsets(parts["add_ids"]), add_ids=cat(parts["add_ids"], np.uint32),
        add_boxes=cat(parts["add_boxes"], np.float32, 2 * d),
    )


def save(path: str, arrays: dict) -> str:
    """Write generated trace arrays as an uncompressed ``.npz`` (the kit's format)."""
    np.savez(path, **arrays)
    return path


# --------------------------------------------------------------------------
# loading and iteration
# --------------------------------------------------------------------------
class TickOps(NamedTuple):
    """One tick, in application order. ids uint32 [K], boxes float32 [K, 2*dims]."""
    rem_ids: np.ndarray
    upd_ids: np.ndarray
    upd_boxes: np.ndarray
    add_ids: np.ndarray
    add_boxes: np.ndarray


class Trace:
    """A trace in memory: the raw arrays plus a dense index over every id
    that ever appears (``all_ids`` sorted uint32 [K]; ``*_idx`` int64) so
    that oracles can use flat state arrays."""

    def __init__(self, arrays: dict, name: str = "trace", path: str | None = None):
        self.raw = arrays
        self.name, self.path = name, path
        r = arrays
        self.dims = int(r["dims"])
        self.ticks = int(r["ticks"])
        self.bounds = np.asarray(r["bounds"], np.float32)
        self.init_ids = r["init_ids"]
        self.init_boxes = r["init_boxes"]
        self.all_ids = np.unique(np.concatenate([r["init_ids"], r["add_ids"]]))
        dense = lambda ids: np.searchsorted(self.all_ids, ids).astype(np.int64)  # noqa: E731
        self.init_idx = dense(r["init_ids"])
        self.upd_idx = dense(r["upd_ids"])
        self.rem_idx = dense(r["rem_ids"])
        self.add_idx = dense(r["add_ids"])

    @classmethod
    def load(cls, path: str) -> "Trace":
        """Load a ``.npz`` trace (the kit's format)."""
        import zipfile

        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (EOFError, ValueError, zipfile.BadZipFile, AttributeError):
            raise ValueError(f"{path}: not a trace (a .npz file of the benchmark kit's format)") from None
        missing = [k for k in ("dims", "ticks", "bounds", "init_ids", "init_boxes", "rem_off", "rem_ids", "upd_off",
                               "upd_ids", "upd_boxes", "add_off", "add_ids", "add_boxes") if k not in arrays]
        if missing:
            raise ValueError(f"{path}: not a trace (a .npz file of the benchmark kit's format): no "
                             f"{', '.join(missing)}")
        base = os.path.basename(path)
        return cls(arrays, base[:-4] if base.endswith(".npz") else base, path)

    @classmethod
    def generate(cls, name: str, ticks: int = 100, seed: int = 1) -> "Trace":
        """Generate ``SCEN-N`` in memory."""
        return cls(generate(name, ticks, seed), name)

    @property
    def scenario(self) -> str:
        return str(self.raw["scenario"])

    def _slices(self, t: int):
        r = self.raw
        return (slice(r["rem_off"][t], r["rem_off"][t + 1]), slice(r["upd_off"][t], r["upd_off"][t + 1]),
                slice(r["add_off"][t], r["add_off"][t + 1]))

    def tick(self, t: int) -> TickOps:
        """Operations of tick t (0-based), original uint32 ids."""
        r = self.raw
        m, u, a = self._slices(t)
        return TickOps(r["rem_ids"][m], r["upd_ids"][u], r["upd_boxes"][u], r["add_ids"][a], r["add_boxes"][a])

    def dense_tick(self, t: int):
        """Tick t by dense index: (rem_idx, upd_idx, upd_boxes, add_idx, add_boxes)."""
        r = self.raw
        m, u, a = self._slices(t)
        return self.rem_idx[m], self.upd_idx[u], r["upd_boxes"][u], self.add_idx[a], r["add_boxes"][a]

    def __iter__(self):
        return (self.tick(t) for t in range(self.ticks))

    def expected_path(self) -> str | None:
        """``TRACE.expected.json`` beside a loaded trace (None for in-memory traces)."""
        if self.path is None:
            return None
        return (self.path[:-4] if self.path.endswith(".npz") else self.path) + ".expected.json"


# --------------------------------------------------------------------------
# exact oracle: numpy sort-and-sweep, recomputed from scratch
# --------------------------------------------------------------------------
def pair_keys(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """uint64 [K] keys ``min << 32 | max`` of integer id arrays a, b [K]."""
    a = a.astype(np.uint64)
    b = b.astype(np.uint64)
    return (np.minimum(a, b) << np.uint64(32)) | np.maximum(a, b)


def rows_to_keys(pairs: np.ndarray) -> np.ndarray:
    """Pair rows uint64 [P, 2] (any order inside a row) -> sorted uint64 keys [P]."""
    pairs = np.asarray(pairs).reshape(-1, 2)
    return np.sort(pair_keys(pairs[:, 0], pairs[:, 1]))


def pairs_sha256(keys: np.ndarray) -> str:
    """sha256 hex of uint64 keys [P] (pass them sorted) as little-endian bytes."""
    return hashlib.sha256(np.ascontiguousarray(keys, dtype="<u8").tobytes()).hexdigest()


def keys_to_ids(keys: np.ndarray, all_ids: np.ndarray) -> np.ndarray:
    """Dense-index pair keys -> sorted original-id pair keys (uint64 [P])."""
    lo = all_ids[(keys >> np.uint64(32)).astype(np.int64)]
    hi = all_ids[(keys & np.uint64(0xFFFFFFFF)).astype(np.int64)]
    return np.sort(pair_keys(lo, hi))


def exact_overlap(boxes_a: np.ndarray, boxes_b: np.ndarray) -> np.ndarray:
    """Row-wise inclusive AABB test of float32 boxes [M, 2d] -> bool [M]."""
    d = boxes_a.shape[1] // 2
    ok = np.ones(len(boxes_a), bool)
    for ax in range(d):
        ok &= (boxes_a[:, ax] <= boxes_b[:, d + ax]) & (boxes_b[:, ax] <= boxes_a[:, d + ax])
    return ok


def overlapping_pairs(ids: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Exact overlapping pairs of boxes float32 [n, 2d] with integer ids [n],
    as sorted unique uint64 keys. Inclusive test on the float32 values.

    Sort and sweep in cells: the axis of largest spread is swept; the other
    axes are cut into cells about one mean box extent wide, each box is listed
    in every cell it touches, and inside a cell boxes are sorted by their min
    on the sweep axis and swept. A pair is kept only in the cell holding the
    max of the two boxes' mins (reference-cell rule), so it appears once."""
    n = len(ids)
    ids = np.asarray(ids)
    if n < 2:
        return np.zeros(0, np.uint64)
    boxes = np.ascontiguousarray(boxes, dtype=np.float32)
    d = boxes.shape[1] // 2
    mins, maxs = boxes[:, :d], boxes[:, d:]
    spread = (mins.astype(np.float64) + maxs).std(axis=0)
    sweep = int(np.argmax(spread))
    cell_axes = [a for a in range(d) if a != sweep]

    key = np.zeros(n, np.int64)                  # cell key of each listed copy
    rep = np.arange(n, dtype=np.int64)           # box of each listed copy
    cmins = []
    for a in cell_axes:
        lo = float(mins[:, a].min())
        ext = maxs[:, a].astype(np.float64) - mins[:, a]
        w = max(float(ext.mean()), 1e-6 * max(1.0, float(maxs[:, a].max()) - lo))
        cmn = np.floor((mins[:, a] - lo) / w).astype(np.int64)
        cmx = np.floor((maxs[:, a] - lo) / w).astype(np.int64)
        ncell = int(cmx.max()) + 1
        cmins.append((cmn, ncell))
        cnt = (cmx - cmn + 1)[rep]
        total = int(cnt.sum())
        start = np.cumsum(cnt) - cnt
        off = np.arange(total, dtype=np.int64) - np.repeat(start, cnt)
        rep_new = np.repeat(rep, cnt)
        key = np.repeat(key, cnt) * ncell + cmn[rep_new] + off
        rep = rep_new
    # composite sort value: cell key, then min on the sweep axis
    s_lo = float(mins[:, sweep].min())
    span = float(maxs[:, sweep].max()) - s_lo + 1.0
    smin = mins[rep, sweep].astype(np.float64) - s_lo
    smax = maxs[rep, sweep].astype(np.float64) - s_lo
    comp = key.astype(np.float64) * span + smin
    order = np.argsort(comp, kind="stable")
    comp, rep, key = comp[order], rep[order], key[order]
    end = np.searchsorted(comp, key.astype(np.float64) * span + smax[order], side="right")
    pos = np.arange(len(comp), dtype=np.int64)
    cnt = end - pos - 1
    total = int(cnt.sum())
    if total == 0:
        return np.zeros(0, np.uint64)
    start = np.cumsum(cnt) - cnt
    first = np.repeat(pos, cnt)
    second = np.arange(total, dtype=np.int64) - np.repeat(start, cnt) + first + 1
    i, j = rep[first], rep[second]
    ok = exact_overlap(boxes[i], boxes[j])
    if cell_axes:                                # reference-cell rule
        ref = np.zeros(total, np.int64)
        for cmn, ncell in cmins:                 # floor is monotone: cell(max) = max(cells)
            ref = ref * ncell + np.maximum(cmn[i], cmn[j])
        ok &= ref == key[first]
    i, j = i[ok], j[ok]
    return np.sort(pair_keys(ids[i], ids[j]))


class RecomputePeer:
    """The numpy sort-and-sweep peer: scatter each tick into flat state arrays
    (boxes float32 [K, 2d], alive bool [K], by dense index) and recompute the
    full pair set from scratch. ``keys`` holds dense-index keys (uint64 [P])."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.boxes = np.zeros((len(trace.all_ids), 2 * trace.dims), np.float32)
        self.alive = np.zeros(len(trace.all_ids), bool)
        self.keys = np.zeros(0, np.uint64)

    def build(self) -> np.ndarray:
        """Insert the initial objects; return their pair keys (dense)."""
        tr = self.trace
        self.boxes[tr.init_idx] = tr.init_boxes
        self.alive[tr.init_idx] = True
        self.keys = self.pairs()
        return self.keys

    def apply(self, t: int) -> None:
        """Apply tick t to the state (removes, updates, adds) without computing pairs."""
        rem_idx, upd_idx, upd_boxes, add_idx, add_boxes = self.trace.dense_tick(t)
        self.alive[rem_idx] = False
        self.boxes[upd_idx] = upd_boxes
        self.boxes[add_idx] = add_boxes
        self.alive[add_idx] = True

    def pairs(self) -> np.ndarray:
        idx = np.flatnonzero(self.alive)
        return overlapping_pairs(idx, self.boxes[idx])

    def tick(self, t: int) -> np.ndarray:
        """Apply tick t and recompute; return the dense pair keys."""
        self.apply(t)
        self.keys = self.pairs()
        return self.keys

    def id_keys(self) -> np.ndarray:
        """Current pairs as sorted original-id keys (uint64 [P])."""
        return keys_to_ids(self.keys, self.trace.all_ids)


def expected(trace: Trace) -> dict:
    """The exact oracle: the content of ``TRACE.expected.json`` (kit's ``verify``)."""
    peer = RecomputePeer(trace)
    prev = peer.build()
    initial = len(prev)
    per_tick, created, deleted = [initial], [], []
    for t in range(trace.ticks):
        cur = peer.tick(t)
        created.append(int(len(np.setdiff1d(cur, prev, assume_unique=True))))
        deleted.append(int(len(np.setdiff1d(prev, cur, assume_unique=True))))
        per_tick.append(int(len(cur)))
        prev = cur
    return dict(
        trace=trace.name, format_version=int(trace.raw["format_version"]), dims=trace.dims,
        ticks=trace.ticks, initial_objects=int(len(trace.init_idx)),
        final_objects=int(peer.alive.sum()),
        initial_pairs=initial, final_pairs=int(len(prev)),
        created_total=int(sum(created)), deleted_total=int(sum(deleted)),
        final_pairs_sha256=pairs_sha256(peer.id_keys()),
        pairs_per_tick=per_tick, created_per_tick=created, deleted_per_tick=deleted,
    )


def write_expected(trace: Trace, path: str | None = None) -> dict:
    """Compute :func:`expected` and write it as JSON (default: beside the trace)."""
    out = expected(trace)
    path = path or trace.expected_path()
    if path is None:
        raise ValueError("in-memory trace: give the path of the expected.json to write")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return out


def load_expected(trace: Trace) -> dict | None:
    """The ``TRACE.expected.json`` beside a loaded trace, or None if there is none."""
    p = trace.expected_path()
    if p is None or not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)
