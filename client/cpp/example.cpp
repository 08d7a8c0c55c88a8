// sapgrid_example: a native game server's use of sapgrid, in C++.
//
// Creates a 2D world, streams a few hundred frames of moving boxes through one StreamFrames stream
// (a few frames in flight), reads each delta's created/deleted pairs in place from the bytes fields,
// keeps a mirror of the active pairs (and of the pair digest) from the deltas alone, and checks, every
// frame, the mirror against its own brute force of the boxes it sent, and at the end ListPairs (every
// page) against both. Exit status 0 when everything matches, 1 on a mismatch, 2 on a bad argument.
//
// --writer NAME streams exactly-once frames: the stream numbers them for that writer, and at the end the
// last frame is sent again: it must be answered with the identical Delta (serialized, byte for byte)
// and leave the world's frame counter, pairs and the writer's seq as they were. --keep-world leaves the
// world on the server (default: deleted at the end).
//
// An observer subscribes to the world before the first frame (Client::subscribe returns once the server
// has registered the subscriber) and reads its deltas in a thread of its own: they must be the stream's
// answers, every one, byte for byte (a frame sent again by its writer is answered, not applied: no delta).
//
//   sapgrid_example --server 127.0.0.1:50051 [--frames 300] [--objects 200] [--window 4]
//                   [--world NAME] [--writer NAME] [--keep-world]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sapgrid/client.hpp"

namespace {

constexpr int kDims = 2;
constexpr float kSize = 1000.0f;

struct Body {
  uint64_t id;
  float box[4];  // xmin, ymin, xmax, ymax
  float vx, vy;
};

// Ids spread over the whole uint64 range, half of them above 2^63.
uint64_t id_of(uint64_t k) { return (k % 2) ? (uint64_t{1} << 63) + 7919 * k : 1 + k; }

std::vector<sapgrid::Pair> brute_force(const std::vector<Body>& bodies) {
  std::vector<sapgrid::Pair> out;
  for (size_t i = 0; i < bodies.size(); ++i) {
    for (size_t j = i + 1; j < bodies.size(); ++j) {
      const float* a = bodies[i].box;
      const float* b = bodies[j].box;
      if (a[0] <= b[2] && b[0] <= a[2] && a[1] <= b[3] && b[1] <= a[3]) {
        uint64_t x = bodies[i].id, y = bodies[j].id;
        out.push_back(sapgrid::Pair{std::min(x, y), std::max(x, y)});
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Args {
  std::string server, world, writer;
  int frames = 300, objects = 200, window = 4;
  bool keep_world = false;
};

int usage(const std::string& why) {
  std::cerr << "sapgrid_example: " << why << "\nusage: sapgrid_example --server HOST:PORT [--frames N] "
            << "[--objects N] [--window N] [--world NAME] [--writer NAME] [--keep-world]\n";
  return 2;
}

bool parse(int argc, char** argv, Args* a, std::string* why) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&](int lo, int hi, int* out) {
      if (i + 1 >= argc) return *why = k + " needs a value", false;
      char* end = nullptr;
      long v = std::strtol(argv[++i], &end, 10);
      if (*end || v < lo || v > hi) {
        return *why = k + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", false;
      }
      *out = static_cast<int>(v);
      return true;
    };
    if (k == "--server" && i + 1 < argc) {
      a->server = argv[++i];
    } else if (k == "--world" && i + 1 < argc) {
      a->world = argv[++i];
    } else if (k == "--writer" && i + 1 < argc) {
      a->writer = argv[++i];
      if (a->writer.empty()) return *why = "--writer needs a name", false;
    } else if (k == "--keep-world") {
      a->keep_world = true;
    } else if (k == "--frames") {
      if (!value(1, 1000000, &a->frames)) return false;
    } else if (k == "--objects") {
      if (!value(2, 100000, &a->objects)) return false;
    } else if (k == "--window") {
      if (!value(1, 64, &a->window)) return false;
    } else {
      return *why = "unknown or incomplete argument " + k, false;
    }
  }
  if (a->server.empty()) return *why = "--server is required", false;
  return true;
}

// The copy path of U64Rows (bytes not 8-byte aligned) reads the same rows as the in-place path.
bool rows_agree() {
  alignas(8) char raw[1 + 3 * 16];
  const uint64_t v[6] = {1, 2, uint64_t{1} << 63, ~uint64_t{0}, 7, 9};
  std::memcpy(raw, v, sizeof v);
  sapgrid::U64Rows aligned(raw, sizeof v, 2);
  std::memmove(raw + 1, raw, sizeof v);
  sapgrid::U64Rows shifted(raw + 1, sizeof v, 2);
  if (aligned.copied() || !shifted.copied() || shifted.rows() != 3) return false;
  for (size_t r = 0; r < 3; ++r) {
    if (!(shifted.pair(r) == sapgrid::Pair{v[2 * r], v[2 * r + 1]})) return false;
  }
  return true;
}

class Scene {
 public:
  Scene(int objects, uint64_t seed) : rng_(seed) {
    for (int i = 0; i < objects; ++i) bodies_.push_back(make());
  }
  const std::vector<Body>& bodies() const { return bodies_; }

  // The first frame: every body added.
  void first_frame(sapgrid::v1::Frame* f) const {
    sapgrid::FrameBuilder b(f);
    for (const Body& body : bodies_) b.add(body.id, body.box, kDims);
  }
  // The next frame: every body moves (bouncing off the bounds); every 25th frame two leave and two come.
  void next_frame(int n, sapgrid::v1::Frame* f) {
    sapgrid::FrameBuilder b(f);
    if (n % 25 == 0) {
      for (int k = 0; k < 2; ++k) {
        size_t victim = std::uniform_int_distribution<size_t>(0, bodies_.size() - 1)(rng_);
        b.remove(bodies_[victim].id);
        bodies_.erase(bodies_.begin() + static_cast<long>(victim));
      }
    }
    for (Body& body : bodies_) {
      float w = body.box[2] - body.box[0], h = body.box[3] - body.box[1];
      if (body.box[0] + body.vx < 0 || body.box[2] + body.vx > kSize) body.vx = -body.vx;
      if (body.box[1] + body.vy < 0 || body.box[3] + body.vy > kSize) body.vy = -body.vy;
      body.box[0] += body.vx;
      body.box[1] += body.vy;
      body.box[2] = body.box[0] + w;
      body.box[3] = body.box[1] + h;
      b.update(body.id, body.box, kDims);
    }
    if (n % 25 == 0) {
      for (int k = 0; k < 2; ++k) {
        bodies_.push_back(make());
        b.add(bodies_.back().id, bodies_.back().box, kDims);
      }
    }
  }

 private:
  Body make() {
    std::uniform_real_distribution<float> pos(0.0f, kSize - 40.0f), ext(5.0f, 40.0f), vel(-6.0f, 6.0f);
    Body b{id_of(next_id_++), {}, vel(rng_), vel(rng_)};
    b.box[0] = pos(rng_);
    b.box[1] = pos(rng_);
    b.box[2] = b.box[0] + ext(rng_);
    b.box[3] = b.box[1] + ext(rng_);
    return b;
  }
  std::mt19937_64 rng_;
  std::vector<Body> bodies_;
  uint64_t next_id_ = 0;
};

// An observer of a world: a subscription opened now, whose deltas (serialized) a thread of its own keeps
// until it has `count` of them or the subscription ends.
class Observer {
 public:
  Observer(sapgrid::Client& client, const std::string& world, int count)
      : sub_(client.subscribe(world)), count_(count), thread_([this] { run(); }) {}
  ~Observer() { stop(); }
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // Wait at most `patience` for the `count` deltas, end the subscription, and return the deltas seen.
  const std::vector<std::string>& wait(std::chrono::seconds patience) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, patience, [this] { return done_; });
    }
    stop();
    return deltas_;
  }
  const std::string& error() const { return error_; }  // (once waited) the Error that ended it, if any

 private:
  void run() {
    try {
      sapgrid::v1::Delta d;
      while (static_cast<int>(deltas_.size()) < count_ && sub_.next(&d)) deltas_.push_back(d.SerializeAsString());
    } catch (const sapgrid::Error& e) {
      error_ = e.what();
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void stop() {
    if (thread_.joinable()) {
      sub_.cancel();
      thread_.join();
    }
  }
  sapgrid::Subscription sub_;
  const int count_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::vector<std::string> deltas_;
  std::string error_;
  std::thread thread_;  // last: it starts once the members it uses are made
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string why;
  if (!parse(argc, argv, &args, &why)) return usage(why);
  if (args.world.empty()) {
    args.world = "cpp-example-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000000);
  }
  if (!rows_agree()) {
    std::cerr << "sapgrid_example: FAIL: U64Rows' copy path differs from its in-place path\n";
    return 1;
  }
  sapgrid::Client client(args.server);
  bool created = false;
  try {
    sapgrid::v1::WorldConfig config;
    config.set_dims(kDims);
    for (float v : {0.0f, 0.0f, kSize, kSize}) config.add_bounds(v);
    config.add_cells(8);
    config.add_cells(8);
    client.create_world(args.world, config);
    created = true;

    Scene scene(args.objects, 7);
    std::set<sapgrid::Pair> mirror;
    uint64_t digest = 0, created_total = 0, deleted_total = 0, fields = 0, in_place = 0;
    std::string failure;
    std::deque<std::vector<Body>> sent;  // the bodies after each frame in flight
    sapgrid::v1::StreamFramesRequest last_request;   // the last frame sent, and the Delta of its answer
    std::string last_delta, resent;
    std::vector<std::string> answers;  // every frame's Delta, serialized
    Observer observer(client, args.world, args.frames);
    auto start = std::chrono::steady_clock::now();
    {
      // With a writer, the stream gives each frame the writer and its next seq (1, 2, ... in a new world).
      sapgrid::FrameStream stream = client.stream(args.world, args.writer);
      int next = 0, answered = 0;
      while (answered < args.frames && failure.empty()) {
        while (next < args.frames && stream.in_flight() < args.window) {
          sapgrid::v1::StreamFramesRequest req;
          req.mutable_frame()->set_world(args.world);
          if (args.writer.empty()) req.mutable_frame()->set_seq(static_cast<uint64_t>(next) + 1);
          if (next == 0) {
            scene.first_frame(req.mutable_frame());
          } else {
            scene.next_frame(next, req.mutable_frame());
          }
          stream.send(req);
          if (next + 1 == args.frames) last_request = req;
          sent.push_back(scene.bodies());
          ++next;
        }
        sapgrid::v1::StreamFramesResponse resp = stream.recv();
        const int k = answered++;
        if (resp.has_error()) throw sapgrid::Error::from_frame(resp.error());
        const sapgrid::v1::Delta& d = resp.delta();
        // The deltas' pairs, read in place from the bytes fields.
        sapgrid::U64Rows created = sapgrid::pair_rows(d.created());
        sapgrid::U64Rows deleted = sapgrid::pair_rows(d.deleted());
        fields += 2;
        in_place += !created.copied() + !deleted.copied();
        for (size_t r = 0; r < deleted.rows(); ++r) {
          if (!mirror.erase(deleted.pair(r))) failure = "a deleted pair was not active";
          digest -= sapgrid::pair_term(deleted.pair(r));
        }
        for (size_t r = 0; r < created.rows(); ++r) {
          if (!mirror.insert(created.pair(r)).second) failure = "a created pair was already active";
          digest += sapgrid::pair_term(created.pair(r));
        }
        created_total += created.rows();
        deleted_total += deleted.rows();
        const std::vector<Body> bodies = std::move(sent.front());
        sent.pop_front();
        std::vector<sapgrid::Pair> truth = brute_force(bodies);
        if (resp.seq() != static_cast<uint64_t>(k) + 1 || d.frame() != static_cast<uint64_t>(k) + 1) {
          failure = "seq/frame counter out of order";
        } else if (d.stats().objects() != bodies.size() || d.stats().pairs() != mirror.size()) {
          failure = "objects/pairs counters differ";
        } else if (!std::equal(truth.begin(), truth.end(), mirror.begin(), mirror.end())) {
          failure = "the pairs of the deltas differ from the brute force (" + std::to_string(mirror.size()) +
                    " vs " + std::to_string(truth.size()) + ")";
        } else if (d.pairs_digest() != digest) {
          failure = "pairs_digest " + std::to_string(d.pairs_digest()) + " != " + std::to_string(digest);
        }
        if (!failure.empty()) failure = "frame " + std::to_string(k + 1) + ": " + failure;
        answers.push_back(d.SerializeAsString());
        if (answered == args.frames) last_delta = answers.back();
      }
      if (!args.writer.empty() && failure.empty()) {
        // The last frame again: answered with its first Delta, byte for byte; nothing applied again.
        sapgrid::v1::StreamFramesResponse again = stream.step(last_request);
        resent = again.delta().SerializeAsString();
        if (resent != last_delta) {
          failure = "the last frame sent again got another Delta (frame " + std::to_string(again.delta().frame()) +
                    ", " + std::to_string(resent.size()) + " bytes; first: " + std::to_string(last_delta.size()) + ")";
        }
      }
      stream.close();
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    if (!args.writer.empty() && failure.empty()) {
      const sapgrid::v1::WorldStats stats = client.get_world(args.world).stats();
      const auto at = stats.writers().find(args.writer);
      if (stats.frames() != static_cast<uint64_t>(args.frames) || at == stats.writers().end() ||
          at->second != static_cast<uint64_t>(args.frames) || stats.pairs_digest() != digest) {
        failure = "after the last frame sent again: " + std::to_string(stats.frames()) + " frames, writer at seq " +
                  (at == stats.writers().end() ? std::string("none") : std::to_string(at->second)) +
                  ", pairs digest " + std::to_string(stats.pairs_digest()) + " (expected " +
                  std::to_string(args.frames) + ", " + std::to_string(args.frames) + ", " + std::to_string(digest) + ")";
      }
    }
    const std::vector<std::string>& observed = observer.wait(std::chrono::seconds(60));
    if (failure.empty() && !observer.error().empty()) failure = "the subscription ended: " + observer.error();
    if (failure.empty() && observed != answers) {
      size_t k = 0;
      while (k < observed.size() && k < answers.size() && observed[k] == answers[k]) ++k;
      failure = "the subscription's " + std::to_string(observed.size()) + " deltas are not the stream's " +
                std::to_string(answers.size()) + " answers (first difference at frame " + std::to_string(k + 1) + ")";
    }
    std::string listed = client.list_pairs(args.world, 64);
    sapgrid::U64Rows rows = sapgrid::pair_rows(listed);
    std::vector<sapgrid::Pair> final_pairs;
    for (size_t r = 0; r < rows.rows(); ++r) final_pairs.push_back(rows.pair(r));
    std::vector<sapgrid::Pair> truth = brute_force(scene.bodies());
    if (failure.empty() && !(final_pairs == truth && std::equal(truth.begin(), truth.end(), mirror.begin(), mirror.end()))) {
      failure = "ListPairs (" + std::to_string(final_pairs.size()) + " pairs) differs from the brute force (" +
                std::to_string(truth.size()) + ") or the deltas (" + std::to_string(mirror.size()) + ")";
    }
    if (!args.keep_world) {
      client.delete_world(args.world);
      created = false;
    }
    if (!failure.empty()) {
      std::cerr << "sapgrid_example: FAIL: " << failure << "\n";
      return 1;
    }
    std::printf("sapgrid_example: ok: %d frames of %zu moving boxes in %.3f s (%.0f frames/s, %d in flight); "
                "%llu pairs created, %llu deleted, %zu active; ListPairs == deltas == brute force; "
                "%llu of %llu pair fields read in place\n",
                args.frames, scene.bodies().size(), seconds, args.frames / seconds, args.window,
                static_cast<unsigned long long>(created_total), static_cast<unsigned long long>(deleted_total),
                final_pairs.size(), static_cast<unsigned long long>(in_place), static_cast<unsigned long long>(fields));
    std::printf("sapgrid_example: subscription: %zu deltas == the stream's answers, byte for byte\n", observed.size());
    if (!args.writer.empty()) {
      std::printf("sapgrid_example: writer %s: frame %d sent again: the identical Delta (%zu bytes), world still at "
                  "%d frames\n", args.writer.c_str(), args.frames, resent.size(), args.frames);
    }
    return 0;
  } catch (const sapgrid::Error& e) {
    std::cerr << "sapgrid_example: FAIL: " << e.what() << " (code " << e.code
              << (e.field.empty() ? "" : ", field " + e.field) << (e.index >= 0 ? "[" + std::to_string(e.index) + "]" : "")
              << ")\n";
    if (created && !args.keep_world) {
      try {
        client.delete_world(args.world);  // the world this run made goes with it
      } catch (const sapgrid::Error& gone) {
        std::cerr << "sapgrid_example: the world " << args.world << " is left: " << gone.what() << "\n";
      }
    }
    return 1;
  }
}
