// sapgrid::Client: a small header-only C++17 client of the sapgrid contract (proto/sapgrid/v1), for
// native game servers. Worlds are created and deleted, frames go through one StreamFrames stream
// (answers in order; send may run ahead of recv), pairs are read with ListPairs (every page), and
// observers follow a world's deltas with a Subscription.
//
// Bulk fields are little-endian bytes (frame.proto). This header targets little-endian hosts, where
// the wire layout is the memory layout: U64Rows reads a pairs field in place as uint64 rows when its
// bytes are 8-byte aligned (protobuf's strings almost always are), and copies them into an aligned
// buffer otherwise. FrameBuilder appends ids, boxes and filters to a Frame's bytes fields.
//
// Exactly-once frames (Frame.writer in the contract): Client::stream(world, writer) numbers its frames
// from where the writer stands in the world (GetWorld's writers); a frame sent again with a seq the world
// already applied is answered with the very Delta of its first answer and never applied again.
//
// Failed calls throw sapgrid::Error with the field and row named by the google.rpc.BadRequest detail of
// the status (grpc-status-details-bin; google/rpc/*.proto's code is generated at build time).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/error_details.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "sapgrid/v1/sapgrid_service.grpc.pb.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "sapgrid/client.hpp reads the contract's little-endian bytes in place: a little-endian host is required"
#endif

namespace sapgrid {

// A failed call or a rejected frame: the gRPC status code (google.rpc.Code numbering), the server's
// message, and the field at fault and its row (-1: the field as a whole; "" and -1: no field named). A
// failed call's field comes from the google.rpc.BadRequest detail of its status ("add_boxes[3]" ->
// field "add_boxes", index 3), a rejected frame's from its FrameError.
class Error : public std::runtime_error {
 public:
  Error(int code, const std::string& message, std::string field = "", int64_t index = -1)
      : std::runtime_error(message), code(code), field(std::move(field)), index(index) {}
  static Error from_status(const std::string& call, const grpc::Status& status) {
    std::pair<std::string, int64_t> at = bad_request_field(status);
    return Error(static_cast<int>(status.error_code()), call + ": " + status.error_message(), at.first, at.second);
  }
  // The first field violation of the status's google.rpc.BadRequest detail, split into (field, row):
  // ("", -1) when there is none or the details cannot be read (they never hide the error itself).
  static std::pair<std::string, int64_t> bad_request_field(const grpc::Status& status) {
    google::rpc::Status details;
    if (status.error_details().empty() || !grpc::ExtractErrorDetails(status, &details).ok()) return {"", -1};
    for (const google::protobuf::Any& any : details.details()) {
      google::rpc::BadRequest bad;
      if (any.Is<google::rpc::BadRequest>() && any.UnpackTo(&bad) && bad.field_violations_size() > 0) {
        return split_field(bad.field_violations(0).field());
      }
    }
    return {"", -1};
  }
  // "add_boxes[3]" -> ("add_boxes", 3); "world" -> ("world", -1); anything else is kept whole, row -1.
  static std::pair<std::string, int64_t> split_field(const std::string& path) {
    const size_t open = path.find('[');
    if (open == std::string::npos || open == 0 || path.size() < open + 3 || path.back() != ']') return {path, -1};
    const std::string digits = path.substr(open + 1, path.size() - open - 2);
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return {path, -1};
    return {path.substr(0, open), std::strtoll(digits.c_str(), nullptr, 10)};
  }
  static Error from_frame(const v1::FrameError& e) { return Error(e.code(), e.message(), e.field(), e.index()); }

  int code;
  std::string field;
  int64_t index;
};

// One pair of a pairs field: (low id, high id).
struct Pair {
  uint64_t lo, hi;
  bool operator==(const Pair& o) const { return lo == o.lo && hi == o.hi; }
  bool operator<(const Pair& o) const { return lo < o.lo || (lo == o.lo && hi < o.hi); }
};

// The rows of a bytes field of uint64 values (`width` per row: 1 for ids, 2 for pairs), read without a
// copy when the bytes are 8-byte aligned; otherwise copied once (std::memcpy) into an aligned buffer.
// Views the string: keep it alive and unchanged while the U64Rows is used.
class U64Rows {
 public:
  U64Rows(const std::string& bytes, size_t width) : U64Rows(bytes.data(), bytes.size(), width) {}
  U64Rows(const char* p, size_t size, size_t width) : width_(width) {
    const size_t row = 8 * width;
    if (width == 0 || size % row != 0) {
      throw Error(13, "a bulk field of " + std::to_string(size) + " bytes is not rows of " + std::to_string(row) +
                          " bytes");
    }
    rows_ = size / row;
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(uint64_t) == 0) {
      data_ = reinterpret_cast<const uint64_t*>(p);  // in place: the wire layout is the memory layout
    } else {
      copy_.resize(rows_ * width);
      if (size) std::memcpy(copy_.data(), p, size);
      data_ = copy_.data();
    }
  }
  U64Rows(const U64Rows&) = delete;
  U64Rows& operator=(const U64Rows&) = delete;
  U64Rows(U64Rows&&) = default;  // a moved vector keeps its buffer, so data_ stays valid

  size_t rows() const { return rows_; }
  size_t width() const { return width_; }
  const uint64_t* data() const { return data_; }
  uint64_t at(size_t row, size_t col) const { return data_[row * width_ + col]; }
  Pair pair(size_t row) const { return Pair{data_[row * width_], data_[row * width_ + 1]}; }
  // True when the bytes were unaligned and had to be copied.
  bool copied() const { return !copy_.empty(); }

 private:
  size_t width_;
  size_t rows_ = 0;
  const uint64_t* data_ = nullptr;
  std::vector<uint64_t> copy_;
};

// A pairs field (Delta.created / .deleted, ListPairsResponse.pairs) as rows of (low, high).
inline U64Rows pair_rows(const std::string& bytes) { return U64Rows(bytes, 2); }

// Appends to the bytes fields of a Frame, in the contract's layouts (ids uint64, boxes float32 rows of
// 2*dims values: all mins then all maxs, category/mask uint32, static one byte).
class FrameBuilder {
 public:
  explicit FrameBuilder(v1::Frame* frame) : f_(frame) {}
  FrameBuilder& add(uint64_t id, const float* box, int dims) {
    put(f_->mutable_add_ids(), &id, 8);
    put(f_->mutable_add_boxes(), box, 8 * static_cast<size_t>(dims));
    return *this;
  }
  FrameBuilder& add_filter(uint32_t category, uint32_t mask, bool is_static) {
    put(f_->mutable_add_category(), &category, 4);
    put(f_->mutable_add_mask(), &mask, 4);
    f_->mutable_add_static()->push_back(is_static ? 1 : 0);
    return *this;
  }
  FrameBuilder& update(uint64_t id, const float* box, int dims) {
    put(f_->mutable_update_ids(), &id, 8);
    put(f_->mutable_update_boxes(), box, 8 * static_cast<size_t>(dims));
    return *this;
  }
  FrameBuilder& remove(uint64_t id) {
    put(f_->mutable_remove_ids(), &id, 8);
    return *this;
  }
  // Exactly-once frames: the frame's writer and its seq in that writer's sequence (a FrameStream with a
  // writer fills both itself: the writer, and the next seq when the frame's is 0).
  FrameBuilder& writer(const std::string& name, uint64_t seq) {
    f_->set_writer(name);
    f_->set_seq(seq);
    return *this;
  }

 private:
  static void put(std::string* field, const void* p, size_t n) { field->append(static_cast<const char*>(p), n); }
  v1::Frame* f_;
};

// One StreamFrames call. send() may run ahead of recv(); answers come in the order frames were sent,
// each a Delta or the FrameError of a rejected frame (the stream goes on).
//
// With a writer (Client::stream(world, writer)), send() gives every frame the stream's writer (when
// the frame names none) and, when the frame's seq is 0, the stream's next seq (from where the writer
// stood when the stream opened, counting up); an explicit seq is sent as given (one the world already
// applied is answered again with its first Delta, not applied again). A frame refused for its content
// takes no seq: the frames sent behind it are answered FAILED_PRECONDITION (a gap), and the caller
// sends them again with set_next_seq().
class FrameStream {
 public:
  FrameStream(v1::SapgridService::Stub* stub, const std::string& world, std::chrono::milliseconds timeout,
              std::string writer = "", uint64_t first_seq = 1)
      : ctx_(std::make_unique<grpc::ClientContext>()), writer_(std::move(writer)), next_seq_(first_seq) {
    if (!world.empty()) ctx_->AddMetadata("x-sapgrid-world", world);  // cluster routing; binds the stream
    ctx_->set_deadline(std::chrono::system_clock::now() + timeout);
    rw_ = stub->StreamFrames(ctx_.get());
  }
  ~FrameStream() {
    if (rw_ && !finished_) {
      ctx_->TryCancel();
      rw_->Finish();
    }
  }
  FrameStream(const FrameStream&) = delete;
  FrameStream& operator=(const FrameStream&) = delete;
  FrameStream(FrameStream&&) = default;

  // Send one frame (the request holds it; fill it with FrameBuilder); with a writer, its writer and seq
  // are filled in first, in the request itself (see above). Returns the frame's seq. Throws if the
  // stream is broken.
  uint64_t send(v1::StreamFramesRequest& request) {
    v1::Frame* f = request.mutable_frame();
    if (!writer_.empty()) {
      if (f->writer().empty()) f->set_writer(writer_);
      if (f->seq() == 0) f->set_seq(next_seq_);
    }
    return write(request);
  }
  // The same for a request that stays as it is (a copy is filled in when the stream must add the writer
  // or the seq).
  uint64_t send(const v1::StreamFramesRequest& request) {
    if (!writer_.empty() && (request.frame().writer().empty() || request.frame().seq() == 0)) {
      v1::StreamFramesRequest filled = request;
      return send(filled);
    }
    return write(request);
  }
  // The answer to the oldest unanswered frame (a Delta or a FrameError: see has_delta()).
  v1::StreamFramesResponse recv() {
    v1::StreamFramesResponse resp;
    if (!rw_->Read(&resp)) throw finish_error("StreamFrames: the stream ended");
    --in_flight_;
    return resp;
  }
  // send + recv; a rejected frame throws its Error (code, field, index).
  v1::StreamFramesResponse step(v1::StreamFramesRequest& request) {
    send(request);
    return answer_of_step();
  }
  v1::StreamFramesResponse step(const v1::StreamFramesRequest& request) {
    send(request);
    return answer_of_step();
  }
  // Half-close and wait for the server to end the call.
  void close() {
    if (finished_) return;
    rw_->WritesDone();
    v1::StreamFramesResponse drain;
    while (rw_->Read(&drain)) {
    }
    finished_ = true;
    grpc::Status st = rw_->Finish();
    if (!st.ok()) throw Error::from_status("StreamFrames", st);
  }
  int in_flight() const { return in_flight_; }
  const std::string& writer() const { return writer_; }
  // The seq the next frame without one gets (with a writer).
  uint64_t next_seq() const { return next_seq_; }
  void set_next_seq(uint64_t seq) { next_seq_ = seq; }

 private:
  uint64_t write(const v1::StreamFramesRequest& request) {
    const v1::Frame& f = request.frame();
    if (!writer_.empty() && f.writer() == writer_ && f.seq() >= next_seq_) next_seq_ = f.seq() + 1;
    if (!rw_->Write(request)) throw finish_error("StreamFrames: write failed");
    ++in_flight_;
    return f.seq();
  }
  v1::StreamFramesResponse answer_of_step() {
    v1::StreamFramesResponse resp = recv();
    if (resp.has_error()) throw Error::from_frame(resp.error());
    return resp;
  }
  Error finish_error(const std::string& what) {
    finished_ = true;
    grpc::Status st = rw_->Finish();
    return st.ok() ? Error(14, what) : Error::from_status("StreamFrames", st);
  }
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StreamFramesRequest, v1::StreamFramesResponse>> rw_;
  bool finished_ = false;
  int in_flight_ = 0;
  std::string writer_;
  uint64_t next_seq_;
};

// One Subscribe call: every Delta of a world from the moment the server registered the subscriber.
// Client::subscribe returns only then (the call's response headers), so every frame applied after it
// returns is in the subscription. next() blocks for the next Delta; it returns false once the
// subscription is cancelled (cancel(), from any thread, also ends a next() that waits) and throws the
// Error that ended it otherwise (NOT_FOUND: no such world, or the world was deleted; RESOURCE_EXHAUSTED:
// the subscriber fell too far behind and was dropped; DEADLINE_EXCEEDED with a timeout).
class Subscription {
 public:
  Subscription(v1::SapgridService::Stub* stub, const std::string& world, const std::vector<double>& region,
               std::chrono::milliseconds timeout)
      : ctx_(std::make_unique<grpc::ClientContext>()) {
    if (!world.empty()) ctx_->AddMetadata("x-sapgrid-world", world);
    if (timeout.count() > 0) ctx_->set_deadline(std::chrono::system_clock::now() + timeout);
    v1::SubscribeRequest req;
    req.set_world(world);
    for (double v : region) req.add_region(v);
    reader_ = stub->Subscribe(ctx_.get(), req);
    reader_->WaitForInitialMetadata();  // (also returns when the call ended: its error comes with next())
  }
  ~Subscription() {
    if (reader_ && !finished_) {
      ctx_->TryCancel();
      v1::SubscribeResponse drain;
      while (reader_->Read(&drain)) {
      }
      reader_->Finish();
    }
  }
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  Subscription(Subscription&&) = default;

  // The next Delta into *delta: true; false once the subscription was cancelled. Throws the Error that
  // ended it otherwise.
  bool next(v1::Delta* delta) {
    if (finished_) return false;
    v1::SubscribeResponse resp;
    if (reader_->Read(&resp)) {
      *delta = std::move(*resp.mutable_delta());
      return true;
    }
    finished_ = true;
    grpc::Status st = reader_->Finish();
    if (*cancelled_ || st.ok()) return false;
    throw Error::from_status("Subscribe", st);
  }
  // End the subscription (the server drops the subscriber); a next() waiting in another thread returns false.
  void cancel() {
    *cancelled_ = true;
    ctx_->TryCancel();
  }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<v1::SubscribeResponse>> reader_;
  std::unique_ptr<std::atomic<bool>> cancelled_ = std::make_unique<std::atomic<bool>>(false);
  bool finished_ = false;
};

class Client {
 public:
  explicit Client(const std::string& address, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : timeout_(timeout) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::SapgridService::NewStub(channel_);
  }

  v1::WorldInfo create_world(const std::string& name, const v1::WorldConfig& config, bool if_not_exists = false) {
    v1::CreateWorldRequest req;
    req.set_name(name);
    *req.mutable_config() = config;
    req.set_if_not_exists(if_not_exists);
    v1::CreateWorldResponse resp;
    auto ctx = context(name);
    check("CreateWorld", stub_->CreateWorld(ctx.get(), req, &resp));
    return resp.world();
  }

  void delete_world(const std::string& name) {
    v1::DeleteWorldRequest req;
    req.set_name(name);
    v1::DeleteWorldResponse resp;
    auto ctx = context(name);
    check("DeleteWorld", stub_->DeleteWorld(ctx.get(), req, &resp));
  }

  v1::WorldInfo get_world(const std::string& name) {
    v1::GetWorldRequest req;
    req.set_name(name);
    v1::GetWorldResponse resp;
    auto ctx = context(name);
    check("GetWorld", stub_->GetWorld(ctx.get(), req, &resp));
    return resp.world();
  }

  // A frame stream bound to `world` (its frames must name it). Its deadline covers the whole stream.
  FrameStream stream(const std::string& world, std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
    return FrameStream(stub_.get(), world, timeout);
  }
  // Exactly-once frames: a stream whose frames carry `writer` (1-64 characters of [A-Za-z0-9_.-]),
  // numbered from where the writer stands in the world (its last applied seq + 1, read with GetWorld;
  // 1 for a writer the world does not know).
  FrameStream stream(const std::string& world, const std::string& writer,
                     std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
    if (writer.empty()) return stream(world, timeout);
    const v1::WorldInfo info = get_world(world);
    const auto& seqs = info.stats().writers();
    const auto at = seqs.find(writer);
    return FrameStream(stub_.get(), world, timeout, writer, at == seqs.end() ? 1 : at->second + 1);
  }

  // Every Delta of `world` from now on (see Subscription): returns once the server has registered it.
  // region: 2*dims values (all mins, then all maxs) for the pairs entering and leaving the view of pairs
  // with an object whose box meets it (the first Delta holds the whole view); empty: the whole world.
  // timeout: the subscription's deadline (0: none).
  Subscription subscribe(const std::string& world, const std::vector<double>& region = {},
                         std::chrono::milliseconds timeout = std::chrono::milliseconds::zero()) {
    return Subscription(stub_.get(), world, region, timeout);
  }

  // One frame with the unary ApplyFrame call. A refused frame throws its Error, with the field and row of
  // the status's google.rpc.BadRequest detail.
  v1::Delta apply_frame(const v1::Frame& frame) {
    v1::ApplyFrameRequest req;
    *req.mutable_frame() = frame;
    v1::ApplyFrameResponse resp;
    auto ctx = context(frame.world());
    check("ApplyFrame", stub_->ApplyFrame(ctx.get(), req, &resp));
    return resp.delta();
  }

  // Every active pair of the world: the pages' bytes joined (rows of (low, high), sorted). Pages are
  // keyed by pair, so the result is consistent when the world does not change meanwhile.
  std::string list_pairs(const std::string& world, uint32_t page_size = 0) {
    std::string out, token;
    for (;;) {
      v1::ListPairsRequest req;
      req.set_world(world);
      req.set_page_size(page_size);
      req.set_page_token(token);
      v1::ListPairsResponse resp;
      auto ctx = context(world);
      check("ListPairs", stub_->ListPairs(ctx.get(), req, &resp));
      out += resp.pairs();
      token = resp.next_page_token();
      if (token.empty()) return out;
    }
  }

  v1::SapgridService::Stub* stub() { return stub_.get(); }

 private:
  std::unique_ptr<grpc::ClientContext> context(const std::string& world) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + timeout_);
    if (!world.empty()) ctx->AddMetadata("x-sapgrid-world", world);
    return ctx;
  }
  static void check(const std::string& call, const grpc::Status& st) {
    if (!st.ok()) throw Error::from_status(call, st);
  }

  std::chrono::milliseconds timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SapgridService::Stub> stub_;
};

// The contract's pair digest (frame.proto, Delta.pairs_digest): the sum mod 2^64 over the pairs of
// splitmix64(lo ^ splitmix64(hi)). Kept in O(delta): add the created pairs' terms, subtract the deleted.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
inline uint64_t pair_term(const Pair& p) { return splitmix64(p.lo ^ splitmix64(p.hi)); }

}  // namespace sapgrid
