/**
 * A client's own check of a world's pairs (`verify: true` on a frame stream).
 *
 * `PairMirror` keeps the digest of the pairs it has seen (the formula of Delta.pairs_digest in the
 * contract), starting from the world's pairs when the stream opened and moved by every delta's
 * created/deleted in O(delta). A delta whose pairsDigest differs from the mirror's, or that does not
 * follow the mirror's frame, is a `DataLoss` error: the client's view of the pairs and the server's have
 * parted. The mirror follows the world frame by frame, so a verified stream must be the world's only
 * writer while it runs.
 */
import { status } from "@grpc/grpc-js";

import type { Delta } from "./codec";
import { digestStep, pairsDigest } from "./digest";
import { makeError } from "./errors";

export class PairMirror {
  digest: bigint;
  frame: bigint;

  /** pairs: the world's pairs at `frame` ((low, high) rows, as `Client.pairs`). */
  constructor(pairs: BigUint64Array, frame: bigint) {
    this.digest = pairsDigest(pairs);
    this.frame = frame;
  }

  /** Move the mirror by a delta; throws DataLoss when the server's digest differs from the mirror's. */
  apply(delta: Delta): Delta {
    if (delta.frame <= this.frame) return delta; // an earlier frame answered again (a duplicate)
    if (delta.frame !== this.frame + 1n) {
      throw makeError(status.DATA_LOSS, `world ${delta.world}: frame ${delta.frame} follows frame ${this.frame} of ` +
        `this stream's mirror: another writer changed the world (verify needs the stream to be the world's only writer)`);
    }
    const digest = digestStep(this.digest, delta.created, delta.deleted);
    if (digest !== delta.pairsDigest) {
      throw makeError(status.DATA_LOSS, `world ${delta.world}: frame ${delta.frame}: the server's pair digest ` +
        `${delta.pairsDigest} differs from this client's mirror ${digest}`);
    }
    this.digest = digest;
    this.frame = delta.frame;
    return delta;
  }
}
