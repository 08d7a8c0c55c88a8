/**
 * The contract loaded once: the sapgrid service, the gRPC health service and the google.rpc error
 * messages, from the protos copied into the package at build time (`proto/`, the include root the
 * imports are written against).
 *
 * Loader options, each chosen so nothing is lost on the way:
 * - keepCase: field names stay snake_case as in the .proto (proto-loader's default camelCases them,
 *   and a request written with the .proto's names then silently sends default values);
 * - longs: String, so every uint64/fixed64 arrives exactly and is turned into a BigInt (never a
 *   Number past 2^53, never a Long);
 * - bytes stay Buffers (the bulk arrays are read as typed-array views of them), defaults and oneofs on.
 * The TypeScript types in ./generated are made by proto-loader-gen-types with the same options.
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { existsSync } from "node:fs";
import path from "node:path";

import type { ProtoGrpcType as SapgridProto } from "./generated/sapgrid_service";
import type { ProtoGrpcType as HealthProto } from "./generated/health";
import type { ProtoGrpcType as StatusProto } from "./generated/status";
import type { ProtoGrpcType as DetailsProto } from "./generated/error_details";

/** Directory of the package's .proto files (the include root: sapgrid/v1/*.proto, google/rpc/*, grpc/health/v1/*). */
export const PROTO_DIR = path.join(__dirname, "..", "proto");

export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

type Loaded = SapgridProto & HealthProto & StatusProto & DetailsProto;

let loaded: Loaded | undefined;

/** The loaded package definition (loaded on first use). */
export function contract(): Loaded {
  if (!loaded) {
    if (!existsSync(path.join(PROTO_DIR, "sapgrid", "v1", "sapgrid_service.proto"))) {
      throw new Error(`sapgrid client: no protos in ${PROTO_DIR}; build the package first (npm run build)`);
    }
    const definition = protoLoader.loadSync(
      ["sapgrid/v1/sapgrid_service.proto", "grpc/health/v1/health.proto", "google/rpc/status.proto",
        "google/rpc/error_details.proto"],
      LOADER_OPTIONS,
    );
    loaded = grpc.loadPackageDefinition(definition) as unknown as Loaded;
  }
  return loaded;
}
