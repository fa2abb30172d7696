// finalize()'s initial values: moved to the device piece by piece.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

#include "engine_harness.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("a unit larger than the staging buffer is initialized piece by piece") {
  // 2^24 + 1000 elements: two pieces, the second short, and at stage 3 on 2
  // ranks the shard boundary falls inside the first piece.
  const int64_t n = (int64_t{1} << 24) + 1000;
  EngineConfig config = base_config(3);
  config.bf16 = true;
  config.optimizer.kind = OptimizerKind::kSgd;  // no state: keep the test's memory small
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    engine.add_unit("big", {{"big.w", {n}}});
    engine.finalize([](const ParamLayout&, std::span<float> v) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 251) - 125.0f;  // exact in bf16
    });
    // The staging buffer never held more than one piece of fp32.
    CHECK(engine.memory_report()[MemoryCategory::kCommBuffers].peak == int64_t{4} << 24);
    const std::vector<float> master = engine.param_master("big.w");
    REQUIRE(master.size() == static_cast<size_t>(n));
    for (size_t i : {size_t{0}, size_t{1} << 23, (size_t{1} << 24) - 1, size_t{1} << 24, static_cast<size_t>(n) - 1}) {
      CAPTURE(i);
      CHECK(master[i] == static_cast<float>(i % 251) - 125.0f);
    }
    // The bf16 parameters came through the same pieces.
    UnitHandle h = engine.gather(0);
    std::vector<bf16> p(static_cast<size_t>(n));
    std::memcpy(p.data(), h.param<bf16>("big.w").data(), p.size() * sizeof(bf16));
    CHECK(static_cast<float>(p[(size_t{1} << 24) + 5]) == static_cast<float>(((size_t{1} << 24) + 5) % 251) - 125.0f);
    CHECK(static_cast<float>(p[12345]) == static_cast<float>(12345 % 251) - 125.0f);
  });
}

TEST_CASE("InitFrom::kZeros: no initializer runs, every value starts at zero, also in bf16 and with offload") {
  for (const bool bf16 : {false, true}) {
    for (int stage : {0, 1, 3}) {
      CAPTURE(bf16);
      CAPTURE(stage);
      run_inprocess(3, [&](Communicator& comm) {
        CachingAllocator alloc(make_host_allocator());
        EngineConfig c = base_config(stage);
        c.bf16 = bf16;
        if (stage > 0) c.offload_optimizer.device = OffloadDevice::kCpu;
        Engine engine(c, comm, alloc, Stream::default_for(Device::host()));
        register_model(engine);
        engine.finalize({}, InitFrom::kZeros);
        for (const auto& [name, values] : master_params(engine)) {
          CAPTURE(name);
          CHECK(std::all_of(values.begin(), values.end(), [](float x) { return x == 0.0f; }));
        }
      });
    }
  }
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(0), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    CHECK_THROWS_WITH_AS(engine.finalize({}), doctest::Contains("the initializer is empty"), Error);
  });
}

TEST_CASE("initial values come from rank 0's initializer, or from every rank's") {
  // The initializer writes its rank into every value: from rank 0 every
  // rank must see 0, and only rank 0 may have run it; from every rank each
  // rank keeps its own values (a deterministic initializer gives them all
  // the same; this one shows whose values were used).
  for (const InitFrom from : {InitFrom::kRank0, InitFrom::kEveryRank}) {
    CAPTURE(static_cast<int>(from));
    for (int stage : {0, 3}) {
      CAPTURE(stage);
      run_inprocess(3, [&](Communicator& comm) {
        CachingAllocator alloc(make_host_allocator());
        Engine engine(base_config(stage), comm, alloc, Stream::default_for(Device::host()));
        register_model(engine);
        int calls = 0;
        engine.finalize(
            [&](const ParamLayout&, std::span<float> v) {
              ++calls;
              std::fill(v.begin(), v.end(), static_cast<float>(comm.rank()) + 0.5f);
            },
            from);
        const bool ran = from == InitFrom::kEveryRank || comm.rank() == 0;
        CHECK((calls > 0) == ran);
        const float expected = from == InitFrom::kRank0 ? 0.5f : static_cast<float>(comm.rank()) + 0.5f;
        for (const auto& [name, values] : master_params(engine)) {
          CAPTURE(name);
          // From every rank at stage 3, each rank's shard holds its own
          // values and the gathered master mixes them; at stage 0 each rank
          // keeps the whole master, its own.
          if (from == InitFrom::kEveryRank && stage == 3) continue;
          CHECK(std::all_of(values.begin(), values.end(), [&](float x) { return x == expected; }));
        }
      });
    }
  }
}
