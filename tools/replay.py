"""``sapgrid replay TRACE.npz``: replay a broadphase trace through sapgrid and time it.

One trace tick is one ``World.step`` (removes, then updates, then adds), in
process through :class:`sapcore.World` or, with ``--server HOST:PORT``,
through the service (:class:`sapgrid.tools.remote_world.RemoteWorld`, same interface).

Timing follows the benchmark kit: ``build_ms`` is the initial batch insert of
the trace's objects in one step; per-tick statistics are over the wall time
of each ``world.step`` call, quantiles by nearest rank. Before the timed run a
tiny throw-away world of the same dimension is stepped once through every
kind of operation, so one-time costs (numba compile/cache load, connection
set-up) are reported as ``warmup_ms`` instead of polluting ``build_ms``.

``--check`` compares the result with ``TRACE.expected.json`` beside the trace
(the kit's oracle); if there is none, sapgrid's own oracle
(:func:`sapgrid.tools.traces.expected`) computes it. ``--json`` ends the output with
one JSON line (the kit's ``run.sh --sapgrid`` reads it).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import sapcore
from sapgrid.tools import traces

#: fields of expected.json that --check compares
CHECK_FIELDS = ("initial_pairs", "final_pairs", "created_total", "deleted_total", "final_pairs_sha256",
                "pairs_per_tick", "created_per_tick", "deleted_per_tick")


# --------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------
def _add_once(parser, *flags, **kw):
    """Add an option unless the parser already has it (the CLI may add shared ones)."""
    if not any(f in parser._option_string_actions for f in flags):
        parser.add_argument(*flags, **kw)


def parse_cells(text: str | None, dims: int) -> tuple | None:
    """``"64,64"`` -> (64, 64); a single value is used on every axis; None -> None."""
    if text is None:
        return None
    vals = [int(v) for v in str(text).replace("x", ",").split(",") if v.strip()]
    if len(vals) == 1:
        vals = vals * dims
    if len(vals) != dims or any(v < 1 for v in vals):
        raise ValueError(f"--cells {text!r}: need {dims} positive integers (or one for every axis)")
    return tuple(vals)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``sapgrid replay``."""
    parser.add_argument("trace", help="trace .npz (format of the benchmark kit)")
    parser.add_argument("--check", action="store_true",
                        help="compare with TRACE.expected.json (or sapgrid's own oracle); exit 1 on mismatch")
    parser.add_argument("--json", action="store_true", help="end the output with one JSON line of results")
    parser.add_argument("--threads", type=int, default=None, help="cell-apply threads (default: all cores)")
    parser.add_argument("--cells", default=None,
                        help="grid cells per axis, e.g. 64,64 (default: sapcore.auto_cells from the trace)")
    _add_once(parser, "--server", default=None, metavar="HOST:PORT",
              help="replay through a sapgrid server instead of in process")


# --------------------------------------------------------------------------
# world set-up
# --------------------------------------------------------------------------
def max_live(trace: traces.Trace) -> int:
    """Largest number of live objects over the trace (after each tick)."""
    r = trace.raw
    live = len(trace.init_ids) + np.cumsum(np.diff(r["add_off"]) - np.diff(r["rem_off"]))
    return int(max(len(trace.init_ids), int(live.max()) if len(live) else 0))


def world_bounds(trace: traces.Trace) -> tuple:
    """The trace's declared bounds, repaired if unusable (non-finite or empty
    on an axis): then the initial boxes' extent. Wrong-but-valid bounds are
    kept as declared: the grid wraps, so boxes outside them still work."""
    d = trace.dims
    b = np.asarray(trace.bounds, np.float64).copy()
    if b.shape == (2 * d,) and np.isfinite(b).all() and (b[:d] < b[d:]).all():
        return tuple(b.tolist())
    boxes = np.asarray(trace.init_boxes, np.float64)
    if len(boxes):
        lo, hi = boxes[:, :d].min(axis=0), boxes[:, d:].max(axis=0)
    else:
        lo, hi = np.zeros(d), np.ones(d)
    hi = np.maximum(hi, lo + 1.0)
    return tuple(np.concatenate([lo, hi]).tolist())


def make_config(trace: traces.Trace, threads: int | None = None, cells=None) -> "sapcore.WorldConfig":
    """WorldConfig for a trace: declared bounds, ``auto_cells`` unless cells are given."""
    bounds = world_bounds(trace)
    if cells is None:
        cells = tuple(int(c) for c in sapcore.auto_cells(trace.dims, bounds, max_live(trace)))
    return sapcore.WorldConfig(dims=trace.dims, bounds=bounds, cells=tuple(cells), threads=threads)


def open_world(config, server: str | None = None, expected_objects: int = 0):
    """Context manager yielding a fresh world: in process, or on ``server`` (deleted on exit)."""
    if server:
        from sapgrid.tools.remote_world import RemoteWorld
        return RemoteWorld.connect(server, config, name=None, expected_objects=expected_objects)
    return contextlib.nullcontext(sapcore.World(config))


def warm_up(dims: int, threads: int | None = None, server: str | None = None) -> float:
    """Step a tiny throw-away world through add/update/remove/pairs; return its wall ms."""
    t0 = time.perf_counter()
    cfg = sapcore.WorldConfig(dims=dims, bounds=(0.0,) * dims + (8.0,) * dims, cells=(2,) * dims, threads=threads)
    rng = np.random.default_rng(0)
    c = rng.uniform(0, 8, size=(16, dims))
    boxes = lambda c: np.concatenate([c - 0.75, c + 0.75], axis=1).astype(np.float32)  # noqa: E731
    ids = np.arange(1, 17, dtype=np.uint64)
    with open_world(cfg, server) as w:
        w.step(add_ids=ids, add_boxes=boxes(c))
        w.step(update_ids=ids[2:], update_boxes=boxes(c[2:] + 0.5))
        for k in (1, 2):    # the same list again (its boxes kept by row), then a frame in one call
            w.step(update_ids=ids[2:], update_boxes=boxes(c[2:] + 0.5 + 0.1 * k))
        w.step(remove_ids=ids[:2], add_ids=ids[:2] + 100, add_boxes=boxes(c[:2] - 0.5))
        w.pairs()
    return (time.perf_counter() - t0) * 1e3


# --------------------------------------------------------------------------
# the replay loop
# --------------------------------------------------------------------------
def nearest_rank(sorted_values: np.ndarray, p: float) -> float:
    """Nearest-rank quantile p of an ascending array (as the kit's peers.py)."""
    return float(sorted_values[max(1, int(np.ceil(p * len(sorted_values)))) - 1])


def timing_summary(times_ms) -> dict:
    """{median_ms, p95_ms, mean_ms, max_ms} (None when no tick ran)."""
    if len(times_ms) == 0:
        return dict(median_ms=None, p95_ms=None, mean_ms=None, max_ms=None)
    ts = np.sort(np.asarray(times_ms, np.float64))
    return dict(median_ms=nearest_rank(ts, 0.5), p95_ms=nearest_rank(ts, 0.95),
                mean_ms=float(ts.mean()), max_ms=float(ts.max()))


def _ids(a: np.ndarray):
    return a.astype(np.uint64) if len(a) else None


@dataclass
class ReplayResult:
    """What one replay measured. times_ms float64 [k]; counts are python ints."""
    build_ms: float = 0.0
    times_ms: list = field(default_factory=list)
    initial_pairs: int = 0
    pairs_per_tick: list = field(default_factory=list)
    created_per_tick: list = field(default_factory=list)
    deleted_per_tick: list = field(default_factory=list)
    phases_s: dict = field(default_factory=dict)   # sum over the ticks of each FrameStats phase (+ swaps)
    final_keys: np.ndarray | None = None  # sorted uint64 [P] (only when the whole trace ran)
    final_objects: int | None = None

    @property
    def ticks_done(self) -> int:
        return len(self.times_ms)

    @property
    def apply_s(self) -> float:
        """Sum of delta.stats.apply_s over the ticks."""
        return float(self.phases_s.get("apply_s", 0.0))

    def counts(self) -> dict:
        """The fields of expected.json this replay can be checked on."""
        out = dict(initial_pairs=self.initial_pairs, created_total=int(sum(self.created_per_tick)),
                   deleted_total=int(sum(self.deleted_per_tick)), pairs_per_tick=list(self.pairs_per_tick),
                   created_per_tick=list(self.created_per_tick), deleted_per_tick=list(self.deleted_per_tick))
        if self.final_keys is not None:
            out.update(final_pairs=int(len(self.final_keys)),
                       final_pairs_sha256=traces.pairs_sha256(self.final_keys))
        return out


#: FrameStats fields summed over the ticks (the engine's own phase timings, seconds; swaps a count)
PHASES = ("validate_s", "rasterize_s", "apply_s", "merge_s", "total_s", "swaps")


def _add_phases(acc: dict, delta) -> None:
    stats = getattr(delta, "stats", None)
    if stats is None:
        return
    for k in PHASES:
        v = getattr(stats, k, None)
        if v is not None:
            acc[k] = acc.get(k, 0) + v


def replay(world, trace: traces.Trace, budget_s: float | None = None, final_pairs: bool = True) -> ReplayResult:
    """Replay ``trace`` into an empty ``world`` (anything with World's step/pairs).

    Stops early once build + ticks exceed ``budget_s`` (then no final pairs).
    Only ``world.step`` is inside the timings; id arrays are converted to
    uint64 before the clock starts."""
    res = ReplayResult()
    init_ids = trace.init_ids.astype(np.uint64)
    t0 = time.perf_counter()
    delta = world.step(add_ids=init_ids, add_boxes=trace.init_boxes)
    res.build_ms = (time.perf_counter() - t0) * 1e3
    res.initial_pairs = pairs = len(delta.created)
    res.pairs_per_tick.append(pairs)
    spent = res.build_ms / 1e3
    perf = time.perf_counter
    for t in range(trace.ticks):
        ops = trace.tick(t)
        kw = dict(remove_ids=_ids(ops.rem_ids), update_ids=_ids(ops.upd_ids),
                  update_boxes=ops.upd_boxes if len(ops.upd_ids) else None,
                  add_ids=_ids(ops.add_ids), add_boxes=ops.add_boxes if len(ops.add_ids) else None)
        s = perf()
        delta = world.step(**kw)
        dt = perf() - s
        res.times_ms.append(dt * 1e3)
        c, d = len(delta.created), len(delta.deleted)
        pairs += c - d
        res.created_per_tick.append(c)
        res.deleted_per_tick.append(d)
        res.pairs_per_tick.append(pairs)
        _add_phases(res.phases_s, delta)
        spent += dt
        if budget_s is not None and spent > budget_s and t + 1 < trace.ticks:
            return res
    if final_pairs:
        res.final_keys = traces.rows_to_keys(world.pairs())
        n = getattr(world, "object_count", None)
        res.final_objects = int(n) if n is not None else None
    return res


# --------------------------------------------------------------------------
# checking
# --------------------------------------------------------------------------
def compare(got: dict, want: dict) -> list[str]:
    """Human-readable differences between replay counts and expected.json (empty: equal)."""
    out = []
    for k in CHECK_FIELDS:
        if k not in want:
            continue
        g, w = got.get(k), want[k]
        if g == w:
            continue
        if isinstance(w, list) and isinstance(g, list):
            if len(g) != len(w):
                out.append(f"{k}: {len(g)} entries, expected {len(w)}")
                continue
            bad = [i for i, (a, b) in enumerate(zip(g, w)) if a != b]
            i = bad[0]
            out.append(f"{k}: {len(bad)} ticks differ, first at index {i}: {g[i]} != expected {w[i]}")
        else:
            out.append(f"{k}: {g} != expected {w}")
    return out


def expected_for(trace: traces.Trace) -> tuple[dict, str]:
    """(expected.json content, where it came from)."""
    want = traces.load_expected(trace)
    if want is not None:
        return want, trace.expected_path()
    return traces.expected(trace), "sapgrid's own oracle (no expected.json beside the trace)"


# --------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------
def _fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def run(args: argparse.Namespace) -> int:
    """Run ``sapgrid replay``; return the exit status (0 ok, 1 mismatch/failure, 2 usage)."""
    server = getattr(args, "server", None)
    threads = getattr(args, "threads", None)
    try:
        trace = traces.Trace.load(args.trace)
        cfg = make_config(trace, threads, parse_cells(getattr(args, "cells", None), trace.dims))
    except (OSError, ValueError, KeyError, sapcore.SapcoreError) as e:
        print(f"sapgrid replay: {e}", file=sys.stderr)
        return 2
    where = f"server {server}" if server else "in process"
    print(f"{trace.name}: dims={trace.dims} objects={len(trace.init_ids)} ticks={trace.ticks} "
          f"cells={'x'.join(map(str, cfg.cells))} threads={threads or 'auto'} ({where})", flush=True)
    summary = dict(trace=trace.name, engine="sapgrid", dims=trace.dims, objects=int(len(trace.init_ids)),
                   ticks=trace.ticks, ticks_done=0, threads=threads, cells=list(cfg.cells), server=server)
    try:
        warm_ms = warm_up(trace.dims, threads, server)
        with open_world(cfg, server, max_live(trace)) as world:
            res = replay(world, trace)
    except Exception as e:  # report as a result line (the kit keeps going), then fail
        summary.update(status=f"failed: {type(e).__name__}: {e}"[:300])
        print(f"replay failed: {type(e).__name__}: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps(summary))
        return 1
    tim = timing_summary(res.times_ms)
    got = res.counts()
    summary.update(ticks_done=res.ticks_done, build_ms=res.build_ms, warmup_ms=warm_ms, **tim,
                   initial_pairs=res.initial_pairs, final_pairs=got["final_pairs"],
                   created_total=got["created_total"], deleted_total=got["deleted_total"],
                   final_pairs_sha256=got["final_pairs_sha256"], final_objects=res.final_objects,
                   apply_s=res.apply_s, phases_s=res.phases_s, checked=bool(args.check), status="ok")
    print(f"build {res.build_ms:.1f} ms (warm-up {warm_ms:.0f} ms); per tick: median {_fmt(tim['median_ms'], '.3f')} "
          f"ms, p95 {_fmt(tim['p95_ms'], '.3f')} ms, mean {_fmt(tim['mean_ms'], '.3f')} ms, "
          f"max {_fmt(tim['max_ms'], '.3f')} ms over {res.ticks_done} ticks")
    print(f"pairs: initial {res.initial_pairs}, final {got['final_pairs']} "
          f"(created {got['created_total']}, deleted {got['deleted_total']}); "
          f"sha256 {got['final_pairs_sha256'][:16]}...")
    ph = res.phases_s
    if ph.get("total_s") and res.times_ms:
        step_s = sum(res.times_ms) / 1e3
        print("engine phases, summed over the ticks: " + ", ".join(
            f"{k[:-2]} {ph[k] * 1e3:.1f} ms" for k in PHASES if k.endswith("_s") and k in ph)
            + f"; step wall {step_s * 1e3:.1f} ms (outside the engine's total: {(step_s - ph['total_s']) * 1e3:.1f} ms)"
            + (f"; {int(ph['swaps'])} endpoint swaps" if "swaps" in ph else ""))
    rc = 0
    if args.check:
        want, source = expected_for(trace)
        diffs = compare(got, want)
        summary.update(expected_source=source, mismatches=diffs)
        if diffs:
            summary["status"] = "mismatch"
            print(f"check: MISMATCH against {source}:")
            for line in diffs:
                print(f"  {line}")
            rc = 1
        else:
            print(f"check: ok against {source}")
    if args.json:
        print(json.dumps(summary), flush=True)
    return rc


def main(argv=None) -> int:
    """Stand-alone entry (``python -m sapgrid.tools.replay``); the CLI calls :func:`run`."""
    ap = argparse.ArgumentParser(prog="sapgrid replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
