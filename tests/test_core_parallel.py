"""How parallel launches use the cores (``sapcore.parallel``): a launch with more than one thread pins
its team's workers each to a core of its own that is not the calling thread's, the calling thread to
the core it is on for the launch only, and leaves it all to OpenMP when the user asks for OpenMP's own
binding. Each case runs in a fresh process (OpenMP's thread pools and settings are per process)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1

needs_cores = pytest.mark.skipif(CORES < 2, reason="pinning needs at least two cores")


def _run(code: str, **env) -> dict:
    """Run ``code`` in a fresh Python with two numba threads; it prints one JSON line."""
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")}
    e.update(NUMBA_NUM_THREADS="2", PYTHONPATH=ROOT, **env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


#: the start of a probe: ``launch()`` runs a 2-thread kernel and returns the OS ids of its two threads
_LAUNCH = textwrap.dedent("""
    import json, os, threading, warnings
    import numba, numpy as np
    from sapcore import parallel
    from sapcore.kernels.threads import team_tids

    def launch():
        tids = np.zeros(128, np.int64)
        team_tids(tids)
        return [int(t) for t in tids[:2]]
""")

_PROBE = _LAUNCH + textwrap.dedent("""
    before = sorted(os.sched_getaffinity(0))
    seen = {}
    for _ in range(3):
        with parallel.region(2, 1 << 20, 1):
            tids = launch()
            here = parallel._getcpu()
            seen = dict(inside=sorted(os.sched_getaffinity(0)), here=here, tids=tids,
                        worker=sorted(os.sched_getaffinity(tids[1])))
    after = sorted(os.sched_getaffinity(0))
    print(json.dumps(dict(layer=numba.threading_layer(), pin=parallel._PIN, before=before, after=after,
                          me=threading.get_native_id(), **seen)))
""")


def _need_omp(r: dict) -> None:
    if r["layer"] != "omp":
        if os.environ.get("CI") == "true":
            pytest.fail(f"numba's threading layer is {r['layer']}, not omp: scripts/setup.sh installs libgomp1")
        pytest.skip(f"numba's threading layer is {r['layer']} (pinning is for OpenMP's)")


@needs_cores
def test_a_launch_pins_its_worker_off_the_callers_core_and_gives_the_caller_its_cores_back():
    r = _run(_PROBE)
    _need_omp(r)
    assert r["pin"] is True
    assert r["tids"][0] == r["me"]                       # thread 0 of the team is the calling thread
    assert r["inside"] == [r["here"]]                    # the caller stays on its core for the launch
    assert len(r["worker"]) == 1 and r["worker"][0] != r["here"]   # the worker on another core
    assert r["after"] == r["before"]                     # and the caller gets its cores back


@needs_cores
def test_a_frame_keeps_the_pin_between_its_launches_and_gives_the_cores_back_at_its_end():
    r = _run(_LAUNCH + textwrap.dedent("""
        calls = []
        real = os.sched_setaffinity
        def counted(pid, cores):
            calls.append(pid)
            real(pid, cores)
        os.sched_setaffinity = counted
        before = sorted(os.sched_getaffinity(0))
        with parallel.region(2, 1 << 20, 1):      # the workers pinned once, as by an earlier frame
            launch()
        calls.clear()
        with parallel.frame(2):
            with parallel.region(2, 1 << 20, 1):
                launch()
                here = parallel._getcpu()
            between = sorted(os.sched_getaffinity(0))
            locked_between = parallel._LOCK.locked()
            for _ in range(3):
                with parallel.region(2, 1 << 20, 1):
                    launch()
            inside = sorted(os.sched_getaffinity(0))
        after = sorted(os.sched_getaffinity(0))
        with parallel.frame(1):                   # a world of one thread: nothing held
            pass
        print(json.dumps(dict(layer=numba.threading_layer(), before=before, here=here, between=between,
                              inside=inside, after=after, calls=calls, locked=locked_between,
                              held=parallel._SET.pinned.held)))
    """))
    _need_omp(r)
    assert r["between"] == r["inside"] == [r["here"]]     # pinned from the first launch to the frame's end
    assert r["locked"] is False                            # other worlds' launches may run in between
    assert r["after"] == r["before"] and r["held"] == 0    # the cores given back when the frame ends
    assert r["calls"] == [0, 0]                            # one pin and one give-back for four launches


@needs_cores
def test_openmp_binding_asked_for_by_the_user_turns_sapcores_pinning_off():
    r = _run(_PROBE, OMP_PROC_BIND="false")
    _need_omp(r)
    assert r["pin"] is False
    assert r["inside"] == r["before"] == r["after"]      # nothing pinned by sapcore
    assert len(r["worker"]) == len(r["before"])


@needs_cores
def test_an_error_while_pinning_turns_it_off_for_the_thread_and_the_launch_goes_on():
    r = _run(_LAUNCH + textwrap.dedent("""
        real = os.sched_setaffinity
        def refuse(pid, cores):
            if pid != 0:
                raise OSError(22, "Invalid argument")
            real(pid, cores)
        os.sched_setaffinity = refuse
        before = sorted(os.sched_getaffinity(0))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with parallel.region(2, 1 << 20, 1):
                launch()
                inside = sorted(os.sched_getaffinity(0))
            with parallel.region(2, 1 << 20, 1):     # the lock was given back: a second launch runs
                launch()
        print(json.dumps(dict(layer=numba.threading_layer(), before=before, inside=inside,
                              after=sorted(os.sched_getaffinity(0)), ok=parallel._SET.pinned.ok,
                              warned=[str(w.message) for w in caught], locked=parallel._LOCK.locked())))
    """))
    _need_omp(r)
    assert r["ok"] is False
    assert len(r["warned"]) == 1 and "no longer pinned" in r["warned"][0]
    assert r["inside"] == r["before"] == r["after"]      # the caller was given its cores back at once
    assert r["locked"] is False


@needs_cores
def test_big_frames_have_the_same_pairs_pinned_or_not():
    code = """
        import json, numpy as np, sapcore
        rng = np.random.default_rng(5)
        n = 60000
        w = sapcore.World(sapcore.WorldConfig(dims=2, bounds=(0, 0, 900, 900),
                                              cells=sapcore.auto_cells(2, (0, 0, 900, 900), n), threads=2))
        ids = np.arange(n, dtype=np.uint64)
        c = rng.uniform(0, 900, (n, 2)).astype(np.float32)
        h = rng.uniform(0.5, 2.0, (n, 2)).astype(np.float32)
        v = rng.normal(0, 0.3, (n, 2)).astype(np.float32)
        w.step(add_ids=ids, add_boxes=np.concatenate([c - h, c + h], 1))
        digest = []
        for t in range(1, 8):
            p = c + v * t
            d = w.step(update_ids=ids, update_boxes=np.concatenate([p - h, p + h], 1))
            digest.append([len(d.created), len(d.deleted), int(d.created.sum() % 1000003),
                           int(d.deleted.sum() % 1000003)])
        from sapcore import parallel
        print(json.dumps(dict(digest=digest, pairs=int(w.pair_count), pin=parallel._PIN)))
    """
    pinned = _run(code)
    plain = _run(code, OMP_PROC_BIND="false")
    assert pinned["pin"] is True and plain["pin"] is False
    assert pinned["digest"] == plain["digest"] and pinned["pairs"] == plain["pairs"]


def test_workers_get_physical_cores_of_their_own_before_smt_siblings():
    from sapcore.parallel import workers_cores
    # siblings numbered apart (0/4, 1/5, ...): the caller on 0, workers on cores 1-3 first, then siblings
    apart = {c: f"{c % 4},{c % 4 + 4}" for c in range(8)}
    assert workers_cores(0, range(8), apart) == [1, 2, 3, 4, 5, 6, 7]
    assert workers_cores(5, range(8), apart) == [0, 2, 3, 1, 4, 6, 7]
    # siblings side by side (0/1, 2/3): the caller on 0, the first worker on 2, not on 0's sibling 1
    side = {c: f"{c - c % 2}-{c - c % 2 + 1}" for c in range(4)}
    assert workers_cores(0, range(4), side) == [2, 1, 3]
    assert workers_cores(3, {0, 1, 2, 3}, side) == [0, 1, 2]
    # no topology known: every other CPU in order
    assert workers_cores(1, [0, 1, 2], {}) == [0, 2]


def test_workers_wait_a_bounded_spin_then_sleep_unless_the_user_says_otherwise():
    """sapcore sets OpenMP's wait before numba loads it: passive, after a spin of 10,000 (the gaps between
    one frame's kernels); a wait policy or a spin count the user set is left as it is."""
    probe = "import json, os, sapcore; print(json.dumps({k: os.environ.get(k) for k in " \
            "('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')}))"
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

    def run(**env):
        out = subprocess.run([sys.executable, "-c", probe], env=dict(clean, PYTHONPATH=ROOT, **env),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run() == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}
    assert run(GOMP_SPINCOUNT="0") == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    assert run(OMP_WAIT_POLICY="ACTIVE") == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}
