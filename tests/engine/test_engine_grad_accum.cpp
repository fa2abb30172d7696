// data_types.grad_accum_dtype: gradients of bf16 compute accumulated across
// micro-steps in fp32 keep the bits that bf16 accumulation rounds away, with
// the exact values at every stage and world size.
#include <doctest/doctest.h>

#include <optional>

#include "engine/engine_harness.h"

using namespace zest;
using namespace zest::test;

namespace {

constexpr int kMicro = 8;
constexpr float kSmall = 1.0f / 512.0f;  // 2^-9: a quarter of bf16's spacing at 1
// Magnitudes of 1 or more, where 2^-9 is at most a quarter of bf16's
// spacing, so that x + 2^-9 rounds back to x without a tie.
const std::vector<float> kFirst = {1.0f, 1.5f, 2.0f, -3.0f, 1.25f, 1.0f, -2.0f, 4.0f};

EngineConfig sgd_bf16(int stage, int micro_steps, std::optional<DType> accum) {
  EngineConfig c = base_config(stage);
  c.bf16 = true;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = 1.0f;
  c.optimizer.weight_decay = 0.0f;
  c.optimizer.momentum = 0.0f;
  c.gradient_accumulation_steps = micro_steps;
  c.grad_accum_dtype = accum;
  return c;
}

struct Outcome {
  std::vector<float> master;  // rank 0's, after one optimizer step from zeros
  int64_t gradient_bytes = 0;
};

// One optimizer step of `micro_steps` micro-steps on `world` ranks, every
// rank writing the same gradients: kFirst in the first micro-step, kSmall
// in each later one.
Outcome one_step(const EngineConfig& config, int world) {
  std::vector<Outcome> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    const Stream stream = Stream::default_for(Device::host());
    Engine engine(config, comm, alloc, stream);
    engine.add_unit("u", {{"w", {static_cast<int64_t>(kFirst.size())}}});
    engine.finalize([](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.0f); });
    for (int m = 0; m < config.accumulation_steps(); ++m) {
      std::vector<bf16> g(kFirst.size());
      for (size_t i = 0; i < g.size(); ++i) g[i] = bf16(m == 0 ? kFirst[i] : kSmall);
      UnitHandle h = engine.gather(0);
      GradHandle grads = engine.grads(0);
      copy_bytes(stream, grads.grad<bf16>("w").data(), g.data(), g.size() * sizeof(bf16));
      stream.synchronize();
      grads.done();
      h.release();
      const StepResult r = engine.step();
      CHECK(r.boundary == (m + 1 == config.accumulation_steps()));
    }
    Outcome o;
    o.master = engine.param_master("w");
    o.gradient_bytes = engine.memory_report()[MemoryCategory::kGradients].current;
    out[static_cast<size_t>(comm.rank())] = o;
  });
  return out[0];
}

}  // namespace

TEST_CASE("grad_accum_dtype fp32 under bf16 keeps what bf16 accumulation rounds away, at every stage") {
  for (int world : {1, 2, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(world);
      CAPTURE(stage);
      const Outcome wide = one_step(sgd_bf16(stage, kMicro, DType::kFloat32), world);
      const Outcome narrow = one_step(sgd_bf16(stage, kMicro, std::nullopt), world);
      const Outcome same = one_step(sgd_bf16(stage, kMicro, DType::kBFloat16), world);
      for (size_t i = 0; i < kFirst.size(); ++i) {
        CAPTURE(i);
        // SGD at lr 1 from zeros: w = -(sum of the micro-steps' gradients) / 8.
        // In fp32 every partial sum is exact; in bf16 each one rounds back to
        // the first gradient.
        CHECK(wide.master[i] == -(kFirst[i] + (kMicro - 1) * kSmall) / kMicro);
        CHECK(narrow.master[i] == -kFirst[i] / kMicro);
        CHECK(same.master[i] == narrow.master[i]);
      }
    }
  }
}

TEST_CASE("grad_accum_dtype fp32 without accumulation: the stage 2-3 gradient shard in fp32, same values") {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const Outcome wide = one_step(sgd_bf16(stage, 1, DType::kFloat32), 2);
    const Outcome narrow = one_step(sgd_bf16(stage, 1, std::nullopt), 2);
    for (size_t i = 0; i < kFirst.size(); ++i) CHECK(wide.master[i] == -kFirst[i]);
    // The unit pads to 512 elements on 2 ranks; at stages 2-3 each rank keeps
    // its 256-element shard between steps, in fp32 or in bf16.
    if (stage >= 2) {
      CHECK(wide.gradient_bytes == 256 * 4);
      CHECK(narrow.gradient_bytes == 256 * 2);
    }
  }
}

TEST_CASE("grad_accum_dtype narrower than fp32 and other than the compute dtype is refused, as is local accumulation in fp32") {
  EngineConfig c = sgd_bf16(1, 2, DType::kFloat16);
  CHECK_THROWS_WITH_AS(one_step(c, 1),
                       doctest::Contains("data_types.grad_accum_dtype is fp16 with bf16 compute: ZEST accumulates "
                                         "gradients in the compute dtype or in fp32"),
                       Error);
  c = sgd_bf16(1, 2, DType::kFloat32);
  c.zero.reduce_at_accumulation_boundary = true;
  CHECK_THROWS_WITH_AS(one_step(c, 1),
                       doctest::Contains("zero.reduce_at_accumulation_boundary with data_types.grad_accum_dtype fp32 "
                                         "under bf16 compute"),
                       Error);
}
