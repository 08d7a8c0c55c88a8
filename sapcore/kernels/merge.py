"""Pair-manager kernels of a frame: net each cell's events in its pair set, then merge the cells.

Per-cell pair sets (001 §6): flags per pair, ``ACTIVE`` (the pair exists) and ``NEW`` (created in this
frame). An event adds or removes a pair; a pair added then removed within the frame disappears without a
trace, a removed pair stays (inactive) until the end of the frame so that a re-add revives it. The keys
touched are kept in a "changed" list, written in place over the cell's events, and the cell's netted
created/deleted pairs are written over it in turn.

World merge: a pair may live in several cells. The world keeps per pair the number of cells holding it
and reports ``created`` when that count goes 0 -> 1 and ``deleted`` when it goes 1 -> 0, netted over the
whole frame. The world's pair table is split in shards by the top bits of the key's hash; the events are
grouped by shard (keeping the touched cells' deterministic order) and the shards merge in parallel.
"""
import numpy as np

from .._numba import NJIT, NJIT_INLINE, NJIT_PARALLEL, NJIT_SERIAL, njit, prange
from .hashing import EVENT_REMOVED, KEY_MASK, hash_u64
from .pair_set import (pair_set_find_slot, pair_set_insert, pair_set_insert_at, pair_set_probe, pair_set_rehash,
                       pair_set_remove_slot)
from .prefetch import prefetch_flat

ACTIVE = np.uint8(1)
NEW = np.uint8(2)
_TOUCH = np.int32(1 << 30)


#: Up to this many events of a cell are compared pairwise (``_distinct_events``) for ``cell_net``'s shortcut
_DISTINCT_MAX = 16


@njit(**NJIT_INLINE)
def _distinct_events(ev_key, eo, cnt):
    """Are the pairs of a cell's ``cnt`` events (at most ``_DISTINCT_MAX``) all different?"""
    for r in range(1, cnt):
        key = ev_key[np.uint64(eo + r)] & KEY_MASK
        for q in range(r):
            if (ev_key[np.uint64(eo + q)] & KEY_MASK) == key:
                return False
    return True


@njit(**NJIT_INLINE)
def cell_net(ev_key, eo, cnt, pm_slots, pm_keys, pm_flag, sb, cap, n):
    """Net one cell's events into its pair set; returns (new pair count, netted event count).

    A cell's first event of a pair follows the set as it was before the frame (a pair "added" was not in
    it, one "removed" was). So when no pair has two events (most cells: ~5 events of different pairs in
    a 100k-object frame), every event is netted as it is: its "added" pairs are inserted, then its
    "removed" ones removed, in the events' order, and the events stay as they are: the set, its pair
    order and the netted events of the general way below, which finds every key twice or three times."""
    pb = sb // 2
    if cnt <= _DISTINCT_MAX and _distinct_events(ev_key, eo, cnt):
        for r in range(cnt):
            ek = ev_key[np.uint64(eo + r)]
            if (ek & EVENT_REMOVED) == 0:
                n = pair_set_insert(pm_slots, pm_keys, pm_flag, sb, cap, pb, n, ek, ACTIVE)
        for r in range(cnt):
            ek = ev_key[np.uint64(eo + r)]
            if (ek & EVENT_REMOVED) != 0:
                i = pair_set_find_slot(pm_slots, pm_keys, sb, cap, pb, ek & KEY_MASK)
                n = pair_set_remove_slot(pm_slots, pm_keys, pm_flag, sb, cap, pb, n, i)
        return n, cnt
    w = 0
    for r in range(cnt):
        ek = ev_key[np.uint64(eo + r)]
        key = ek & KEY_MASK
        if (ek & EVENT_REMOVED) == 0:
            i = pair_set_probe(pm_slots, pm_keys, sb, cap, pb, key)
            p = pm_slots[np.uint64(sb + i)]
            if p >= 0:
                pm_flag[np.uint64(pb + p)] |= ACTIVE          # removed earlier in this frame: revived
            else:
                n = pair_set_insert_at(pm_slots, pm_keys, pm_flag, sb, pb, n, i, key, ACTIVE | NEW)
                ev_key[np.uint64(eo + w)] = key
                w += 1
        else:
            i = pair_set_find_slot(pm_slots, pm_keys, sb, cap, pb, key)
            p = pm_slots[np.uint64(sb + i)]
            if (pm_flag[np.uint64(pb + p)] & NEW) != 0:
                n = pair_set_remove_slot(pm_slots, pm_keys, pm_flag, sb, cap, pb, n, i)
            else:
                pm_flag[np.uint64(pb + p)] = 0
                ev_key[np.uint64(eo + w)] = key
                w += 1
    o = 0
    for r in range(w):
        key = ev_key[np.uint64(eo + r)]
        i = pair_set_find_slot(pm_slots, pm_keys, sb, cap, pb, key)
        if i < 0:
            continue
        p = pm_slots[np.uint64(sb + i)]
        f = pm_flag[np.uint64(pb + p)]
        if (f & ACTIVE) == 0:
            n = pair_set_remove_slot(pm_slots, pm_keys, pm_flag, sb, cap, pb, n, i)
            ev_key[np.uint64(eo + o)] = key | EVENT_REMOVED
            o += 1
        elif (f & NEW) != 0:
            pm_flag[np.uint64(pb + p)] = ACTIVE
            ev_key[np.uint64(eo + o)] = key
            o += 1
    return n, o


@njit(**NJIT_INLINE)
def _net_touched(t, touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys, pm_flag,
                 out_n):
    """Touched cell t of ``cells_net`` (its parallel and serial loops)."""
    c = touched[t]
    if t + 1 < touched.shape[0] and ev_n[t + 1] > 0:
        # the next cell's pair set is requested from memory while this one is netted (each cell's set is
        # a region of its own, its first reads would wait for memory)
        c1 = touched[t + 1]
        sb1 = cell_pm_base[c1]
        cap1 = cell_pm_cap[c1]
        for i in range(sb1, sb1 + cap1, 16):
            prefetch_flat(pm_slots, i)
        for i in range(sb1 // 2, sb1 // 2 + cell_pm_n[c1], 8):
            prefetch_flat(pm_keys, i)
        for i in range(sb1 // 2, sb1 // 2 + cell_pm_n[c1], 64):
            prefetch_flat(pm_flag, i)
    if ev_n[t] == 0:
        out_n[t] = 0
        return
    n, o = cell_net(ev_key, ev_off[t], ev_n[t], pm_slots, pm_keys, pm_flag,
                    cell_pm_base[c], cell_pm_cap[c], cell_pm_n[c])
    cell_pm_n[c] = n
    out_n[t] = o


@njit(**NJIT_INLINE)
def pair_set_short(c, plus, cell_pm_n, cell_pm_cap):
    """Does cell c's pair set lack room for ``plus`` more "pair added" events (load factor <= 1/2)?"""
    return plus > 0 and 2 * (np.int64(cell_pm_n[c]) + plus) > cell_pm_cap[c]


@njit(**NJIT)
def pair_sets_growth(touched, ev_plus, cell_pm_n, cell_pm_cap):
    """The touched cells whose pair set lacks room for its "pair added" events (load factor <= 1/2), and
    the capacity each gets: the power of two (at least 16) >= 2.5 times what it will hold. A quarter of
    the need more than the load factor asks: a set that grew to just over twice its pairs would grow
    again at the next few pairs, and each growth sends a small frame down the general phases. Returns
    ``(cells int32, caps int64)``."""
    nt = touched.shape[0]
    k = 0
    for t in range(nt):
        if pair_set_short(touched[t], ev_plus[t], cell_pm_n, cell_pm_cap):
            k += 1
    cells = np.empty(k, np.int32)
    caps = np.empty(k, np.int64)
    k = 0
    for t in range(nt):
        c = touched[t]
        if pair_set_short(c, ev_plus[t], cell_pm_n, cell_pm_cap):
            g = np.int64(cell_pm_n[c]) + ev_plus[t]
            cap = 16
            while cap < 2 * g + g // 2 + 1:
                cap *= 2
            cells[k] = c
            caps[k] = cap
            k += 1
    return cells, caps


@njit(**NJIT_PARALLEL)
def cells_net(touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n,
              pm_slots, pm_keys, pm_flag, out_n):
    for t in prange(touched.shape[0]):
        _net_touched(t, touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys,
                     pm_flag, out_n)


@njit(**NJIT_SERIAL)
def cells_net_serial(touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n,
                     pm_slots, pm_keys, pm_flag, out_n):
    """``cells_net`` on the calling thread alone (no parallel launch); the same results."""
    for t in range(touched.shape[0]):
        _net_touched(t, touched, ev_key, ev_off, ev_n, cell_pm_base, cell_pm_cap, cell_pm_n, pm_slots, pm_keys,
                     pm_flag, out_n)


@njit(**NJIT_INLINE)
def _log2(x):
    k = 0
    while (1 << k) < x:
        k += 1
    return k


@njit(**NJIT_INLINE)
def world_shard(key, shards):
    """Shard of a pair key in the world's pair table."""
    return np.int64(hash_u64(key) >> np.uint64(64 - _log2(shards)))


@njit(**NJIT)
def world_bucket(ev_key, ev_off, out_n, shards):
    """The cells' netted events (in touched-cell order) grouped by world shard, stably.

    Returns (events uint64 [E], off int64 [shards + 1]): shard s's events are ``events[off[s]:off[s+1]]``
    in their original order. The shard of a key is the top bits of its hash (``world_shard``).
    """
    total = 0
    for t in range(out_n.shape[0]):
        total += out_n[t]
    shard = np.empty(total, np.int32)
    off = np.zeros(shards + 1, np.int64)
    r = 0
    for t in range(out_n.shape[0]):
        eo = ev_off[t]
        for i in range(out_n[t]):
            s = world_shard(ev_key[eo + i] & KEY_MASK, shards)
            shard[r] = s
            off[s + 1] += 1
            r += 1
    for s in range(shards):
        off[s + 1] += off[s]
    fill = off[:shards].copy()
    out = np.empty(total, np.uint64)
    r = 0
    for t in range(out_n.shape[0]):
        eo = ev_off[t]
        for i in range(out_n[t]):
            s = shard[r]
            out[fill[s]] = ev_key[eo + i]
            fill[s] += 1
            r += 1
    return out, off


@njit(**NJIT_PARALLEL)
def world_bucket_parts(ev_key, ev_off, out_n, shards, parts):
    """``world_bucket`` in ``parts`` parts of consecutive touched cells (one a thread): each counts its
    events by shard, then writes them at its place in each shard's run (shard after shard, part after
    part within one), so the result is ``world_bucket``'s, whatever ``parts``."""
    nt = out_n.shape[0]
    cnt = np.zeros((parts, shards), np.int64)
    for p in prange(parts):
        mine = np.zeros(shards, np.int64)          # this part's counts (no line shared with another part)
        for t in range(nt * p // parts, nt * (p + 1) // parts):
            eo = ev_off[t]
            for i in range(out_n[t]):
                mine[world_shard(ev_key[eo + i] & KEY_MASK, shards)] += 1
        cnt[p] = mine
    off = np.zeros(shards + 1, np.int64)
    at = np.empty((parts, shards), np.int64)
    total = 0
    for s in range(shards):
        off[s] = total
        for p in range(parts):
            at[p, s] = total
            total += cnt[p, s]
    off[shards] = total
    out = np.empty(total, np.uint64)
    for p in prange(parts):
        fill = at[p].copy()
        for t in range(nt * p // parts, nt * (p + 1) // parts):
            eo = ev_off[t]
            for i in range(out_n[t]):
                ek = ev_key[eo + i]
                s = world_shard(ek & KEY_MASK, shards)
                out[fill[s]] = ek
                fill[s] += 1
    return out, off


#: events ahead whose slot (``_AHEAD2``) and pair (``_AHEAD1``) in the world table are prefetched
_AHEAD1 = 8
_AHEAD2 = 16


@njit(**NJIT_INLINE)
def merge_events(events, lo, m, g_slots, g_keys, g_cnt, sb, cap, pb, gn, ch_key, ch_orig, ch_p, created, c0,
                 deleted, d0, prefetch):
    """Merge ``events[lo:lo + m]`` (one shard's, in their order) into the shard's pair counts (slots from
    ``sb``, pairs from ``pb``, ``gn`` of them); its created and deleted keys go to ``created`` from ``c0``
    and ``deleted`` from ``d0``. ``ch_key`` / ``ch_orig`` / ``ch_p``: room for ``m`` changed pairs.
    ``prefetch``: request the table's slots and pairs of events ahead (a table far bigger than a cache).
    Returns (created, deleted, the shard's pair count after). Inlined: ``_merge_shard`` and the one-call
    frame (``kernels.frame``, with its workspace's rows) share it."""
    nc = 0
    mask = np.uint64(cap - 1)
    for r in range(m):
        # the slot of the event _AHEAD2 ahead is requested from memory, and the pair (key, count) of
        # the event _AHEAD1 ahead, whose slot is at hand by then
        if prefetch and r + _AHEAD2 < m:
            ka = events[np.uint64(lo + r + _AHEAD2)] & KEY_MASK
            prefetch_flat(g_slots, sb + np.int64(hash_u64(ka) & mask))
        if prefetch and r + _AHEAD1 < m:
            q = g_slots[sb + np.int64(hash_u64(events[np.uint64(lo + r + _AHEAD1)] & KEY_MASK) & mask)]
            if q >= 0:
                prefetch_flat(g_keys, pb + q)
                prefetch_flat(g_cnt, pb + q)
        ek = events[np.uint64(lo + r)]
        key = ek & KEY_MASK
        i = pair_set_probe(g_slots, g_keys, sb, cap, pb, key)
        p = g_slots[np.uint64(sb + i)]
        if p < 0:
            gn = pair_set_insert_at(g_slots, g_keys, g_cnt, sb, pb, gn, i, key, _TOUCH)
            p = gn - 1
            ch_key[nc] = key
            ch_orig[nc] = 0
            ch_p[nc] = p
            nc += 1
        elif (g_cnt[np.uint64(pb + p)] & _TOUCH) == 0:
            ch_key[nc] = key
            ch_orig[nc] = g_cnt[np.uint64(pb + p)]
            ch_p[nc] = p
            nc += 1
            g_cnt[np.uint64(pb + p)] |= _TOUCH
        if (ek & EVENT_REMOVED) != 0:
            g_cnt[np.uint64(pb + p)] -= 1
        else:
            g_cnt[np.uint64(pb + p)] += 1
    # the pairs' indices are still valid here: nothing has been removed yet
    ncr = 0
    nde = 0
    nz = 0
    for r in range(nc):
        p = ch_p[r]
        now = g_cnt[np.uint64(pb + p)] & ~_TOUCH
        g_cnt[np.uint64(pb + p)] = now
        if now == 0:
            ch_key[nz] = ch_key[r]          # removed below (r >= nz: in place is safe)
            nz += 1
            if ch_orig[r] > 0:
                deleted[np.uint64(d0 + nde)] = ch_key[r]
                nde += 1
        elif ch_orig[r] == 0:
            created[np.uint64(c0 + ncr)] = ch_key[r]
            ncr += 1
    for r in range(nz):
        i = pair_set_find_slot(g_slots, g_keys, sb, cap, pb, ch_key[r])
        gn = pair_set_remove_slot(g_slots, g_keys, g_cnt, sb, cap, pb, gn, i)
    return ncr, nde, gn


@njit(**NJIT_INLINE)
def _merge_shard(s, events, off, g_slots, g_keys, g_cnt, cap, g_n, created, deleted):
    """Merge shard s's events (``world_merge``); returns (created, deleted) counts, written from
    ``off[s]`` on. Inlined: called once per shard by both merges."""
    lo = off[s]
    m = off[s + 1] - lo
    ncr, nde, g_n[s] = merge_events(events, lo, m, g_slots, g_keys, g_cnt, s * cap, cap, s * (cap // 2), g_n[s],
                                    np.empty(m, np.uint64), np.empty(m, np.int32), np.empty(m, np.int64),
                                    created, lo, deleted, lo, True)
    return ncr, nde


@njit(**NJIT_PARALLEL)
def world_merge(events, off, g_slots, g_keys, g_cnt, cap, g_n, created, deleted, n_created, n_deleted):
    """Merge the cells' netted events into the world's pair counts, one shard per task, in parallel.

    Shard s owns slots ``[s * cap, (s + 1) * cap)`` and pairs ``[s * cap // 2, ...)`` of the world table
    (``g_n[s]`` of them) and the events ``events[off[s]:off[s + 1]]`` (``world_bucket``). Its created
    and deleted keys (handle space, unsorted) go to ``created`` / ``deleted`` from ``off[s]`` on,
    ``n_created[s]`` / ``n_deleted[s]`` of them. Each shard processes its events in their given order,
    so the result does not depend on the number of threads.
    """
    for s in prange(off.shape[0] - 1):
        n_created[s], n_deleted[s] = _merge_shard(s, events, off, g_slots, g_keys, g_cnt, cap, g_n, created,
                                                  deleted)


@njit(**NJIT_INLINE)
def table_short(g_n, off, cap, shards):
    """Does some shard of the world's pair table lack room for its bucketed events ``off[s]:off[s + 1]``
    (load factor < 1/2; ``WorldPairs.reserve`` grows it)?"""
    for s in range(shards):
        if 2 * (g_n[s] + off[s + 1] - off[s]) >= cap:
            return True
    return False


@njit(**NJIT)
def world_merge_small(ev_key, ev_off, out_n, shards, g_slots, g_keys, g_cnt, cap, g_n):
    """``world_bucket``, ``world_merge`` and the gathering of their results in one serial call, for a
    frame with few pair events (one call instead of five: their fixed cost is most of a small frame's
    merge). Returns (done, created, deleted, pairs): pairs the table's pair count after; done False (nothing changed) when some shard lacks room
    for its events at load factor < 1/2; the caller then grows the table and merges the general way.
    The result is the same as the general merge's: shards are merged in their order, each alone."""
    events, off = world_bucket(ev_key, ev_off, out_n, shards)
    if table_short(g_n, off, cap, shards):
        return False, events[:0], events[:0], 0
    created = np.empty(events.shape[0], np.uint64)
    deleted = np.empty(events.shape[0], np.uint64)
    n_cr = np.empty(shards, np.int64)
    n_de = np.empty(shards, np.int64)
    pairs = 0
    for s in range(shards):
        n_cr[s], n_de[s] = _merge_shard(s, events, off, g_slots, g_keys, g_cnt, cap, g_n, created, deleted)
        pairs += g_n[s]
    return True, gather_runs(created, off, n_cr), gather_runs(deleted, off, n_de), pairs


#: keys ``keys_to_ids`` looks ahead of the one it converts, to request their two ids from memory
_IDS_AHEAD = 16


@njit(**NJIT_INLINE)
def keys_to_ids(keys, obj_id, lo, hi, ahead):
    """Handle-pair keys -> id pairs (lo <= hi) in ``lo``/``hi``; returns whether every id fits in 32
    bits (then ``lo << 32 | hi``, or ``id_pairs_sorted``, sorts the pairs). With ``ahead`` (a large
    delta's keys), the ids of the key ``_IDS_AHEAD`` on are requested from memory (a key's handles are
    anywhere in the object arrays: 6,600 keys of a 100k-object frame 237 -> 174 us, caches cold). Inlined
    where a kernel calls it (the one-call frame's ``_ids_sorted``, with the columns of its rows, without
    ``ahead``); ``World`` calls it from Python."""
    small = True
    n = keys.shape[0]
    for i in range(n):
        if ahead and i + _IDS_AHEAD < n:
            ka = keys[i + _IDS_AHEAD]
            prefetch_flat(obj_id, np.int64(ka >> np.uint64(32)))
            prefetch_flat(obj_id, np.int64(ka & np.uint64(0xFFFFFFFF)))
        a = obj_id[np.int64(keys[i] >> np.uint64(32))]
        b = obj_id[np.int64(keys[i] & np.uint64(0xFFFFFFFF))]
        if a > b:
            a, b = b, a
        lo[i] = a
        hi[i] = b
        small = small and b <= np.uint64(0xFFFFFFFF)
    return small


#: widest digit of the radix sort: 2,048 counters (16 KiB) a pass stay in the L1 cache
RADIX_BITS = 11


@njit(**NJIT_INLINE)
def _radix_sort(src, dst, bits):
    """Least-significant-digit radix sort of ``src`` (uint64 keys below ``2**bits``), ``dst`` the same size
    as its workspace; returns the one of the two that holds the sorted keys. As few passes as ``bits``
    needs at ``RADIX_BITS`` a digit, the digits of equal width; every pass's counts from one read of the
    keys; a pass whose digit is the same in every key is skipped (it would keep the order)."""
    n = src.shape[0]
    passes = (bits + RADIX_BITS - 1) // RADIX_BITS
    if n < 2 or passes == 0:
        return src
    width = (bits + passes - 1) // passes
    digits = 1 << width
    mask = np.uint64(digits - 1)
    count = np.zeros((passes, digits), np.int64)
    for i in range(n):
        x = src[i]
        for p in range(passes):
            count[p, np.int64((x >> np.uint64(p * width)) & mask)] += 1
    for p in range(passes):
        s = np.uint64(p * width)
        if count[p, np.int64((src[0] >> s) & mask)] == n:
            continue
        total = 0
        for d in range(digits):
            c = count[p, d]
            count[p, d] = total
            total += c
        for i in range(n):
            x = src[i]
            d = np.int64((x >> s) & mask)
            dst[count[p, d]] = x
            count[p, d] += 1
        src, dst = dst, src
    return src


@njit(**NJIT_INLINE)
def _bit_length(x):
    """Bits of the uint64 ``x`` up to its highest set bit (0 for 0)."""
    bits = 0
    while bits < 64 and (x >> np.uint64(bits)) != np.uint64(0):
        bits += 1
    return bits


@njit(**NJIT)
def sort_u64(a):
    """``a`` (uint64) sorted ascending, as a new array: ``_radix_sort``, as many digits as the largest key
    has bits."""
    src = a.copy()
    if src.shape[0] < 2:
        return src
    return _radix_sort(src, np.empty_like(src), _bit_length(src.max()))


@njit(**NJIT)
def id_pairs_sorted(lo, hi, out):
    """The id pairs of ``keys_to_ids`` (every id within 32 bits) as sorted rows (low id, high id) in ``out``
    (uint64 [K, 2]), in one kernel (for a large delta): packed ``lo << b | hi`` with b the bits of the
    largest id (``hi`` holds it), radix-sorted (``_radix_sort``: 2b bits, four passes for ids below
    ~260,000 where ``lo << 32`` took five), unpacked. A delta side of 6,600 pairs: ~55 us against ~185 us
    for the fixed ``lo << 32`` packing in five passes (``np.sort`` of the packed pairs: 60-120 us)."""
    k = lo.shape[0]
    top = np.uint64(0)
    for i in range(k):
        top = max(top, hi[i])
    b = np.uint64(_bit_length(top))
    packed = np.empty(k, np.uint64)
    for i in range(k):
        packed[i] = (lo[i] << b) | hi[i]
    packed = _radix_sort(packed, np.empty(k, np.uint64), 2 * np.int64(b))
    low = (np.uint64(1) << b) - np.uint64(1)
    for i in range(k):
        out[i, 0] = packed[i] >> b
        out[i, 1] = packed[i] & low


@njit(**NJIT_PARALLEL)
def id_pairs_both(created, deleted, obj_id, out_cr, out_de):
    """A large delta's created and deleted keys as sorted id rows (``keys_to_ids``, then ``id_pairs_sorted``)
    in ``out_cr`` / ``out_de`` (uint64 [K, 2], K their lengths), the two side by side. Returns whether
    every id fits in 32 bits; if not, nothing is sorted (the caller sorts the long way)."""
    ok = np.ones(2, np.bool_)
    for w in prange(2):
        keys = created if w == 0 else deleted
        out = out_cr if w == 0 else out_de
        lo = np.empty(keys.shape[0], np.uint64)
        hi = np.empty(keys.shape[0], np.uint64)
        ok[w] = keys_to_ids(keys, obj_id, lo, hi, True)
        if ok[w]:
            id_pairs_sorted(lo, hi, out)
    return ok[0] and ok[1]


@njit(**NJIT)
def gather_runs(src, off, counts):
    """Concatenate the runs ``src[off[s]:off[s] + counts[s]]``."""
    total = 0
    for s in range(counts.shape[0]):
        total += counts[s]
    out = np.empty(total, src.dtype)
    w = 0
    for s in range(counts.shape[0]):
        for r in range(counts[s]):
            out[w] = src[off[s] + r]
            w += 1
    return out


@njit(**NJIT)
def pair_sets_move(cells, new_base, new_cap, cell_pm_base, cell_pm_cap, cell_pm_n,
                   old_slots, old_keys, old_flag, pm_slots, pm_keys, pm_flag):
    """Move the pair sets of ``cells`` to new regions (bigger tables) and rehash them."""
    for i in range(cells.shape[0]):
        c = cells[i]
        n = cell_pm_n[c]
        ob = cell_pm_base[c] // 2
        nb = new_base[i] // 2
        for p in range(n):
            pm_keys[nb + p] = old_keys[ob + p]
            pm_flag[nb + p] = old_flag[ob + p]
        pair_set_rehash(pm_slots, pm_keys, new_base[i], new_cap[i], nb, n)
        cell_pm_base[c] = new_base[i]
        cell_pm_cap[c] = new_cap[i]
