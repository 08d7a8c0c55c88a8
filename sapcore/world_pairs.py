"""The world's pair table: per active pair, the number of cells that hold it (kernels/merge.py).

A pair is created for the world when its count goes 0 -> 1 and deleted when it goes 1 -> 0, netted
over a frame. The table is split in ``SHARDS`` open-addressing shards (a constant, so that the result
never depends on the thread count), merged in parallel.
"""
from __future__ import annotations

import numpy as np

from . import parallel
from .kernels import merge as kmerge
from .kernels.hashing import capacity_for
from .kernels.pair_set import pair_set_find

SHARDS = 8


class WorldPairs:
    """Shards of ``cap`` slots each; shard s keeps its ``n[s]`` keys and counts packed at s * cap / 2."""

    def __init__(self):
        self.cap = 16
        self.slots = np.full(SHARDS * 16, -1, np.int32)
        self.keys = np.zeros(SHARDS * 8, np.uint64)
        self.cnt = np.zeros(SHARDS * 8, np.int32)
        self.n = np.zeros(SHARDS, np.int64)
        self.count = 0

    def reserve(self, extra: np.ndarray) -> None:
        """Room in every shard for ``extra[s]`` more pairs (load factor <= 1/2)."""
        need = int((self.n + extra).max())
        if 2 * need < self.cap:
            return
        cap = capacity_for(need)
        half, old_half = cap // 2, self.cap // 2
        keys = np.zeros(SHARDS * half, np.uint64)
        cnt = np.zeros(SHARDS * half, np.int32)
        slots = np.empty(SHARDS * cap, np.int32)
        for s in range(SHARDS):
            n = int(self.n[s])
            keys[s * half:s * half + n] = self.keys[s * old_half:s * old_half + n]
            cnt[s * half:s * half + n] = self.cnt[s * old_half:s * old_half + n]
            kmerge.pair_set_rehash(slots, keys, s * cap, cap, s * half, n)
        self.cap, self.slots, self.keys, self.cnt = cap, slots, keys, cnt

    def merge(self, ev_key, ev_off, out_n, max_threads: int, events: int) -> tuple[np.ndarray, np.ndarray]:
        """Add the cells' netted pair events (at most ``events`` of them); return the keys of the pairs
        created and deleted. Few events are merged by one serial call when the table has room."""
        if events < parallel.MIN_EVENTS:
            done, created, deleted, count = kmerge.world_merge_small(ev_key, ev_off, out_n, SHARDS, self.slots,
                                                                     self.keys, self.cnt, self.cap, self.n)
            if done:
                self.count = count
                return created, deleted
        if parallel.serial(max_threads, events, parallel.MIN_EVENTS):
            events, boff = kmerge.world_bucket(ev_key, ev_off, out_n, SHARDS)
        else:
            with parallel.region(max_threads, events, parallel.MIN_EVENTS):
                events, boff = kmerge.world_bucket_parts(ev_key, ev_off, out_n, SHARDS, max_threads)
        self.reserve(np.diff(boff))
        created = np.empty(events.shape[0], np.uint64)
        deleted = np.empty(events.shape[0], np.uint64)
        n_cr = np.zeros(SHARDS, np.int64)
        n_de = np.zeros(SHARDS, np.int64)
        with parallel.region(max_threads, events.shape[0], parallel.MIN_EVENTS):
            kmerge.world_merge(events, boff, self.slots, self.keys, self.cnt, self.cap, self.n, created, deleted,
                               n_cr, n_de)
        self.count = int(self.n.sum())
        return kmerge.gather_runs(created, boff, n_cr), kmerge.gather_runs(deleted, boff, n_de)

    def all_keys(self) -> np.ndarray:
        """Every active pair's key (handle space), shard after shard."""
        return kmerge.gather_runs(self.keys, np.arange(SHARDS, dtype=np.int64) * (self.cap // 2), self.n)

    def nbytes(self) -> int:
        return self.slots.nbytes + self.keys.nbytes + self.cnt.nbytes + self.n.nbytes

    def check(self, counts: dict) -> None:
        """The table holds exactly ``counts`` (pair key -> cells holding it), each in its shard and hashed."""
        assert len(counts) == self.count == int(self.n.sum()), "world pair count"
        cap = self.cap
        assert 2 * int(self.n.max()) < cap, "world pair table load factor"
        for s in range(SHARDS):
            pb = s * (cap // 2)
            for p in range(int(self.n[s])):
                key = self.keys[pb + p]
                assert kmerge.world_shard(key, SHARDS) == s, f"shard of pair {int(key):#x}"
                assert counts.get(int(key)) == int(self.cnt[pb + p]), f"world count of pair {int(key):#x}"
                assert pair_set_find(self.slots, self.keys, s * cap, cap, pb, key) == p, "world hash"
