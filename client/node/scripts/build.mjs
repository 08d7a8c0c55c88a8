// Build of the package: copy the contract's protos (and the gRPC health and google.rpc error protos,
// taken from the npm packages that ship them) into proto/, generate the TypeScript types of the
// messages and services with @grpc/proto-loader's proto-loader-gen-types into src/generated/, compile
// with tsc into dist/ (.js and .d.ts), and type-check examples/*.ts against the result.
import { cpSync, existsSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const require = createRequire(import.meta.url);
const protoOut = path.join(here, "proto");
const contract = path.resolve(here, "..", "..", "proto", "sapgrid", "v1");

function copy(from, to) {
  mkdirSync(path.dirname(to), { recursive: true });
  cpSync(from, to);
}

// The contract lives in the repository's proto/; a package unpacked elsewhere already holds its copy.
if (existsSync(contract)) {
  rmSync(path.join(protoOut, "sapgrid"), { recursive: true, force: true });
  for (const name of readdirSync(contract).filter((n) => n.endsWith(".proto"))) {
    copy(path.join(contract, name), path.join(protoOut, "sapgrid", "v1", name));
  }
}
const googleProtos = path.dirname(require.resolve("google-proto-files/package.json"));
for (const name of ["status.proto", "error_details.proto", "code.proto"]) {
  copy(path.join(googleProtos, "google", "rpc", name), path.join(protoOut, "google", "rpc", name));
}
const healthProtos = path.dirname(require.resolve("grpc-health-check/package.json"));
copy(path.join(healthProtos, "proto", "health", "v1", "health.proto"),
  path.join(protoOut, "grpc", "health", "v1", "health.proto"));

// Types for exactly the loader options of src/proto.ts (keepCase, longs as String, bytes as Buffer).
const generated = path.join(here, "src", "generated");
rmSync(generated, { recursive: true, force: true });
const genTypes = require.resolve("@grpc/proto-loader/build/bin/proto-loader-gen-types.js");
execFileSync(process.execPath, [genTypes, "--keepCase", "--longs=String", "--enums=String", "--defaults",
  "--oneofs", "--grpcLib=@grpc/grpc-js", "--includeComments", "-I", protoOut, "-O", generated,
  "sapgrid/v1/sapgrid_service.proto", "grpc/health/v1/health.proto", "google/rpc/status.proto",
  "google/rpc/error_details.proto"], { stdio: "inherit" });

rmSync(path.join(here, "dist"), { recursive: true, force: true });
execFileSync(process.execPath, [require.resolve("typescript/bin/tsc"), "-p", here], { stdio: "inherit" });
// A TypeScript user's code type-checked against the published .d.ts (through the package's exports).
execFileSync(process.execPath, [require.resolve("typescript/bin/tsc"), "-p", path.join(here, "examples")], { stdio: "inherit" });
