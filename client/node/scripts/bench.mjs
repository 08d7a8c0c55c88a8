// The Node client's cost per frame against the Python client's, in the same run on the same server:
//   node scripts/bench.mjs --server HOST:PORT [--objects 10000] [--frames 200] [--python ../../.venv/bin/python]
// A 2D world of N objects where every object moves every frame (the crowd case). Measured per client:
// after 20 frames of warm-up, round trip median / p99 of one frame at a time (send, wait for the delta), the server's own time of
// a frame (FrameStats.server_seconds) and so the client side of the round trip (round trip - server
// time: encode, transport, decode), and frames/s with 8 frames in flight on one stream.
// The Python peer (scripts/bench_peer.py) runs the same measure with sapgrid.client after the Node one.
import { execFileSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { Client } from "../dist/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const { values } = parseArgs({
  options: {
    server: { type: "string", default: "127.0.0.1:50051" },
    objects: { type: "string", default: "10000" },
    frames: { type: "string", default: "200" },
    python: { type: "string", default: path.resolve(here, "..", "..", "..", ".venv", "bin", "python") },
    "no-peer": { type: "boolean", default: false },
  },
});
const N = Number(values.objects);
const FRAMES = Number(values.frames);

function lcg(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

function quantile(xs, q) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

const rnd = lcg(1);
const extent = Math.sqrt(N) * 10;
const pos = new Float32Array(2 * N).map(() => rnd() * extent);
function boxes() {
  const b = new Float32Array(4 * N);
  for (let i = 0; i < N; i++) {
    pos[2 * i] += rnd() - 0.5;
    pos[2 * i + 1] += rnd() - 0.5;
    b[4 * i] = pos[2 * i];
    b[4 * i + 1] = pos[2 * i + 1];
    b[4 * i + 2] = pos[2 * i] + 4;
    b[4 * i + 3] = pos[2 * i + 1] + 4;
  }
  return b;
}

const c = new Client(values.server);
await c.waitReady();
const world = `bench-node-${process.pid}`;
await c.createWorld(world, { dims: 2, bounds: [0, 0, extent, extent], expectedObjects: N });
const ids = BigUint64Array.from({ length: N }, (_, i) => BigInt(i + 1));
const s = await c.stream(world);
await s.step({ addIds: ids, addBoxes: boxes() });
const frames = Array.from({ length: FRAMES }, boxes); // made before timing
for (let k = 0; k < 20; k++) await s.step({ updateIds: ids, updateBoxes: frames[k] }); // warm-up, not timed
const rt = [], srv = [];
for (let k = 0; k < FRAMES; k++) {
  const t0 = process.hrtime.bigint();
  const d = await s.step({ updateIds: ids, updateBoxes: frames[k] });
  rt.push(Number(process.hrtime.bigint() - t0) / 1e6);
  srv.push(d.stats.serverSeconds * 1e3);
}
const t0 = process.hrtime.bigint();
let inFlight = 0, done = 0;
for (let k = 0; k < FRAMES; k++) {
  s.send({ updateIds: ids, updateBoxes: frames[k] });
  if (++inFlight >= 8) { await s.recv(); inFlight--; done++; }
}
while (inFlight > 0) { await s.recv(); inFlight--; done++; }
const fps = done / (Number(process.hrtime.bigint() - t0) / 1e9);
s.close();
await c.deleteWorld(world);
c.close();
const client = rt.map((x, i) => x - srv[i]);
const node = { rt_p50: quantile(rt, 0.5), rt_p99: quantile(rt, 0.99), server_p50: quantile(srv, 0.5),
  client_p50: quantile(client, 0.5), fps };
const fmt = (r) => `round trip p50 ${r.rt_p50.toFixed(2)} ms, p99 ${r.rt_p99.toFixed(2)} ms; server ${r.server_p50.toFixed(2)} ms; ` +
  `client side ${r.client_p50.toFixed(2)} ms; pipelined ${r.fps.toFixed(1)} frames/s`;
console.log(`${N} objects all moving, ${FRAMES} frames`);
console.log(`node:   ${fmt(node)}`);
if (!values["no-peer"]) {
  const out = execFileSync(values.python, [path.join(here, "bench_peer.py"), values.server, String(N), String(FRAMES)],
    { encoding: "utf8" });
  const py = JSON.parse(out.trim().split("\n").pop());
  console.log(`python: ${fmt(py)}`);
  console.log(`node/python: round trip ${(node.rt_p50 / py.rt_p50).toFixed(2)}x, client side ` +
    `${(node.client_p50 / py.client_p50).toFixed(2)}x, frames/s ${(node.fps / py.fps).toFixed(2)}x`);
}
