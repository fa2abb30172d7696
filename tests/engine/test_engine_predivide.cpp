// prescale_gradients and gradient_predivide_factor: the reduced gradient has
// the bits of DeepSpeed's order of operations (Note [gradient predivision],
// engine/gradient_division.h) at every stage, in fp16 and bf16, on a world
// size where dividing before or after the sum rounds differently.
#include <doctest/doctest.h>

#include <cstring>

#include "config/config_test_helpers.h"
#include "engine/engine_harness.h"
#include "zest/config/config.h"

using namespace zest;
using namespace zest::test;

namespace {

constexpr int kWorld = 3;
constexpr size_t kNumel = 257;  // not a multiple of the shard quantum

// Rank r's gradient of element i: fp16- and bf16-representable values of
// varied magnitude, so products and sums round.
float grad_value(int rank, size_t i) {
  return (1.0f + noise(static_cast<uint32_t>(rank), static_cast<uint32_t>(i), 3)) * 37.0f;
}

// One optimizer step of SGD (lr 1, no decay) from zero weights: the master
// weights are then minus the reduced gradient, exactly. Rank 0's values.
template <typename T>
std::vector<float> reduced_by_engine(EngineConfig config) {
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.lr = 1.0f;
  config.optimizer.weight_decay = 0.0f;
  config.fp16.loss_scale = 1.0;  // static: the gradients carry no scale
  std::vector<float> out;
  run_inprocess(kWorld, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    engine.add_unit("u", {{"u.w", {static_cast<int64_t>(kNumel)}}});
    engine.finalize([](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.0f); });
    {
      UnitHandle h = engine.gather(0);
      GradHandle g = engine.grads(0);
      T* grads = static_cast<T*>(g.data());
      for (size_t i = 0; i < kNumel; ++i) grads[i] = T(grad_value(comm.rank(), i));
      g.done();
    }
    const StepResult r = engine.step();
    REQUIRE(r.applied);
    std::vector<float> w = engine.param_master("u.w");
    if (comm.rank() == 0) out = std::move(w);
  });
  return out;
}

// DeepSpeed's order, element by element: each rank's gradient times
// `before` (rounded to T), summed over the ranks in float and rounded once
// (the in-process reduction), times `after` (rounded to T).
template <typename T>
std::vector<float> expected(float before, float after) {
  std::vector<float> out(kNumel);
  for (size_t i = 0; i < kNumel; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < kWorld; ++r) sum += static_cast<float>(T(static_cast<float>(T(grad_value(r, i))) * before));
    out[i] = -static_cast<float>(T(static_cast<float>(T(sum)) * after));
  }
  return out;
}

// The average ZEST takes without either key: the sum divided by W, rounded once.
template <typename T>
std::vector<float> averaged() {
  std::vector<float> out(kNumel);
  for (size_t i = 0; i < kNumel; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < kWorld; ++r) sum += static_cast<float>(T(grad_value(r, i)));
    out[i] = -static_cast<float>(T(sum / static_cast<float>(kWorld)));
  }
  return out;
}

template <typename T>
void check_division(bool fp16) {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    EngineConfig config = base_config(stage);
    config.fp16.enabled = fp16;
    config.bf16 = !fp16;
    const std::vector<float> plain = reduced_by_engine<T>(config);
    CHECK(same_bits(plain, averaged<T>()));

    config.prescale_gradients = true;
    config.gradient_predivide_factor = 5.0;  // ignored with prescale_gradients, as in DeepSpeed
    const std::vector<float> pre = reduced_by_engine<T>(config);
    const std::vector<float> want_pre = expected<T>(static_cast<float>(1.0 / kWorld), 1.0f);
    CHECK(same_bits(pre, want_pre));
    CHECK_FALSE(same_bits(want_pre, plain));  // the order shows in the bits

    config.prescale_gradients = false;
    const std::vector<float> five = reduced_by_engine<T>(config);
    const std::vector<float> want_five = expected<T>(static_cast<float>(1.0 / 5.0), static_cast<float>(5.0 / kWorld));
    CHECK(same_bits(five, want_five));
    CHECK_FALSE(same_bits(want_five, plain));
    CHECK_FALSE(same_bits(want_five, want_pre));

    // f == W: no division after the sum.
    config.gradient_predivide_factor = kWorld;
    CHECK(same_bits(reduced_by_engine<T>(config), expected<T>(static_cast<float>(1.0 / kWorld), 1.0f)));
  }
}

}  // namespace

TEST_CASE("prescale_gradients and gradient_predivide_factor divide in DeepSpeed's order, fp16, stages 0-3") {
  check_division<fp16>(true);
}

TEST_CASE("prescale_gradients and gradient_predivide_factor divide in DeepSpeed's order, bf16, stages 0-3") {
  check_division<bf16>(false);
}

TEST_CASE("prescale_gradients and gradient_predivide_factor are read from the config") {
  const EngineConfig c = zest::test::parse(R"({"train_batch_size": 8, "prescale_gradients": true,
                                              "gradient_predivide_factor": 2.5})");
  CHECK(c.prescale_gradients);
  CHECK(c.gradient_predivide_factor == 2.5);
  CHECK_THROWS_WITH_AS((void)zest::test::parse(R"({"gradient_predivide_factor": 0})"),
                       doctest::Contains("gradient_predivide_factor"), Error);
  const EngineConfig d = zest::test::parse(R"({"train_batch_size": 8})");
  CHECK_FALSE(d.prescale_gradients);
  CHECK(d.gradient_predivide_factor == 1.0);
}
