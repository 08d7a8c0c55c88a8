// Type-checked against the package's published .d.ts at build time (tsc --noEmit -p examples): what a
// TypeScript user writes compiles, with the types of deltas, errors and world infos.
import { Client, InvalidArgument, SapgridError, pairsDigest } from "@sapgrid/client";
import type { Delta, FrameStream, WorldInfo } from "@sapgrid/client";

export async function run(address: string): Promise<bigint> {
  const c = new Client(address, { timeoutMs: 10_000 });
  const info: WorldInfo = await c.createWorld("typed", { dims: 2, bounds: [0, 0, 10, 10], cells: [2, 2] });
  const gen: bigint = info.generation;
  const s: FrameStream = await c.stream("typed", { writer: "typed-1", resume: true, backoff: { deadlineMs: 5000 } });
  const d: Delta = await s.step({ addIds: new BigUint64Array([1n, 2n]), addBoxes: new Float32Array([0, 0, 1, 1, 0, 0, 1, 1]) });
  const created: BigUint64Array = d.created;
  try {
    await s.step({ removeIds: [99n] });
  } catch (e) {
    if (e instanceof InvalidArgument) console.log(e.field, e.index, e.codeName);
    else if (e instanceof SapgridError) console.log(e.code);
  }
  s.close();
  const q = await c.query("typed", [0, 0, 1, 1], { includeBoxes: true });
  const boxes: Float32Array = q.boxes;
  console.log(gen, created, boxes, d.stats.engineSeconds);
  c.close();
  return pairsDigest(await c.pairs("typed"));
}
