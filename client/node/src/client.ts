/**
 * The sapgrid client: worlds, frames (unary `step` and pipelined `stream`), queries, pairs and
 * subscriptions over one gRPC channel (@grpc/grpc-js), with typed arrays in and out and typed errors.
 */
import { readFileSync } from "node:fs";
import * as grpc from "@grpc/grpc-js";
import { Metadata, status } from "@grpc/grpc-js";

import {
  boxesArray, configMessage, deltaFrom, encodeFrame, idsArray, infoFrom, joinPairs, pairsArray, regionValues, u64,
} from "./codec";
import type { Delta, FrameInput, WorldInfo, WorldOptions } from "./codec";
import { fromServiceError, makeError, SapgridError } from "./errors";
import type { SapgridServiceClient } from "./generated/sapgrid/v1/SapgridService";
import type { HealthClient } from "./generated/grpc/health/v1/Health";
import type { ApplyFrameResponse__Output } from "./generated/sapgrid/v1/ApplyFrameResponse";
import type { ListPairsResponse__Output } from "./generated/sapgrid/v1/ListPairsResponse";
import type { ListWorldsResponse__Output } from "./generated/sapgrid/v1/ListWorldsResponse";
import type { QueryRegionResponse__Output } from "./generated/sapgrid/v1/QueryRegionResponse";
import type { WorldInfo__Output } from "./generated/sapgrid/v1/WorldInfo";

type WithWorld = { world: WorldInfo__Output | null };
import { contract } from "./proto";
import { PairMirror } from "./mirror";
import { backoffOf, FrameStream, OPEN_RETRY, retrying } from "./stream";
import type { FrameCall, OpenOptions, StreamOptions } from "./stream";
import type { StreamFramesResponse__Output } from "./generated/sapgrid/v1/StreamFramesResponse";
import type { SubscribeResponse__Output } from "./generated/sapgrid/v1/SubscribeResponse";
import type { SnapshotWorldResponse__Output } from "./generated/sapgrid/v1/SnapshotWorldResponse";
import type { StreamPairsResponse__Output } from "./generated/sapgrid/v1/StreamPairsResponse";

const SNAPSHOT_CHUNK = 1 << 20;

export const DEFAULT_ADDRESS = "127.0.0.1:50051";
export const DEFAULT_MAX_MESSAGE_BYTES = 64 << 20;
/** gRPC metadata header naming the world of a call (the cluster's proxy routes by it). */
export const WORLD_HEADER = "x-sapgrid-world";
const WORLD_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

export interface ClientOptions {
  /** Default deadline of unary calls and pair listings, ms (default 60,000; 0: none). */
  timeoutMs?: number;
  /** gRPC message limit both ways (default 64 MiB, as the server's --max-message-bytes). */
  maxMessageBytes?: number;
  /** TLS with the system's root certificates (or with `caFile`, the server's CA, PEM). */
  tls?: boolean;
  /** PEM files: the CA that signed the server's certificate; with certFile/keyFile, mutual TLS. */
  caFile?: string;
  certFile?: string;
  keyFile?: string;
  /** Sent as `authorization: Bearer TOKEN` on every call (the server's --auth-file). */
  token?: string;
  /** Channel credentials of your own (instead of tls/caFile/certFile/keyFile). */
  credentials?: grpc.ChannelCredentials;
  /** Extra channel options of @grpc/grpc-js. */
  channelOptions?: grpc.ChannelOptions;
}

/** Result of `query`: the sorted ids, their boxes when asked for, and the world's frame count then. */
export interface QueryResult {
  ids: BigUint64Array;
  boxes: Float32Array;
  frame: bigint;
}

/** One page of `listPairs`. */
export interface PairsPage {
  pairs: BigUint64Array;
  nextPageToken: string;
  totalPairs: bigint;
  frame: bigint;
}

/**
 * Every delta of a world from now on: `for await (const d of sub)`. `sub.cancel()` ends it, and so does
 * leaving the loop (break, return, throw): the server drops the subscriber then. `await sub.ready` waits
 * until the server has registered the subscriber: every frame applied after that is in it.
 */
export class Subscription implements AsyncIterable<Delta>, AsyncIterator<Delta> {
  /**
   * Resolves once the server has registered the subscriber (Subscribe's response headers), or once the
   * call ended (never rejects: a refusal, e.g. no such world, comes with the first `next()`).
   */
  readonly ready: Promise<void>;
  private cancelled = false;
  private readonly queue: Delta[] = [];
  private waiter: { resolve: (r: IteratorResult<Delta>) => void; reject: (e: SapgridError) => void } | undefined;
  private done = false;
  private error: SapgridError | undefined;

  constructor(private readonly call: grpc.ClientReadableStream<SubscribeResponse__Output>) {
    this.ready = new Promise((resolve) => {
      call.once("metadata", () => resolve());
      call.once("status", () => resolve());
    });
    call.on("data", (r: SubscribeResponse__Output) => this.push(deltaFrom(r.delta!)));
    call.on("error", (e: grpc.ServiceError) => this.finish(this.cancelled ? undefined : fromServiceError(e)));
    // grpc-js ends the readable side just before it emits a failed call's error: the end waits a turn.
    call.on("end", () => setImmediate(() => this.finish(undefined)));
  }

  private push(delta: Delta): void {
    const w = this.waiter;
    this.waiter = undefined;
    if (w) w.resolve({ value: delta, done: false });
    else this.queue.push(delta);
  }

  private finish(error: SapgridError | undefined): void {
    if (this.done) return;
    this.done = true;
    this.error = error;
    const w = this.waiter;
    this.waiter = undefined;
    if (w && error) w.reject(error);
    else if (w) w.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterator<Delta> {
    return this;
  }

  /** The next delta; done when the subscription was cancelled; rejects with the error that ended it. */
  next(): Promise<IteratorResult<Delta>> {
    const delta = this.queue.shift();
    if (delta) return Promise.resolve({ value: delta, done: false });
    if (this.done) {
      const err = this.error;
      this.error = undefined; // raised once
      return err ? Promise.reject(err) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => (this.waiter = { resolve, reject }));
  }

  /** Leaving a for-await loop (break, return, throw) ends the subscription. */
  return(): Promise<IteratorResult<Delta>> {
    this.cancel();
    return Promise.resolve({ value: undefined, done: true });
  }

  cancel(): void {
    if (this.cancelled) return;
    this.cancelled = true;
    this.queue.length = 0;
    this.call.cancel();
    this.finish(undefined);
  }
}

/** TLS credentials from the options (any of tls, caFile, certFile, keyFile), else plaintext. */
function channelCredentials(opts: ClientOptions): grpc.ChannelCredentials {
  const { tls, caFile, certFile, keyFile, token } = opts;
  if (token !== undefined && (typeof token !== "string" || !token || /[\r\n]/.test(token))) {
    throw makeError(status.INVALID_ARGUMENT, "token: expected a non-empty string on one line", "token");
  }
  if (!tls && !caFile && !certFile && !keyFile) return grpc.credentials.createInsecure();
  if (!certFile !== !keyFile) {
    throw makeError(status.INVALID_ARGUMENT, "certFile and keyFile go together (mutual TLS)", certFile ? "keyFile" : "certFile");
  }
  const read = (file: string | undefined, key: string): Buffer | null => {
    if (!file) return null;
    try {
      return readFileSync(file);
    } catch (e) {
      throw makeError(status.INVALID_ARGUMENT, `${key}: cannot read ${file}: ${(e as Error).message}`, key);
    }
  };
  return grpc.credentials.createSsl(read(caFile, "caFile"), read(keyFile, "keyFile"), read(certFile, "certFile"));
}

type Unary<Req, Res> = (req: Req, md: Metadata, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res?: Res) => void) => grpc.ClientUnaryCall;

export class Client {
  readonly address: string;
  readonly timeoutMs: number;
  readonly maxMessageBytes: number;
  /** The generated service stub (every method of the contract, snake_case fields as in the .proto). */
  readonly stub: SapgridServiceClient;
  private readonly healthStub: HealthClient;

  constructor(address: string = DEFAULT_ADDRESS, opts: ClientOptions = {}) {
    this.address = address;
    this.timeoutMs = opts.timeoutMs ?? 60_000;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    const options: grpc.ChannelOptions = {
      "grpc.max_send_message_length": this.maxMessageBytes,
      "grpc.max_receive_message_length": this.maxMessageBytes,
      "grpc.keepalive_time_ms": 30_000,
      "grpc.keepalive_timeout_ms": 20_000,
      "grpc.keepalive_permit_without_calls": 1,
      ...opts.channelOptions,
    };
    const creds = opts.credentials ?? channelCredentials(opts);
    this.token = opts.token;
    const proto = contract();
    this.stub = new proto.sapgrid.v1.SapgridService(address, creds, options);
    // The health stub shares the service stub's channel.
    this.healthStub = new proto.grpc.health.v1.Health(address, creds, { ...options, channelOverride: this.stub.getChannel() });
  }

  private readonly token: string | undefined;

  private metadata(world = ""): Metadata {
    const md = new Metadata();
    if (this.token) md.set("authorization", `Bearer ${this.token}`);
    if (world && WORLD_NAME.test(world)) md.set(WORLD_HEADER, world);
    return md;
  }

  private deadline(timeoutMs?: number): grpc.CallOptions {
    const ms = timeoutMs ?? this.timeoutMs;
    return ms > 0 ? { deadline: Date.now() + ms } : {};
  }

  private unary<Req, Res, T>(method: Unary<Req, Res>, request: Req, read: (r: Res) => T, world = "",
    timeoutMs?: number): Promise<T> {
    return new Promise((resolve, reject) => {
      method.call(this.stub, request, this.metadata(world), this.deadline(timeoutMs), (err, res) => {
        if (err) reject(fromServiceError(err));
        else {
          try {
            resolve(read(res as Res));
          } catch (e) {
            reject(e);
          }
        }
      });
    });
  }

  /** Resolves when the channel is connected (rejects Unavailable after timeoutMs). */
  waitReady(timeoutMs = 10_000): Promise<void> {
    return new Promise((resolve, reject) => {
      this.stub.waitForReady(Date.now() + timeoutMs, (err) => {
        if (err) reject(makeError(status.UNAVAILABLE, `server ${this.address} not reachable: ${err.message}`));
        else resolve();
      });
    });
  }

  /** The server's gRPC health status ("SERVING", "NOT_SERVING", ...) for a service ("" = the server). */
  health(service = "", timeoutMs?: number): Promise<string> {
    return new Promise((resolve, reject) => {
      this.healthStub.Check({ service }, this.metadata(), this.deadline(timeoutMs), (err, res) => {
        if (err) reject(fromServiceError(err));
        else resolve(String(res?.status ?? "UNKNOWN"));
      });
    });
  }

  // ---- worlds ------------------------------------------------------------------------------------
  /** Create a world (dims 2 or 3, bounds mins then maxs, cells per axis or none: the server picks). */
  createWorld(name: string, opts: WorldOptions & { ifNotExists?: boolean } = {}): Promise<WorldInfo> {
    const { ifNotExists, ...config } = opts;
    let msg;
    try {
      msg = configMessage(config);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.unary(this.stub.CreateWorld, { name, config: msg, if_not_exists: ifNotExists ?? false },
      (r: WithWorld) => infoFrom(r.world), name);
  }

  deleteWorld(name: string): Promise<void> {
    return this.unary(this.stub.DeleteWorld, { name }, () => undefined, name);
  }

  listWorlds(): Promise<WorldInfo[]> {
    return this.unary(this.stub.ListWorlds, {}, (r: ListWorldsResponse__Output) => r.worlds.map(infoFrom));
  }

  /** The server's version (from ListWorlds' answer). */
  serverVersion(): Promise<string> {
    return this.unary(this.stub.ListWorlds, {}, (r: ListWorldsResponse__Output) => r.server_version);
  }

  getWorld(name: string): Promise<WorldInfo> {
    return this.unary(this.stub.GetWorld, { name }, (r: WithWorld) => infoFrom(r.world), name);
  }

  // ---- frames ------------------------------------------------------------------------------------
  /** Apply one frame with a unary call (seq default 0; writer: exactly-once frames, see Frame.writer). */
  step(world: string, frame: FrameInput & { writer?: string } = {}, opts: { timeoutMs?: number } = {}): Promise<Delta> {
    const { writer, ...arrays } = frame;
    let msg;
    try {
      msg = encodeFrame(frame.world ?? world, u64(frame.seq ?? 0, "seq"), arrays, writer ?? "");
    } catch (e) {
      return Promise.reject(e);
    }
    return this.unary(this.stub.ApplyFrame, { frame: msg }, (r: ApplyFrameResponse__Output) => deltaFrom(r.delta!), world, opts.timeoutMs);
  }

  /**
   * Open a frame stream (frames name `world`). writer: exactly-once frames, numbered from where the
   * writer stands in the world (read with GetWorld). resume (needs a writer): reconnect with backoff and
   * send unanswered frames again when the call breaks; every delta reaches `recv` once, in order.
   * verify: check every delta's pairsDigest against a mirror of the world's pairs (the stream must be
   * the world's only writer; a difference is a DataLoss error). `openStream` opens without asking anything.
   */
  async stream(world: string, opts: StreamOptions = {}): Promise<FrameStream> {
    if (opts.resume && !opts.writer) {
      throw makeError(status.INVALID_ARGUMENT, "resume: a resuming stream needs a writer (the server tells the " +
        "frames it applied by writer and seq)", "writer");
    }
    // A resuming stream's opening calls retry a broken connection (not an unknown world) within its deadline.
    const call = <T>(attempt: () => Promise<T>, what: string): Promise<T> =>
      (opts.resume ? retrying(attempt, `world ${world}: ${what}`, backoffOf(opts.backoff), OPEN_RETRY) : attempt());
    const mirror = opts.verify ? await call(() => this.mirror(world), "mirror") : undefined;
    const firstSeq = opts.writer
      ? ((await call(() => this.getWorld(world), "where the writer stands")).writers.get(opts.writer) ?? 0n) + 1n : 1n;
    return new FrameStream(this, world, { ...opts, firstSeq, mirror });
  }

  /** A FrameStream as given (numbering from `firstSeq`, default 1), without asking the server anything. */
  openStream(world: string, opts: OpenOptions = {}): FrameStream {
    return new FrameStream(this, world, opts);
  }

  /** A PairMirror of the world's pairs now (one consistent snapshot, with its frame). */
  async mirror(world: string): Promise<PairMirror> {
    const [pairs, frame] = await this.pairsAt(world);
    return new PairMirror(pairs, frame);
  }

  /** The world's snapshot (taken between two of its frames): bytes `restore` turns into a world that
   * continues exactly like this one. */
  snapshot(world: string, opts: { timeoutMs?: number } = {}): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const call = this.stub.SnapshotWorld({ name: world }, this.metadata(world), this.deadline(opts.timeoutMs));
      const chunks: Buffer[] = [];
      call.on("data", (r: SnapshotWorldResponse__Output) => chunks.push(r.chunk));
      call.on("error", (err) => reject(fromServiceError(err)));
      call.on("end", () => setImmediate(() => resolve(Buffer.concat(chunks))));
    });
  }

  /** Create a world from a snapshot, under the snapshot's own name or `name`. */
  restore(data: Uint8Array, name = "", opts: { timeoutMs?: number } = {}): Promise<WorldInfo> {
    if (!(data instanceof Uint8Array)) {
      return Promise.reject(makeError(status.INVALID_ARGUMENT, "restore: the snapshot must be a Buffer or Uint8Array"));
    }
    return new Promise((resolve, reject) => {
      const call = this.stub.RestoreWorld(this.metadata(name), this.deadline(opts.timeoutMs), (err, res) => {
        if (err) reject(fromServiceError(err));
        else resolve(infoFrom(res!.world));
      });
      const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
      let first = true;
      for (let at = 0; at < Math.max(bytes.length, 1); at += SNAPSHOT_CHUNK) {
        call.write({ name: first ? name : "", chunk: bytes.subarray(at, at + SNAPSHOT_CHUNK) });
        first = false;
      }
      call.end();
    });
  }

  /** Freeze a world (its frames answered UNAVAILABLE "moving"; reads and snapshots still served), or
   * unfreeze it with frozen = false. */
  freeze(name: string, frozen = true): Promise<WorldInfo> {
    return this.unary(this.stub.FreezeWorld, { name, frozen }, (r: WithWorld) => infoFrom(r.world), name);
  }

  /** @internal The StreamFrames call of a FrameStream (its requests go out as the stream serialized them). */
  openFrameCall(world: string, timeoutMs?: number): FrameCall {
    const opts: grpc.CallOptions = timeoutMs ? { deadline: Date.now() + timeoutMs } : {};
    const method = contract().sapgrid.v1.SapgridService.service.StreamFrames;
    return this.stub.makeBidiStreamRequest(method.path, (b: Buffer) => b,
      method.responseDeserialize as (b: Buffer) => StreamFramesResponse__Output, this.metadata(world), opts);
  }

  // ---- queries and pairs -------------------------------------------------------------------------
  /** Sorted ids of the live boxes intersecting region (2*dims numbers, mins then maxs); boxes if asked. */
  query(world: string, region: ReadonlyArray<number> | Float32Array | Float64Array,
    opts: { includeBoxes?: boolean } = {}): Promise<QueryResult> {
    let values: number[];
    try {
      values = regionValues(region);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.unary(this.stub.QueryRegion, { world, region: values, include_boxes: opts.includeBoxes ?? false },
      (r: QueryRegionResponse__Output) => ({ ids: idsArray(r.ids), boxes: boxesArray(r.boxes), frame: BigInt(r.frame) }), world);
  }

  /** One page of the active pairs. */
  listPairs(world: string, opts: { pageSize?: number; pageToken?: string } = {}): Promise<PairsPage> {
    return this.unary(this.stub.ListPairs, { world, page_size: opts.pageSize ?? 0, page_token: opts.pageToken ?? "" },
      (r: ListPairsResponse__Output) => ({ pairs: pairsArray(r.pairs), nextPageToken: r.next_page_token, totalPairs: BigInt(r.total_pairs),
        frame: BigInt(r.frame) }), world);
  }

  /** All active pairs of one snapshot of the world, (low, high) rows sorted (streamed in chunks). */
  async pairs(world: string, opts: { chunkSize?: number; timeoutMs?: number } = {}): Promise<BigUint64Array> {
    return (await this.pairsAt(world, opts))[0];
  }

  private pairsAt(world: string, opts: { chunkSize?: number; timeoutMs?: number } = {}): Promise<[BigUint64Array, bigint]> {
    return new Promise((resolve, reject) => {
      const call = this.stub.StreamPairs({ world, chunk_size: opts.chunkSize ?? 0 }, this.metadata(world),
        this.deadline(opts.timeoutMs));
      const chunks: Buffer[] = [];
      let frame = 0n;
      call.on("data", (r: StreamPairsResponse__Output) => {
        chunks.push(r.pairs);
        frame = BigInt(r.frame);
      });
      call.on("error", (err) => reject(fromServiceError(err)));
      // grpc-js ends the readable side just before it emits a failed call's error: the end waits a turn.
      call.on("end", () => setImmediate(() => {
        try {
          resolve([joinPairs(chunks), frame]);
        } catch (e) {
          reject(e);
        }
      }));
    });
  }

  /**
   * Every delta the world produces from now on (async iterable); with a region (2*dims numbers), the
   * pairs entering and leaving the view of pairs with an object in it (the first delta holds the view).
   * `await sub.ready` before sending the frames it must see: the server registers it after this returns.
   */
  subscribe(world: string, opts: { region?: ReadonlyArray<number>; timeoutMs?: number } = {}): Subscription {
    const region = opts.region ? regionValues(opts.region) : [];
    const call = this.stub.Subscribe({ world, region }, this.metadata(world),
      opts.timeoutMs ? { deadline: Date.now() + opts.timeoutMs } : {});
    return new Subscription(call);
  }

  close(): void {
    this.healthStub.close();
    this.stub.close();
  }
}

export { SapgridError };
