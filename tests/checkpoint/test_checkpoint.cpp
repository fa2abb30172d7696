// Sharded checkpoints: exact resume, resharding across world sizes and
// stages, and damaged checkpoints failing clearly.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "checkpoint/temp_dir.h"
#include "engine/engine_harness.h"
#include "zest/core/crc32.h"
#include "zest/checkpoint/checkpoint.h"
#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/checkpoint/checkpoint_reader.h"
#include "zest/core/file_io.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {


// Runs steps [first, last) on `world` ranks; loads `load_from` first and
// saves to `save_to` at the end when given. Returns rank 0's parameters and
// checks that every rank has the same.
Params run(EngineConfig config, int world, int64_t first, int64_t last, const std::string& load_from = "",
           const std::string& save_to = "", RunOptions opt = runs(1, 0)) {
  std::vector<Params> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    if (!load_from.empty()) load_checkpoint(engine, load_from);
    RankResult r;
    run_steps(engine, comm, opt, first, last, r);
    if (!save_to.empty()) save_checkpoint(engine, save_to);
    out[static_cast<size_t>(comm.rank())] = master_params(engine);
  });
  for (const Params& p : out) {
    for (const auto& [name, values] : p) CHECK(same_bits(values, out[0].at(name)));
  }
  return out[0];
}

// Writes an edited manifest back with a matching checksum, as a deliberate
// edit would: the checks behind the checksum must still catch it.
void write_resealed(const fs::path& manifest, const std::string& text) {
  nlohmann::json doc = nlohmann::json::parse(text);
  doc.erase("manifest_crc32");
  const std::string canonical = doc.dump();
  doc["manifest_crc32"] = fmt::format("{:08x}", crc32(canonical.data(), canonical.size()));
  std::ofstream(manifest) << doc.dump(1) << "\n";
}

EngineConfig adam_config(int stage) {
  EngineConfig c = base_config(stage);
  c.gradient_clipping = 0.5;
  return c;
}

}  // namespace

TEST_CASE("N steps straight equal k steps, save, load, N - k steps, bit for bit, at every stage") {
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 3}) {
      CAPTURE(stage);
      CAPTURE(world);
      TempDir dir;
      EngineConfig config = adam_config(stage);
      config.fp16.enabled = stage == 2;  // also the loss scaler's state
      const Params straight = run(config, world, 0, 5);
      run(config, world, 0, 2, "", dir.str());
      CHECK(fs::exists(dir.path / "latest"));
      CHECK(fs::exists(dir.path / "step_000002" / "manifest.json"));
      const Params resumed = run(config, world, 2, 5, dir.str());
      check_same(resumed, straight);
    }
  }
}

TEST_CASE("resharding: 4 -> 2 -> 3 -> 1 -> 4 ranks, across stages, keeps parameters and optimizer state") {
  // Every rank computes the same gradients, so runs on 1, 2 and 4 ranks give
  // the same parameters bit for bit (test_engine_equivalence), and a resharded
  // run can be compared with one that never stopped.
  RunOptions opt = runs(1, 0);
  opt.backward.same_on_every_rank = true;
  TempDir a, b, c, d;
  const Params straight = run(adam_config(2), 4, 0, 4, "", "", opt);

  const Params at4 = run(adam_config(2), 4, 0, 2, "", a.str(), opt);
  // 4 -> 2 ranks (stage 1), then continue: equals the straight run.
  check_same(run(adam_config(1), 2, 2, 4, a.str(), "", opt), straight);
  // Pure reloads keep the parameters bit for bit, whatever the layout.
  check_same(run(adam_config(1), 2, 0, 0, a.str(), b.str(), opt), at4);
  check_same(run(adam_config(3), 3, 0, 0, b.str(), c.str(), opt), at4);
  check_same(run(adam_config(0), 1, 0, 0, c.str(), d.str(), opt), at4);
  // ...and the optimizer state survives every hop: continuing after them
  // still equals the straight run.
  check_same(run(adam_config(3), 4, 2, 4, d.str(), "", opt), straight);
}

TEST_CASE("a damaged or foreign checkpoint is a clear error naming the file") {
  TempDir dir;
  const EngineConfig config = adam_config(2);
  run(config, 2, 0, 1, "", dir.str());
  const fs::path ckpt = dir.path / "step_000001";
  const fs::path shard = ckpt / "rank_00001.bin";
  const auto load = [&] { run(config, 2, 0, 0, dir.str()); };
  const std::string pristine = read_text_file(shard.string());

  SUBCASE("truncated shard") {
    fs::resize_file(shard, pristine.size() - 4);
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("rank_00001.bin' has"), Error);
  }
  SUBCASE("a flipped byte") {
    std::string bad = pristine;
    bad[bad.size() / 2] ^= 0x10;
    std::ofstream(shard, std::ios::binary) << bad;
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("rank_00001.bin' is corrupt: CRC-32"), Error);
  }
  SUBCASE("a missing shard") {
    fs::remove(shard);
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("cannot open '"), Error);
  }
  SUBCASE("a newer format") {
    std::string m = read_text_file((ckpt / "manifest.json").string());
    m.replace(m.find("\"format_version\": 2"), 19, "\"format_version\": 7");
    std::ofstream(ckpt / "manifest.json") << m;
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("format version 7, newer than the 3"), Error);
  }
  SUBCASE("a manifest of another model") {
    std::string m = read_text_file((ckpt / "manifest.json").string());
    m.replace(m.find("\"a.w\""), 5, "\"a.v\"");
    write_resealed(ckpt / "manifest.json", m);
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("is of another model"), Error);
  }
  SUBCASE("not JSON at all") {
    std::ofstream(ckpt / "manifest.json") << "{ nope";
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("manifest.json': byte 4: not valid JSON"), Error);
  }
  SUBCASE("a NaN with a matching checksum") {
    std::string bad = pristine;
    const float nan = std::nanf("");
    std::memcpy(bad.data() + 8, &nan, 4);
    std::ofstream(shard, std::ios::binary) << bad;
    std::string m = read_text_file((ckpt / "manifest.json").string());
    const std::string old_crc = std::to_string(crc32(pristine.data(), pristine.size()));
    m.replace(m.find(old_crc), old_crc.size(), std::to_string(crc32(bad.data(), bad.size())));
    write_resealed(ckpt / "manifest.json", m);
    CHECK_THROWS_WITH_AS(load(), doctest::Contains("has nan at element"), Error);
  }
  SUBCASE("no checkpoint at all") {
    TempDir empty;
    CHECK_THROWS_WITH_AS(run(config, 2, 0, 0, empty.str()), doctest::Contains("no checkpoint to load"), Error);
  }
}

// A process killed at random moments of saves: test_kill_loop.cpp (test_checkpoint_safety).

// A MiCS run (zero.mics_shard_size) holds a replica of the model states per
// group of ranks: its first group's ranks save their shards, which load
// under flat sharding at other world sizes and stages, and back into MiCS.
TEST_CASE("a MiCS checkpoint (4 ranks, groups of 2) loads flat on 4, 2 and 3 ranks, and a flat one back into MiCS") {
  // Every rank computes the same gradients, so runs on 2, 3 and 4 ranks,
  // flat or in groups, give the same parameters bit for bit.
  RunOptions opt = runs(1, 0);
  opt.backward.same_on_every_rank = true;
  const auto config = [](int stage, int mics_shard_size) {
    EngineConfig c = adam_config(stage);
    c.zero.mics_shard_size = mics_shard_size;
    return c;
  };
  TempDir a, b, c;
  const Params straight = run(config(3, -1), 4, 0, 4, "", "", opt);
  const Params mics_straight = run(config(3, 2), 4, 0, 4, "", "", opt);
  check_same(mics_straight, straight);

  const Params at2 = run(config(3, 2), 4, 0, 2, "", a.str(), opt);
  // The first group's two shards hold the whole model: two shard files, the
  // partitions of the group, on a world of 4.
  const CheckpointManifest m = CheckpointReader((a.path / "step_000002").string()).manifest();
  CHECK(m.partitions == 2);
  CHECK(m.world_size == 4);
  CHECK(m.files.size() == 2u);

  // MiCS -> flat stage 3 on 4 ranks, continued: the straight run's bits, so
  // the parameters and the optimizer state both came through.
  check_same(run(config(3, -1), 4, 2, 4, a.str(), "", opt), straight);
  // MiCS -> stage 1 on 2 ranks -> stage 2 on 3 ranks: the parameters kept...
  check_same(run(config(1, -1), 2, 0, 0, a.str(), b.str(), opt), at2);
  check_same(run(config(2, -1), 3, 0, 0, b.str(), c.str(), opt), at2);
  // ...and back into MiCS on 4 ranks, continued: still the straight run.
  check_same(run(config(3, 2), 4, 2, 4, c.str(), "", opt), straight);
  check_same(run(config(3, 2), 4, 2, 4, a.str(), "", opt), mics_straight);
}
