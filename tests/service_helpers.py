"""Helpers of the service tests (not fixtures)."""
from __future__ import annotations

import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families


def random_boxes(rng, n: int, dims: int = 2, side: float = 100.0, size: float = 3.0) -> np.ndarray:
    """float32 [n, 2*dims] boxes (mins then maxs) inside [0, side]^dims."""
    lo = rng.uniform(0, side - size, size=(n, dims))
    ext = rng.uniform(0.5, size, size=(n, dims))
    return np.concatenate([lo, lo + ext], axis=1).astype(np.float32)


def pair_set(pairs: np.ndarray) -> set:
    return {(int(a), int(b)) for a, b in np.asarray(pairs).reshape(-1, 2)}


def assert_same_pairs(a: np.ndarray, b: np.ndarray) -> None:
    a = np.asarray(a, dtype=np.uint64).reshape(-1, 2)
    b = np.asarray(b, dtype=np.uint64).reshape(-1, 2)
    assert a.shape == b.shape, f"{a.shape} != {b.shape}"
    assert np.array_equal(a, b)


def scrape(url: str) -> str:
    """The text of a /metrics page."""
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def metric_value(text: str, name: str, **labels) -> float | None:
    """Value of the sample ``name`` in a /metrics text: the first whose labels include ``labels``
    (no labels given: the sample without labels); None if there is none."""
    want = {k: str(v) for k, v in labels.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and (want.items() <= sample.labels.items() if want else not sample.labels):
                return float(sample.value)
    return None


