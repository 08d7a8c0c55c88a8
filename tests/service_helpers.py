"""Helpers of the service tests (not fixtures)."""
from __future__ import annotations

import numpy as np


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
