// The program's own state saved with a checkpoint (user_state.h): exact
// bytes back on every rank, at 1, 2 and 4 ranks and stages 0-3; the global
// set across a resharding, the per-rank set refused or dropped there; a
// damaged file named; the file format refusing damage without crashing.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/engine_harness.h"
#include "temp_dir.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/user_state.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

// `n` bytes from a seed, every value 0-255 likely (zeros included).
Blob bytes_of(uint32_t seed, size_t n) {
  Blob out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>(mix(seed * 2654435761u + static_cast<uint32_t>(i)));
  return out;
}

UserState state_of_rank(int rank) {
  UserState s;
  s.global["data.position"] = to_bytes(int64_t{123'456'789'012});
  s.global["rng.mt19937"] = bytes_of(5, 2500);  // a std::mt19937's size, about
  s.global["empty"] = {};
  s.global["text"] = to_bytes(std::string("epoch 3\0shard 7", 15));
  s.per_rank["sampler.position"] = to_bytes(int64_t{1000} * rank + 7);
  s.per_rank["rng"] = bytes_of(100u + static_cast<uint32_t>(rank), 64u + 13u * static_cast<size_t>(rank));
  return s;
}

// On `world` ranks at `stage`: a finalized engine, then `body(engine, rank)`.
void on_ranks(int stage, int world, const std::function<void(Engine&, int)>& body) {
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(stage), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    body(engine, comm.rank());
  });
}

void save_with(Engine& e, const std::string& dir, UserState state) {
  CheckpointOptions o;
  o.user_state = &state;
  save_checkpoint(e, dir, o);
}

std::vector<UserState> load_on(int stage, int world, const std::string& dir,
                               PerRankUserState policy = PerRankUserState::kFail) {
  std::vector<UserState> out(static_cast<size_t>(world));
  on_ranks(stage, world, [&](Engine& e, int rank) {
    UserState& s = out[static_cast<size_t>(rank)];
    s.global["left over"] = to_bytes(1);  // a load replaces what was there
    CheckpointOptions o;
    o.user_state = &s;
    o.per_rank_user_state = policy;
    load_checkpoint(e, dir, o);
  });
  return out;
}

void flip_byte(const fs::path& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  const char c = static_cast<char>(f.get());
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x20));
}

}  // namespace

TEST_CASE("user state comes back bit for bit on every rank, at 1, 2 and 4 ranks and stages 0-3") {
  for (int world : {1, 2, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(world);
      CAPTURE(stage);
      TempDir dir;
      on_ranks(stage, world, [&](Engine& e, int rank) { save_with(e, dir.str(), state_of_rank(rank)); });
      // Loaded at another stage of the same world size: the per-rank sets
      // still go to their ranks.
      for (int load_stage : {stage, 3 - stage}) {
        const std::vector<UserState> loaded = load_on(load_stage, world, dir.str());
        for (int r = 0; r < world; ++r) {
          CAPTURE(r);
          const UserState expected = state_of_rank(r);
          const UserState& got = loaded[static_cast<size_t>(r)];
          CHECK(got.global == expected.global);
          CHECK(got.per_rank == expected.per_rank);
          CHECK_FALSE(got.per_rank_dropped);
          CHECK(from_bytes<int64_t>(got.per_rank.at("sampler.position")) == 1000 * r + 7);
        }
      }
    }
  }
}

TEST_CASE("resharding keeps the global user state, per-rank state is refused, or dropped on request") {
  TempDir dir, empty_per_rank;
  on_ranks(2, 4, [&](Engine& e, int rank) {
    save_with(e, dir.str(), state_of_rank(rank));
    UserState global_only = state_of_rank(rank);
    global_only.per_rank.clear();
    save_with(e, empty_per_rank.str(), global_only);
  });
  CHECK_THROWS_WITH_AS(load_on(1, 2, dir.str()),
                       doctest::Contains("holds per-rank user state saved by 4 ranks, and this job has 2"), Error);
  // A failed load leaves the caller's state as it was.
  UserState untouched;
  untouched.global["mine"] = to_bytes(42);
  CHECK_THROWS_AS(on_ranks(1, 2,
                           [&](Engine& e, int rank) {
                             UserState s = untouched;
                             CheckpointOptions o;
                             o.user_state = &s;
                             try {
                               load_checkpoint(e, dir.str(), o);
                             } catch (...) {
                               if (rank == 0) CHECK(s.global == untouched.global);
                               throw;
                             }
                           }),
                  Error);
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const std::vector<UserState> dropped = load_on(3, world, dir.str(), PerRankUserState::kDrop);
    for (const UserState& s : dropped) {
      CHECK(s.global == state_of_rank(0).global);
      CHECK(s.per_rank.empty());
      CHECK(s.per_rank_dropped);
    }
    // Nothing per-rank was saved: nothing to lose, no option needed.
    for (const UserState& s : load_on(0, world, empty_per_rank.str())) {
      CHECK(s.global == state_of_rank(0).global);
      CHECK(s.per_rank.empty());
      CHECK_FALSE(s.per_rank_dropped);
    }
  }
}

TEST_CASE("user state: a global set that differs between ranks, damaged files, and none saved") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(on_ranks(1, 2,
                                [&](Engine& e, int rank) {
                                  UserState s = state_of_rank(rank);
                                  if (rank == 1) s.global["data.position"] = to_bytes(int64_t{5});
                                  save_with(e, dir.str(), s);
                                }),
                       doctest::Contains("user state 'global' differs between rank 0 and rank 1"), Error);
  on_ranks(1, 2, [&](Engine& e, int rank) { save_with(e, dir.str(), state_of_rank(rank)); });
  const fs::path ck = dir.path / "step_000000";
  for (const char* file : {"user_global.bin", "user_rank_00001.bin"}) {
    CAPTURE(file);
    const fs::path path = ck / file;
    const fs::path copy = dir.path / "saved.bin";
    fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
    flip_byte(path, 30);
    const std::string named = std::string(file) + "' (user state";
    CHECK_THROWS_WITH_AS(load_on(1, 2, dir.str()), doctest::Contains(named.c_str()), Error);
    fs::resize_file(path, fs::file_size(path) - 1);
    CHECK_THROWS_WITH_AS(load_on(1, 2, dir.str()), doctest::Contains("bytes; the manifest says"), Error);
    fs::copy_file(copy, path, fs::copy_options::overwrite_existing);
  }
  CHECK(load_on(1, 2, dir.str())[1].per_rank == state_of_rank(1).per_rank);
  // A checkpoint saved without user state gives empty sets.
  TempDir plain;
  on_ranks(0, 1, [&](Engine& e, int) { save_checkpoint(e, plain.str()); });
  const UserState none = load_on(0, 1, plain.str())[0];
  CHECK(none.global.empty());
  CHECK(none.per_rank.empty());
}

TEST_CASE("the user state file format: every truncation and a bad header are errors, not crashes") {
  UserState s = state_of_rank(3);
  const std::string file = detail::serialize_user_blobs(s.global, "t");
  const auto bytes = std::as_bytes(std::span(file.data(), file.size()));
  CHECK(detail::parse_user_blobs(bytes, "t") == s.global);
  for (size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS((void)detail::parse_user_blobs(bytes.first(n), "t"), Error);
  }
  std::string extra = file + "x";
  CHECK_THROWS_WITH_AS((void)detail::parse_user_blobs(std::as_bytes(std::span(extra.data(), extra.size())), "t"),
                       doctest::Contains("t: 1 bytes after the last of 4 blobs: the file is damaged"), Error);
  std::string bad = file;
  bad[0] = 'X';
  CHECK_THROWS_WITH_AS((void)detail::parse_user_blobs(std::as_bytes(std::span(bad.data(), bad.size())), "t"),
                       doctest::Contains("t: not a ZEST user state file (no \"ZESTUSR1\" header)"), Error);
  // A length field claiming more than the file holds.
  std::string huge = file;
  std::memset(huge.data() + 16, 0xff, 8);
  CHECK_THROWS_WITH_AS((void)detail::parse_user_blobs(std::as_bytes(std::span(huge.data(), huge.size())), "t"),
                       doctest::Contains("has a name of 18446744073709551615 bytes"), Error);
  UserState unnamed;
  unnamed.global[""] = {};
  CHECK_THROWS_WITH_AS((void)detail::serialize_user_blobs(unnamed.global, "user state 'global'"),
                       doctest::Contains("user state 'global': a blob name has 0 bytes; names must have 1 to 4096"),
                       Error);
}
