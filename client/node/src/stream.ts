/**
 * Frame streams: one StreamFrames call per stream, `send` may run ahead of `recv` (pipelining), and
 * answers come back in the order the frames were sent.
 *
 * With a writer (`Frame.writer`, exactly-once frames), the stream numbers its frames from where the
 * writer stands in the world. A frame the server refuses for its content (a bad box, an unknown id)
 * takes no seq: the frames the stream numbered after it are numbered one lower and sent again on a new
 * call (the server had refused them as a gap), and the refused frame's error comes from its own `recv`.
 *
 * With `resume`, the stream also survives a lost connection, a restarted server or a frozen world: it
 * keeps every frame until its answer is handed out, reconnects with exponential backoff (for at most
 * `backoff.deadlineMs` per recovery), asks GetWorld where the writer stands, and sends the unanswered
 * frames again in order; the server answers those it had applied with the very delta it gave the first
 * time, so each delta reaches `recv` exactly once, in order.
 */
import { status } from "@grpc/grpc-js";
import type { ClientDuplexStream, ServiceError } from "@grpc/grpc-js";

import { deltaFrom, encodeFrame, u64 } from "./codec";
import type { Delta, FrameInput, WorldInfo } from "./codec";
import { fromFrameError, fromServiceError, makeError, SapgridError } from "./errors";
import type { Frame } from "./generated/sapgrid/v1/Frame";
import type { PairMirror } from "./mirror";
import { contract } from "./proto";
import type { StreamFramesRequest } from "./generated/sapgrid/v1/StreamFramesRequest";
import type { StreamFramesResponse__Output } from "./generated/sapgrid/v1/StreamFramesResponse";

/** A StreamFrames call whose requests are sent already serialized (each frame is encoded once, at send). */
export type FrameCall = ClientDuplexStream<Buffer, StreamFramesResponse__Output>;
type Call = FrameCall;

/** What a FrameStream needs of its client. */
export interface StreamHost {
  openFrameCall(world: string, timeoutMs?: number): FrameCall;
  getWorld(name: string): Promise<WorldInfo>;
  readonly maxMessageBytes: number;
}

/** Recovery of a resuming stream: delays double from initialMs up to maxMs; an error after deadlineMs. */
export interface Backoff {
  initialMs?: number;
  maxMs?: number;
  deadlineMs?: number;
}

export interface StreamOptions {
  /** Exactly-once frames: the writer's name (1-64 characters of [A-Za-z0-9_.-]). */
  writer?: string;
  /** Reconnect and send unanswered frames again when the call breaks (needs a writer). */
  resume?: boolean;
  /** Check every delta's pairsDigest against a mirror of the world's pairs (DataLoss on a difference). */
  verify?: boolean;
  /** Deadline of the whole call (ms); none by default. */
  timeoutMs?: number;
  backoff?: Backoff;
}

/** What `openStream` takes besides StreamOptions: where numbering starts, and a mirror to verify with. */
export interface OpenOptions extends StreamOptions {
  /** Seq of the first frame the stream numbers (default 1). */
  firstSeq?: bigint | number;
  mirror?: PairMirror;
}

interface Waiter {
  resolve: (d: Delta) => void;
  reject: (e: SapgridError) => void;
}

type Answer = { delta: Delta } | { error: SapgridError };

interface Pending {
  seq: bigint;
  /** The serialized StreamFramesRequest: encoded once, when sent (the caller may reuse its arrays at once). */
  request: Buffer;
  numbered: boolean; // numbered by the stream (renumbered after a refused frame)
}

// A call that ended with one of these is opened again (resume); a frame answered with one of these in its
// slot (a frozen or moving world, a failed log write, a world gone from a replica it moved away from) is
// sent again.
const CALL_RETRY = new Set([status.UNAVAILABLE, status.CANCELLED, status.UNKNOWN, status.RESOURCE_EXHAUSTED,
  status.NOT_FOUND, status.INTERNAL]);
const FRAME_RETRY = new Set([status.UNAVAILABLE, status.NOT_FOUND]);

function serialize(request: StreamFramesRequest): Buffer {
  return contract().sapgrid.v1.StreamFramesRequest.serialize(request);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The backoff of a resuming stream with its defaults filled in. */
export function backoffOf(b: Backoff = {}): Required<Backoff> {
  return { initialMs: 50, maxMs: 1000, deadlineMs: 60_000, ...b };
}

/**
 * `attempt()`, again with exponential backoff while it fails with a code worth retrying (a broken
 * connection, a restarting server), for at most `deadlineMs`; then its last error, saying so. Opening a
 * resuming stream uses it without NOT_FOUND (an unknown world fails at once).
 */
export async function retrying<T>(attempt: () => Promise<T>, what: string, backoff: Required<Backoff>,
  retry: ReadonlySet<number> = CALL_RETRY): Promise<T> {
  const giveUp = Date.now() + backoff.deadlineMs;
  let delay = backoff.initialMs;
  for (;;) {
    let last: SapgridError;
    try {
      return await attempt();
    } catch (e) {
      last = fromServiceError(e as Error);
      if (!retry.has(last.code)) throw last;
    }
    if (Date.now() + delay > giveUp) {
      throw makeError(last.code, `${what}: gave up after ${backoff.deadlineMs / 1000} s: ${last.message}`);
    }
    await sleep(delay);
    delay = Math.min(delay * 2, backoff.maxMs);
  }
}

// Recovering retries what a broken call ends with (CANCELLED here is a call the transport cancelled: a
// stream this client closes stops recovering first).
const RECOVER_RETRY: ReadonlySet<number> = CALL_RETRY;

/** The codes opening a resuming stream retries: those of a broken call, but not an unknown world. */
export const OPEN_RETRY: ReadonlySet<number> = new Set([...CALL_RETRY].filter((c) => c !== status.NOT_FOUND));

/** One StreamFrames call: `send` frames ahead, `recv` their answers in order (`step` = send + recv). */
export class FrameStream {
  readonly world: string;
  readonly writer: string;
  readonly resume: boolean;
  /** The mirror deltas are verified against (verify), if any. */
  readonly mirror: PairMirror | undefined;
  /** Times the call was opened again after it broke (resume). */
  reconnects = 0;
  /** Frames sent again after a reconnection, and how many of them the server had applied already
   * (answered with the deltas it kept, not applied again). */
  resent = 0;
  resentApplied = 0;

  private call: Call | undefined;
  private nextSeq: bigint;
  private readonly pending: Pending[] = [];
  private readonly answers: Answer[] = [];
  private readonly waiters: Waiter[] = [];
  private failure: SapgridError | undefined;
  private closed = false;
  private recovering = false;
  private readonly backoff: Required<Backoff>;
  private readonly timeoutMs: number | undefined;

  constructor(private readonly host: StreamHost, world: string, opts: OpenOptions = {}) {
    this.world = world;
    this.writer = opts.writer ?? "";
    this.resume = opts.resume ?? false;
    if (this.resume && !this.writer) {
      throw makeError(status.INVALID_ARGUMENT, "resume: a resuming stream needs a writer (the server tells the " +
        "frames it applied by writer and seq)", "writer");
    }
    this.mirror = opts.mirror;
    this.timeoutMs = opts.timeoutMs;
    this.nextSeq = u64(opts.firstSeq ?? 1, "firstSeq");
    this.backoff = backoffOf(opts.backoff);
    this.call = this.open();
  }

  /** Frames sent and not yet answered by the server. */
  get inFlight(): number {
    return this.pending.length;
  }

  private open(): Call {
    const call = this.host.openFrameCall(this.world, this.timeoutMs);
    call.on("data", (resp: StreamFramesResponse__Output) => this.onData(call, resp));
    call.on("error", (err: ServiceError) => this.onEnded(call, fromServiceError(err)));
    call.on("end", () => setImmediate(() => this.onEnded(call, makeError(status.UNAVAILABLE, "stream closed by the server"))));
    for (const p of this.pending) call.write(p.request);
    return call;
  }

  private drop(call: Call | undefined): void {
    if (!call) return;
    call.removeAllListeners();
    call.on("error", () => undefined);
    call.end();
    call.cancel();
  }

  /**
   * Send one frame; returns its seq: the frame's `seq`, or the stream's next number (1, 2, ... or, with
   * a writer, from where the writer stands). An explicit seq is sent as given and numbering goes on after it.
   */
  send(frame: FrameInput = {}): bigint {
    if (this.closed) throw makeError(status.CANCELLED, "send: the stream is closed");
    if (this.failure) throw this.failure;
    const numbered = frame.seq === undefined;
    const seq = numbered ? this.nextSeq : u64(frame.seq!, "seq");
    const msg = encodeFrame(frame.world ?? this.world, seq, frame, this.writer);
    this.push(seq, msg, numbered);
    return seq;
  }

  /**
   * Send a ready Frame message as is (snake_case fields of the .proto, bulk fields as Buffers: e.g. the
   * exact bytes of a conformance vector); returns its seq.
   */
  sendMessage(frame: Frame): bigint {
    if (this.closed) throw makeError(status.CANCELLED, "send: the stream is closed");
    if (this.failure) throw this.failure;
    const seq = u64(BigInt(String(frame.seq ?? 0)), "seq");
    this.push(seq, { world: this.world, writer: this.writer, ...frame }, false);
    return seq;
  }

  private push(seq: bigint, msg: Frame, numbered: boolean): void {
    const request = serialize({ frame: msg });
    if (request.length > this.host.maxMessageBytes) {
      throw makeError(status.RESOURCE_EXHAUSTED, `frame: ${request.length} bytes is more than the message limit of ` +
        `${this.host.maxMessageBytes} bytes; raise it on both sides (maxMessageBytes and sapgrid serve ` +
        `--max-message-bytes) or send the objects in several frames`, "frame");
    }
    if (seq >= this.nextSeq) this.nextSeq = seq + 1n;
    this.pending.push({ seq, request, numbered });
    if (this.call && !this.recovering) this.call.write(request);
  }

  /** The answer to the oldest unanswered frame; rejects with its typed error if it was refused. */
  recv(): Promise<Delta> {
    const answer = this.answers.shift();
    if (answer) return "delta" in answer ? Promise.resolve(answer.delta) : Promise.reject(answer.error);
    if (this.failure) return Promise.reject(this.failure);
    if (this.closed) return Promise.reject(makeError(status.CANCELLED, "recv: the stream is closed"));
    if (this.waiters.length >= this.pending.length) {
      return Promise.reject(makeError(status.FAILED_PRECONDITION, "recv() with no frame in flight"));
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** send + recv. */
  step(frame: FrameInput = {}): Promise<Delta> {
    try {
      this.send(frame);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.recv();
  }

  /** Resolves when the transport has taken every frame sent so far (back-pressure for long pipelines). */
  drained(): Promise<void> {
    const call = this.call;
    if (!call || this.recovering || !call.writableNeedDrain) return Promise.resolve();
    return new Promise((resolve) => call.once("drain", () => resolve()));
  }

  /** End the stream; answers still in flight are discarded and waiting `recv`s reject CANCELLED. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.drop(this.call);
    this.call = undefined;
    this.fail(makeError(status.CANCELLED, "the stream is closed"));
  }

  private deliver(answer: Answer): void {
    const w = this.waiters.shift();
    if (!w) this.answers.push(answer);
    else if ("delta" in answer) w.resolve(answer.delta);
    else w.reject(answer.error);
  }

  private fail(err: SapgridError): void {
    if (!this.failure) this.failure = err;
    for (const w of this.waiters.splice(0)) w.reject(this.failure);
  }

  private onData(call: Call, resp: StreamFramesResponse__Output): void {
    if (call !== this.call) return;
    const head = this.pending[0];
    if (!head) {
      this.fail(makeError(status.INTERNAL, `an answer (seq ${resp.seq}) for no frame sent`));
      return;
    }
    if (resp.result === "error" && resp.error && this.resume && FRAME_RETRY.has(resp.error.code)) {
      this.recover(fromFrameError(resp.error)); // e.g. a frozen world: sent again later
      return;
    }
    this.pending.shift();
    if (resp.result === "delta" && resp.delta) {
      const delta = deltaFrom(resp.delta);
      try {
        this.deliver({ delta: this.mirror ? this.mirror.apply(delta) : delta });
      } catch (e) {
        this.deliver({ error: e as SapgridError });
      }
      return;
    }
    this.deliver({ error: resp.error ? fromFrameError(resp.error) : makeError(status.INTERNAL, "an answer with neither delta nor error") });
    if (this.writer && head.numbered) this.renumberAfter(head.seq);
  }

  /** A refused frame took no seq: the stream's frames after it go one lower, sent again on a new call. */
  private renumberAfter(refused: bigint): void {
    for (const p of this.pending) {
      if (p.numbered && p.seq > refused) {
        p.seq -= 1n;
        const { frame } = contract().sapgrid.v1.StreamFramesRequest.deserialize(p.request);
        p.request = serialize({ frame: { ...frame!, seq: p.seq.toString() } });
      }
    }
    this.nextSeq -= 1n;
    if (this.pending.length && !this.recovering) {
      this.drop(this.call);
      this.call = this.open();
    }
  }

  private onEnded(call: Call, err: SapgridError): void {
    if (call !== this.call || this.closed) return;
    if (this.resume && CALL_RETRY.has(err.code)) {
      this.recover(err);
      return;
    }
    this.call = undefined;
    this.fail(err);
  }

  private recover(cause: SapgridError): void {
    if (this.recovering) return;
    this.recovering = true;
    this.drop(this.call);
    this.call = undefined;
    void this.recoverLoop(cause);
  }

  private async recoverLoop(cause: SapgridError): Promise<void> {
    const where = async (): Promise<bigint> => {
      if (this.closed) throw makeError(status.ABORTED, "the stream is closed"); // ends the retries
      const info = await this.host.getWorld(this.world);
      if (info.frozen) throw makeError(status.UNAVAILABLE, `world ${this.world} is frozen (moving)`);
      const stands = info.writers.get(this.writer) ?? 0n;
      const first = this.pending[0]?.seq ?? this.nextSeq;
      if (stands < first - 1n) {
        throw makeError(status.DATA_LOSS, `world ${this.world}: writer ${this.writer} stands at seq ${stands} but ` +
          `the server had answered its frames up to seq ${first - 1n}: answered frames were lost (a server ` +
          `without a data directory, or with --fsync no, restarted)`, "writer");
      }
      return stands;
    };
    let stands: bigint;
    try {
      stands = await retrying(where, `world ${this.world}: could not resume writer ${this.writer} (${cause.message})`,
        this.backoff, RECOVER_RETRY);
    } catch (e) {
      this.recovering = false;
      if (!this.closed) this.fail(e as SapgridError);
      return;
    }
    if (this.closed) return;
    for (const p of this.pending) {
      this.resent++;
      if (p.seq <= stands) this.resentApplied++;
    }
    this.reconnects++;
    this.recovering = false;
    this.call = this.open();
  }
}
