/**
 * Frame streams: one StreamFrames call per stream, `send` may run ahead of `recv` (pipelining), and
 * answers come back in the order the frames were sent.
 *
 * With a writer (`Frame.writer`), frames are numbered by the stream (seq = the writer's next seq) and
 * the server applies each at most once. With `resume`, the stream also survives a lost connection or a
 * restarted server: it keeps every frame not yet answered, reconnects with exponential backoff, asks
 * GetWorld where the writer stands, and sends the unanswered frames again in order; the server answers
 * a frame it had already applied with the very delta it gave the first time, so each delta is handed to
 * `recv` exactly once, in order.
 */
import { Metadata, status } from "@grpc/grpc-js";
import type { ClientDuplexStream, ServiceError } from "@grpc/grpc-js";

import { deltaFrom, encodeFrame, u64 } from "./codec";
import type { Delta, FrameInput, WorldInfo } from "./codec";
import { fromFrameError, fromServiceError, makeError, SapgridError } from "./errors";
import type { Frame } from "./generated/sapgrid/v1/Frame";
import type { StreamFramesRequest } from "./generated/sapgrid/v1/StreamFramesRequest";
import type { StreamFramesResponse__Output } from "./generated/sapgrid/v1/StreamFramesResponse";

type Call = ClientDuplexStream<StreamFramesRequest, StreamFramesResponse__Output>;

/** What a FrameStream needs of its client. */
export interface StreamHost {
  openFrameCall(world: string, timeoutMs?: number): Call;
  getWorld(name: string): Promise<WorldInfo>;
  readonly maxMessageBytes: number;
}

/** Reconnection of a resuming stream: delays double from initialMs up to maxMs; give up after maxAttempts. */
export interface Backoff {
  initialMs?: number;
  maxMs?: number;
  maxAttempts?: number;
}

export interface StreamOptions {
  /** Exactly-once frames: the writer's name (1-64 characters of [A-Za-z0-9_.-]). */
  writer?: string;
  /** Reconnect and re-send unanswered frames when the connection is lost (needs a writer). */
  resume?: boolean;
  /** Seq of the first frame when frames are numbered by the stream (default 1; resume: the writer's last + 1). */
  firstSeq?: bigint | number;
  /** Deadline of the whole stream (ms); none by default. */
  timeoutMs?: number;
  backoff?: Backoff;
}

interface Waiter {
  resolve: (d: Delta) => void;
  reject: (e: SapgridError) => void;
}

type Answer = { delta: Delta } | { error: SapgridError };

interface Pending {
  seq: bigint;
  request: StreamFramesRequest;
}

const TRANSIENT = new Set([status.UNAVAILABLE]);

function frameBytes(f: Frame): number {
  let n = 64 + Buffer.byteLength(f.world ?? "") + Buffer.byteLength(f.writer ?? "");
  for (const k of ["remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static", "update_ids",
    "update_boxes"] as const) {
    const v = f[k];
    if (v) n += v.length + 6;
  }
  return n;
}

/** One StreamFrames call: `send` frames ahead, `recv` their answers in order (`step` = send + recv). */
export class FrameStream {
  readonly world: string;
  readonly writer: string;
  readonly resume: boolean;
  /** Frames sent and not yet answered by the server. */
  get inFlight(): number {
    return this.pending.length;
  }

  private call: Call | undefined;
  private nextSeq: bigint;
  private readonly pending: Pending[] = [];
  private readonly answers: Answer[] = [];
  private readonly waiters: Waiter[] = [];
  private failure: SapgridError | undefined;
  private closed = false;
  private reconnecting = false;
  private rewindTo: bigint | undefined;
  private readonly backoff: Required<Backoff>;
  /** Reconnections made so far (resuming streams). */
  reconnects = 0;
  /** Frames sent again after a reconnection, and how many of them the server had applied already
   * (answered with the deltas it kept, not applied again). */
  resent = 0;
  resentApplied = 0;

  constructor(private readonly host: StreamHost, world: string, private readonly opts: StreamOptions = {},
    firstSeq?: bigint) {
    this.world = world;
    this.writer = opts.writer ?? "";
    this.resume = opts.resume ?? false;
    if (this.resume && !this.writer) {
      throw makeError(status.INVALID_ARGUMENT, "resume: a resuming stream needs a writer (stream(world, {writer, resume: true}))", "writer");
    }
    this.nextSeq = firstSeq ?? u64(opts.firstSeq ?? 1, "firstSeq");
    this.backoff = { initialMs: 50, maxMs: 2000, maxAttempts: 30, ...opts.backoff };
    this.call = this.open();
  }

  private open(): Call {
    const call = this.host.openFrameCall(this.world, this.opts.timeoutMs);
    call.on("data", (resp: StreamFramesResponse__Output) => this.onData(call, resp));
    call.on("error", (err: ServiceError) => this.onFailure(call, fromServiceError(err)));
    call.on("end", () => setImmediate(() => this.onFailure(call, makeError(status.UNAVAILABLE, "stream closed by the server"))));
    return call;
  }

  /**
   * Send one frame; returns its seq. Without a writer, seq is the frame's `seq` or the stream's
   * count (1, 2, ...); with a writer, the stream numbers the frames (the writer's next seq).
   */
  send(frame: FrameInput = {}): bigint {
    if (this.closed) throw makeError(status.CANCELLED, "send: the stream is closed");
    if (this.failure) throw this.failure;
    let seq: bigint;
    if (this.writer) {
      if (frame.seq !== undefined) {
        throw makeError(status.INVALID_ARGUMENT, "seq: a writer's stream numbers its frames itself; give no seq", "seq");
      }
      seq = this.nextSeq;
    } else {
      seq = frame.seq === undefined ? this.nextSeq : u64(frame.seq, "seq");
    }
    const world = frame.world ?? this.world;
    const msg = encodeFrame(world, seq, frame, this.writer);
    const size = frameBytes(msg);
    if (size > this.host.maxMessageBytes) {
      throw makeError(status.RESOURCE_EXHAUSTED, `frame: ${size} bytes is more than the message limit of ` +
        `${this.host.maxMessageBytes} bytes; raise it on both sides (maxMessageBytes and sapgrid serve ` +
        `--max-message-bytes) or send the objects in several frames`, "frame");
    }
    this.nextSeq = seq + 1n;
    const request: StreamFramesRequest = { frame: msg };
    this.pending.push({ seq, request });
    if (this.call && !this.reconnecting) this.call.write(request);
    return seq;
  }

  /**
   * Send a ready Frame message as is (snake_case fields of the .proto, bulk fields as Buffers: e.g. the
   * exact bytes of a conformance vector); returns its seq. Not on a writer's stream (it numbers frames).
   */
  sendMessage(frame: Frame): bigint {
    if (this.closed) throw makeError(status.CANCELLED, "send: the stream is closed");
    if (this.failure) throw this.failure;
    if (this.writer) {
      throw makeError(status.INVALID_ARGUMENT, "sendMessage: a writer's stream numbers its frames; use send()", "frame");
    }
    const seq = u64(BigInt(String(frame.seq ?? 0)), "seq");
    const request: StreamFramesRequest = { frame: { world: this.world, ...frame } };
    this.pending.push({ seq, request });
    if (this.call && !this.reconnecting) this.call.write(request);
    return seq;
  }

  /** The answer to the oldest unanswered frame; rejects with its typed error if it was refused. */
  recv(): Promise<Delta> {
    const answer = this.answers.shift();
    if (answer) return "delta" in answer ? Promise.resolve(answer.delta) : Promise.reject(answer.error);
    if (this.failure) return Promise.reject(this.failure);
    if (this.closed) return Promise.reject(makeError(status.CANCELLED, "recv: the stream is closed"));
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** send + recv. */
  step(frame: FrameInput = {}): Promise<Delta> {
    this.send(frame);
    return this.recv();
  }

  /** Resolves when the transport has taken every frame sent so far (back-pressure for long pipelines). */
  drained(): Promise<void> {
    const call = this.call;
    if (!call || this.reconnecting || !call.writableNeedDrain) return Promise.resolve();
    return new Promise((resolve) => call.once("drain", () => resolve()));
  }

  /** End the stream; answers still in flight are discarded and waiting `recv`s reject CANCELLED. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    const call = this.call;
    this.call = undefined;
    if (call) {
      call.removeAllListeners();
      call.on("error", () => undefined);
      call.end();
      call.cancel();
    }
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
    if (resp.result === "error" && resp.error && this.resume && TRANSIENT.has(resp.error.code)) {
      // The world cannot take frames right now (e.g. frozen while it moves): try again later.
      this.reconnect(call, fromFrameError(resp.error));
      return;
    }
    this.pending.shift();
    if (resp.result === "delta" && resp.delta) {
      this.rewindTo = undefined;
      this.deliver({ delta: deltaFrom(resp.delta) });
    } else {
      const err = resp.error ? fromFrameError(resp.error) : makeError(status.INTERNAL, "an answer with neither delta nor error");
      // A refused frame does not advance its writer: once every frame after it is answered (refused
      // too), the next frame takes its seq again so the writer's sequence has no gap.
      if (this.writer && this.rewindTo === undefined) this.rewindTo = head.seq;
      this.deliver({ error: err });
    }
    if (this.writer && this.rewindTo !== undefined && this.pending.length === 0) {
      this.nextSeq = this.rewindTo;
      this.rewindTo = undefined;
    }
  }

  private onFailure(call: Call, err: SapgridError): void {
    if (call !== this.call || this.closed) return;
    if (this.resume && (TRANSIENT.has(err.code) || err.code === status.INTERNAL)) {
      this.reconnect(call, err);
      return;
    }
    this.call = undefined;
    this.fail(err);
  }

  private reconnect(call: Call, cause: SapgridError): void {
    if (this.reconnecting) return;
    this.reconnecting = true;
    call.removeAllListeners();
    call.on("error", () => undefined);
    call.cancel();
    this.call = undefined;
    void this.reconnectLoop(cause);
  }

  private async reconnectLoop(cause: SapgridError): Promise<void> {
    let last = cause;
    for (let attempt = 0; attempt < this.backoff.maxAttempts; attempt++) {
      const delay = Math.min(this.backoff.maxMs, this.backoff.initialMs * 2 ** attempt);
      await new Promise((r) => setTimeout(r, delay));
      if (this.closed) return;
      let info: WorldInfo;
      try {
        info = await this.host.getWorld(this.world);
      } catch (e) {
        const err = fromServiceError(e as Error);
        if (TRANSIENT.has(err.code) || err.code === status.DEADLINE_EXCEEDED) {
          last = err;
          continue;
        }
        this.reconnecting = false;
        this.fail(err);
        return;
      }
      if (this.closed) return;
      if (info.frozen) {
        last = makeError(status.UNAVAILABLE, `world ${this.world} is frozen`);
        continue;
      }
      const stands = info.writers.get(this.writer) ?? 0n;
      const answeredUpTo = (this.pending[0]?.seq ?? this.nextSeq) - 1n;
      if (stands < answeredUpTo) {
        this.reconnecting = false;
        this.fail(makeError(status.FAILED_PRECONDITION, `writer ${this.writer} of world ${this.world} stands at seq ` +
          `${stands}, but its frames up to seq ${answeredUpTo} were answered: the world lost applied frames`, "writer"));
        return;
      }
      this.reconnects++;
      this.reconnecting = false;
      this.call = this.open();
      for (const p of this.pending) {
        this.call.write(p.request);
        this.resent++;
        if (p.seq <= stands) this.resentApplied++;
      }
      return;
    }
    this.reconnecting = false;
    this.fail(makeError(status.UNAVAILABLE, `world ${this.world}: gave up reconnecting after ` +
      `${this.backoff.maxAttempts} attempts: ${last.message}`));
  }
}
