// Shared by the tests: the server under test (SAPGRID_ADDRESS, set by tests/test_client_node.py, which
// starts a real sapgrid server), unique world names, hex <-> typed arrays.
import { randomBytes } from "node:crypto";

export function address() {
  const a = process.env.SAPGRID_ADDRESS;
  if (!a) {
    throw new Error("SAPGRID_ADDRESS is not set: run these tests through tests/test_client_node.py, or start " +
      "`sapgrid serve` and run SAPGRID_ADDRESS=127.0.0.1:50051 npm test");
  }
  return a;
}

export function worldName(tag) {
  return `node-${tag}-${randomBytes(4).toString("hex")}`;
}

export function hex(view) {
  return Buffer.from(view.buffer, view.byteOffset, view.byteLength).toString("hex");
}

export function fromHex(h) {
  return Buffer.from(h ?? "", "hex");
}

/** A Buffer's bytes at an odd offset of a larger buffer (as received messages often are). */
export function unaligned(bytes) {
  const big = Buffer.alloc(bytes.length + 3);
  bytes.copy(big, 3);
  return big.subarray(3);
}
