// The examples' digest of the trained weights (examples/common/
// weights_digest.h), which the multi-host tests compare across runs: FNV-1a
// over the parameters' fp32 bits, padding and sharding left out, so equal
// weights give equal digests at every stage.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "common/weights_digest.h"
#include "task.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/memory/raw_allocator.h"

using namespace zest;

namespace {

EngineConfig at_stage(int stage) {
  EngineConfig config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;
  config.optimizer.lr = 3e-3f;
  return config;
}

}  // namespace

TEST_CASE("the weights digest is FNV-1a of the parameters' fp32 bits in registration order") {
  for (int stage : {0, 3}) {
    CAPTURE(stage);
    std::vector<std::string> lines(2);
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(at_stage(stage), comm, alloc, Stream::default_for(Device::host()));
      engine.add_unit("a", {{"a.w", {2}}});
      engine.add_unit("b", {{"b.w", {1}}});
      engine.finalize([](const ParamLayout& p, std::span<float> v) {
        if (p.name == "a.w") {
          v[0] = 1.0f;
          v[1] = -2.0f;
        } else {
          v[0] = 0.5f;
        }
      });
      // FNV-1a 64 over the bytes 00 00 80 3f, 00 00 00 c0, 00 00 00 3f.
      CHECK(examples::weights_digest(engine) == 0xc598e74ad8b1c9b5ull);
      lines[static_cast<size_t>(comm.rank())] = examples::format_weights_digest(engine, stage);
    });
    const std::string expected = "weights digest, stage " + std::to_string(stage) + ": 0xc598e74ad8b1c9b5 (3 values)";
    CHECK(lines[0] == expected);
    CHECK(lines[1] == expected);
  }
}

TEST_CASE("the MLP trained at stages 0-3 has one weights digest, not its initial one") {
  const mlp::Shape shape{.input = 16, .hidden = 32, .output = 4, .layers = 2};
  std::vector<uint64_t> initial(4), trained(4);
  for (int stage = 0; stage < 4; ++stage) {
    std::mutex mu;
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(at_stage(stage), comm, alloc, Stream::default_for(Device::host()));
      mlp::register_layers(engine, shape);
      engine.finalize([](const ParamLayout& p, std::span<float> v) { mlp::init_parameter(p, v, 7); });
      const uint64_t before = examples::weights_digest(engine);
      const mlp::Teacher teacher(shape, 8);
      for (long s = 0; s < 3; ++s) {
        mlp::forward_backward(engine, shape, teacher.batch(s, comm.rank() * 8, 8));
        engine.step();
      }
      const uint64_t after = examples::weights_digest(engine);
      if (comm.rank() == 0) {
        std::lock_guard lock(mu);
        initial[static_cast<size_t>(stage)] = before;
        trained[static_cast<size_t>(stage)] = after;
      }
    });
  }
  for (int stage = 1; stage < 4; ++stage) {
    CAPTURE(stage);
    CHECK(initial[static_cast<size_t>(stage)] == initial[0]);
    CHECK(trained[static_cast<size_t>(stage)] == trained[0]);
  }
  CHECK(trained[0] != initial[0]);
}
