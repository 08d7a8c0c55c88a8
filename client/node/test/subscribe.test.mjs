// `sub.ready`: a subscription's frames from the moment the server has registered it. tests/test_client_node.py
// runs this file against its server and once more against a server that registers subscribers 0.5 s late:
// a frame sent as soon as `ready` resolves must still be the subscription's first delta.
import { test, after } from "node:test";
import assert from "node:assert/strict";

import { Client, NotFound } from "../dist/index.js";
import { address, worldName } from "./helpers.mjs";

const client = new Client(address());
after(() => client.close());

test("a frame applied once sub.ready resolves is in the subscription", { timeout: 120_000 }, async () => {
  const name = worldName("ready");
  await client.createWorld(name, { dims: 2, bounds: [0, 0, 100, 100], cells: [4, 4] });
  const s = await client.stream(name);
  for (let k = 0; k < 3; k++) {
    const sub = client.subscribe(name, { timeoutMs: 60_000 });
    await sub.ready;
    const id = BigInt(2 * k + 1);
    const d = await s.step({ addIds: [id, id + 1n], addBoxes: [10 * k, 0, 10 * k + 2, 2, 10 * k + 1, 1, 10 * k + 3, 3] });
    assert.deepEqual(d.created, BigUint64Array.from([id, id + 1n]));
    const first = await sub.next();
    assert.equal(first.done, false);
    assert.equal(first.value.frame, d.frame);
    assert.deepEqual(first.value.created, d.created);
    sub.cancel();
  }
  s.close();
  await client.deleteWorld(name);
});

test("sub.ready of a refused subscription resolves; the refusal comes with next()", { timeout: 120_000 }, async () => {
  const sub = client.subscribe(worldName("nowhere"), { timeoutMs: 60_000 });
  await sub.ready;
  await assert.rejects(sub.next(), (e) => e instanceof NotFound);
});
