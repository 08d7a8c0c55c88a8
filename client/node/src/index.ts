/** sapgrid's Node.js client: see Client, FrameStream, the typed errors and pairsDigest. */
export { Client, DEFAULT_ADDRESS, DEFAULT_MAX_MESSAGE_BYTES, Subscription, WORLD_HEADER } from "./client";
export type { ClientOptions, PairsPage, QueryResult } from "./client";
export { FrameStream } from "./stream";
export type { Backoff, OpenOptions, StreamOptions } from "./stream";
export { PairMirror } from "./mirror";
export {
  AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, makeError, NotFound,
  PermissionDenied, ResourceExhausted, SapgridError, splitField, Unauthenticated, Unavailable,
} from "./errors";
export { digestStep, pairsDigest, splitmix64 } from "./digest";
export { boxesArray, idsArray, pairsArray } from "./codec";
export type {
  BitsInput, BoxesInput, Delta, FrameArrays, FrameInput, FrameStats, IdsInput, StaticInput, WorldConfigInfo, WorldInfo,
  WorldOptions,
} from "./codec";
export { PROTO_DIR } from "./proto";
