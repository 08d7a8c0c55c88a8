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
    none = np.empty((0, 2), np.uint64)
    for value in (0, 1, top, 2**63, np.uint64(9)):          # a delta without pairs keeps the digest
        got = digest.digest_step(value, none, none[:0])
        assert got == layout.digest_step(int(value), none, none) == int(value) and isinstance(got, int)
    # adding a set then removing it gives the digest back
    assert digest.digest_step(digest.digest_step(5, pairs, []), [], pairs) == 5
