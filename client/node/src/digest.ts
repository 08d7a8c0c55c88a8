/**
 * The pair-set digest of the contract (frame.proto, Delta.pairs_digest):
 *   digest = sum over the pairs (lo, hi) of splitmix64(lo ^ splitmix64(hi)), mod 2^64,
 * order-independent, so a mirror of a world's pairs is checked in O(delta):
 * `digestStep(digest, delta.created, delta.deleted) === delta.pairsDigest`.
 *
 * 64-bit arithmetic on two uint32 halves (Math.imul and 16-bit partial products for the high word)
 * rather than BigInt, which allocates per operation: 4x faster (100,000 pairs in ~10 ms on the development VM).
 */
import { status } from "@grpc/grpc-js";
import { makeError } from "./errors";

const MASK64 = (1n << 64n) - 1n;

// The three constants of splitmix64 as (high, low) uint32 halves.
const GOLDEN_HI = 0x9e3779b9, GOLDEN_LO = 0x7f4a7c15;
const MIX1_HI = 0xbf58476d, MIX1_LO = 0x1ce4e5b9;
const MIX2_HI = 0x94d049bb, MIX2_LO = 0x133111eb;

// Result registers of the 64-bit helpers (no allocation per call).
let rHi = 0;
let rLo = 0;

/** (aHi, aLo) * (bHi, bLo) mod 2^64 into rHi, rLo. */
function mul64(aHi: number, aLo: number, bHi: number, bLo: number): void {
  const a0 = aLo & 0xffff, a1 = aLo >>> 16, b0 = bLo & 0xffff, b1 = bLo >>> 16;
  const p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff);
  rLo = (((mid & 0xffff) << 16) | (p00 & 0xffff)) >>> 0;
  const hi = p11 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16);
  rHi = (hi + Math.imul(aHi, bLo) + Math.imul(aLo, bHi)) >>> 0;
}

/** splitmix64 of (hi, lo) into rHi, rLo. */
function mix(hi: number, lo: number): void {
  // x += golden
  let l = (lo + GOLDEN_LO) >>> 0;
  let h = (hi + GOLDEN_HI + (l < lo ? 1 : 0)) >>> 0;
  // x = (x ^ (x >> 30)) * MIX1
  l = (l ^ ((l >>> 30) | (h << 2))) >>> 0;
  h = (h ^ (h >>> 30)) >>> 0;
  mul64(h, l, MIX1_HI, MIX1_LO);
  // x = (x ^ (x >> 27)) * MIX2
  l = (rLo ^ ((rLo >>> 27) | (rHi << 5))) >>> 0;
  h = (rHi ^ (rHi >>> 27)) >>> 0;
  mul64(h, l, MIX2_HI, MIX2_LO);
  // x ^= x >> 31
  l = (rLo ^ ((rLo >>> 31) | (rHi << 1))) >>> 0;
  h = (rHi ^ (rHi >>> 31)) >>> 0;
  rHi = h;
  rLo = l;
}

/** splitmix64 of one uint64 (the standard finalizer, as in the contract). */
export function splitmix64(x: bigint): bigint {
  const v = BigInt.asUintN(64, x);
  mix(Number(v >> 32n), Number(v & 0xffffffffn));
  return (BigInt(rHi) << 32n) | BigInt(rLo);
}

/**
 * The digest of a set of pairs: a BigUint64Array of (lo, hi) rows as returned in deltas and by
 * `pairs()`. The empty set has digest 0n.
 */
export function pairsDigest(pairs: BigUint64Array): bigint {
  if (!(pairs instanceof BigUint64Array)) {
    throw makeError(status.INVALID_ARGUMENT, "pairs: expected a BigUint64Array of (low, high) rows");
  }
  if (pairs.length % 2 !== 0) {
    throw makeError(status.INVALID_ARGUMENT, `pairs: ${pairs.length} values is not a whole number of (low, high) rows`);
  }
  const w = new Uint32Array(pairs.buffer, pairs.byteOffset, pairs.length * 2);
  // The sum is kept as a low word and a high word; the carry of the low words is folded every row.
  let sumHi = 0;
  let sumLo = 0;
  for (let i = 0; i < w.length; i += 4) {
    mix(w[i + 3], w[i + 2]); // splitmix64(hi)
    mix((w[i + 1] ^ rHi) >>> 0, (w[i] ^ rLo) >>> 0); // splitmix64(lo ^ splitmix64(hi))
    const lo = sumLo + rLo;
    sumLo = lo >>> 0;
    sumHi = (sumHi + rHi + (lo > 0xffffffff ? 1 : 0)) >>> 0;
  }
  return (BigInt(sumHi) << 32n) | BigInt(sumLo);
}

/** A digest after a delta: `digest` plus the created pairs' terms minus the deleted pairs'. */
export function digestStep(digest: bigint, created: BigUint64Array, deleted: BigUint64Array): bigint {
  return (digest + pairsDigest(created) - pairsDigest(deleted)) & MASK64;
}
