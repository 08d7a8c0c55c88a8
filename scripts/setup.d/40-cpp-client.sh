#!/usr/bin/env bash
# The C++ example client's toolchain from Debian (client/cpp): gRPC C++ 1.51 and protobuf 3.21
# headers and libraries, protoc with grpc_cpp_plugin, nlohmann's JSON library (the conformance
# runner), CMake, g++ and pkg-config (grpc++.pc). Used by tests/test_client_cpp.py, which builds
# client/cpp into build/cpp.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/apt.sh
apt_install libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler nlohmann-json3-dev \
  cmake g++ make pkg-config
