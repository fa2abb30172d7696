// Engine::begin_shard_load / load_shard / finish_shard_load, the one-pass
// path of a weights load (import_hf): the same master weights, parameters
// and zeroed optimizer state, bit for bit, as write_shard and restore()
// (start_from_weights), at every stage, in fp32 and bf16, with the master
// partly offloaded, with a frozen unit, and with ranges loaded from several
// threads at once.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "engine/engine_harness.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/engine/unit_handle.h"

using namespace zest;
using namespace zest::test;

namespace {

// What a load leaves: every buffer of every owned shard, and every unit's
// gathered compute-dtype parameters (their bytes).
struct Loaded {
  std::vector<std::vector<float>> shards;
  std::vector<std::vector<std::byte>> params;
};

// Values for unit u's shard: finite, distinct, not representable in bf16
// (so the narrowing shows), zero in the padding as a load writes it.
std::vector<float> new_values(const Engine& engine, int u) {
  const UnitLayout& U = engine.layout().unit(u);
  const size_t begin = U.shard * static_cast<size_t>(engine.partition());
  std::vector<float> v(U.shard, 0.0f);
  for (const ParamLayout& p : U.params) {
    for (size_t i = std::max(begin, p.offset); i < std::min(begin + U.shard, p.offset + p.numel); ++i) {
      v[i - begin] = 0.37f + static_cast<float>(i) * 1.0001f + static_cast<float>(u);
    }
  }
  return v;
}

bool bf16_compute(const Engine& engine) { return engine.compute_dtype() == DType::kBFloat16; }

Loaded load_run(const EngineConfig& config, int world, bool one_pass, int threads) {
  std::vector<Loaded> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator()), host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()), [](Engine& e) {
          register_model(e);
          e.add_unit("f", {{"f.w", {5, 7}, "default", false}, {"f.b", {5}, "no_decay", false}});
        });
    const int units = engine->layout().num_units();
    for (int64_t s = 0; s < 2; ++s) {  // steps first, so the optimizer state is not zero
      for (int u = 0; u < units; ++u) UnitHandle h = engine->gather(u);
      for (int u = units - 1; u >= 0; --u) {
        if (engine->layout().unit(u).frozen) continue;
        if (bf16_compute(*engine)) {
          write_grads<bf16>(*engine, u, comm.rank(), s, 0, Backward{});
        } else {
          write_grads<float>(*engine, u, comm.rank(), s, 0, Backward{});
        }
      }
      engine->step();
    }
    for (int u = 0; u < units; ++u) {
      const std::vector<float> v = new_values(*engine, u);
      if (!one_pass) {
        start_unit_from_weights(*engine, u, v);
        continue;
      }
      const bool direct = engine->begin_shard_load(u);
      CHECK(direct);  // host memory here: several threads may write
      // Two ranges, the second split among `threads` threads.
      const size_t half = v.size() / 3;
      engine->load_shard(u, 0, std::span(v).first(half));
      std::vector<std::thread> ts;
      const size_t rest = v.size() - half, per = (rest + threads - 1) / threads;
      for (int t = 0; t < threads; ++t) {
        const size_t b = std::min(rest, per * t), e = std::min(rest, b + per);
        ts.emplace_back([&, b, e] { engine->load_shard(u, half + b, std::span(v).subspan(half + b, e - b)); });
      }
      for (std::thread& t : ts) t.join();
    }
    Engine::Progress fresh = engine->progress();
    fresh.applied_steps = 0;
    fresh.skipped_steps = 0;
    if (one_pass) {
      engine->finish_shard_load(fresh);
    } else {
      engine->restore(fresh);
    }
    Loaded r;
    for (int u = 0; u < units; ++u) {
      const int buffers = engine->layout().unit(u).frozen ? 1 : engine->shard_buffers();
      for (int b = 0; b < buffers; ++b) r.shards.push_back(engine->read_shard(u, b));
      UnitHandle h = engine->gather(u);
      const auto* bytes = static_cast<const std::byte*>(h.data());
      r.params.emplace_back(bytes, bytes + engine->layout().unit(u).padded * elem_size(engine->compute_dtype()));
    }
    CHECK(engine->progress().applied_steps == 0);
    out[static_cast<size_t>(comm.rank())] = std::move(r);
  });
  // Every rank's shards, rank 0's parameters (the same on every rank).
  Loaded all = out[0];
  for (size_t r = 1; r < out.size(); ++r) {
    all.shards.insert(all.shards.end(), out[r].shards.begin(), out[r].shards.end());
  }
  return all;
}

}  // namespace

TEST_CASE("load_shard leaves the bits write_shard and restore leave, optimizer state zeroed") {
  for (const int stage : {0, 1, 3}) {
    for (const int precision : {0, 1, 2}) {  // fp32; bf16; bf16 master weights and state
      for (const double ratio : {0.0, 0.5}) {
        if ((ratio > 0 || precision == 2) && stage == 0) continue;  // offload, bf16 master: a ZeRO stage
        EngineConfig config = base_config(stage);
        const bool bf16 = precision > 0;
        config.bf16 = bf16;
        config.bf16_master_weights_and_grads = config.bf16_optimizer_states = precision == 2;
        if (ratio > 0) {
          config.offload_optimizer.device = OffloadDevice::kCpu;
          config.offload_optimizer.ratio = ratio;
        }
        const int world = stage == 0 ? 1 : 2;
        CAPTURE(stage);
        CAPTURE(precision);
        CAPTURE(ratio);
        const Loaded reference = load_run(config, world, false, 1);
        const Loaded loaded = load_run(config, world, true, 3);
        REQUIRE(loaded.shards.size() == reference.shards.size());
        for (size_t i = 0; i < loaded.shards.size(); ++i) {
          CAPTURE(i);
          CHECK(same_bits(loaded.shards[i], reference.shards[i]));
        }
        CHECK(loaded.params == reference.params);
        // The state buffers are zero (Adam: buffers 1 and 2 of each trainable unit).
        size_t nonzero = 0;
        for (const std::vector<float>& s : loaded.shards)
          for (const float x : s) nonzero += x != 0.0f;
        CHECK(nonzero > 0);  // the masters
      }
    }
  }
}

TEST_CASE("load_shard refuses a range past the shard, naming the unit") {
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator()), host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(base_config(1), comm, alloc, host, Stream::default_for(Device::host()));
    const size_t shard = engine->layout().unit(0).shard;
    const std::vector<float> v(2, 1.0f);
    const std::string want =
        fmt::format("load_shard of unit 'a': elements [{}, {}) are past its shard of {}", shard - 1, shard + 1, shard);
    CHECK_THROWS_WITH_AS(engine->load_shard(0, shard - 1, v), doctest::Contains(want.c_str()), Error);
  });
}
