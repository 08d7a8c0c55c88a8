"""``sapgrid bench``: sapgrid's own benchmark, needing nothing outside the project.

For every scenario x size it generates the trace in memory
(:mod:`sapgrid.tools.traces`, the benchmark kit's rules), replays it through
``sapcore.World`` and, in the same run, through the numpy sort-and-sweep
recomputed from scratch every tick (the "peer", the kit's ``numpy-sap``), and
prints a markdown table of per-tick median / p95 ms and the ratio
peer / sapgrid. The final pairs of sapgrid are checked against the exact
oracle (the peer's state after the whole trace).

Then, at the largest size (crowd2d layout), the costs a user asks about:

- batch insert of N boxes into an empty world (ms; ratio to one full-motion tick),
- a still tick: a step with no operations, and a step that "updates" every
  object with its unchanged box (ms; % of a full-motion tick),
- batch remove of 10% of the objects in one step (ms),
- memory: ``World.memory_bytes()`` if the engine has it, else the tracemalloc
  delta of building the world (bytes per object and per active pair),
- the apply phase with 1 vs 2 threads: the sum of ``delta.stats.apply_s + merge_s`` (phases 4-7: a
  frame on the calling thread applies, nets and merges in one call, all counted in ``apply_s``).

Timings are wall times of ``world.step`` (nearest-rank quantiles, as the kit).
``--json`` ends the output with one JSON line holding everything.
With ``--server`` the service is benchmarked instead (``sapgrid.tools.bench_server``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc

import numpy as np

import sapcore
from sapgrid.tools import replay as rp
from sapgrid.tools import traces

DEFAULT_SIZES = "10000,100000"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``sapgrid bench``."""
    parser.add_argument("--scenarios", default=",".join(traces.SCENARIOS),
                        help=f"comma list from {','.join(traces.SCENARIOS)}")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma list of object counts")
    parser.add_argument("--ticks", type=int, default=100, help="ticks per trace (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="trace seed (default 1, as the kit)")
    parser.add_argument("--threads", type=int, default=None, help="cell-apply threads (default: all cores)")
    parser.add_argument("--peer-budget", type=float, default=10.0,
                        help="seconds per trace for the numpy peer (build + ticks; default 10, as the kit)")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="seconds per trace for sapgrid (build + ticks; default 120)")
    parser.add_argument("--no-peer", action="store_true", help="skip the numpy peer")
    parser.add_argument("--no-extras", action="store_true",
                        help="skip insert/remove/still-tick/memory/threads measurements")
    parser.add_argument("--json", action="store_true", help="end the output with one JSON line of all results")
    rp._add_once(parser, "--server", default=None, metavar="HOST:PORT",
                 help="benchmark a sapgrid server instead (sapgrid.tools.bench_server)")


# --------------------------------------------------------------------------
# one trace: sapgrid vs the peer
# --------------------------------------------------------------------------
def run_peer(trace: traces.Trace, budget_s: float) -> dict:
    """Time the recompute peer on ``trace`` (stops once build + ticks > budget_s), then
    finish applying the trace untimed; return timings and the exact final id keys."""
    peer = traces.RecomputePeer(trace)
    t0 = time.perf_counter()
    peer.build()
    build_ms = (time.perf_counter() - t0) * 1e3
    spent, times = build_ms / 1e3, []
    t = 0
    while t < trace.ticks:
        s = time.perf_counter()
        peer.tick(t)
        dt = time.perf_counter() - s
        times.append(dt * 1e3)
        spent += dt
        t += 1
        if spent > budget_s:
            break
    for u in range(t, trace.ticks):          # untimed: just reach the final state
        peer.apply(u)
    if t < trace.ticks:
        peer.keys = peer.pairs()
    return dict(build_ms=build_ms, ticks_done=len(times), final_keys=peer.id_keys(), **rp.timing_summary(times))


def run_sapgrid(trace: traces.Trace, threads, budget_s: float, cells=None) -> tuple[dict, rp.ReplayResult]:
    """Replay ``trace`` through a fresh in-process World; (summary dict, raw result)."""
    cfg = rp.make_config(trace, threads, cells)
    world = sapcore.World(cfg)
    res = rp.replay(world, trace, budget_s=budget_s)
    out = dict(build_ms=res.build_ms, ticks_done=res.ticks_done, cells=list(cfg.cells),
               apply_s=res.apply_s, phases_s=res.phases_s, **rp.timing_summary(res.times_ms))
    if res.final_keys is not None:
        out["final_pairs"] = int(len(res.final_keys))
    mem = getattr(world, "memory_bytes", None)
    if callable(mem):
        out["memory_bytes"] = int(mem())
    return out, res


def bench_trace(name: str, args, warmed: set) -> dict:
    """Generate one trace and time both engines on it; one result row."""
    t0 = time.perf_counter()
    trace = traces.Trace.generate(name, args.ticks, args.seed)
    gen_s = time.perf_counter() - t0
    if trace.dims not in warmed:
        rp.warm_up(trace.dims, args.threads)
        warmed.add(trace.dims)
    row = dict(trace=name, objects=int(len(trace.init_ids)), ticks=trace.ticks, gen_s=gen_s)
    sg, res = run_sapgrid(trace, args.threads, args.budget)
    row["sapgrid"] = sg
    if not args.no_peer:
        peer = run_peer(trace, args.peer_budget)
        want = peer.pop("final_keys")
        row["peer"] = peer
        peer_med, sg_med = peer["median_ms"], sg["median_ms"]
        row["ratio"] = peer_med / sg_med if peer_med and sg_med else None
        if res.final_keys is None:
            row["check"] = "partial"
        elif np.array_equal(res.final_keys, want):
            row["check"] = "ok"
        else:
            row["check"] = f"MISMATCH ({len(res.final_keys)} pairs, exact {len(want)})"
        row["exact_pairs"] = int(len(want))
    return row


# --------------------------------------------------------------------------
# the extras, at the largest size
# --------------------------------------------------------------------------
def _median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - s) * 1e3)
    return rp.nearest_rank(np.sort(ts), 0.5)


def bench_extras(n: int, args, full_tick_ms: float | None) -> dict:
    """Insert / still tick / remove / memory / threads on a crowd2d-n world."""
    ticks = max(1, min(args.ticks, 30))
    trace = traces.Trace.generate(f"crowd2d-{n}", ticks, args.seed)
    rp.warm_up(2, args.threads)
    cfg = rp.make_config(trace, args.threads)
    ids = trace.init_ids.astype(np.uint64)
    boxes = trace.init_boxes
    out = dict(objects=n, cells=list(cfg.cells), threads=args.threads)

    # batch insert into an empty world: median of 3 fresh worlds (the last one is kept)
    insert_ms = []
    for _ in range(3):
        world = None                          # free the previous world before building the next
        world = sapcore.World(cfg)
        s = time.perf_counter()
        delta = world.step(add_ids=ids, add_boxes=boxes)
        insert_ms.append((time.perf_counter() - s) * 1e3)
    out["insert_ms"] = rp.nearest_rank(np.sort(insert_ms), 0.5)
    out["insert_ms_runs"] = insert_ms
    pairs = int(len(delta.created))

    # memory (tracemalloc slows allocations down: never active while timing)
    mem_fn = getattr(world, "memory_bytes", None)
    if callable(mem_fn):
        mem, how = int(mem_fn()), "World.memory_bytes()"
    else:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        w2 = sapcore.World(cfg)
        w2.step(add_ids=ids, add_boxes=boxes)
        mem, how = int(tracemalloc.get_traced_memory()[0] - base), "tracemalloc delta of building the world"
        tracemalloc.stop()
        del w2
    out.update(pairs=pairs, memory_bytes=mem, memory_source=how, bytes_per_object=mem / n,
               bytes_per_pair=mem / pairs if pairs else None)

    # the full-motion reference tick (from the main table if crowd2d-n ran)
    if full_tick_ms is None:
        w2 = sapcore.World(cfg)
        full_tick_ms = rp.timing_summary(rp.replay(w2, trace, final_pairs=False).times_ms)["median_ms"]
        del w2
    out["full_tick_ms"] = full_tick_ms
    out["insert_vs_tick"] = out["insert_ms"] / full_tick_ms if full_tick_ms else None

    # still ticks: nothing moves
    out["still_empty_ms"] = _median_ms(lambda: world.step(), 21)
    out["still_same_boxes_ms"] = _median_ms(lambda: world.step(update_ids=ids, update_boxes=boxes), 7)
    if full_tick_ms:
        out["still_empty_pct"] = 100.0 * out["still_empty_ms"] / full_tick_ms
        out["still_same_boxes_pct"] = 100.0 * out["still_same_boxes_ms"] / full_tick_ms

    # batch remove of 10%
    gone = np.sort(np.random.default_rng(args.seed).choice(ids, size=max(1, n // 10), replace=False))
    s = time.perf_counter()
    delta = world.step(remove_ids=gone)
    out["remove10_ms"] = (time.perf_counter() - s) * 1e3
    out["remove10_pairs_deleted"] = int(len(delta.deleted))
    del world

    # apply phase with 1 vs 2 threads (same trace, same grid); runs interleaved t1, t2, t1, t2
    # and the better of the two kept, so a burst of load on the shared machine hits both alike
    for k in (1, 2):
        rp.warm_up(2, k)
    for _ in range(2):
        for k in (1, 2):
            w = sapcore.World(rp.make_config(trace, k, cfg.cells))
            res = rp.replay(w, trace, final_pairs=False)
            del w
            cells_s = res.apply_s + res.phases_s.get("merge_s", 0.0)
            if cells_s < out.get(f"apply_s_t{k}", float("inf")):
                out[f"apply_s_t{k}"] = cells_s
                out[f"tick_median_ms_t{k}"] = rp.timing_summary(res.times_ms)["median_ms"]
    out["apply_ticks"] = ticks
    out["apply_speedup"] = out["apply_s_t1"] / out["apply_s_t2"] if out["apply_s_t2"] else None
    return out


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------
def _f(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def _load(avg) -> str:
    return "?" if not avg else f"{avg[0]:.1f}"


def _size(b: int) -> str:
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"


def table(rows: list[dict]) -> str:
    """Markdown table of the per-trace rows."""
    head = ("| trace | objects | sapgrid ticks | sapgrid median ms | sapgrid p95 ms | sapgrid build ms "
            "| peer ticks | peer median ms | peer p95 ms | peer/sapgrid | final pairs | check |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        sg, pe = r["sapgrid"], r.get("peer") or {}
        lines.append(
            f"| {r['trace']} | {r['objects']} | {sg['ticks_done']}/{r['ticks']} | {_f(sg['median_ms'])} "
            f"| {_f(sg['p95_ms'])} | {_f(sg['build_ms'], '.1f')} "
            f"| {str(pe.get('ticks_done', '-')) + '/' + str(r['ticks']) if pe else '-'} "
            f"| {_f(pe.get('median_ms'))} | {_f(pe.get('p95_ms'))} | {_f(r.get('ratio'), '.1f')}x "
            f"| {sg.get('final_pairs', '-')} | {r.get('check', '-')} |")
    return "\n".join(lines)


def extras_text(x: dict) -> str:
    """Markdown bullet list of the extras."""
    n = x["objects"]
    pct = lambda k: f" ({_f(x.get(k), '.1f')}% of a full-motion tick)" if x.get(k) is not None else ""  # noqa: E731
    budget = 300 * x["objects"] + 48 * x["pairs"]        # the issue's memory budget, bytes
    return "\n".join([
        f"crowd2d, {n} objects, cells {'x'.join(map(str, x['cells']))}, threads {x['threads'] or 'auto'}:",
        f"- batch insert of {n} boxes into an empty world: {_f(x['insert_ms'], '.1f')} ms "
        f"= {_f(x['insert_vs_tick'], '.1f')}x a full-motion tick ({_f(x['full_tick_ms'])} ms)",
        f"- still tick, empty step: {_f(x['still_empty_ms'])} ms{pct('still_empty_pct')}",
        f"- still tick, all {n} updated with unchanged boxes: {_f(x['still_same_boxes_ms'])} ms"
        f"{pct('still_same_boxes_pct')}",
        f"- batch remove of 10% ({n // 10} objects, {x['remove10_pairs_deleted']} pairs deleted): "
        f"{_f(x['remove10_ms'], '.1f')} ms",
        f"- memory ({x['memory_source']}): {_size(x['memory_bytes'])} = "
        f"{_f(x['bytes_per_object'], '.0f')} B/object, {_f(x['bytes_per_pair'], '.0f')} B/pair "
        f"({x['pairs']} pairs); budget 300 B/object + 48 B/pair = {_size(budget)}: "
        f"{'ok' if x['memory_bytes'] < budget else 'OVER'}",
        f"- apply phases (cells, netting, merge) over {x['apply_ticks']} full-motion ticks (best of 2): "
        f"1 thread {_f(x['apply_s_t1'] * 1e3, '.1f')} ms, "
        f"2 threads {_f(x['apply_s_t2'] * 1e3, '.1f')} ms -> speed-up {_f(x['apply_speedup'], '.2f')}x "
        f"(tick median {_f(x['tick_median_ms_t1'])} vs {_f(x['tick_median_ms_t2'])} ms)",
    ])


def environment() -> dict:
    """Context that explains noisy numbers: cores, load average, numba threading layer."""
    env = dict(cores=os.cpu_count(), load_avg=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    try:
        import numba
        env.update(numba_threads=numba.config.NUMBA_NUM_THREADS, threading_layer=numba.threading_layer(),
                   omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"))
    except Exception:  # no parallel kernel has run yet (threading_layer raises), or no numba
        pass
    return env


def run(args: argparse.Namespace) -> int:
    """Run ``sapgrid bench``; return the exit status (1 if any check failed)."""
    if getattr(args, "replicas", 1) != 1 and not (getattr(args, "server", None) and getattr(args, "worlds", 0)):
        raise SystemExit("sapgrid bench: --replicas is for the many-worlds mode (--server spawn --worlds W)")
    if getattr(args, "server", None):
        from sapgrid.tools import bench_server, bench_worlds
        return (bench_worlds if getattr(args, "worlds", 0) else bench_server).run(args)
    try:
        scens = [s for s in args.scenarios.split(",") if s]
        try:
            sizes = [int(v) for v in str(args.sizes).split(",") if v]
        except ValueError:
            raise ValueError(f"--sizes {args.sizes!r}: not a comma-separated list of object counts") from None
        names = [f"{s}-{n}" for s in scens for n in sizes]
        for nm in names:
            traces.parse_name(nm)
        if args.ticks < 1:
            raise ValueError("--ticks must be >= 1")
    except ValueError as e:
        print(f"sapgrid bench: {e}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    load_start = environment().get("load_avg")
    rows, warmed = [], set()
    for nm in names:
        row = bench_trace(nm, args, warmed)
        sg, pe = row["sapgrid"], row.get("peer") or {}
        print(f"{nm}: sapgrid median {_f(sg['median_ms'])} ms, peer median {_f(pe.get('median_ms'))} ms, "
              f"check {row.get('check', '-')}", flush=True)
        rows.append(row)
    if rows:
        print()
        print(table(rows))
    extras = None
    if not args.no_extras and sizes:
        n = max(sizes)
        ref = next((r["sapgrid"]["median_ms"] for r in rows if r["trace"] == f"crowd2d-{n}"), None)
        extras = bench_extras(n, args, ref)
        print()
        print(extras_text(extras))
        from sapgrid.tools import bench_frames

        extras["fixed_cost"] = bench_frames.fixed_cost(args.seed)
        extras["two_worlds"] = bench_frames.two_worlds(n, seed=args.seed)
        extras["paced"] = bench_frames.paced(n, threads=args.threads, seed=args.seed)
        extras["service_frame"] = bench_frames.service_frame(seed=args.seed)
        print(bench_frames.text(extras["fixed_cost"], extras["two_worlds"], extras["paced"],
                                extras["service_frame"]))
    total_s = time.perf_counter() - t_start
    env = dict(environment(), load_avg_start=load_start)
    print(f"\n_{len(rows)} traces, {args.ticks} ticks each, threads {args.threads or 'auto'}; total {total_s:.0f} s; "
          f"{env.get('cores')} cores, load average {_load(load_start)} at start, {_load(env.get('load_avg'))} at end; "
          f"numba threading layer {env.get('threading_layer', '?')}_", flush=True)
    if args.json:
        print(json.dumps(dict(bench="sapgrid", ticks=args.ticks, seed=args.seed, threads=args.threads,
                              rows=rows, extras=extras, total_s=total_s, env=env)), flush=True)
    bad = [r for r in rows if str(r.get("check", "ok")).startswith("MISMATCH")]
    return 1 if bad else 0


def main(argv=None) -> int:
    """Stand-alone entry (``python -m sapgrid.tools.bench``); the CLI calls :func:`run`."""
    ap = argparse.ArgumentParser(prog="sapgrid bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
