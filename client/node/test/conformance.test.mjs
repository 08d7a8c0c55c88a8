// The shared conformance vectors (conformance/vectors/*.json at the repository's root, and this
// package's own test/vectors/*.json), and more given in SAPGRID_VECTORS (the Python-parity scenario the
// pytest side records with the Python client): every frame's answer must match byte for byte (created
// and deleted pairs, frame, objects, pairs, the digest the server sends and the one this client keeps
// from the deltas; or the error's code, field and index), then the final pair list (ListPairs, small
// pages). A writer's step {"same_as_step": K} must be answered with the very delta of step K (every
// field, timings included). SAPGRID_ALLOW_ZERO_DIGEST=1 accepts a server digest of 0 (servers from
// before pairs_digest).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { Client, SapgridError, digestStep } from "../dist/index.js";
import { address, fromHex, hex, worldName } from "./helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const FRAME_FIELDS = ["remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static", "update_ids",
  "update_boxes"];

function vectorFiles() {
  const files = [];
  for (const dir of [path.resolve(here, "..", "..", "..", "conformance", "vectors"), path.join(here, "vectors")]) {
    if (existsSync(dir)) {
      for (const n of readdirSync(dir).filter((n) => n.endsWith(".json")).sort()) files.push(path.join(dir, n));
    }
  }
  // More vector files or directories (path-delimited), e.g. the Python-parity scenario of the pytest side.
  for (const p of (process.env.SAPGRID_VECTORS ?? "").split(path.delimiter).filter(Boolean)) {
    if (statSync(p).isDirectory()) {
      for (const n of readdirSync(p).filter((n) => n.endsWith(".json")).sort()) files.push(path.join(p, n));
    } else {
      files.push(p);
    }
  }
  return files;
}

const ALLOW_ZERO_DIGEST = process.env.SAPGRID_ALLOW_ZERO_DIGEST === "1";
const PAGE_SIZE = 4; // small pages, so the runner walks next_page_token
const client = new Client(address());
after(() => client.close());

async function allPairs(world) {
  const pages = [];
  let token = "";
  for (let i = 0; i < 10_000; i++) {
    const page = await client.listPairs(world, { pageSize: PAGE_SIZE, pageToken: token });
    pages.push(Buffer.from(page.pairs.buffer, page.pairs.byteOffset, page.pairs.byteLength));
    token = page.nextPageToken;
    if (!token) break;
  }
  return Buffer.concat(pages).toString("hex");
}

// Each field of a frame as the typed array a user would pass, or null when its bytes are not a whole
// number of elements (a vector of malformed input).
const TYPED = {
  remove_ids: ["removeIds", BigUint64Array], add_ids: ["addIds", BigUint64Array], add_boxes: ["addBoxes", Float32Array],
  add_category: ["addCategory", Uint32Array], add_mask: ["addMask", Uint32Array], add_static: ["addStatic", Uint8Array],
  update_ids: ["updateIds", BigUint64Array], update_boxes: ["updateBoxes", Float32Array],
};

function typedFrame(frame) {
  const out = {};
  for (const [k, [key, Type]] of Object.entries(TYPED)) {
    if (!frame[k]) continue;
    const bytes = new Uint8Array(fromHex(frame[k])); // a fresh, aligned copy
    if (bytes.byteLength % Type.BYTES_PER_ELEMENT !== 0) return null;
    out[key] = new Type(bytes.buffer, 0, bytes.byteLength / Type.BYTES_PER_ELEMENT);
  }
  return out;
}

export async function runVector(v, where) {
  const name = worldName(v.name.replace(/[^A-Za-z0-9_.-]/g, "_").slice(0, 40));
  const w = v.world;
  await client.createWorld(name, {
    dims: w.dims, bounds: w.bounds, cells: w.cells, threads: w.threads, maxObjects: w.max_objects,
    coordLimit: w.coord_limit, expectedObjects: w.expected_objects,
  });
  try {
    const stream = client.openStream(name);
    // Pipelined: every frame sent ahead, answers read in order.
    for (const step of v.steps) {
      const arrays = typedFrame(step.frame);
      if (arrays && !step.frame.writer) {
        stream.send({ ...arrays, seq: BigInt(step.frame.seq ?? 0) }); // the typed-array path users take
      } else {
        const f = { seq: String(step.frame.seq ?? 0), writer: step.frame.writer ?? "", world: name };
        for (const k of FRAME_FIELDS) f[k] = fromHex(step.frame[k]);
        stream.sendMessage(f); // bytes no typed array can hold (e.g. 7 bytes of ids): sent as they are
      }
    }
    let mirror = 0n;
    const answers = []; // each step's delta, for the duplicates of writer steps
    for (const [i, step] of v.steps.entries()) {
      const at = `${where} step ${i} (seq ${step.frame.seq})`;
      const e = step.expect;
      if (e.same_as_step !== undefined) {
        // A writer's frame sent again: answered with the very delta of step K (timings included, so a
        // delta computed again differs); the world and this runner's digest do not move.
        const d = await stream.recv();
        const first = answers[e.same_as_step];
        assert.ok(first, `${at}: step ${e.same_as_step} was not answered with a delta`);
        assert.deepEqual(d, first, `${at}: not the very delta of step ${e.same_as_step}`);
        continue;
      }
      if (e.error) {
        const err = await stream.recv().then(() => null, (x) => x);
        assert.ok(err instanceof SapgridError, `${at}: expected error ${JSON.stringify(e.error)}, got a delta`);
        assert.deepEqual({ code: err.code, field: err.field, index: err.index },
          { code: e.error.code, field: e.error.field ?? "", index: e.error.index ?? -1 }, `${at}: ${err.message}`);
        continue;
      }
      const d = await stream.recv();
      answers[i] = d;
      assert.equal(d.seq, BigInt(step.frame.seq ?? 0), `${at}: seq`);
      assert.equal(hex(d.created), e.created ?? "", `${at}: created`);
      assert.equal(hex(d.deleted), e.deleted ?? "", `${at}: deleted`);
      if (e.frame !== undefined) assert.equal(d.frame, BigInt(e.frame), `${at}: frame`);
      if (e.objects !== undefined) assert.equal(d.stats.objects, e.objects, `${at}: objects`);
      if (e.pairs !== undefined) assert.equal(d.stats.pairs, e.pairs, `${at}: pairs`);
      mirror = digestStep(mirror, d.created, d.deleted);
      if (e.pairs_digest !== undefined) {
        assert.equal(mirror, BigInt(e.pairs_digest), `${at}: the digest kept from the deltas`);
        if (!(ALLOW_ZERO_DIGEST && d.pairsDigest === 0n)) {
          assert.equal(d.pairsDigest, BigInt(e.pairs_digest), `${at}: pairs_digest`);
        }
      }
      if (e.mirror_digest !== undefined) assert.equal(mirror, BigInt(e.mirror_digest), `${at}: mirror digest`);
    }
    stream.close();
    assert.equal(await allPairs(name), v.final_pairs ?? "", `${where}: final pairs`);
  } finally {
    await client.deleteWorld(name);
  }
}

for (const file of vectorFiles()) {
  const v = JSON.parse(readFileSync(file, "utf8"));
  test(`vector ${v.name}`, { timeout: 120_000 }, () => runVector(v, path.basename(file)));
}
