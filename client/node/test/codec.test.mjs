// The client's codec and digest on their own (no server): typed arrays in and out, bad input refused
// with a clear typed error, the pair digest against the contract's formula and Python's values.
import { test } from "node:test";
import assert from "node:assert/strict";

import { InvalidArgument, digestStep, idsArray, pairsArray, pairsDigest, splitmix64 } from "../dist/index.js";
import { encodeFrame } from "../dist/codec.js";
import { unaligned } from "./helpers.mjs";

const M = (1n << 64n) - 1n;

// The contract's formula, written directly with BigInt (the reference the fast version is checked against).
function refMix(x) {
  x = (x + 0x9e3779b97f4a7c15n) & M;
  x = ((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
  x = ((x ^ (x >> 27n)) * 0x94d049bb133111ebn) & M;
  return x ^ (x >> 31n);
}

function refDigest(pairs) {
  let d = 0n;
  for (let i = 0; i < pairs.length; i += 2) d = (d + refMix(pairs[i] ^ refMix(pairs[i + 1]))) & M;
  return d;
}

function randomU64(rnd) {
  return (BigInt(Math.floor(rnd() * 2 ** 32)) << 32n) | BigInt(Math.floor(rnd() * 2 ** 32));
}

function lcg(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

test("splitmix64 and pairsDigest follow the contract's formula", () => {
  const rnd = lcg(7);
  for (const x of [0n, 1n, M, 0x9e3779b97f4a7c15n, 1n << 63n]) assert.equal(splitmix64(x), refMix(x));
  const pairs = new BigUint64Array(2000);
  for (let i = 0; i < pairs.length; i++) pairs[i] = i % 7 === 0 ? M - BigInt(i) : randomU64(rnd);
  for (let i = 0; i < 200; i++) assert.equal(splitmix64(pairs[i]), refMix(pairs[i]));
  assert.equal(pairsDigest(pairs), refDigest(pairs));
  assert.equal(pairsDigest(new BigUint64Array(0)), 0n);
  // Known values from sapgrid.layout.pairs_digest (Python).
  assert.equal(pairsDigest(new BigUint64Array([1n, 2n])), 16171810823986729605n);
  assert.equal(pairsDigest(new BigUint64Array([1n, 2n, 3n, 1n << 60n, 5n, M])), 3402558058819664592n);
});

test("digestStep adds created terms and subtracts deleted ones (order-independent)", () => {
  const a = new BigUint64Array([1n, 2n, 3n, 4n, 5n, 6n]);
  const created = new BigUint64Array([7n, 8n]);
  const deleted = new BigUint64Array([3n, 4n]);
  const after = new BigUint64Array([1n, 2n, 5n, 6n, 7n, 8n]);
  assert.equal(digestStep(pairsDigest(a), created, deleted), pairsDigest(after));
  assert.equal(digestStep(0n, new BigUint64Array(0), a), (M + 1n - pairsDigest(a)) & M);
  assert.throws(() => pairsDigest(new BigUint64Array(3)), InvalidArgument);
  assert.throws(() => pairsDigest([1n, 2n]), InvalidArgument);
});

test("received bytes at any offset are read as aligned typed arrays", () => {
  const ids = new BigUint64Array([1n, 2n ** 63n + 5n, 42n]);
  const raw = Buffer.from(ids.buffer);
  const odd = unaligned(raw);
  assert.notEqual(odd.byteOffset % 8, 0);
  assert.deepEqual(idsArray(odd), ids);
  assert.deepEqual(pairsArray(unaligned(Buffer.from(new BigUint64Array([3n, 9n]).buffer))), new BigUint64Array([3n, 9n]));
  // An aligned Buffer is viewed, not copied.
  const view = idsArray(raw);
  assert.equal(view.buffer, raw.buffer);
  assert.throws(() => pairsArray(Buffer.alloc(24)), /not a whole number of 16-byte rows/);
});

test("frames: typed arrays are sent as views, plain arrays converted, bad input refused clearly", () => {
  const ids = new BigUint64Array([5n, 6n]);
  const boxes = new Float32Array([0, 0, 1, 1, 2, 2, 3, 3]);
  const f = encodeFrame("w", 3n, { addIds: ids, addBoxes: boxes, addStatic: [true, false], addMask: [1, 0xffffffff] });
  assert.equal(f.add_ids.buffer, ids.buffer);
  assert.equal(f.add_boxes.buffer, boxes.buffer);
  assert.deepEqual([...f.add_static], [1, 0]);
  assert.equal(f.add_mask.toString("hex"), "01000000ffffffff");
  assert.equal(f.seq, "3");
  const same = encodeFrame("w", 3n, { addIds: [5, 6n], addBoxes: [0, 0, 1, 1, 2, 2, 3, 3] });
  assert.deepEqual(same.add_ids, f.add_ids);
  assert.deepEqual(same.add_boxes, f.add_boxes);
  const cases = [
    [{ addIds: new Float64Array(2) }, /addIds: expected a BigUint64Array/],
    [{ addIds: [1.5] }, /addIds\[0\]: 1.5 is not an integer id/],
    [{ removeIds: [-1] }, /removeIds\[0\]: -1 is outside/],
    [{ addIds: [2n ** 64n] }, /outside 0..2\^64-1/],
    [{ addBoxes: ["1"] }, /addBoxes\[0\]: 1 is not a number/],
    [{ addBoxes: new Uint8Array(4) }, /addBoxes: expected a Float32Array/],
    [{ addMask: [2 ** 32] }, /addMask\[0\]: .* is not a uint32/],
    [{ addStatic: [2] }, /addStatic\[0\]: 2 is not a boolean/],
    [{ add_ids: [1] }, /unknown key 'add_ids'/],
  ];
  for (const [frame, re] of cases) {
    assert.throws(() => encodeFrame("w", 1n, frame), (e) => e instanceof InvalidArgument && re.test(e.message), re.source);
  }
});
