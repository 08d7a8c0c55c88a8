"""The frame path's compiled and pre-bound parts give exactly what their plain definitions give."""
from __future__ import annotations

import numpy as np
import pytest

from sapgrid import layout
from sapgrid.server import digest


@pytest.mark.parametrize("seed", range(5))
def test_digest_step_is_the_contract_digest(seed):
    rng = np.random.default_rng(seed)
    value = 0
    for _ in range(60):
        created = rng.integers(0, 2**64 - 1, size=(int(rng.integers(0, 40)), 2), dtype=np.uint64)
        deleted = rng.integers(0, 2**64 - 1, size=(int(rng.integers(0, 40)), 2), dtype=np.uint64)
        expected = layout.digest_step(value, created, deleted)
        got = digest.digest_step(value, created, deleted)
        assert got == expected and isinstance(got, int)
        value = got
    assert value != 0


def test_digest_step_takes_any_pair_array():
    pairs = np.array([[1, 2], [3, 2**64 - 1], [0, 7]], np.uint64)
    top = 2**64 - 1
    for created, deleted in [(pairs, pairs[:0]), (pairs[::2], pairs[1:]), (pairs.T.copy().T, pairs[:1]),
                             (pairs.ravel(), np.empty(0, np.uint64)), ([[1, 2]], [])]:
        for value in (0, 1, top, 2**63):
            assert digest.digest_step(value, created, deleted) == layout.digest_step(value, created, deleted)
    assert digest.digest_step(top, [], []) == top
    # adding a set then removing it gives the digest back
    assert digest.digest_step(digest.digest_step(5, pairs, []), [], pairs) == 5


def test_frame_metrics_observe_as_prometheus_does():
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from sapgrid.server.metrics import LATENCY_BUCKETS, PHASES, Metrics

    values = [0.0, -1.0, 5e-5, 5.0001e-5, 1e-4, 0.00099, 0.001, 0.0123, 10.0, 11.0, float("inf"), 3e-6]
    plain = CollectorRegistry()
    reference = Histogram("sapgrid_frame_duration_seconds", "x", ["world", "phase"], buckets=LATENCY_BUCKETS,
                          registry=plain)
    metrics = Metrics(process=False)
    for v in values:
        stats = SimpleNamespace(objects=3, pairs=2, created=1, deleted=0, swaps=4, cell_overflows=0, validate_s=v,
                                rasterize_s=v, apply_s=v, merge_s=v, total_s=v)
        metrics.frame_applied("w", stats, v, v)
        for phase in PHASES:
            reference.labels("w", phase).observe(v)

    def series(registry):
        return sorted(line for line in generate_latest(registry).decode().splitlines()
                      if line.startswith("sapgrid_frame_duration_seconds_"))

    got, expected = series(metrics.registry), series(plain)
    assert got == expected and len(got) == len(PHASES) * (len(LATENCY_BUCKETS) + 3)
