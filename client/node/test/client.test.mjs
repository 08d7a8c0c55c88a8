// Every call of the client against a real sapgrid server (SAPGRID_ADDRESS): worlds, unary and
// pipelined frames checked against a brute-force oracle, typed errors with field and index, queries,
// pairs (paged and streamed), subscriptions, and what the client refuses before sending.
import { test, after } from "node:test";
import assert from "node:assert/strict";

import {
  AlreadyExists, Client, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, SapgridError,
  digestStep, pairsDigest,
} from "../dist/index.js";
import { address, worldName } from "./helpers.mjs";

const client = new Client(address());
after(() => client.close());

function lcg(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

function randomBoxes(rnd, n, size = 6, extent = 100) {
  const b = new Float32Array(4 * n);
  for (let i = 0; i < n; i++) {
    const x = rnd() * extent, y = rnd() * extent;
    b.set([x, y, x + 0.5 + rnd() * size, y + 0.5 + rnd() * size], 4 * i);
  }
  return b;
}

/** All overlapping pairs of a map id -> [xmin, ymin, xmax, ymax] (touching counts), sorted. */
function brutePairs(boxes) {
  const ids = [...boxes.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const out = [];
  for (let i = 0; i < ids.length; i++) {
    const a = boxes.get(ids[i]);
    for (let j = i + 1; j < ids.length; j++) {
      const b = boxes.get(ids[j]);
      if (a[0] <= b[2] && b[0] <= a[2] && a[1] <= b[3] && b[1] <= a[3]) out.push(ids[i], ids[j]);
    }
  }
  return BigUint64Array.from(out);
}

function pairKeys(pairs) {
  const keys = [];
  for (let i = 0; i < pairs.length; i += 2) keys.push(`${pairs[i]}-${pairs[i + 1]}`);
  return keys;
}

async function rejection(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail("expected the call to be refused");
}

test("health, version and readiness", { timeout: 120_000 }, async () => {
  await client.waitReady(10_000);
  assert.equal(await client.health(), "SERVING");
  assert.match(await client.serverVersion(), /^\d+\.\d+\.\d+/);
});

test("no server: waitReady and calls are refused Unavailable", { timeout: 60_000 }, async () => {
  const net = await import("node:net");
  const port = await new Promise((resolve) => {
    const srv = net.createServer().listen(0, "127.0.0.1", () => {
      const p = srv.address().port;
      srv.close(() => resolve(p));
    });
  });
  const nobody = new Client(`127.0.0.1:${port}`, { timeoutMs: 5000 });
  try {
    await assert.rejects(nobody.waitReady(300), (e) => e instanceof SapgridError && e.codeName === "UNAVAILABLE");
    await assert.rejects(nobody.listWorlds(), (e) => e instanceof SapgridError && e.codeName === "UNAVAILABLE");
    const s = nobody.openStream("w");
    await assert.rejects(s.step({ removeIds: [1n] }), (e) => e instanceof SapgridError && e.codeName === "UNAVAILABLE");
  } finally {
    nobody.close();
  }
});

test("worlds: create with snake_case config fields on the wire, get, list, refuse, delete", { timeout: 120_000 }, async () => {
  const name = worldName("worlds");
  const info = await client.createWorld(name, { dims: 3, bounds: [0, 0, 0, 50, 50, 50], expectedObjects: 200_000, maxObjects: 3 });
  assert.equal(info.name, name);
  assert.equal(info.config.dims, 3);
  assert.deepEqual(info.config.bounds, [0, 0, 0, 50, 50, 50]);
  // The grid was sized for 200,000 objects (the server picks more cells than for its default 10,000),
  // and the object limit is the one asked for: both fields reached the server.
  const small = worldName("worlds-small");
  const dflt = await client.createWorld(small, { dims: 3, bounds: [0, 0, 0, 50, 50, 50] });
  const cells = (w) => w.config.cells.reduce((a, b) => a * b, 1);
  assert.ok(cells(info) > cells(dflt), `${info.config.cells} vs ${dflt.config.cells}`);
  assert.equal(info.config.maxObjects, 3n);
  const over = await rejection(client.step(name, { addIds: [1, 2, 3, 4], addBoxes: new Float32Array(24) }));
  assert.ok(over instanceof ResourceExhausted, String(over));
  assert.equal(typeof info.generation, "bigint");

  const got = await client.getWorld(name);
  assert.equal(got.generation, info.generation);
  assert.equal(got.objects, 0);
  assert.equal(got.framesRejected, 1);
  const names = (await client.listWorlds()).map((w) => w.name);
  assert.ok(names.includes(name) && names.includes(small));

  const dup = await rejection(client.createWorld(name, { dims: 3, bounds: [0, 0, 0, 50, 50, 50] }));
  assert.ok(dup instanceof AlreadyExists && dup.code === 6, String(dup));
  const same = await client.createWorld(name, { dims: 3, bounds: [0, 0, 0, 50, 50, 50], ifNotExists: true });
  assert.equal(same.generation, info.generation);
  const badName = await rejection(client.createWorld("no spaces allowed", {}));
  assert.ok(badName instanceof InvalidArgument, String(badName));
  assert.match(badName.message, /name/);
  const badLimit = await rejection(client.createWorld(worldName("bad"), { maxObjects: -1 }));
  assert.ok(badLimit instanceof InvalidArgument && /maxObjects/.test(badLimit.message), String(badLimit));
  const badBounds = await rejection(client.createWorld(worldName("bad"), { dims: 2, bounds: [0, 0, -1, 10] }));
  assert.ok(badBounds instanceof InvalidArgument, String(badBounds));

  await client.deleteWorld(name);
  await client.deleteWorld(small);
  const gone = await rejection(client.getWorld(name));
  assert.ok(gone instanceof NotFound && gone.codeName === "NOT_FOUND", String(gone));
  assert.ok(!(await client.listWorlds()).some((w) => w.name === name));
});

test("a pipelined stream: 40 frames sent ahead, answered in order, pairs equal a brute-force oracle", { timeout: 120_000 }, async () => {
  const name = worldName("stream");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
  const rnd = lcg(11);
  const n = 150;
  const base = (1n << 62n) + 7n; // ids past 2^53 travel exactly
  const ids = BigUint64Array.from({ length: n }, (_, i) => base + BigInt(i));
  const boxes = new Map();
  const first = randomBoxes(rnd, n);
  ids.forEach((id, i) => boxes.set(id, [...first.subarray(4 * i, 4 * i + 4)]));
  const s = await client.stream(name);
  const sent = [s.send({ addIds: ids, addBoxes: first })];
  for (let k = 0; k < 39; k++) {
    const moved = ids.filter(() => rnd() < 0.3);
    const nb = randomBoxes(rnd, moved.length);
    moved.forEach((id, i) => boxes.set(id, [...nb.subarray(4 * i, 4 * i + 4)]));
    sent.push(s.send({ updateIds: moved, updateBoxes: nb }));
  }
  assert.equal(s.inFlight, 40);
  assert.deepEqual(sent, Array.from({ length: 40 }, (_, i) => BigInt(i + 1)));
  const mirror = new Set();
  let digest = 0n;
  for (let k = 0; k < 40; k++) {
    const d = await s.recv();
    assert.equal(d.seq, BigInt(k + 1));
    assert.equal(d.frame, BigInt(k + 1));
    assert.equal(d.world, name);
    assert.ok(d.created instanceof BigUint64Array && d.deleted instanceof BigUint64Array);
    for (const key of pairKeys(d.deleted)) assert.ok(mirror.delete(key), `deleted ${key} was not active`);
    for (const key of pairKeys(d.created)) mirror.add(key);
    digest = digestStep(digest, d.created, d.deleted);
    assert.equal(d.stats.pairs, mirror.size);
    assert.equal(d.stats.objects, n);
  }
  assert.equal(s.inFlight, 0);
  s.close();
  const expected = brutePairs(boxes);
  const pairs = await client.pairs(name);
  assert.deepEqual(pairs, expected);
  assert.deepEqual([...mirror].sort(), pairKeys(expected).sort());
  assert.equal(digest, pairsDigest(pairs));
  const info = await client.getWorld(name);
  if (info.pairsDigest !== 0n || pairs.length === 0) assert.equal(info.pairsDigest, digest);
  await client.deleteWorld(name);
});

test("a frame is encoded when sent: its arrays may be reused at once (one buffer for every tick)", { timeout: 120_000 }, async () => {
  const name = worldName("reuse");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 10, 10], cells: [1, 1] });
  const s = await client.stream(name);
  const ids = new BigUint64Array([1n, 2n]);
  const boxes = new Float32Array([0, 0, 1, 1, 0.5, 0.5, 2, 2]);
  s.send({ addIds: ids, addBoxes: boxes });
  ids.set([3n, 4n]); // the caller's next tick, written into the same arrays before any answer came
  boxes.set([5, 5, 6, 6, 7, 7, 8, 8]);
  s.send({ addIds: ids, addBoxes: boxes });
  assert.deepEqual((await s.recv()).created, new BigUint64Array([1n, 2n]));
  assert.deepEqual((await s.recv()).created, new BigUint64Array(0));
  await assert.rejects(s.recv(), (e) => e.codeName === "FAILED_PRECONDITION" && /no frame in flight/.test(e.message));
  s.close();
  const q = await client.query(name, [5, 5, 8, 8], { includeBoxes: true });
  assert.deepEqual(q.ids, new BigUint64Array([3n, 4n]));
  assert.deepEqual(q.boxes, new Float32Array([5, 5, 6, 6, 7, 7, 8, 8]));
  await client.deleteWorld(name);
});

test("refused frames: typed errors with field and index, the world unchanged, the stream goes on", { timeout: 120_000 }, async () => {
  const name = worldName("errors");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 10, 10], cells: [2, 2] });
  const s = await client.stream(name);
  const d1 = await s.step({ addIds: [1, 2], addBoxes: [0, 0, 2, 2, 1, 1, 3, 3] });
  assert.deepEqual(d1.created, new BigUint64Array([1n, 2n]));
  // Sent back to back: a bad box, a dims mismatch, an unknown world, then a good frame.
  s.send({ addIds: [3, 4], addBoxes: [0, 0, 1, 1, 5, 5, 4, 6] });
  s.send({ updateIds: [1], updateBoxes: [0, 0, 0, 1, 1, 1] });
  s.send({ world: worldName("nowhere"), addIds: [9], addBoxes: [0, 0, 1, 1] });
  s.send({ updateIds: [2], updateBoxes: [5, 5, 6, 6] });
  const e1 = await rejection(s.recv());
  assert.ok(e1 instanceof InvalidArgument, String(e1));
  assert.deepEqual([e1.code, e1.field, e1.index], [3, "add_boxes", 1]);
  assert.match(e1.message, /add_boxes\[1\]/);
  const e2 = await rejection(s.recv());
  assert.ok(e2 instanceof FailedPrecondition || e2 instanceof InvalidArgument, String(e2));
  assert.equal(e2.field, "update_boxes");
  const e3 = await rejection(s.recv());
  assert.ok(e3 instanceof FailedPrecondition, String(e3)); // the stream is bound to its world (x-sapgrid-world)
  const d2 = await s.recv();
  assert.deepEqual(d2.deleted, new BigUint64Array([1n, 2n]));
  assert.equal(d2.frame, 2n); // the refused frames changed nothing
  assert.equal(d2.stats.objects, 2);
  s.close();
  await assert.rejects(s.recv(), (e) => e instanceof SapgridError && e.codeName === "CANCELLED");
  // A frame naming another world that exists: refused in its slot, nothing written there.
  const other = worldName("other");
  await client.createWorld(other, { dims: 2, bounds: [0, 0, 10, 10], cells: [1, 1] });
  const bound = await client.stream(name);
  await assert.rejects(bound.step({ world: other, addIds: [1n], addBoxes: [0, 0, 1, 1] }),
    (e) => e instanceof FailedPrecondition && e.message.includes(other));
  bound.close();
  assert.equal((await client.getWorld(other)).objects, 0);
  await client.deleteWorld(other);

  // Unary: the BadRequest detail of the status names the field and row.
  const e4 = await rejection(client.step(name, { addIds: [5, 6, 7], addBoxes: [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, NaN, 1] }));
  assert.ok(e4 instanceof InvalidArgument, String(e4));
  assert.deepEqual([e4.field, e4.index], ["add_boxes", 2]);
  const e5 = await rejection(client.step(name, { removeIds: [1, 77] }));
  assert.deepEqual([e5.code, e5.field, e5.index], [3, "remove_ids", 1]);
  const e6 = await rejection(client.step(worldName("nowhere"), { removeIds: [1] }));
  assert.ok(e6 instanceof NotFound, String(e6));
  // Refused before sending: nothing reaches the server.
  const e7 = await rejection(client.step(name, { addIds: [1.5] }));
  assert.ok(e7 instanceof InvalidArgument && /addIds\[0\]/.test(e7.message), String(e7));
  const info = await client.getWorld(name);
  assert.equal(info.objects, 2);
  assert.equal(info.frames, 2n);
  await client.deleteWorld(name);
});

test("unary step, query with and without boxes, pairs paged and streamed", { timeout: 120_000 }, async () => {
  const name = worldName("query");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [8, 8] });
  const rnd = lcg(5);
  const n = 300;
  const ids = BigUint64Array.from({ length: n }, (_, i) => BigInt(i + 1));
  const boxes = randomBoxes(rnd, n, 10);
  const d = await client.step(name, { seq: 77, addIds: ids, addBoxes: boxes });
  assert.equal(d.seq, 77n);
  const region = [20, 20, 45, 50];
  const want = [];
  for (let i = 0; i < n; i++) {
    const b = boxes.subarray(4 * i, 4 * i + 4);
    if (b[0] <= region[2] && region[0] <= b[2] && b[1] <= region[3] && region[1] <= b[3]) want.push(ids[i]);
  }
  const q = await client.query(name, region);
  assert.deepEqual(q.ids, BigUint64Array.from(want));
  assert.equal(q.boxes.length, 0);
  assert.equal(q.frame, 1n);
  const qb = await client.query(name, new Float64Array(region), { includeBoxes: true });
  assert.equal(qb.boxes.length, 4 * want.length);
  qb.ids.forEach((id, k) => assert.deepEqual(qb.boxes.subarray(4 * k, 4 * k + 4), boxes.subarray(4 * Number(id - 1n), 4 * Number(id))));
  const badRegion = await rejection(client.query(name, [0, 0, 1]));
  assert.ok(badRegion instanceof SapgridError && badRegion.code !== 0, String(badRegion));

  const all = await client.pairs(name);
  assert.equal(all.length / 2, d.stats.pairs);
  assert.ok(all.length > 40);
  assert.deepEqual(await client.pairs(name, { chunkSize: 7 }), all); // many chunks joined
  const pages = [];
  let token = "";
  for (let i = 0; i < 1000; i++) {
    const page = await client.listPairs(name, { pageSize: 9, pageToken: token });
    assert.ok(page.pairs.length <= 18);
    assert.equal(page.totalPairs, BigInt(all.length / 2));
    pages.push(...page.pairs);
    token = page.nextPageToken;
    if (!token) break;
  }
  assert.deepEqual(BigUint64Array.from(pages), all);
  await client.deleteWorld(name);
  const gone = await rejection(client.pairs(name));
  assert.ok(gone instanceof NotFound, String(gone));
});

async function waitSubscribers(name, count) {
  for (let i = 0; i < 200; i++) {
    if ((await client.getWorld(name)).subscribers === count) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.fail(`world ${name} never had ${count} subscribers`);
}

test("subscribe: every delta of the world, in order, as the writer got it; region views; break and cancel end it", { timeout: 120_000 }, async () => {
  const name = worldName("sub");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
  const sub = client.subscribe(name);
  const region = client.subscribe(name, { region: [0, 0, 10, 10] });
  await waitSubscribers(name, 2);
  const rnd = lcg(3);
  const ids = BigUint64Array.from({ length: 60 }, (_, i) => BigInt(i + 1));
  const s = await client.stream(name);
  const answers = [await s.step({ addIds: ids, addBoxes: randomBoxes(rnd, 60, 8, 30) })];
  for (let k = 0; k < 5; k++) answers.push(await s.step({ updateIds: ids.subarray(0, 30), updateBoxes: randomBoxes(rnd, 30, 8, 30) }));
  s.close();
  const seen = [];
  for await (const d of sub) {
    seen.push(d);
    if (seen.length === answers.length) break;
  }
  seen.forEach((d, k) => {
    assert.equal(d.frame, answers[k].frame);
    assert.deepEqual(d.created, answers[k].created);
    assert.deepEqual(d.deleted, answers[k].deleted);
  });
  // The region's view: pairs with an object whose box meets [0,0]-[10,10]; the mirror of its deltas
  // equals that set computed from the world's pairs and boxes.
  const view = new Set();
  let got = 0;
  for await (const d of region) {
    for (const key of pairKeys(d.deleted)) view.delete(key);
    for (const key of pairKeys(d.created)) view.add(key);
    if (++got === answers.length) break;
  }
  const q = await client.query(name, [0, 0, 10, 10]);
  const inside = new Set([...q.ids].map(String));
  const all = await client.pairs(name);
  const want = [];
  for (let i = 0; i < all.length; i += 2) {
    if (inside.has(String(all[i])) || inside.has(String(all[i + 1]))) want.push(`${all[i]}-${all[i + 1]}`);
  }
  assert.deepEqual([...view].sort(), want.sort());
  await waitSubscribers(name, 0); // leaving a loop ends its subscription
  // cancel() ends a loop that waits for deltas, without an error.
  const idle = client.subscribe(name);
  await waitSubscribers(name, 1);
  setTimeout(() => idle.cancel(), 50);
  for await (const _ of idle) assert.fail("no frame was sent");
  await waitSubscribers(name, 0);
  // A deleted world ends its subscriptions with NOT_FOUND.
  const late = client.subscribe(name);
  await waitSubscribers(name, 1);
  await client.deleteWorld(name);
  const ended = await (async () => {
    try {
      for await (const _ of late) { /* no frames */ }
    } catch (e) {
      return e;
    }
    return null;
  })();
  assert.ok(ended instanceof NotFound, String(ended));
});

test("what the client refuses itself: message limit, resume without a writer", { timeout: 120_000 }, async () => {
  const name = worldName("limits");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [2, 2] });
  const small = new Client(address(), { maxMessageBytes: 4096 });
  try {
    const s = await small.stream(name);
    const n = 400;
    assert.throws(() => s.send({ addIds: BigUint64Array.from({ length: n }, (_, i) => BigInt(i + 1)), addBoxes: new Float32Array(4 * n) }),
      (e) => e instanceof ResourceExhausted && e.field === "frame" && /message limit of 4096/.test(e.message));
    const d = await s.step({ addIds: [1], addBoxes: [0, 0, 1, 1] }); // the stream goes on
    assert.equal(d.seq, 1n);
    s.close();
  } finally {
    small.close();
  }
  await assert.rejects(client.stream(name, { resume: true }), (e) => e instanceof InvalidArgument && e.field === "writer");
  assert.throws(() => client.openStream(name, { resume: true }), (e) => e instanceof InvalidArgument && e.field === "writer");
  await client.deleteWorld(name);
});

test("the README's example runs as written (examples/quickstart.mjs)", { timeout: 120_000 }, async () => {
  const { execFile } = await import("node:child_process");
  const { fileURLToPath } = await import("node:url");
  const script = fileURLToPath(new URL("../examples/quickstart.mjs", import.meta.url));
  const out = await new Promise((resolve, reject) => {
    execFile(process.execPath, [script, address()], { timeout: 60_000 }, (err, stdout, stderr) =>
      (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)));
  });
  assert.deepEqual(out.trim().split("\n"), [
    "BigUint64Array(2) [ 1n, 2n ]",
    "true add_boxes 0 add_boxes[0]: min > max on axis 0",
    "BigUint64Array(2) [ 1n, 2n ] 0 2n",
    "BigUint64Array(1) [ 1n ]",
    "true",
  ]);
});
