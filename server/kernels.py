"""The engine's kernels, loaded in the background before the server's loop applies a frame itself.

numba loads a kernel (from its on-disk cache, or compiles it) the first time a frame needs it: a
process's first frame takes ~0.2 s of loading, and each path a later frame takes first (a big frame's
parallel one, a delta of thousands of pairs, ids above 2**32, ...) tens of milliseconds more (minutes of
compiling with an empty cache). In a thread of the call pool that costs only that frame: the loading
thread gives the GIL up every few milliseconds (Python's switch interval). In the server's loop it held
every stream of every world meanwhile (a 100-object world streaming at 100 Hz: round trips of 58-92 ms
while another world's first frames of 2,000 boxes were applied; 4-5 ms with this module). So the server's
start calls ``load_all``: for each number of dims a thread that drives scratch worlds of those dims
through every kind of frame, made and parsed as the service makes and parses them
(``protocol``: read-only views of the request's bytes, zero-copy views of a big one; a restore's batch
insert takes its arrays read-only too): every path of ``World.step`` a frame takes, the digest of a
frame's pairs, the queries and a snapshot's export. Until it is done, ``ready(dims)`` is False and the
loop sends that many dims' frames to the pool (``WorldRunner.apply``). Once per process: the kernels stay
loaded. ``deploy/warm_cache.py`` runs the same load alone, to fill numba's cache.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import numba

from sapgrid.v1 import sapgrid_service_pb2 as pb

from . import protocol
from .digest import digest_step

log = logging.getLogger("sapgrid.server")

#: the scratch world's sizes: frames of fewer than ``parallel.HOLD_GIL_BELOW`` updates (one call that holds
#: the GIL), more (calls that release it), and a frame of more than ``protocol.PARSE_BYTES`` (read zero-copy)
SIZES = (7, 100, 3_000)
#: added to the ids of the dense scenes: ids above 2**32 make the engine's lists of ids uint64 (uint32 while
#: they fit)
HIGH_IDS = 1 << 40

#: the worlds' numbers of dims (``sapcore.WorldConfig``)
DIMS = (2, 3)

_lock = threading.Lock()
_loading: dict[int, threading.Thread] = {}
_ready: dict[int, bool] = {}


def ready(dims: int) -> bool:
    """Are the kernels of ``dims``-D worlds loaded (every frame's: see the module's docstring)?"""
    return _ready.get(dims, False)


def load(dims: int) -> None:
    """Load the kernels of ``dims``-D worlds in a thread of their own, once per process; returns at once."""
    with _lock:
        if dims in _loading or _ready.get(dims):
            return
        if numba.config.DISABLE_JIT:            # the kernels are plain Python: nothing to load
            _ready[dims] = True
            return
        thread = threading.Thread(target=_load, args=(dims,), name=f"sapgrid-kernels-{dims}d", daemon=True)
        _loading[dims] = thread
    thread.start()


def load_all() -> None:
    """``load`` every number of dims (``DIMS``)."""
    for dims in DIMS:
        load(dims)


def wait(dims: int, timeout: float | None = None) -> bool:
    """Wait for ``load(dims)`` to end (started if it was not); True once the kernels are loaded."""
    load(dims)
    thread = _loading.get(dims)
    if thread is not None:
        thread.join(timeout)
    return ready(dims)


def wait_all(timeout: float | None = None) -> bool:
    """``wait`` for every number of dims, at most ``timeout`` seconds in all; True once all are loaded."""
    end = None if timeout is None else time.monotonic() + timeout
    return all([wait(d, None if end is None else max(0.0, end - time.monotonic())) for d in DIMS])


def _load(dims: int) -> None:
    t0 = time.perf_counter()
    try:
        exercise(dims)
    except Exception:       # a scratch world's failure is the engine's bug: frames then all go to the pool
        log.exception("loading the kernels of %dD worlds failed; every frame of them is applied in a thread "
                      "of the call pool", dims)
        return
    _ready[dims] = True
    log.info("kernels of %dD worlds loaded in %.2f s", dims, time.perf_counter() - t0)


def _request(dims: int, remove=None, update=None, update_boxes=None, add=None, add_boxes=None,
             category=None, mask=None, static=None) -> dict:
    """A frame as the service gets it: the request's bytes, parsed (``protocol.parse_frame``) and read into
    the engine's arrays (``protocol.frame_arrays``: read-only views; a restore passes its snapshot's
    arrays read-only as well, ``Registry._fill``)."""
    request = pb.StreamFramesRequest()
    f = request.frame
    f.world, f.seq = "kernels", 1
    for field, value in (("remove_ids", remove), ("update_ids", update), ("update_boxes", update_boxes),
                         ("add_ids", add), ("add_boxes", add_boxes), ("add_category", category),
                         ("add_mask", mask), ("add_static", static)):
        if value is not None:
            setattr(f, field, np.ascontiguousarray(value).tobytes())
    return protocol.frame_arrays(protocol.parse_frame(request.SerializeToString()), dims)


def exercise(dims: int, seed: int = 0) -> None:
    """Drive scratch ``dims``-D worlds through every kind of frame a service applies (see the module's
    docstring), with the service's own arrays, in a sparse scene and in a dense one (deltas of thousands of
    pairs): what leaves every kernel a frame needs loaded."""
    rng = np.random.default_rng(seed)
    for dense in (False, True):
        _scene(dims, rng, dense)


def _scene(dims: int, rng, dense: bool) -> None:
    import sapcore

    n = max(SIZES)
    side = float((n / 0.05) ** (1.0 / dims))
    bounds = (0.0,) * dims + (side,) * dims
    world = sapcore.World(sapcore.WorldConfig(dims=dims, bounds=bounds, cells=sapcore.auto_cells(dims, bounds, n)))
    digest = 0

    def step(**frame):
        nonlocal digest
        delta = world.step(**_request(dims, **frame))
        digest = digest_step(digest, delta.created, delta.deleted)

    for k, size in enumerate(reversed(SIZES) if dense else SIZES):     # dense: the big adds into a new world
        ids = np.arange(1, size + 1, dtype=np.uint64) + np.uint64(k * 10 * n) + np.uint64(HIGH_IDS if dense else 0)
        # dense: ~8 boxes overlap each (boxes 1-4 wide), thousands of pairs made and ended in one frame
        spread = min(side, 5.0 * (size / 8) ** (1.0 / dims)) if dense else side
        centre = rng.uniform(0, spread, (size, dims)).astype(np.float32)
        half = rng.uniform(0.5, 2.0, (size, dims)).astype(np.float32)
        boxes = np.concatenate([centre - half, centre + half], 1)
        step(add=ids, add_boxes=boxes)
        for _ in range(3):                       # the list of updates, then the list again (its one call)
            boxes = boxes + rng.normal(0, 0.5, (size, 1)).astype(np.float32)
            step(update=ids, update_boxes=boxes)
        step(update=ids, update_boxes=boxes)     # a still frame
        step(update=ids[::2], update_boxes=boxes[::2] + 1)                  # another list
        order = rng.permutation(size)
        step(update=ids[order], update_boxes=boxes[order] - 1)              # ids off the list's order
        few = ids[: max(1, size // 10)]
        m = len(few)
        step(remove=few, update=ids[m:], update_boxes=boxes[m:], add=few + np.uint64(5 * n),
             add_boxes=boxes[:m], category=np.full(m, 2, np.uint32), mask=np.full(m, 1, np.uint32),
             static=np.ones(m, np.uint8))
        step(remove=few + np.uint64(5 * n), add=few, add_boxes=boxes[:m] + side / 4)
        more = ids + np.uint64(7 * n)
        for extra in ("add", "remove"):          # the list repeated (its boxes kept by row), with adds or removes
            for t in range(3):
                step(update=ids, update_boxes=boxes + t)
            step(update=ids, update_boxes=boxes, **({"add": more[:m], "add_boxes": boxes[:m]} if extra == "add"
                                                    else {"remove": more[:m]}))
        step(remove=few)
        step(add=few, add_boxes=boxes[:m])
        if dense:                                # the boxes dealt out again: both sides of the delta big
            step(update=ids, update_boxes=boxes[rng.permutation(size)])
    region = (0.0,) * dims + (side / 2,) * dims
    world.query(region)
    live = world.ids()
    world.boxes(live[:10])
    world.filters(live[:10])
    world.pairs()
    world.export()
    world.cell_occupancy()
    world.memory_bytes()
    step(remove=live)
