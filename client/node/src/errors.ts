/**
 * Typed errors of the sapgrid client, carrying the server's message and the field/index at fault.
 *
 * Every failed call and every rejected frame of a stream becomes one of these: `code` is the gRPC
 * status number (grpc.status), `field`/`index` come from the call's google.rpc.BadRequest detail
 * (trailer `grpc-status-details-bin`, e.g. "add_boxes[3]" -> "add_boxes", 3) or from the stream's
 * FrameError ("" and -1 when the fault is not about one field / one row).
 */
import { Metadata, status } from "@grpc/grpc-js";
import type { ServiceError } from "@grpc/grpc-js";

import { contract } from "./proto";
import type { FrameError__Output } from "./generated/sapgrid/v1/FrameError";

const STATUS_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(status).filter(([, v]) => typeof v === "number").map(([k, v]) => [v as number, k]),
);

/** A call failed: `code` (grpc.status number), `codeName` ("INVALID_ARGUMENT"), the server's `message`, `field`, `index`. */
export class SapgridError extends Error {
  readonly code: number;
  readonly field: string;
  readonly index: number;

  constructor(code: number, message: string, field = "", index = -1) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.field = field;
    this.index = index;
  }

  get codeName(): string {
    return STATUS_NAMES[this.code] ?? `CODE_${this.code}`;
  }

  override toString(): string {
    return `${this.name} (${this.codeName}): ${this.message}`;
  }
}

export class InvalidArgument extends SapgridError {}
export class FailedPrecondition extends SapgridError {}
export class NotFound extends SapgridError {}
export class AlreadyExists extends SapgridError {}
export class ResourceExhausted extends SapgridError {}
export class Unavailable extends SapgridError {}
export class DeadlineExceeded extends SapgridError {}
export class Cancelled extends SapgridError {}
export class Internal extends SapgridError {}
/** The client's view and the server's disagree: a mirror's pair digest differs from the server's, or a
 * writer's frames the server had answered are gone (a server without a data directory restarted). */
export class DataLoss extends SapgridError {}
/** No or unknown credentials (the server's --auth-file). */
export class Unauthenticated extends SapgridError {}
/** The caller's role does not cover this call or world. */
export class PermissionDenied extends SapgridError {}

const BY_CODE: Record<number, typeof SapgridError> = {
  [status.INVALID_ARGUMENT]: InvalidArgument,
  [status.FAILED_PRECONDITION]: FailedPrecondition,
  [status.NOT_FOUND]: NotFound,
  [status.ALREADY_EXISTS]: AlreadyExists,
  [status.RESOURCE_EXHAUSTED]: ResourceExhausted,
  [status.UNAVAILABLE]: Unavailable,
  [status.DEADLINE_EXCEEDED]: DeadlineExceeded,
  [status.CANCELLED]: Cancelled,
  [status.INTERNAL]: Internal,
  [status.DATA_LOSS]: DataLoss,
  [status.UNAUTHENTICATED]: Unauthenticated,
  [status.PERMISSION_DENIED]: PermissionDenied,
};

/** The typed error of a status code (the class of the code, SapgridError for others). */
export function makeError(code: number, message: string, field = "", index = -1): SapgridError {
  const Cls = BY_CODE[code] ?? SapgridError;
  return new Cls(code, message, field, index);
}

const FIELD_RE = /^([A-Za-z_][A-Za-z0-9_.]*)(?:\[(\d+)\])?$/;

/** "add_boxes[3]" -> ["add_boxes", 3]; "world" -> ["world", -1]. */
export function splitField(path: string): [string, number] {
  const m = FIELD_RE.exec(path);
  if (!m) return [path, -1];
  return [m[1], m[2] === undefined ? -1 : Number(m[2])];
}

const BAD_REQUEST_URL = "type.googleapis.com/google.rpc.BadRequest";

/** The field violation of a google.rpc.Status detail in the trailers, or undefined. */
function badRequestField(metadata: Metadata | undefined): string | undefined {
  const raw = metadata?.get("grpc-status-details-bin")[0];
  if (!raw || typeof raw === "string") return undefined;
  const { google } = contract();
  const st = google.rpc.Status.deserialize(raw);
  for (const detail of st.details) {
    if (detail.type_url === BAD_REQUEST_URL && detail.value) {
      const br = google.rpc.BadRequest.deserialize(Buffer.from(detail.value));
      if (br.field_violations.length) return br.field_violations[0].field;
    }
  }
  return undefined;
}

/** Typed error of a failed call (a grpc-js ServiceError), with the field of its BadRequest detail. */
export function fromServiceError(err: ServiceError | Error): SapgridError {
  if (err instanceof SapgridError) return err;
  const se = err as Partial<ServiceError>;
  if (typeof se.code !== "number") return makeError(status.UNKNOWN, err.message);
  let field = "";
  let index = -1;
  try {
    const path = badRequestField(se.metadata);
    if (path !== undefined) [field, index] = splitField(path);
  } catch {
    // A malformed detail must not hide the error itself.
  }
  return makeError(se.code, se.details ?? err.message, field, index);
}

/** Typed error of a stream's FrameError (a rejected frame). */
export function fromFrameError(msg: FrameError__Output): SapgridError {
  return makeError(msg.code, msg.message, msg.field, Number(msg.index));
}
