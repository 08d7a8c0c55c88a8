// sapgrid_conformance: replays the shared conformance vectors (conformance/vectors/*.json) against a
// sapgrid server with the C++ client, and checks every answer byte for byte.
//
// For each vector: create a uniquely named world from "world", send each step's frame (seq as given,
// the world's name filled in, the bulk fields' exact bytes from hex) through one StreamFrames stream,
// and compare the answer with "expect": the delta's created/deleted bytes, frame, objects, pairs and
// pairs_digest (the server's, and the client's own kept from the deltas), or the error's code, field
// and index, or for a writer's duplicate {"same_as_step": K} the answer's Delta, serialized, byte for
// byte the Delta of step K (timings included: the first answer itself; the client's digest does not
// move). Then ListPairs (every page, small pages) must give exactly "final_pairs". Prints a line per
// vector; exit status 0 when all match, 1 otherwise, 2 on a bad argument or an unreadable vector.
//
// --unary sends each frame with the unary ApplyFrame call instead (Client::apply_frame): a refused
// frame's code, field and index are then read from the google.rpc.BadRequest detail of the call's status
// (sapgrid::Error), and must be the vector's all the same.
//
//   sapgrid_conformance --server 127.0.0.1:50051 [--unary] VECTOR.json...
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "sapgrid/client.hpp"

namespace {

using nlohmann::json;
namespace v1 = sapgrid::v1;

const char* const kBulkFields[] = {"remove_ids", "add_ids", "add_boxes", "add_category",
                                   "add_mask",   "add_static", "update_ids", "update_boxes"};

std::string from_hex(const std::string& hex) {
  if (hex.size() % 2) throw std::invalid_argument("odd-length hex string");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

std::string to_hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// The Frame of a vector step (missing keys: empty).
v1::Frame frame_of(const json& raw, const std::string& world) {
  v1::Frame f;
  f.set_world(world);
  sapgrid::FrameBuilder(&f).writer(raw.value("writer", std::string()), raw.value("seq", uint64_t{0}));
  const google::protobuf::Descriptor* d = f.GetDescriptor();
  const google::protobuf::Reflection* r = f.GetReflection();
  for (const char* name : kBulkFields) {
    r->SetString(&f, d->FindFieldByName(name), from_hex(raw.value(name, std::string())));
  }
  return f;
}

// `digest`: the client's own pair digest, kept from the deltas (sapgrid::pair_term), checked against the
// vector's too. `earlier`: the answers to the steps before this one (a duplicate's Delta must be one of
// them, byte for byte).
std::vector<std::string> compare(const json& step, const v1::StreamFramesResponse& resp, uint64_t* digest,
                                 const std::vector<v1::StreamFramesResponse>& earlier) {
  std::vector<std::string> bad;
  const json& expect = step.at("expect");
  const uint64_t seq = step.at("frame").value("seq", uint64_t{0});
  if (resp.seq() != seq) bad.push_back("seq " + std::to_string(resp.seq()) + " != " + std::to_string(seq));
  if (expect.contains("same_as_step")) {
    const int64_t k = expect.at("same_as_step").get<int64_t>();
    if (k < 0 || k >= static_cast<int64_t>(earlier.size()) || !earlier[k].has_delta()) {
      bad.push_back("same_as_step " + std::to_string(k) + ": not an earlier step answered with a delta");
    } else if (!resp.has_delta()) {
      bad.push_back("error " + std::to_string(resp.error().code()) + " " + resp.error().field() + "[" +
                    std::to_string(resp.error().index()) + "] (" + resp.error().message() +
                    ") where the Delta of step " + std::to_string(k) + " was expected again");
    } else if (resp.delta().SerializeAsString() != earlier[k].delta().SerializeAsString()) {
      bad.push_back("a Delta other than step " + std::to_string(k) + "'s (frame " + std::to_string(resp.delta().frame()) +
                    ", created " + to_hex(resp.delta().created()) + ")");
    }
    return bad;  // answered again, not applied again: the pair digest does not move
  }
  if (expect.contains("error")) {
    const json& e = expect.at("error");
    if (!resp.has_error()) {
      bad.push_back("a delta where the error " + e.dump() + " was expected");
    } else if (resp.error().code() != e.at("code").get<int>() || resp.error().field() != e.at("field").get<std::string>() ||
               resp.error().index() != e.at("index").get<int64_t>()) {
      bad.push_back("error " + std::to_string(resp.error().code()) + " " + resp.error().field() + "[" +
                    std::to_string(resp.error().index()) + "] != " + e.dump() + " (" + resp.error().message() + ")");
    }
    return bad;
  }
  if (!resp.has_delta()) {
    bad.push_back("error " + std::to_string(resp.error().code()) + " " + resp.error().field() + "[" +
                  std::to_string(resp.error().index()) + "] (" + resp.error().message() + ") where a delta was expected");
    return bad;
  }
  const v1::Delta& d = resp.delta();
  auto check = [&](const char* what, const std::string& got, const std::string& want) {
    if (got != want) bad.push_back(std::string(what) + " " + got + " != " + want);
  };
  check("created", to_hex(d.created()), expect.at("created").get<std::string>());
  check("deleted", to_hex(d.deleted()), expect.at("deleted").get<std::string>());
  check("frame", std::to_string(d.frame()), std::to_string(expect.at("frame").get<uint64_t>()));
  check("objects", std::to_string(d.stats().objects()), std::to_string(expect.at("objects").get<uint64_t>()));
  check("pairs", std::to_string(d.stats().pairs()), std::to_string(expect.at("pairs").get<uint64_t>()));
  const std::string want = expect.at("pairs_digest").get<std::string>();
  check("pairs_digest", std::to_string(d.pairs_digest()), want);
  sapgrid::U64Rows created = sapgrid::pair_rows(d.created()), deleted = sapgrid::pair_rows(d.deleted());
  for (size_t r = 0; r < created.rows(); ++r) *digest += sapgrid::pair_term(created.pair(r));
  for (size_t r = 0; r < deleted.rows(); ++r) *digest -= sapgrid::pair_term(deleted.pair(r));
  check("client pairs_digest", std::to_string(*digest), want);
  return bad;
}

// Replays one vector on a fresh world; the mismatches (empty: the server conforms).
// The answer of the unary ApplyFrame call to `frame`, as a stream's answer would hold it (a refused
// frame: its sapgrid::Error, read from the status's BadRequest detail, as the FrameError).
v1::StreamFramesResponse apply_unary(sapgrid::Client& client, const v1::Frame& frame) {
  v1::StreamFramesResponse resp;
  try {
    *resp.mutable_delta() = client.apply_frame(frame);
    resp.set_seq(resp.delta().seq());
  } catch (const sapgrid::Error& e) {
    if (e.code == 4 || e.code == 14) throw;  // DEADLINE_EXCEEDED, UNAVAILABLE: not an answer to compare
    resp.set_seq(frame.seq());
    v1::FrameError* err = resp.mutable_error();
    err->set_code(e.code);
    err->set_message(e.what());
    err->set_field(e.field);
    err->set_index(e.index);
  }
  return resp;
}

std::vector<std::string> replay(sapgrid::Client& client, const json& vector, int serial, bool unary) {
  const std::string name = ("conf-cpp-" + vector.at("name").get<std::string>() + "-" +
                            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 100000000) +
                            "-" + std::to_string(serial))
                               .substr(0, 64);
  const json& w = vector.at("world");
  v1::WorldConfig config;
  config.set_dims(w.at("dims").get<uint32_t>());
  for (double b : w.at("bounds")) config.add_bounds(b);
  for (uint32_t c : w.at("cells")) config.add_cells(c);
  client.create_world(name, config);
  std::vector<std::string> bad;
  try {
    const json& steps = vector.at("steps");
    sapgrid::FrameStream stream = client.stream(name);
    uint64_t digest = 0;
    std::vector<v1::StreamFramesResponse> answers;
    for (size_t i = 0; i < steps.size(); ++i) {
      v1::StreamFramesRequest req;
      *req.mutable_frame() = frame_of(steps[i].at("frame"), name);
      v1::StreamFramesResponse resp;
      if (unary) {
        resp = apply_unary(client, req.frame());
      } else {
        stream.send(req);
        resp = stream.recv();
      }
      for (const std::string& m : compare(steps[i], resp, &digest, answers)) {
        bad.push_back("step " + std::to_string(i) + ": " + m);
      }
      answers.push_back(std::move(resp));
    }
    stream.close();
    const std::string listed = to_hex(client.list_pairs(name, 4));
    if (listed != vector.at("final_pairs").get<std::string>()) {
      bad.push_back("ListPairs " + listed + " != " + vector.at("final_pairs").get<std::string>());
    }
  } catch (...) {
    client.delete_world(name);
    throw;
  }
  client.delete_world(name);
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  std::string server;
  bool unary = false;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--server" && i + 1 < argc) {
      server = argv[++i];
    } else if (a == "--unary") {
      unary = true;
    } else if (a.rfind("--", 0) == 0) {
      std::cerr << "sapgrid_conformance: unknown or incomplete argument " << a << "\n";
      return 2;
    } else {
      paths.push_back(a);
    }
  }
  if (server.empty() || paths.empty()) {
    std::cerr << "usage: sapgrid_conformance --server HOST:PORT [--unary] VECTOR.json...\n";
    return 2;
  }
  std::vector<json> vectors;
  for (const std::string& p : paths) {
    std::ifstream in(p);
    if (!in) {
      std::cerr << "sapgrid_conformance: cannot read " << p << "\n";
      return 2;
    }
    try {
      vectors.push_back(json::parse(in));
    } catch (const json::exception& e) {
      std::cerr << "sapgrid_conformance: " << p << ": " << e.what() << "\n";
      return 2;
    }
  }
  sapgrid::Client client(server);
  int failures = 0;
  for (size_t i = 0; i < vectors.size(); ++i) {
    const json& v = vectors[i];
    std::vector<std::string> bad;
    try {
      bad = replay(client, v, static_cast<int>(i), unary);
    } catch (const std::exception& e) {  // sapgrid::Error (a failed call), json's or hex's errors
      bad.push_back(std::string("replay failed: ") + e.what());
    }
    std::cout << (bad.empty() ? "ok   " : "FAIL ") << v.value("name", paths[i]) << " (" << v.at("steps").size()
              << " frames)\n";
    for (const std::string& m : bad) std::cout << "    " << m << "\n";
    failures += !bad.empty();
  }
  std::cout << (vectors.size() - failures) << "/" << vectors.size() << " vectors match\n";
  return failures ? 1 : 0;
}
