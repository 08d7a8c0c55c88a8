// The README's example: node examples/quickstart.mjs [HOST:PORT]
import { Client, InvalidArgument, digestStep, pairsDigest } from "@sapgrid/client";

const c = new Client(process.argv[2] ?? "127.0.0.1:50051");
const world = `arena-${process.pid}`;
await c.createWorld(world, { dims: 2, bounds: [0, 0, 1000, 1000], cells: [16, 16] });
const s = await c.stream(world);                          // one bidirectional stream, frames answered in order
let d = await s.step({
  addIds: new BigUint64Array([1n, 2n, 3n]),
  addBoxes: new Float32Array([0, 0, 2, 2, 1, 1, 3, 3, 9, 9, 10, 10]),   // rows of mins then maxs
});
console.log(d.created);                             // BigUint64Array [1n, 2n]: (low, high) rows, sorted
let digest = digestStep(0n, d.created, d.deleted);  // a mirror's digest, kept in O(delta)
try {
  await s.step({ addIds: [4n], addBoxes: [5, 5, 4, 6] });
} catch (e) {
  console.log(e instanceof InvalidArgument, e.field, e.index, e.message); // true add_boxes 0 add_boxes[0]: ...
}
d = await s.step({ updateIds: [2n], updateBoxes: [5, 5, 6, 6] });
digest = digestStep(digest, d.created, d.deleted);
console.log(d.deleted, d.stats.pairs, d.frame);     // BigUint64Array [1n, 2n] 0 2n
s.close();
console.log((await c.query(world, [0, 0, 4, 4])).ids);  // BigUint64Array [1n]
const pairs = await c.pairs(world);                      // all active pairs (streamed in chunks)
console.log(pairsDigest(pairs) === digest);              // true
const sub = c.subscribe(world);                          // every delta of the world, for observers
await sub.ready;                                         // registered: every frame from now on is in it
setTimeout(() => sub.cancel(), 100);
for await (const delta of sub) console.log(delta.frame); // (none here: cancelled, the loop ends)
await c.deleteWorld(world);
c.close();
