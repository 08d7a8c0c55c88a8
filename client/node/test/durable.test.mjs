// Exactly-once writer streams that resume (`stream(world, {writer, resume: true})`) against real
// servers with a data directory, started here from SAPGRID_SERVE (the `sapgrid` command): the
// connection cut under a pipeline of frames (a TCP relay between client and server drops every
// socket), and the server killed and started again on its data directory. Every delta must reach
// `recv` once, in order, equal to the deltas of the same frames on an undisturbed world, and no frame
// may be applied twice. Also: a writer's refused frames and seq gaps, verify (the client's mirror of the
// pair digest), a frozen world, snapshot and restore.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

import { Client, DataLoss, FailedPrecondition, InvalidArgument, NotFound } from "../dist/index.js";
import { worldName } from "./helpers.mjs";

const SERVE = process.env.SAPGRID_SERVE;
if (!SERVE) {
  throw new Error("SAPGRID_SERVE (the sapgrid command) is not set: run these tests through tests/test_client_node.py");
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A `sapgrid serve` process on 127.0.0.1:port with a data directory, SERVING when this resolves. */
async function startServer(port, dataDir, extra = [], clientOptions = {}) {
  const proc = spawn(SERVE, ["serve", "--listen", `127.0.0.1:${port}`, "--metrics-port", "-1", "--data-dir", dataDir,
    "--grace-seconds", "1", ...extra], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  proc.stdout.on("data", (b) => (log += b));
  proc.stderr.on("data", (b) => (log += b));
  const probe = new Client(`127.0.0.1:${port}`, { timeoutMs: 2000, ...clientOptions });
  try {
    for (let i = 0; i < 1200; i++) {
      if (proc.exitCode !== null) throw new Error(`sapgrid serve exited ${proc.exitCode}:\n${log}`);
      try {
        if ((await probe.health()) === "SERVING") return proc;
      } catch { /* not up yet */ }
      await sleep(100);
    }
    throw new Error(`sapgrid serve did not become SERVING in 120 s:\n${log}`);
  } finally {
    probe.close();
  }
}

async function stopServer(proc, signal = "SIGTERM") {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill(signal);
  const timer = setTimeout(() => proc.kill("SIGKILL"), 20_000);
  await exited;
  clearTimeout(timer);
}

/**
 * A TCP relay to 127.0.0.1:target. hold() keeps the server's bytes from the client (frames reach the
 * server and are applied, their answers wait in the relay); cut() drops every connection with what it
 * held, and the relay relays new connections again.
 */
async function startRelay(target) {
  const sockets = new Set();
  let held = false;
  const server = net.createServer((down) => {
    const up = net.connect(target, "127.0.0.1");
    for (const [a, b] of [[down, up], [up, down]]) {
      sockets.add(a);
      a.on("error", () => b.destroy());
      a.on("close", () => { sockets.delete(a); b.destroy(); });
    }
    down.on("data", (chunk) => up.write(chunk));
    up.on("data", (chunk) => { if (!held) down.write(chunk); });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    address: `127.0.0.1:${server.address().port}`,
    hold() {
      held = true;
    },
    cut() {
      const n = sockets.size;
      for (const s of sockets) s.destroy();
      held = false;
      return n;
    },
    close: () => new Promise((r) => { for (const s of sockets) s.destroy(); server.close(r); }),
  };
}

function lcg(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

/** n frames of a 200-object world: all added, then 30% moved each frame. */
function makeFrames(n, seed) {
  const rnd = lcg(seed);
  const N = 200;
  const ids = BigUint64Array.from({ length: N }, (_, i) => BigInt(i + 1));
  const boxes = (k) => {
    const b = new Float32Array(4 * k);
    for (let i = 0; i < k; i++) {
      const x = rnd() * 100, y = rnd() * 100;
      b.set([x, y, x + 1 + rnd() * 6, y + 1 + rnd() * 6], 4 * i);
    }
    return b;
  };
  const frames = [{ addIds: ids, addBoxes: boxes(N) }];
  for (let k = 1; k < n; k++) {
    const moved = ids.filter(() => rnd() < 0.3);
    frames.push({ updateIds: moved, updateBoxes: boxes(moved.length) });
  }
  return frames;
}

function summary(d) {
  return { seq: d.seq, frame: d.frame, created: [...d.created], deleted: [...d.deleted], objects: d.stats.objects,
    pairs: d.stats.pairs, digest: d.pairsDigest };
}

/** The deltas of frames on a fresh world through a plain stream (nothing disturbed). */
async function reference(client, frames) {
  const name = worldName("ref");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
  const s = await client.stream(name, { writer: "ref" });
  frames.forEach((f) => s.send(f));
  const out = [];
  for (let k = 0; k < frames.length; k++) out.push(summary(await s.recv()));
  s.close();
  await client.deleteWorld(name);
  return out;
}

let port, dataDir, server;

before(async () => {
  port = await freePort();
  dataDir = mkdtempSync(path.join(os.tmpdir(), "sapgrid-node-resume-"));
  server = await startServer(port, dataDir);
});

after(async () => {
  if (server) await stopServer(server);
  rmSync(dataDir, { recursive: true, force: true });
});

/** Resolves once the world has applied `seq` frames of `writer` (bounded wait). */
async function waitApplied(client, name, writer, seq) {
  for (let i = 0; i < 1200; i++) {
    if ((await client.getWorld(name)).writers.get(writer) === seq) return;
    await sleep(25);
  }
  assert.fail(`writer ${writer} of ${name} never reached seq ${seq}`);
}

test("resume across cut connections: each delta once, in order, as on an undisturbed world", { timeout: 300_000 }, async () => {
  const relay = await startRelay(port);
  const direct = new Client(`127.0.0.1:${port}`);
  const c = new Client(relay.address);
  try {
    const frames = makeFrames(50, 1);
    const want = await reference(direct, frames);
    const name = worldName("cut");
    await c.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
    const s = await c.stream(name, { writer: "game-1", resume: true, backoff: { initialMs: 20, maxMs: 200 } });
    const got = [];
    // 1. Twelve frames applied by the server whose answers never reach the client.
    relay.hold();
    for (const f of frames.slice(0, 12)) s.send(f);
    await waitApplied(direct, name, "game-1", 12n);
    assert.ok(relay.cut() > 0, "the relay had connections to cut");
    for (let k = 0; k < 12; k++) got.push(summary(await s.recv()));
    assert.equal(s.resentApplied, 12); // all answered from the deltas the world kept
    // 2. Cuts at any moment of a pipeline, frames sent while the stream reconnects.
    for (const f of frames.slice(12, 40)) s.send(f);
    for (let k = 12; k < 40; k++) {
      got.push(summary(await s.recv()));
      if (k === 15 || k === 30) relay.cut();
    }
    for (const f of frames.slice(40)) s.send(f);
    relay.cut();
    for (let k = 40; k < 50; k++) got.push(summary(await s.recv()));
    assert.ok(s.reconnects >= 3, `reconnects: ${s.reconnects}`);
    assert.deepEqual(got, want);
    s.close();
    const info = await direct.getWorld(name);
    assert.equal(info.frames, 50n); // no frame applied twice
    assert.equal(info.writers.get("game-1"), 50n);
    assert.equal(info.pairsDigest, want[49].digest);
    await direct.deleteWorld(name);
  } finally {
    c.close();
    direct.close();
    await relay.close();
  }
});

test("resume across a server killed and started again on its data directory", { timeout: 300_000 }, async () => {
  const relay = await startRelay(port);
  const direct = new Client(`127.0.0.1:${port}`);
  const c = new Client(relay.address);
  try {
    const frames = makeFrames(30, 2);
    const want = await reference(direct, frames);
    const name = worldName("restart");
    await c.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
    const s = await c.stream(name, { writer: "game-2", resume: true, backoff: { initialMs: 50, maxMs: 500, deadlineMs: 60_000 } });
    const got = [];
    for (const f of frames.slice(0, 5)) s.send(f);
    for (let k = 0; k < 5; k++) got.push(summary(await s.recv()));
    relay.hold();
    for (const f of frames.slice(5, 15)) s.send(f);
    await waitApplied(direct, name, "game-2", 15n);
    // Killed with ten frames applied and logged whose answers the client never got.
    await stopServer(server, "SIGKILL");
    relay.cut();
    for (const f of frames.slice(15, 20)) s.send(f); // sent while the server is down
    server = await startServer(port, dataDir);
    for (const f of frames.slice(20)) s.send(f);
    for (let k = 5; k < 30; k++) got.push(summary(await s.recv()));
    assert.ok(s.reconnects >= 1, `reconnects: ${s.reconnects}`);
    assert.equal(s.resentApplied, 10);
    assert.deepEqual(got, want);
    s.close();
    const info = await direct.getWorld(name);
    assert.equal(info.frames, 30n);
    assert.equal(info.writers.get("game-2"), 30n);
    // A new resuming stream of the writer goes on from where it stands.
    const again = await c.stream(name, { writer: "game-2", resume: true });
    const d = await again.step({ removeIds: [1n] });
    assert.equal(d.seq, 31n);
    again.close();
    await direct.deleteWorld(name);
  } finally {
    c.close();
    direct.close();
    await relay.close();
  }
});

test("opening a resuming stream waits for a server that is down; an unknown world fails at once", { timeout: 300_000 }, async () => {
  const c = new Client(`127.0.0.1:${port}`);
  try {
    const name = worldName("opening");
    await c.createWorld(name, { dims: 2, bounds: [0, 0, 10, 10], cells: [2, 2] });
    await (await c.stream(name, { writer: "o" })).step({ addIds: [1n], addBoxes: [0, 0, 1, 1] });
    await stopServer(server);
    const opening = c.stream(name, { writer: "o", resume: true, verify: true, backoff: { initialMs: 50, maxMs: 200 } });
    await sleep(300);
    server = await startServer(port, dataDir);
    const s = await opening;
    assert.equal((await s.step({ addIds: [2n], addBoxes: [0, 0, 1, 1] })).seq, 2n); // the world and its writer survived
    s.close();
    // Not retried: were it, the retries would outlast this test's own deadline.
    await assert.rejects(c.stream(worldName("nowhere"), { writer: "o", resume: true, backoff: { deadlineMs: 3_600_000 } }),
      (e) => e instanceof NotFound && !/gave up/.test(e.message));
    await c.deleteWorld(name);
  } finally {
    c.close();
  }
});

test("a writer's sequence: a refused frame takes no seq, the frames after it go on; gaps and repeats", { timeout: 300_000 }, async () => {
  const c = new Client(`127.0.0.1:${port}`);
  try {
    const name = worldName("seqs");
    await c.createWorld(name, { dims: 2, bounds: [0, 0, 10, 10], cells: [2, 2] });
    const s = await c.stream(name, { writer: "w" });
    assert.equal((await s.step({ addIds: [1n], addBoxes: [0, 0, 1, 1] })).seq, 1n);
    // Pipelined: a refused frame, then two good ones sent before its answer came back.
    assert.deepEqual([s.send({ addIds: [1n], addBoxes: [0, 0, 1, 1] }), s.send({ addIds: [2n], addBoxes: [0, 0, 1, 1] }),
      s.send({ addIds: [3n], addBoxes: [0, 0, 1, 1] })], [2n, 3n, 4n]);
    await assert.rejects(s.recv(), (e) => e instanceof InvalidArgument && e.field === "add_ids" && e.index === 0);
    const d2 = await s.recv();
    const d3 = await s.recv();
    assert.deepEqual([d2.seq, d3.seq, d3.frame, d3.stats.objects], [2n, 3n, 3n, 3]); // renumbered, applied
    assert.equal(s.send({ removeIds: [3n] }), 4n);
    assert.equal((await s.recv()).seq, 4n);
    s.close();
    assert.equal((await c.getWorld(name)).writers.get("w"), 4n);
    // A stream numbering past the writer's next seq: a gap; before it: answered with the deltas the
    // frames got the first time, not applied again.
    const gap = c.openStream(name, { writer: "w", firstSeq: 9 });
    await assert.rejects(gap.step({ removeIds: [2n] }), (e) => e instanceof FailedPrecondition && /expected seq 5/.test(e.message));
    gap.close();
    const old = c.openStream(name, { writer: "w", firstSeq: 2 });
    const again = await old.step({ addIds: [7n], addBoxes: [0, 0, 1, 1] }); // its content is not even looked at
    assert.deepEqual(summary(again), summary(d2));
    old.close();
    const info = await c.getWorld(name);
    assert.equal(info.frames, 4n);
    assert.equal(info.objects, 2);
    await c.deleteWorld(name);
  } finally {
    c.close();
  }
});

test("verify: every delta checked against the client's mirror; another writer's frame is DataLoss", { timeout: 300_000 }, async () => {
  const c = new Client(`127.0.0.1:${port}`);
  try {
    const name = worldName("verify");
    await c.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
    const frames = makeFrames(20, 3);
    await c.step(name, frames[0]); // the world has pairs before the stream opens: the mirror starts from them
    const s = await c.stream(name, { writer: "v", verify: true });
    assert.equal(s.mirror.frame, 1n);
    for (const f of frames.slice(1)) s.send(f);
    for (let k = 1; k < 20; k++) assert.equal((await s.recv()).frame, BigInt(k + 1));
    assert.equal(s.mirror.digest, (await c.getWorld(name)).pairsDigest);
    await c.step(name, { removeIds: [1n] }); // another writer
    await assert.rejects(s.step({ removeIds: [2n] }), (e) => e instanceof DataLoss && /another writer/.test(e.message));
    s.close();
    await c.deleteWorld(name);
  } finally {
    c.close();
  }
});

test("a frozen world: a resuming stream waits and goes on once it is unfrozen", { timeout: 300_000 }, async () => {
  const c = new Client(`127.0.0.1:${port}`);
  try {
    const frames = makeFrames(20, 4);
    const want = await reference(c, frames);
    const name = worldName("frozen");
    await c.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
    const s = await c.stream(name, { writer: "f", resume: true, backoff: { initialMs: 20, maxMs: 100 } });
    const got = [];
    for (const f of frames.slice(0, 5)) got.push(summary(await s.step(f)));
    assert.equal((await c.freeze(name)).frozen, true);
    for (const f of frames.slice(5)) s.send(f);
    await sleep(300); // answered UNAVAILABLE "moving", sent again and again while frozen
    assert.equal((await c.getWorld(name)).frames, 5n);
    assert.equal((await c.freeze(name, false)).frozen, false);
    for (let k = 5; k < 20; k++) got.push(summary(await s.recv()));
    assert.deepEqual(got, want);
    s.close();
    await c.deleteWorld(name);
  } finally {
    c.close();
  }
});

test("snapshot and restore: the restored world goes on exactly like the original", { timeout: 300_000 }, async () => {
  const c = new Client(`127.0.0.1:${port}`);
  try {
    const frames = makeFrames(30, 5);
    const name = worldName("snap");
    await c.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
    const s = await c.stream(name, { writer: "s" });
    for (const f of frames.slice(0, 15)) await s.step(f);
    const snap = await c.snapshot(name);
    assert.ok(Buffer.isBuffer(snap) && snap.length > 1000);
    const copy = worldName("snap-copy");
    const info = await c.restore(snap, copy);
    assert.equal(info.name, copy);
    assert.equal(info.frames, 15n);
    assert.equal(info.writers.get("s"), 15n);
    const t = await c.stream(copy, { writer: "s" });
    for (const f of frames.slice(15)) {
      const [a, b] = [summary(await s.step(f)), summary(await t.step(f))];
      assert.deepEqual(b, a);
    }
    s.close();
    t.close();
    const bad = Buffer.from(snap);
    bad[bad.length >> 1] ^= 0xff;
    await assert.rejects(c.restore(bad, worldName("bad")), (e) => e instanceof InvalidArgument);
    await assert.rejects(c.restore(snap, copy), (e) => e.codeName === "ALREADY_EXISTS");
    await c.deleteWorld(name);
    await c.deleteWorld(copy);
  } finally {
    c.close();
  }
});

test("TLS and tokens: the client's credentials, Unauthenticated and PermissionDenied", { timeout: 300_000 }, async () => {
  const tlsDir = process.env.SAPGRID_TLS_DIR; // ca.pem, server.pem, server.key made by the pytest side (trustme)
  assert.ok(tlsDir, "SAPGRID_TLS_DIR is not set");
  const dir = mkdtempSync(path.join(os.tmpdir(), "sapgrid-node-auth-"));
  const authFile = path.join(dir, "auth.toml");
  const token = (role, name) => execFileSync(SERVE, ["auth", "token", "--file", authFile, "--name", name, "--role", role,
    "--worlds", "node-*"], { encoding: "utf8" }).trim().split(/\s+/).pop();
  const admin = token("admin", "ops");
  const reader = token("reader", "viewer");
  const tls = { caFile: path.join(tlsDir, "ca.pem") };
  const securePort = await freePort();
  const proc = await startServer(securePort, path.join(dir, "data"), ["--auth-file", authFile, "--tls-cert",
    path.join(tlsDir, "server.pem"), "--tls-key", path.join(tlsDir, "server.key")], { ...tls, token: admin });
  const address = `localhost:${securePort}`;
  const ops = new Client(address, { ...tls, token: admin });
  const viewer = new Client(address, { ...tls, token: reader });
  const nobody = new Client(address, tls);
  const plain = new Client(address, { token: admin, timeoutMs: 5000 });
  try {
    const name = worldName("secure");
    await ops.createWorld(name, { dims: 2, bounds: [0, 0, 10, 10], cells: [1, 1] });
    const s = await ops.stream(name, { writer: "w", resume: true });
    assert.deepEqual((await s.step({ addIds: [1n, 2n], addBoxes: [0, 0, 1, 1, 0, 0, 1, 1] })).created, new BigUint64Array([1n, 2n]));
    s.close();
    assert.deepEqual(await viewer.pairs(name), new BigUint64Array([1n, 2n]));
    await assert.rejects(viewer.step(name, { removeIds: [1n] }), (e) => e.codeName === "PERMISSION_DENIED" && e.constructor.name === "PermissionDenied");
    await assert.rejects(viewer.deleteWorld(name), (e) => e.codeName === "PERMISSION_DENIED");
    await assert.rejects(nobody.getWorld(name), (e) => e.codeName === "UNAUTHENTICATED" && e.constructor.name === "Unauthenticated");
    await assert.rejects(plain.getWorld(name), (e) => e.codeName === "UNAVAILABLE"); // plaintext to a TLS server
    assert.equal((await ops.getWorld(name)).objects, 2); // the refused calls changed nothing
    assert.throws(() => new Client(address, { caFile: path.join(dir, "missing.pem") }), (e) => e.field === "caFile");
    assert.throws(() => new Client(address, { ...tls, certFile: path.join(tlsDir, "server.pem") }), (e) => e.field === "keyFile");
    await ops.deleteWorld(name);
  } finally {
    for (const c of [ops, viewer, nobody, plain]) c.close();
    await stopServer(proc);
    rmSync(dir, { recursive: true, force: true });
  }
});
