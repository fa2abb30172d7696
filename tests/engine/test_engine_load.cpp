// Engine::begin_shard_load / load_shard / finish_shard_load, the one-pass
// path of a weights load (import_hf): the same master weights, parameters
// and zeroed optimizer state, bit for bit, as write_shard and restore()
// (start_from_weights), at every stage, in fp32 and bf16, with the master
// partly offloaded or in an NVMe swap file, with a frozen unit, and with ranges loaded from several
// threads at once.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "checkpoint/temp_dir.h"
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
      // Host memory here: several threads may write; a master in a swap
      // file is written by one.
      const bool in_file = config.offload_optimizer.device == OffloadDevice::kNvme;
      const bool parallel = engine->begin_shard_load(u).threads;
      CHECK((parallel || in_file));
      const int writers = parallel ? threads : 1;
      // Two ranges, the second split among `writers` threads.
      const size_t half = v.size() / 3;
      engine->load_shard(u, 0, std::span(v).first(half));
      std::vector<std::thread> ts;
      const size_t rest = v.size() - half, per = (rest + writers - 1) / writers;
      for (int t = 0; t < writers; ++t) {
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
      for (const double ratio : {0.0, 0.5, 1.0}) {  // 1: offloaded to NVMe
        if ((ratio > 0 || precision == 2) && stage == 0) continue;  // offload, bf16 master: a ZeRO stage
        EngineConfig config = base_config(stage);
        const bool bf16 = precision > 0;
        config.bf16 = bf16;
        config.bf16_master_weights_and_grads = config.bf16_optimizer_states = precision == 2;
        const TempDir swap;
        if (ratio > 0) {
          config.offload_optimizer.device = ratio < 1 ? OffloadDevice::kCpu : OffloadDevice::kNvme;
          config.offload_optimizer.ratio = ratio;
          config.offload_optimizer.nvme_path = swap.str();
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

TEST_CASE("load_shard with the parameters on NVMe: the shard staged piece by piece, the bits of restore") {
  // offload_param nvme (with the optimizer on NVMe, as it must be): each
  // shard in the swap file takes its pieces in a staged buffer (Note [staged
  // shard writes] in engine/detail/param_swap.h), written when the next unit's
  // pieces start and by finish_shard_load; the gathers after read them
  // back from the file.
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    EngineConfig config = base_config(3);
    config.bf16 = bf16;
    const TempDir swap;
    config.offload_optimizer.device = OffloadDevice::kNvme;
    config.offload_optimizer.nvme_path = swap.str();
    config.offload_param.device = OffloadDevice::kNvme;
    config.offload_param.nvme_path = swap.str();
    config.offload_param.buffer_count = 2;
    config.offload_param.max_in_cpu = 0;
    config.zero.stage3_param_persistence_threshold = 0;
    const Loaded reference = load_run(config, 2, false, 1);
    const Loaded loaded = load_run(config, 2, true, 1);
    REQUIRE(loaded.shards.size() == reference.shards.size());
    for (size_t i = 0; i < loaded.shards.size(); ++i) {
      CAPTURE(i);
      CHECK(same_bits(loaded.shards[i], reference.shards[i]));
    }
    CHECK(loaded.params == reference.params);
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

namespace {

// How a unit's bf16 values reach a bf16 engine with an fp32 master.
enum class Bf16Load {
  kWritten,   // load_shard, without every_value: the master is written
  kInPlace,   // copied into ShardLoad::in_place: the master is deferred
  kInPlaceRead,  // and every master read (widened) before the first step
};

struct Bf16Run {
  std::vector<std::vector<float>> masters;  // read_shard(u, 0) after the load, by rank then unit
  Loaded trained;                           // after two steps
};

// Unit u's load values (new_values) rounded to bf16, as a bf16 checkpoint
// holds them.
std::vector<uint16_t> bf16_values(const Engine& engine, int u) {
  const std::vector<float> v = new_values(engine, u);
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16_bits(v[i]);
  return out;
}

Bf16Run bf16_load_run(const EngineConfig& config, int world, Bf16Load how) {
  std::vector<Bf16Run> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator()), host(make_host_allocator());
    const std::unique_ptr<Engine> engine = finalized_engine(config, comm, alloc, host,
                                                            Stream::default_for(Device::host()));
    const int units = engine->layout().num_units();
    for (int u = 0; u < units; ++u) {
      const std::vector<uint16_t> v = bf16_values(*engine, u);
      if (how == Bf16Load::kWritten) {
        CHECK(engine->begin_shard_load(u).in_place.empty());
        engine->load_shard(u, 0, v.data(), DType::kBFloat16, v.size());
        continue;
      }
      const Engine::ShardLoad load = engine->begin_shard_load(u, DType::kBFloat16);
      REQUIRE(load.in_place.size() == v.size() * 2);
      std::memcpy(load.in_place.data(), v.data(), load.in_place.size());
    }
    engine->finish_shard_load(engine->progress());
    Bf16Run r;
    if (how != Bf16Load::kInPlace) {
      for (int u = 0; u < units; ++u) r.masters.push_back(engine->read_shard(u, 0));
    }
    RankResult ignored;
    run_steps(*engine, comm, runs(world, 2), 0, 2, ignored);
    for (int u = 0; u < units; ++u) {
      for (int b = 0; b < engine->shard_buffers(); ++b) r.trained.shards.push_back(engine->read_shard(u, b));
      UnitHandle h = engine->gather(u);
      const auto* bytes = static_cast<const std::byte*>(h.data());
      r.trained.params.emplace_back(bytes, bytes + engine->layout().unit(u).padded * 2);
    }
    out[static_cast<size_t>(comm.rank())] = std::move(r);
  });
  Bf16Run all = std::move(out[0]);
  for (size_t r = 1; r < out.size(); ++r) {
    all.masters.insert(all.masters.end(), out[r].masters.begin(), out[r].masters.end());
    all.trained.shards.insert(all.trained.shards.end(), out[r].trained.shards.begin(), out[r].trained.shards.end());
  }
  return all;
}

}  // namespace

TEST_CASE("a load in the compute dtype defers the master: the same bits read and after steps as a load that writes it") {
  for (const int stage : {1, 2, 3}) {
    for (const double ratio : {0.0, 0.5}) {
      EngineConfig config = base_config(stage);
      config.bf16 = true;
      if (ratio > 0) {
        config.offload_optimizer.device = OffloadDevice::kCpu;
        config.offload_optimizer.ratio = ratio;
      }
      CAPTURE(stage);
      CAPTURE(ratio);
      const Bf16Run written = bf16_load_run(config, 2, Bf16Load::kWritten);
      const Bf16Run deferred = bf16_load_run(config, 2, Bf16Load::kInPlace);
      const Bf16Run read = bf16_load_run(config, 2, Bf16Load::kInPlaceRead);
      // Read before a step: widened from the parameters, the bits the
      // written master holds (the bf16 values widened, none of them zero
      // outside the padding).
      REQUIRE(read.masters.size() == written.masters.size());
      for (size_t i = 0; i < read.masters.size(); ++i) CHECK(same_bits(read.masters[i], written.masters[i]));
      // Widened by the first step instead, or by the reads before it: the
      // update starts from the same master either way.
      for (const Bf16Run* run : {&deferred, &read}) {
        REQUIRE(run->trained.shards.size() == written.trained.shards.size());
        for (size_t i = 0; i < written.trained.shards.size(); ++i) {
          CAPTURE(i);
          CHECK(same_bits(run->trained.shards[i], written.trained.shards[i]));
        }
        CHECK(run->trained.params == written.trained.params);
      }
    }
  }
}

TEST_CASE("a load abandoned after writing in place: the parameters come back from the master, a frozen unit's are zeroed") {
  for (const int stage : {0, 3}) {
    CAPTURE(stage);
    run_inprocess(stage == 0 ? 1 : 2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator()), host(make_host_allocator());
      EngineConfig config = base_config(stage);
      config.bf16 = true;
      const std::unique_ptr<Engine> engine =
          finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()), [](Engine& e) {
            register_model(e);
            e.add_unit("f", {{"f.w", {5, 7}, "default", false}});
          });
      const int units = engine->layout().num_units();
      const Params before = master_params(*engine);
      for (int u = 0; u < units; ++u) {
        const Engine::ShardLoad load = engine->begin_shard_load(u, DType::kBFloat16);
        REQUIRE(!load.in_place.empty());
        std::fill(load.in_place.begin(), load.in_place.end(), std::byte{0x7f});  // stand-ins for a refused file
        engine->abandon_shard_load(u);
      }
      engine->finish_shard_load(engine->progress());
      const Params after = master_params(*engine);
      for (const auto& [name, values] : after) {
        CAPTURE(name);
        if (name == "f.w") {
          CHECK(std::all_of(values.begin(), values.end(), [](float x) { return detail::float_bits(x) == 0; }));
        } else {
          CHECK(same_bits(values, before.at(name)));
        }
      }
      // The parameters are the master narrowed again, on every rank.
      for (int u = 0; u + 1 < units; ++u) {
        UnitHandle h = engine->gather(u);
        for (const ParamLayout& p : engine->layout().unit(u).params) {
          const std::span<const bf16> w = h.param<bf16>(p.name);
          for (size_t i = 0; i < p.numel; ++i) {
            CHECK(w[i].bits == float_to_bf16_bits(before.at(p.name)[i]));
          }
        }
      }
    });
  }
}
