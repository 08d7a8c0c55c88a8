/**
 * Typed arrays <-> the contract's bulk `bytes` fields, and the client's result types.
 *
 * Layouts (proto/sapgrid/v1/frame.proto): little-endian ids uint64 (BigUint64Array), boxes float32 rows
 * of 2*dims values, mins then maxs (Float32Array), pairs uint64 rows (low id, high id)
 * (BigUint64Array, 2 values a pair), category/mask uint32 (Uint32Array), static one byte (Uint8Array).
 * Typed arrays are sent as views of their memory (no copy, no per-element loop); received bytes are
 * read as typed-array views of the received Buffer, copied once (one memcpy) into a fresh buffer only
 * when the Buffer does not start on a multiple of the element size (typed arrays need aligned views).
 */
import { endianness } from "node:os";
import { status } from "@grpc/grpc-js";

import { makeError } from "./errors";
import type { Delta__Output } from "./generated/sapgrid/v1/Delta";
import type { Frame } from "./generated/sapgrid/v1/Frame";
import type { FrameStats__Output } from "./generated/sapgrid/v1/FrameStats";
import type { WorldConfig } from "./generated/sapgrid/v1/WorldConfig";
import type { WorldConfig__Output } from "./generated/sapgrid/v1/WorldConfig";
import type { WorldInfo__Output } from "./generated/sapgrid/v1/WorldInfo";

if (endianness() !== "LE") {
  throw new Error("sapgrid client: the wire's bulk arrays are little-endian; this machine is big-endian");
}

/** Ids: a BigUint64Array (sent as is), or an array of non-negative integers (number or bigint). */
export type IdsInput = BigUint64Array | ReadonlyArray<number | bigint>;
/** Boxes: a Float32Array of rows of 2*dims values (sent as is), or numbers / a Float64Array (converted to float32). */
export type BoxesInput = Float32Array | Float64Array | ReadonlyArray<number>;
/** Category / mask bits: a Uint32Array, or an array of integers 0..2^32-1. */
export type BitsInput = Uint32Array | ReadonlyArray<number>;
/** Static flags: a Uint8Array of 0/1, or booleans. */
export type StaticInput = Uint8Array | ReadonlyArray<boolean | number>;

/** The arrays of one frame (every field optional; removes, then updates, then adds). */
export interface FrameArrays {
  removeIds?: IdsInput;
  addIds?: IdsInput;
  addBoxes?: BoxesInput;
  addCategory?: BitsInput;
  addMask?: BitsInput;
  addStatic?: StaticInput;
  updateIds?: IdsInput;
  updateBoxes?: BoxesInput;
}

/** A frame as given to `step` / `send`: its arrays, and optionally its seq and the world it names. */
export interface FrameInput extends FrameArrays {
  seq?: bigint | number;
  world?: string;
}

const FRAME_KEYS: Record<string, [string, (v: unknown, key: string) => Buffer]> = {
  removeIds: ["remove_ids", idsBytes],
  addIds: ["add_ids", idsBytes],
  addBoxes: ["add_boxes", boxesBytes],
  addCategory: ["add_category", bitsBytes],
  addMask: ["add_mask", bitsBytes],
  addStatic: ["add_static", staticBytes],
  updateIds: ["update_ids", idsBytes],
  updateBoxes: ["update_boxes", boxesBytes],
};

function badInput(message: string): never {
  throw makeError(status.INVALID_ARGUMENT, message);
}

function viewBytes(a: ArrayBufferView): Buffer {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength);
}

const U64_MAX = (1n << 64n) - 1n;

/** uint64 little-endian bytes of ids (a view of a BigUint64Array; plain arrays are checked and converted). */
export function idsBytes(value: unknown, key = "ids"): Buffer {
  if (value instanceof BigUint64Array) return viewBytes(value);
  if (!Array.isArray(value)) {
    badInput(`${key}: expected a BigUint64Array or an array of integers, got ${describe(value)}`);
  }
  const out = new BigUint64Array(value.length);
  value.forEach((v, i) => {
    let b: bigint;
    if (typeof v === "bigint") b = v;
    else if (typeof v === "number" && Number.isSafeInteger(v)) b = BigInt(v);
    else badInput(`${key}[${i}]: ${String(v)} is not an integer id (use a bigint past 2^53)`);
    if (b < 0n || b > U64_MAX) badInput(`${key}[${i}]: ${b} is outside 0..2^64-1`);
    out[i] = b;
  });
  return viewBytes(out);
}

/** float32 little-endian bytes of boxes (a view of a Float32Array; others converted to float32). */
export function boxesBytes(value: unknown, key = "boxes"): Buffer {
  if (value instanceof Float32Array) return viewBytes(value);
  if (value instanceof Float64Array) return viewBytes(new Float32Array(value));
  if (!Array.isArray(value)) badInput(`${key}: expected a Float32Array or an array of numbers, got ${describe(value)}`);
  value.forEach((v, i) => {
    if (typeof v !== "number") badInput(`${key}[${i}]: ${String(v)} is not a number`);
  });
  return viewBytes(Float32Array.from(value as number[]));
}

/** uint32 little-endian bytes of category / mask bits. */
export function bitsBytes(value: unknown, key = "bits"): Buffer {
  if (value instanceof Uint32Array) return viewBytes(value);
  if (!Array.isArray(value)) badInput(`${key}: expected a Uint32Array or an array of integers, got ${describe(value)}`);
  value.forEach((v, i) => {
    if (!(Number.isInteger(v) && v >= 0 && v <= 0xffffffff)) badInput(`${key}[${i}]: ${String(v)} is not a uint32`);
  });
  return viewBytes(Uint32Array.from(value as number[]));
}

/** One byte (0 or 1) per static flag. */
export function staticBytes(value: unknown, key = "static"): Buffer {
  if (value instanceof Uint8Array) return viewBytes(value);
  if (!Array.isArray(value)) badInput(`${key}: expected a Uint8Array or an array of booleans, got ${describe(value)}`);
  value.forEach((v, i) => {
    if (!(v === true || v === false || v === 0 || v === 1)) badInput(`${key}[${i}]: ${String(v)} is not a boolean`);
  });
  return viewBytes(Uint8Array.from(value as Array<boolean | number>, Number));
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (ArrayBuffer.isView(v)) return v.constructor.name;
  return typeof v === "object" ? (v.constructor?.name ?? "object") : typeof v;
}

/** The uint64 of a seq / frame number (a non-negative safe integer or a bigint below 2^64). */
export function u64(value: bigint | number, key: string): bigint {
  let b: bigint;
  if (typeof value === "bigint") b = value;
  else if (typeof value === "number" && Number.isSafeInteger(value)) b = BigInt(value);
  else badInput(`${key}: ${String(value)} is not an integer`);
  if (b < 0n || b > U64_MAX) badInput(`${key}: ${b} is outside 0..2^64-1`);
  return b;
}

/** The Frame message of a FrameInput (every array checked; unknown keys refused). */
export function encodeFrame(world: string, seq: bigint, frame: FrameArrays, writer = ""): Frame {
  const msg: Frame = { world, seq: seq.toString(), writer };
  if (frame === null || typeof frame !== "object") badInput(`frame: expected an object of arrays, got ${describe(frame)}`);
  for (const [key, value] of Object.entries(frame)) {
    if (key === "seq" || key === "world") continue;
    const spec = FRAME_KEYS[key];
    if (!spec) {
      badInput(`frame: unknown key '${key}' (known: ${Object.keys(FRAME_KEYS).join(", ")}, seq, world)`);
    }
    if (value === undefined || value === null) continue;
    (msg as Record<string, unknown>)[spec[0]] = spec[1](value, key);
  }
  return msg;
}

function aligned(buf: Buffer, align: number): Uint8Array {
  // Typed-array views need byteOffset % element size == 0; received Buffers are slices at any offset.
  return buf.byteOffset % align === 0 ? buf : new Uint8Array(buf);
}

function checkRows(buf: Buffer, rowBytes: number, what: string): void {
  if (buf.byteLength % rowBytes !== 0) {
    throw makeError(status.INTERNAL, `${what}: ${buf.byteLength} bytes is not a whole number of ${rowBytes}-byte rows`);
  }
}

/** A uint64 field (ids) as a BigUint64Array view of the received bytes. */
export function idsArray(buf: Buffer | Uint8Array, what = "ids"): BigUint64Array {
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  checkRows(b, 8, what);
  const a = aligned(b, 8);
  return new BigUint64Array(a.buffer, a.byteOffset, a.byteLength / 8);
}

/** A pairs field as a BigUint64Array of (low, high) rows: pair k is [2k], [2k+1]. */
export function pairsArray(buf: Buffer | Uint8Array, what = "pairs"): BigUint64Array {
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  checkRows(b, 16, what);
  return idsArray(b, what);
}

/** A float32 field (boxes) as a Float32Array view of the received bytes. */
export function boxesArray(buf: Buffer, what = "boxes"): Float32Array {
  checkRows(buf, 4, what);
  const a = aligned(buf, 4);
  return new Float32Array(a.buffer, a.byteOffset, a.byteLength / 4);
}

/** Chunks of pairs joined into one BigUint64Array (one copy of each chunk into one new buffer). */
export function joinPairs(chunks: Buffer[]): BigUint64Array {
  if (chunks.length === 1) return pairsArray(chunks[0]);
  chunks.forEach((c) => checkRows(c, 16, "pairs"));
  return idsArray(Buffer.concat(chunks), "pairs");
}

/** Counters and timings (seconds) of one applied frame. */
export interface FrameStats {
  objects: number;
  pairs: number;
  created: number;
  deleted: number;
  swaps: number;
  cellsTouched: number;
  cellOverflows: number;
  validateSeconds: number;
  rasterizeSeconds: number;
  applySeconds: number;
  mergeSeconds: number;
  engineSeconds: number;
  queueSeconds: number;
  serverSeconds: number;
}

/**
 * The answer to a frame. created / deleted: BigUint64Array of (low id, high id) rows, sorted
 * (pair k is [2k], [2k+1]); frame: frames the world has applied, this one included; pairsDigest:
 * the digest of the world's pairs after the frame (see `pairsDigest`).
 */
export interface Delta {
  seq: bigint;
  world: string;
  frame: bigint;
  created: BigUint64Array;
  deleted: BigUint64Array;
  pairsDigest: bigint;
  stats: FrameStats;
}

export interface WorldConfigInfo {
  dims: number;
  bounds: number[];
  cells: number[];
  threads: number;
  maxObjects: bigint;
  coordLimit: number;
  expectedObjects: bigint;
}

/** A world as the server describes it. */
export interface WorldInfo {
  name: string;
  config: WorldConfigInfo;
  generation: bigint;
  objects: number;
  pairs: number;
  frames: bigint;
  framesRejected: number;
  queueDepth: number;
  subscribers: number;
  lastFrame: FrameStats | null;
  pairsDigest: bigint;
  /** Exactly-once frames: each writer the world knows -> the seq of its last applied frame. */
  writers: Map<string, bigint>;
  frozen: boolean;
}

/** Options of a world's configuration (`createWorld`). */
export interface WorldOptions {
  dims?: number;
  bounds?: ReadonlyArray<number>;
  cells?: ReadonlyArray<number>;
  threads?: number;
  maxObjects?: bigint | number;
  coordLimit?: number;
  expectedObjects?: bigint | number;
}

export function statsFrom(s: FrameStats__Output | null): FrameStats {
  return {
    objects: Number(s?.objects ?? 0),
    pairs: Number(s?.pairs ?? 0),
    created: Number(s?.created ?? 0),
    deleted: Number(s?.deleted ?? 0),
    swaps: Number(s?.swaps ?? 0),
    cellsTouched: Number(s?.cells_touched ?? 0),
    cellOverflows: Number(s?.cell_overflows ?? 0),
    validateSeconds: s?.validate_seconds ?? 0,
    rasterizeSeconds: s?.rasterize_seconds ?? 0,
    applySeconds: s?.apply_seconds ?? 0,
    mergeSeconds: s?.merge_seconds ?? 0,
    engineSeconds: s?.engine_seconds ?? 0,
    queueSeconds: s?.queue_seconds ?? 0,
    serverSeconds: s?.server_seconds ?? 0,
  };
}

export function deltaFrom(d: Delta__Output): Delta {
  return {
    seq: BigInt(d.seq),
    world: d.world,
    frame: BigInt(d.frame),
    created: pairsArray(d.created, "created"),
    deleted: pairsArray(d.deleted, "deleted"),
    pairsDigest: BigInt(d.pairs_digest),
    stats: statsFrom(d.stats),
  };
}

function configFrom(c: WorldConfig__Output | null): WorldConfigInfo {
  return {
    dims: c?.dims ?? 0,
    bounds: [...(c?.bounds ?? [])],
    cells: [...(c?.cells ?? [])],
    threads: c?.threads ?? 0,
    maxObjects: BigInt(c?.max_objects ?? 0),
    coordLimit: c?.coord_limit ?? 0,
    expectedObjects: BigInt(c?.expected_objects ?? 0),
  };
}

export function infoFrom(w: WorldInfo__Output | null): WorldInfo {
  const s = w?.stats;
  return {
    name: w?.name ?? "",
    config: configFrom(w?.config ?? null),
    generation: BigInt(w?.generation ?? 0),
    objects: Number(s?.objects ?? 0),
    pairs: Number(s?.pairs ?? 0),
    frames: BigInt(s?.frames ?? 0),
    framesRejected: Number(s?.frames_rejected ?? 0),
    queueDepth: s?.queue_depth ?? 0,
    subscribers: s?.subscribers ?? 0,
    lastFrame: s?.last_frame ? statsFrom(s.last_frame) : null,
    pairsDigest: BigInt(s?.pairs_digest ?? 0),
    writers: new Map(Object.entries(s?.writers ?? {}).map(([k, v]) => [k, BigInt(v)])),
    frozen: s?.frozen ?? false,
  };
}

/** The WorldConfig message of createWorld's options (bounds default to 0..1000 on every axis). */
export function configMessage(opts: WorldOptions): WorldConfig {
  const dims = opts.dims ?? 2;
  const bounds = opts.bounds ?? [...Array(dims).fill(0), ...Array(dims).fill(1000)];
  return {
    dims,
    bounds: [...bounds],
    cells: [...(opts.cells ?? [])],
    threads: opts.threads ?? 0,
    max_objects: u64(opts.maxObjects ?? 0, "maxObjects").toString(),
    coord_limit: opts.coordLimit ?? 0,
    expected_objects: u64(opts.expectedObjects ?? 0, "expectedObjects").toString(),
  };
}

/** A region (2*dims numbers, mins then maxs) as the message's repeated double. */
export function regionValues(region: ReadonlyArray<number> | Float32Array | Float64Array, key = "region"): number[] {
  const values = Array.from(region as ArrayLike<number>);
  values.forEach((v, i) => {
    if (typeof v !== "number") badInput(`${key}[${i}]: ${String(v)} is not a number`);
  });
  return values;
}
