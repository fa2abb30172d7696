// The memory estimator: the ZeRO paper's figures, exact bytes of a small
// model worked out by hand, the largest model that fits, bad options, the
// units file, and the engine's measured bytes against the estimate.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "engine/engine_harness.h"
#include "zest/core/check.h"
#include "zest/engine/layout_constants.h"
#include "zest/estimate/memory_estimate.h"
#include "zest/optim/exact_sum.h"

using namespace zest;

namespace {

// Rounded to three significant digits, as the paper prints its figures.
double sig3(double x) {
  const double scale = std::pow(10.0, std::floor(std::log10(x)) - 2);
  return std::round(x / scale) * scale;
}

EstimateOptions options(int world, int stage, DType dtype, OptimizerKind kind) {
  EstimateOptions o;
  o.world_size = world;
  o.zero.stage = stage;
  o.zero.stage3_param_persistence_threshold = 0;
  o.compute_dtype = dtype;
  o.optimizer.kind = kind;
  return o;
}

// Unit A: parameters of 1000 and 10 elements, the second aligned to 1024 (a
// multiple of kParamAlign = 64), so A ends at 1034. Unit B: one parameter of
// 10. With kShardQuantum = 256:
//   stage 0 (P = 1, quantum 256): A padded 1280, B 256; Ψ' = 1536, s = 1536
//   stages 1-3 (P = 3, quantum 768): A 1536 (shard 512), B 768 (shard 256);
//   Ψ' = 2304, s = 768
// Ψ = 1020.
ModelDescription small_model() {
  REQUIRE_MESSAGE(kShardQuantum == 256, "the hand-computed bytes assume kShardQuantum = 256");
  REQUIRE(kParamAlign == 64);
  ModelDescription m;
  m.units = {{"A", {1000, 10}, 1}, {"B", {10}, 1}};
  return m;
}

struct Expected {
  int64_t params, grads, master, optimizer;
};

void check_states(const MemoryEstimate& e, const Expected& x) {
  CHECK(e[MemoryCategory::kParameters].persistent == x.params);
  CHECK(e[MemoryCategory::kGradients].persistent == x.grads);
  CHECK(e[MemoryCategory::kMasterWeights].persistent == x.master);
  CHECK(e[MemoryCategory::kOptimizerState].persistent == x.optimizer);
  CHECK(e.model_state_bytes == x.params + x.grads + x.master + x.optimizer);
}

// Each rank's measured bytes, device and host, equal the estimate.
void check_measured(const MemoryEstimate& e, const std::vector<test::RankResult>& res) {
  for (const test::RankResult& r : res) {
    for (MemoryCategory c : kAllMemoryCategories) {
      CAPTURE(category_name(c));
      CHECK(r.memory[c].current == e[c].persistent);
      CHECK(r.memory[c].peak == e[c].peak);
      CHECK(r.memory.host(c).current == e.host(c).persistent);
    }
    CHECK(r.memory.model_states() == e.model_state_bytes);
    CHECK(r.memory.host_model_states() == e.host_model_state_bytes);
  }
}

}  // namespace

TEST_CASE("the ZeRO paper's example: 7.5B parameters, N_d = 64, K = 12") {
  const double expected[] = {120e9, 31.4e9, 16.6e9, 1.88e9};
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    CHECK(sig3(paper_model_bytes(7.5e9, 64, stage, 12)) == doctest::Approx(expected[stage]));
    // The estimate of the same model, one unit, fp16 AdamW: only padding
    // (under 64 x kShardQuantum elements of 16 bytes) separates it from the
    // formula.
    EstimateOptions o = options(64, stage, DType::kFloat16, OptimizerKind::kAdamW);
    const MemoryEstimate e = estimate_memory(ModelDescription::from_total(7'500'000'000), o);
    CHECK(e.paper_k == 12.0);
    CHECK(e.paper_bytes == doctest::Approx(paper_model_bytes(7.5e9, 64, stage, 12)));
    CHECK(sig3(static_cast<double>(e.model_state_bytes)) == doctest::Approx(expected[stage]));
    CHECK(e.padding_bytes >= 0);
    CHECK(e.padding_bytes < static_cast<int64_t>(16 * 64 * kShardQuantum));
  }
}

TEST_CASE("fp16 AdamW, W = 3: bytes by hand (b = 2, master 4s, optimizer 8s)") {
  const ModelDescription m = small_model();
  const auto est = [&](int stage) {
    return estimate_memory(m, options(3, stage, DType::kFloat16, OptimizerKind::kAdamW));
  };
  // stage 0: 2*1536, 2*1536, 4*1536, 8*1536
  check_states(est(0), {3072, 3072, 6144, 12288});
  // stage 1: 2*2304, 2*2304, 4*768, 8*768
  check_states(est(1), {4608, 4608, 3072, 6144});
  // stage 2: gradients 2*768
  check_states(est(2), {4608, 1536, 3072, 6144});
  // stage 3 (threshold 0): parameters 2*768
  check_states(est(3), {1536, 1536, 3072, 6144});

  // The paper at Ψ = 1020: 16Ψ, 4Ψ + 12Ψ/3, 2Ψ + 14Ψ/3, 16Ψ/3; padding is
  // the rest, as no accumulator or persistent unit is involved.
  const double paper[] = {16320, 8160, 6800, 5440};
  for (int stage = 0; stage <= 3; ++stage) {
    const MemoryEstimate e = est(stage);
    CHECK(e.numel == 1020);
    CHECK(e.paper_bytes == doctest::Approx(paper[stage]));
    CHECK(e.padding_bytes == e.model_state_bytes - static_cast<int64_t>(paper[stage]));
  }
  CHECK(est(0).padded_numel == 1536);
  CHECK(est(3).padded_numel == 2304);
  CHECK(est(3).owned_numel == 768);

  // Transients. comm_buffers: finalize stages the largest unit in fp32
  // (4*1280 at stage 0, 4*1536 after), more than the norm sums
  // ((s/256 + 22) * 8 bytes).
  CHECK(est(0)[MemoryCategory::kCommBuffers].peak == 5120);
  CHECK(est(1)[MemoryCategory::kCommBuffers].peak == 6144);
  CHECK(est(0).peak_bytes == 24576 + 5120);
  CHECK(est(1).peak_bytes == 18432 + 6144);
  // stage 2: the default reduce bucket is a quarter of the model
  // (ZeroConfig::reduce_bucket: 2304 / 4 = 576 elements), which A (1536)
  // fills alone: 2*1536 = 3072 staged, less than finalize's 6144
  CHECK(est(2).grad_units_in_flight == 1);
  CHECK(est(2)[MemoryCategory::kGradients].peak == 1536 + 3072);
  CHECK(est(2).peak_bytes == 15360 + 6144);
  // stage 3: the unit in use and the other prefetched (window 5e7
  // elements): 4608 gathered, plus A's 3072 of staged gradients
  CHECK(est(3).live_units == 2);
  CHECK(est(3)[MemoryCategory::kParameters].peak == 1536 + 4608);
  CHECK(est(3).peak_bytes == 12288 + 4608 + 3072);

  // One unit in flight each way (the largest, A: 2*1536 each).
  EstimateOptions one = options(3, 3, DType::kFloat16, OptimizerKind::kAdamW);
  one.live_units = 1;
  one.grad_units_in_flight = 1;
  CHECK(estimate_memory(m, one).live_units == 1);
  CHECK(estimate_memory(m, one).peak_bytes == 12288 + 3072 + 3072);
}

TEST_CASE("frozen units: their parameter bytes counted apart, as MemoryReport::frozen_parameters") {
  ModelDescription m = small_model();
  m.units[0].frozen = true;  // A: 1034 elements, a LoRA base's share
  // Stage 0: A's flat buffer, 1280 fp16 elements; B has no frozen bytes.
  MemoryEstimate e = estimate_memory(m, options(1, 0, DType::kFloat16, OptimizerKind::kAdamW));
  CHECK(e.frozen_parameter_bytes == 1280 * 2);
  CHECK(e[MemoryCategory::kParameters].persistent == (1280 + 256) * 2);
  // Stage 3 on 3 ranks: A's shard, 512 elements...
  e = estimate_memory(m, options(3, 3, DType::kFloat16, OptimizerKind::kAdamW));
  CHECK(e.frozen_parameter_bytes == 512 * 2);
  // ...its whole buffer when the persistence threshold keeps it resident...
  EstimateOptions resident = options(3, 3, DType::kFloat16, OptimizerKind::kAdamW);
  resident.zero.stage3_param_persistence_threshold = 100000;
  CHECK(estimate_memory(m, resident).frozen_parameter_bytes == 1536 * 2);
  // ...and none on the device when offload_param moves the shard to the host.
  EstimateOptions offload = options(3, 3, DType::kFloat16, OptimizerKind::kAdamW);
  offload.offload_optimizer.device = OffloadDevice::kCpu;
  offload.offload_param.device = OffloadDevice::kCpu;
  e = estimate_memory(m, offload);
  CHECK(e.frozen_parameter_bytes == 0);
  CHECK(e.host(MemoryCategory::kParameters).persistent == (512 + 256) * 2);
}

TEST_CASE("fp32 SGD, W = 3: no master copy and no state (b = 4, K = 0)") {
  const ModelDescription m = small_model();
  const auto est = [&](int stage) {
    return estimate_memory(m, options(3, stage, DType::kFloat32, OptimizerKind::kSgd));
  };
  check_states(est(0), {6144, 6144, 0, 0});  // 4*1536 each
  check_states(est(1), {9216, 9216, 0, 0});  // 4*2304 each
  check_states(est(2), {9216, 3072, 0, 0});  // gradients 4*768
  check_states(est(3), {3072, 3072, 0, 0});
  // The paper with b = 4, K = 0 at Ψ = 1020: 8Ψ, 8Ψ, 4Ψ + 4Ψ/3, 8Ψ/3.
  CHECK(est(0).paper_bytes == doctest::Approx(8160));
  CHECK(est(1).paper_bytes == doctest::Approx(8160));
  CHECK(est(2).paper_bytes == doctest::Approx(5440));
  CHECK(est(3).paper_bytes == doctest::Approx(2720));
  CHECK(est(3).paper_k == 0.0);
}

TEST_CASE("fp32 AdamW and bf16 SGD with momentum, W = 3") {
  const ModelDescription m = small_model();
  // fp32 AdamW stage 1: parameters and gradients 4*2304, optimizer 8*768.
  check_states(estimate_memory(m, options(3, 1, DType::kFloat32, OptimizerKind::kAdamW)),
               {9216, 9216, 0, 6144});
  // bf16 SGD with momentum (one state buffer) stage 2: 2*2304, 2*768,
  // master 4*768, momentum 4*768.
  EstimateOptions o = options(3, 2, DType::kBFloat16, OptimizerKind::kSgd);
  o.optimizer.momentum = 0.9f;
  check_states(estimate_memory(m, o), {4608, 1536, 3072, 3072});
}

TEST_CASE("LAMB keeps Adam's two fp32 state buffers (m and v): its model states are AdamW's") {
  const ModelDescription m = small_model();
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const MemoryEstimate lamb = estimate_memory(m, options(3, stage, DType::kFloat16, OptimizerKind::kLamb));
    const MemoryEstimate adamw = estimate_memory(m, options(3, stage, DType::kFloat16, OptimizerKind::kAdamW));
    CHECK(lamb[MemoryCategory::kOptimizerState].persistent == adamw[MemoryCategory::kOptimizerState].persistent);
    CHECK(lamb.model_state_bytes == adamw.model_state_bytes);
    CHECK(lamb.paper_k == 12.0);
  }
  // fp16 stage 1 by hand: 2*2304, 2*2304, master 4*768, m and v 8*768.
  check_states(estimate_memory(m, options(3, 1, DType::kFloat16, OptimizerKind::kLamb)), {4608, 4608, 3072, 6144});
}

TEST_CASE("accumulation, the persistence threshold and the offload model") {
  const ModelDescription m = small_model();
  EstimateOptions o = options(3, 0, DType::kFloat16, OptimizerKind::kAdamW);
  o.gradient_accumulation_steps = 2;
  // stage 0: full gradients plus a full accumulator (2*1536 each)
  CHECK(estimate_memory(m, o)[MemoryCategory::kGradients].persistent == 3072 + 3072);
  o.zero.stage = 1;  // full gradients 2*2304 plus the owned accumulator 2*768
  CHECK(estimate_memory(m, o)[MemoryCategory::kGradients].persistent == 4608 + 1536);
  o.zero.stage = 2;  // the shard accumulates anyway
  CHECK(estimate_memory(m, o)[MemoryCategory::kGradients].persistent == 1536);

  // Stage 3, threshold 10: B (10 parameters) stays whole (2*768), A is
  // sharded (2*512), and only A (2*1536) is ever gathered.
  EstimateOptions t = options(3, 3, DType::kFloat16, OptimizerKind::kAdamW);
  t.zero.stage3_param_persistence_threshold = 10;
  const MemoryEstimate e = estimate_memory(m, t);
  CHECK(e[MemoryCategory::kParameters].persistent == 1024 + 1536);
  CHECK(e.live_units == 1);
  CHECK(e[MemoryCategory::kParameters].peak == 1024 + 1536 + 3072);

}

TEST_CASE("bf16 master weights and state, W = 3: bytes by hand (b = 2, no master copy, optimizer 4s, K = 6)") {
  const ModelDescription m = small_model();
  const auto est = [&](int stage, DType state) {
    EstimateOptions o = options(3, stage, DType::kBFloat16, OptimizerKind::kAdamW);
    o.master_dtype = DType::kBFloat16;
    o.state_dtype = state;
    o.offload_optimizer.device = state == DType::kFloat32 ? OffloadDevice::kCpu : OffloadDevice::kNone;
    return estimate_memory(m, o);
  };
  // stage 1: 2*2304, 2*2304, the master is the parameters, 2*2*768
  check_states(est(1, DType::kBFloat16), {4608, 4608, 0, 3072});
  check_states(est(2, DType::kBFloat16), {4608, 1536, 0, 3072});
  check_states(est(3, DType::kBFloat16), {1536, 1536, 0, 3072});
  CHECK(est(3, DType::kBFloat16).paper_k == 6.0);
  // The paper at Ψ = 1020, stage 3: (2 + 2 + 6)Ψ/3.
  CHECK(est(3, DType::kBFloat16).paper_bytes == doctest::Approx(3400.0));
  // fp32 state, offloaded (DeepSpeed's only mixed case): the host keeps the
  // bf16 master copy (2*768) and the fp32 moments (8*768); two gradient
  // slots of 64 elements and no parameter slots.
  const MemoryEstimate h = est(2, DType::kFloat32);
  check_states(h, {4608, 1536, 0, 0});
  CHECK(h.host(MemoryCategory::kMasterWeights).persistent == 1536);
  CHECK(h.host(MemoryCategory::kOptimizerState).persistent == 6144);
  CHECK(h.host(MemoryCategory::kCommBuffers).peak == 2 * 64 * 2);
  CHECK(h.paper_k == 10.0);
  // Outside the engine's rules: refused as the engine refuses them.
  EstimateOptions bad = options(3, 2, DType::kBFloat16, OptimizerKind::kAdamW);
  bad.master_dtype = DType::kBFloat16;
  CHECK_THROWS_WITH_AS(estimate_memory(m, bad), doctest::Contains("need offload_optimizer cpu"), Error);
  bad.compute_dtype = DType::kFloat16;
  CHECK_THROWS_WITH_AS(estimate_memory(m, bad), doctest::Contains("bf16 master weights need bf16 compute"), Error);
}

TEST_CASE("offload: device and host bytes by category, by hand") {
  const ModelDescription m = small_model();
  using C = MemoryCategory;
  // Stage 2, W = 3, fp16 AdamW: s = 768 owned elements, all on the host
  // (ratio 1): master 4*768 and optimizer 8*768 there; the device keeps the
  // parameters (2*2304) and the gradient shard (2*768). The staging: chunks
  // of max(64, ceil(768/16) aligned to 64) = 64 elements, two slots each of
  // gradients and parameters, 4*64*2 bytes.
  EstimateOptions off = options(3, 2, DType::kFloat16, OptimizerKind::kAdamW);
  off.offload_optimizer.device = OffloadDevice::kCpu;
  const MemoryEstimate h = estimate_memory(m, off);
  check_states(h, {4608, 1536, 0, 0});
  CHECK(h.host_numel == 768);
  CHECK(h.host(C::kParameters).persistent == 0);
  CHECK(h.host(C::kGradients).persistent == 0);
  CHECK(h.host(C::kMasterWeights).persistent == 3072);
  CHECK(h.host(C::kOptimizerState).persistent == 6144);
  CHECK(h.host(C::kCommBuffers).peak == 512);
  CHECK(h.host_model_state_bytes == 9216);
  CHECK(h.host_peak_bytes == 9216 + 512);
  // The published accounting at Ψ = 1020: bΨ on the device, (12 + 4)Ψ/N on the host.
  CHECK(h.paper_bytes == doctest::Approx(2040.0));
  CHECK(h.paper_host_bytes == doctest::Approx(16.0 * 1020 / 3));

  // ratio 0.5: floor(384) rounded down to 64 = 384 elements on the host, the
  // other 384 on the device.
  off.offload_optimizer.ratio = 0.5;
  const MemoryEstimate r = estimate_memory(m, off);
  check_states(r, {4608, 1536, 4 * 384, 8 * 384});
  CHECK(r.host(C::kMasterWeights).persistent == 4 * 384);
  CHECK(r.host(C::kOptimizerState).persistent == 8 * 384);
  CHECK(r.host(C::kCommBuffers).peak == 4 * 64 * 2);
  // ratio 0.01: 7 elements round down to 0: nothing offloaded.
  off.offload_optimizer.ratio = 0.01;
  CHECK(estimate_memory(m, off).host_peak_bytes == 0);

  // delayed_update: the whole host part's gradients and parameters, 2*2*768.
  off.offload_optimizer.ratio = 1.0;
  off.offload_optimizer.delayed_update = true;
  CHECK(estimate_memory(m, off).host(C::kCommBuffers).peak == 3072);

  // fp32 SGD with momentum: the host master is allocated in fp32 as well
  // (4*768), one state buffer (4*768), two gradient slots only (2*64*4).
  EstimateOptions f = options(3, 1, DType::kFloat32, OptimizerKind::kSgd);
  f.optimizer.momentum = 0.9f;
  f.offload_optimizer.device = OffloadDevice::kCpu;
  const MemoryEstimate g = estimate_memory(m, f);
  check_states(g, {4 * 2304, 4 * 2304, 0, 0});
  CHECK(g.host(C::kMasterWeights).persistent == 3072);
  CHECK(g.host(C::kOptimizerState).persistent == 3072);
  CHECK(g.host(C::kCommBuffers).peak == 512);

  // Stage 3 with parameters offloaded too, threshold 0: the
  // parameter shards (2*768) move to the host; the device holds the
  // gathered units only while they are live.
  EstimateOptions p = options(3, 3, DType::kFloat16, OptimizerKind::kAdamW);
  p.offload_optimizer.device = OffloadDevice::kCpu;
  p.offload_param.device = OffloadDevice::kCpu;
  const MemoryEstimate q = estimate_memory(m, p);
  check_states(q, {0, 1536, 0, 0});
  CHECK(q.host(C::kParameters).persistent == 1536);
  CHECK(q.host_model_state_bytes == 1536 + 3072 + 6144);
  CHECK(q.live_units == 2);
  CHECK(q[C::kParameters].peak == 2 * (1536 + 768));
  CHECK(q.paper_bytes == 0.0);
  CHECK(q.paper_host_bytes == doctest::Approx(18.0 * 1020 / 3));

  // Offload at the stages DeepSpeed and the engine allow only.
  EstimateOptions bad = options(3, 0, DType::kFloat16, OptimizerKind::kAdamW);
  bad.offload_optimizer.device = OffloadDevice::kCpu;
  CHECK_THROWS_WITH(estimate_memory(m, bad), doctest::Contains("needs ZeRO stage 1, 2 or 3"));
  bad.zero.stage = 2;
  bad.offload_param.device = OffloadDevice::kCpu;
  CHECK_THROWS_WITH(estimate_memory(m, bad), doctest::Contains("offload_param (device cpu) is for stage 3 only"));
  bad.zero.stage = 3;
  bad.offload_optimizer.ratio = 0.5;
  CHECK_THROWS_WITH(estimate_memory(m, bad), doctest::Contains("offload_param (device cpu) goes with offload_optimizer "
                                                               "cpu at ratio 1, as in the engine"));
  bad.offload_param.device = OffloadDevice::kNone;
  bad.offload_optimizer.ratio = 1.5;
  CHECK_THROWS_WITH(estimate_memory(m, bad), doctest::Contains("ratio is 1.5: it must be in [0, 1]"));
  // offload_param nvme: with the optimizer on NVMe only, as the engine
  // runs it, never counted as something else.
  bad.offload_optimizer.ratio = 1.0;
  bad.offload_param.device = OffloadDevice::kNvme;
  CHECK_THROWS_WITH(estimate_memory(m, bad),
                    doctest::Contains("offload_param (device nvme) goes with offload_optimizer nvme at ratio 1, as in "
                                      "the engine"));
  bad.offload_param.device = OffloadDevice::kNone;
  bad.offload_optimizer.device = OffloadDevice::kNvme;
  bad.offload_optimizer.delayed_update = true;
  CHECK_THROWS_WITH(estimate_memory(m, bad), doctest::Contains("delayed_update with device \"nvme\" is not supported"));
  bad.offload_optimizer.delayed_update = false;
  bad.zero.stage = 0;
  CHECK_THROWS_WITH(estimate_memory(m, bad), doctest::Contains("offload_optimizer (device nvme) needs ZeRO stage 1"));
  bad.zero.stage = 3;
  bad.offload_optimizer.buffer_count = 0;
  CHECK_THROWS_WITH(estimate_memory(m, bad), doctest::Contains("buffer_count is 0: it must be at least 1"));
}

// Stage 2, W = 3, fp16 AdamW, ratio 1: the 768 owned elements in chunks of
// 64 (as with cpu). A record: 64 x 4 master + 2 x 64 x 4 state = 768 bytes,
// padded to 4096; 12 records, two regions: 2 x 12 x 4096 bytes.
TEST_CASE("offload_optimizer nvme: the swap file on NVMe, the ring on the host, by hand") {
  using C = MemoryCategory;
  EstimateOptions o = options(3, 2, DType::kFloat16, OptimizerKind::kAdamW);
  o.offload_optimizer.device = OffloadDevice::kNvme;
  const ModelDescription m = small_model();
  const MemoryEstimate e = estimate_memory(m, o);
  CHECK(e.host_numel == 768);
  check_states(e, {4608, 1536, 0, 0});  // the device as with cpu
  CHECK(e.nvme_bytes == 2 * 12 * 4096);
  CHECK(e.nvme(C::kMasterWeights).persistent == 2 * 12 * 64 * 4);
  CHECK(e.nvme(C::kOptimizerState).persistent == 2 * 12 * 4096 - 2 * 12 * 64 * 4);
  CHECK(e.nvme(C::kParameters).persistent == 0);
  // The host: no master or state; four chunk slots (gradients and
  // parameters, 4 x 64 x 2) and the ring, buffer_count (4) records and
  // 4096 bytes to align them, all comm_buffers.
  CHECK(e.host(C::kMasterWeights).persistent == 0);
  CHECK(e.host(C::kOptimizerState).persistent == 0);
  CHECK(e.host(C::kCommBuffers).persistent == 512 + 5 * 4096);
  CHECK(e.host_swap_buffer_bytes == 5 * 4096);
  CHECK(e.host_model_state_bytes == 0);
  CHECK(e.host_peak_bytes == 512 + 5 * 4096);
  // The published count: the optimizer's (12 + 4)Ψ/N on NVMe instead of the host.
  CHECK(e.paper_bytes == doctest::Approx(2040.0));
  CHECK(e.paper_host_bytes == 0.0);
  CHECK(e.paper_nvme_bytes == doctest::Approx(16.0 * 1020 / 3));

  // fp32 SGD with momentum (the master is the parameters: with cpu two
  // slots; from the ring four), buffer_count 2, ratio 0.5: 384 elements in
  // chunks of 64, records of 64 x 4 + 64 x 4 = 512 bytes padded to 4096.
  EstimateOptions f = options(3, 1, DType::kFloat32, OptimizerKind::kSgd);
  f.optimizer.momentum = 0.9f;
  f.offload_optimizer.device = OffloadDevice::kNvme;
  f.offload_optimizer.buffer_count = 2;
  f.offload_optimizer.ratio = 0.5;
  const MemoryEstimate g = estimate_memory(m, f);
  CHECK(g.host_numel == 384);
  CHECK(g.nvme_bytes == 2 * 6 * 4096);
  CHECK(g.nvme(C::kMasterWeights).persistent == 2 * 6 * 64 * 4);
  CHECK(g.host(C::kCommBuffers).persistent == 4 * 64 * 4 + 3 * 4096);
  CHECK(g.host_swap_buffer_bytes == 3 * 4096);
  // The device keeps the other 384 elements' state (the master is the parameters).
  check_states(g, {4 * 2304, 4 * 2304, 0, 4 * 384});

  // A chunk of 2^22 elements fills its record: no padding. 2^26 owned
  // elements (one rank, stage 1, fp16 AdamW): 16 records of 48 MiB.
  EstimateOptions big = options(1, 1, DType::kFloat16, OptimizerKind::kAdamW);
  big.offload_optimizer.device = OffloadDevice::kNvme;
  const MemoryEstimate b = estimate_memory(ModelDescription::from_total(size_t{1} << 26), big);
  CHECK(b.nvme_bytes == 2 * 16 * (int64_t{48} << 20));
  CHECK(b.host_swap_buffer_bytes == 4 * (int64_t{48} << 20) + 4096);
}

// Published per-parameter figures for mixed-precision Adam (b = 2, K = 12):
//   ZeRO (Rajbhandari et al. 2019, /work/shared/REFERENCE.md): 16 bytes per
//     parameter without offload = 2 fp16 parameters + 2 fp16 gradients + 12
//     fp32 master, momentum and variance.
//   DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py
//     estimate_zero2_model_states_mem_needs and stage3.py
//     estimate_zero3_model_states_mem_needs, additional_buffer_factor
//     aside), on one node:
//     ZeRO-2 + cpu_offload         gpu 2Ψ          cpu max(4N, 16)Ψ per node
//     ZeRO-3 + offload_optimizer   gpu 2Ψ/N (+ the largest layer)  cpu 16Ψ per node
//     ZeRO-3 + both                gpu the largest layer           cpu 18Ψ per node
//     where 16 = 12 + 4 fp32 gradients for the host update, and 18 adds the
//     2-byte parameters. Per rank on one node of N ranks: 16Ψ/N and 18Ψ/N.
//   With the 2-byte gradients that pass through, 2 + 2 + 16 = 20 bytes per
//   parameter: ZeRO-Infinity's count of model states (240 x layers x
//   hidden^2 for 12 hidden^2 parameters per layer).
TEST_CASE("the published per-parameter offload figures") {
  const double psi = 1e9;
  // No offload: the ZeRO formula, nothing on the host.
  for (int stage = 0; stage <= 3; ++stage) {
    const PaperBytes p = paper_offload_bytes(psi, 8, stage, false, false);
    CHECK(p.device == paper_model_bytes(psi, 8, stage));
    CHECK(p.host == 0.0);
  }
  CHECK(paper_offload_bytes(psi, 1, 0, false, false).device == 16 * psi);
  // ZeRO-2 + offload on one GPU: 2Ψ on the device, 16Ψ on the host.
  const PaperBytes z2 = paper_offload_bytes(psi, 1, 2, true, false);
  CHECK(z2.device == 2 * psi);
  CHECK(z2.host == 16 * psi);
  // On 4 GPUs of one node: DeepSpeed's max(4 x 4, 16)Ψ = 16Ψ per node, 4Ψ per rank.
  CHECK(paper_offload_bytes(psi, 4, 2, true, false).host == 4 * psi);
  CHECK(paper_offload_bytes(psi, 4, 1, true, false).device == 2 * psi);
  // ZeRO-3 + optimizer offload on 8 GPUs: 2Ψ/8 and 16Ψ/8.
  const PaperBytes z3 = paper_offload_bytes(psi, 8, 3, true, false);
  CHECK(z3.device == 2 * psi / 8);
  CHECK(z3.host == 16 * psi / 8);
  // ZeRO-3 + both: nothing held on the device, 18Ψ/8 on the host.
  const PaperBytes both = paper_offload_bytes(psi, 8, 3, true, true);
  CHECK(both.device == 0.0);
  CHECK(both.host == 18 * psi / 8);
  // ZeRO-Infinity's 20 bytes per parameter on one GPU: 18 held + 2 passing through.
  const PaperBytes one = paper_offload_bytes(psi, 1, 3, true, false);
  CHECK(one.device + one.host + 2 * psi == 20 * psi);
  CHECK_THROWS_WITH(paper_offload_bytes(psi, 8, 2, true, true), doctest::Contains("only at stage 3"));

  // ZEST's own count differs by the fp32 gradients: it streams the reduced
  // 2-byte gradients to the host update in chunks, so the host holds 12
  // bytes per owned parameter (plus the chunk slots), the device 2 + 2/N at
  // stage 2. At 7.5B parameters on 64 ranks:
  EstimateOptions o = options(64, 2, DType::kFloat16, OptimizerKind::kAdamW);
  o.offload_optimizer.device = OffloadDevice::kCpu;
  const MemoryEstimate e = estimate_memory(ModelDescription::from_total(7'500'000'000), o);
  CHECK(sig3(static_cast<double>(e.host_model_state_bytes)) == sig3(12 * 7.5e9 / 64));
  CHECK(sig3(static_cast<double>(e.model_state_bytes)) == sig3(2 * 7.5e9 + 2 * 7.5e9 / 64));
  CHECK(e.paper_bytes == 2 * 7.5e9);
  CHECK(e.paper_host_bytes == doctest::Approx(16 * 7.5e9 / 64));
}

TEST_CASE("the largest model that fits a device and a host") {
  // One rank, 16 GiB device, stage 2, optimizer offloaded: by model states
  // the device holds 4 bytes per parameter (2 + 2) and the host 12. With 64
  // GiB of host the device binds (16 GiB / 4 < 64 GiB / 12).
  const int64_t device = int64_t{16} << 30;
  EstimateOptions o = options(1, 2, DType::kFloat16, OptimizerKind::kAdamW);
  o.offload_optimizer.device = OffloadDevice::kCpu;
  const FitOptions states{FitCriterion::kModelStates, 0, int64_t{64} << 30, std::nullopt};
  const size_t psi = largest_fitting_model(device, o, states);
  CHECK(static_cast<double>(psi) == doctest::Approx(device / 4.0).epsilon(1e-6));
  // With 32 GiB of host, the host binds: 32 GiB / 12 bytes.
  const FitOptions small_host{FitCriterion::kModelStates, 0, int64_t{32} << 30, std::nullopt};
  const size_t h = largest_fitting_model(device, o, small_host);
  CHECK(static_cast<double>(h) == doctest::Approx((int64_t{32} << 30) / 12.0).epsilon(1e-6));
  const MemoryEstimate at = estimate_memory(ModelDescription::from_total(h), o);
  const MemoryEstimate next = estimate_memory(ModelDescription::from_total(h + 1), o);
  CHECK(at.host_model_state_bytes <= *small_host.host_bytes);
  CHECK(next.host_model_state_bytes > *small_host.host_bytes);
  CHECK(next.model_state_bytes <= device);
  // Without offload the same device fits a quarter as much (16 bytes each).
  EstimateOptions none = options(1, 2, DType::kFloat16, OptimizerKind::kAdamW);
  CHECK(static_cast<double>(largest_fitting_model(device, none, {FitCriterion::kModelStates, 0, std::nullopt, std::nullopt})) ==
        doctest::Approx(device / 16.0).epsilon(1e-6));
  // The table: a row per offload choice, "-" where the stage does not allow it.
  const std::string t = format_fit_table(o, device, int64_t{32} << 30, 100'000'000);
  CHECK(t.find("offload_optimizer") != std::string::npos);
  CHECK(t.find("optimizer + param") != std::string::npos);
  CHECK(t.find("(h)") != std::string::npos);
}

TEST_CASE("the largest model that fits a device, a host and an NVMe drive") {
  // One rank, 16 GiB device, stage 2, the optimizer on NVMe: the device
  // holds 4 bytes a parameter, the host none of the state, the drive two
  // copies of 12 (records of 2^22 elements fill their 4096-byte pages).
  const int64_t device = int64_t{16} << 30;
  const int64_t nvme = int64_t{64} << 30;
  EstimateOptions o = options(1, 2, DType::kFloat16, OptimizerKind::kAdamW);
  o.offload_optimizer.device = OffloadDevice::kNvme;
  FitOptions fit{FitCriterion::kModelStates, 0, int64_t{64} << 30, std::nullopt};
  // Without a capacity the device binds, as with cpu offload.
  CHECK(static_cast<double>(largest_fitting_model(device, o, fit)) == doctest::Approx(device / 4.0).epsilon(1e-6));
  fit.nvme_bytes = nvme;
  const size_t psi = largest_fitting_model(device, o, fit);
  CHECK(static_cast<double>(psi) == doctest::Approx(nvme / 24.0).epsilon(1e-3));
  const MemoryEstimate at = estimate_memory(ModelDescription::from_total(psi), o);
  const MemoryEstimate next = estimate_memory(ModelDescription::from_total(psi + 1), o);
  CHECK(at.nvme_bytes <= nvme);
  CHECK(next.nvme_bytes > nvme);
  CHECK(next.model_state_bytes <= device);
  CHECK(next.host_model_state_bytes == 0);
  // The table marks the drive as the limit on the nvme rows.
  const std::string t = format_fit_table(o, device, int64_t{64} << 30, 100'000'000, {1, 2, 3}, nvme);
  CHECK(t.find("optimizer nvme") != std::string::npos);
  CHECK(t.find("nvme + param cpu") != std::string::npos);
  CHECK(t.find("(n)") != std::string::npos);
  CHECK(format_fit_table(o, device, int64_t{64} << 30, 100'000'000, {1, 2, 3}).find("nvme") == std::string::npos);
  FitOptions bad = fit;
  bad.nvme_bytes = -1;
  CHECK_THROWS_WITH(largest_fitting_model(device, o, bad), doctest::Contains("nvme_bytes is -1: it must be >= 0"));
}

TEST_CASE("ZeRO-Infinity's published count: 20 bytes a parameter on NVMe") {
  // 240 x layers x hidden^2 bytes for 12 x layers x hidden^2 parameters.
  CHECK(paper_infinity_nvme_bytes(1e12, 1) == 20e12);
  CHECK(paper_infinity_nvme_bytes(1e12, 16) == 20e12 / 16);
  // The optimizer's part on NVMe (paper_offload_bytes): (12 + 4)Ψ/N there,
  // the device's as with cpu offload, nothing on the host.
  const PaperBytes p = paper_offload_bytes(1e9, 8, 3, true, false, 12.0, 2.0, true);
  CHECK(p.nvme == 16e9 / 8);
  CHECK(p.host == 0.0);
  CHECK(p.device == 2e9 / 8);
}

TEST_CASE("the largest model that fits: consistent, and monotone in the stage") {
  const int64_t device = int64_t{80} << 30;
  for (const FitOptions fit : {FitOptions{FitCriterion::kModelStates, 0, std::nullopt, std::nullopt},
                               FitOptions{FitCriterion::kPeak, 0, std::nullopt, std::nullopt},
                               FitOptions{FitCriterion::kPeak, 100'000'000, std::nullopt, std::nullopt}}) {
    size_t previous = 0;
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(stage);
      CAPTURE(fit.unit_numel);
      EstimateOptions o = options(64, stage, DType::kFloat16, OptimizerKind::kAdamW);
      o.zero.stage3_param_persistence_threshold = 100'000;
      const size_t psi = largest_fitting_model(device, o, fit);
      const auto bytes = [&](size_t n) {
        const MemoryEstimate e = estimate_memory(ModelDescription::from_total(n, fit.unit_numel), o);
        return fit.criterion == FitCriterion::kPeak ? e.peak_bytes + e.runtime_reserve_bytes
                                                    : e.model_state_bytes;
      };
      CHECK(bytes(psi) <= device);
      CHECK(bytes(psi + 1) > device);
      // A model that is one unit is the exception at its peak: stage 2
      // stages the whole unit's gradient on top of its owned shard (2Ψ +
      // 2Ψ/N, where stage 1 holds 2Ψ), and stage 3 also gathers the whole
      // unit, so each fits less than the stage before. (Before the norm's
      // workspace was O(shard), its (N+1)s/32 bytes at every stage hid the
      // first of these.)
      const bool one_unit_peak = fit.criterion == FitCriterion::kPeak && fit.unit_numel == 0;
      if (one_unit_peak && stage >= 2) {
        CHECK(psi < previous);
      } else {
        CHECK(psi >= previous);
      }
      previous = psi;
    }
  }
  // By the paper's count, stage 0 fits 80 GiB / 16 bytes.
  EstimateOptions o = options(64, 0, DType::kFloat16, OptimizerKind::kAdamW);
  const size_t psi = largest_fitting_model(device, o, {FitCriterion::kModelStates, 0, std::nullopt, std::nullopt});
  CHECK(static_cast<double>(psi) == doctest::Approx(device / 16.0).epsilon(1e-6));
  CHECK(largest_fitting_model(100, o) == 0);
}

TEST_CASE("bad options and models are errors naming what is wrong") {
  const ModelDescription m = small_model();
  EstimateOptions o;
  o.world_size = 0;
  CHECK_THROWS_WITH_AS(estimate_memory(m, o), doctest::Contains("world_size is 0"), Error);
  o.world_size = 2;
  o.zero.stage = 4;
  CHECK_THROWS_WITH_AS(estimate_memory(m, o), doctest::Contains("allowed values are 0, 1, 2 and 3"),
                       Error);
  o.zero.stage = 1;
  o.compute_dtype = DType::kInt32;
  CHECK_THROWS_WITH_AS(estimate_memory(m, o), doctest::Contains("fp32, fp16 and bf16"), Error);
  o.compute_dtype = DType::kFloat16;
  o.gradient_accumulation_steps = 0;
  CHECK_THROWS_AS(estimate_memory(m, o), Error);
  CHECK_THROWS_AS(paper_model_bytes(1e9, 8, 4), Error);
  CHECK_THROWS_AS(paper_model_bytes(1e9, 0, 1), Error);
  CHECK_THROWS_AS(estimate_memory(ModelDescription{}, EstimateOptions{}), Error);
}

TEST_CASE("units files: text lines and JSON lists") {
  const ModelDescription t = parse_model_description(
      "# name numel...\n"
      "embed 1000 10   # comment\n"
      "\n"
      "head 1e3\n");
  REQUIRE(t.units.size() == 2);
  CHECK(t.units[0].name == "embed");
  CHECK(t.units[0].param_numels == std::vector<size_t>{1000, 10});
  CHECK(t.units[1].param_numels == std::vector<size_t>{1000});
  CHECK_FALSE(t.total_only);

  const ModelDescription j = parse_model_description(
      R"([[1000, 10], {"name": "block", "params": [4096, 64], "count": 48}])");
  REQUIRE(j.units.size() == 2);
  CHECK(j.units[0].name == "unit0");
  CHECK(j.units[1].count == 48);
  CHECK(j.num_units() == 49);
  CHECK(j.numel() == 1010 + 48 * 4160);

  CHECK_THROWS_WITH_AS(parse_model_description("a 10\nb 12x\n"), doctest::Contains("units line 2"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_model_description("lonely\n"), doctest::Contains("no parameter counts"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_model_description(R"([{"params": [1], "size": 3}])"),
                       doctest::Contains("unknown key \"size\""), Error);
  CHECK_THROWS_AS(parse_model_description("[[0]]"), Error);
  CHECK_THROWS_AS(parse_model_description("  \n# nothing\n"), Error);

  const ModelDescription split = ModelDescription::from_total(2500, 1000);
  CHECK(split.num_units() == 3);
  CHECK(split.numel() == 2500);
}

TEST_CASE("the table lists every stage with its formula") {
  const std::string text = format_estimate_table(ModelDescription::from_total(7'500'000'000),
                                                 options(64, 0, DType::kFloat16, OptimizerKind::kAdamW),
                                                 {{0, 1, 2, 3}, int64_t{80} << 30});
  CHECK(text.find("treated as one unit") != std::string::npos);
  CHECK(text.find("120.000 GB") != std::string::npos);
  CHECK(text.find("1.875 GB") != std::string::npos);
  CHECK(text.find("(2b+K)Ψ/N") != std::string::npos);
  CHECK(text.find("largest Ψ, peak") != std::string::npos);
}

// The contract: what the engine allocates is what the estimate says, per
// category, at rest and at its peak (after steps in which stage 3 prefetches).
TEST_CASE("the engine's measured bytes equal the estimate") {
  ModelDescription m;  // engine_harness.h's model, in layout order
  m.units = {{"a", {91, 7}, 1}, {"b", {35, 5, 1}, 1}, {"c", {33}, 1}};
  for (int world : {1, 3}) {
    for (int stage : {0, 1, 2, 3}) {
      // fp32; bf16; bf16 with fp32 accumulation; bf16 master weights and state
      for (const int precision : {0, 1, 2, 3}) {
        if (precision == 3 && stage == 0) continue;  // stages 1-3 only, as in DeepSpeed
        for (const int64_t accum : {1, 2}) {
          CAPTURE(world);
          CAPTURE(stage);
          CAPTURE(precision);
          CAPTURE(accum);
          EngineConfig config = test::base_config(stage);
          config.bf16 = precision > 0;
          if (precision == 2) config.grad_accum_dtype = DType::kFloat32;
          config.bf16_master_weights_and_grads = config.bf16_optimizer_states = precision == 3;
          config.gradient_accumulation_steps = accum;
          const MemoryEstimate e = estimate_memory(m, EstimateOptions::from_config(config, world));
          check_measured(e, test::run_engine(config, test::runs(world, 2)));
        }
      }
    }
  }
}

// Hierarchical sharding at stage 3. MiCS (zero.mics_shard_size): a rank of
// a world of W in groups of S holds what a rank of a world of S holds. hpZ
// (zero.zero_hpz_partition_size): the transients add each gathered unit's
// secondary copy, padded / H elements. The engine measures both.
TEST_CASE("MiCS: stage 3's bytes at W ranks in groups of S are those of S ranks, and hpZ's peak adds padded / H "
          "per gathered unit, as the engine measures") {
  const ModelDescription paper = ModelDescription::from_total(7'500'000'000);
  EstimateOptions mics = options(64, 3, DType::kFloat16, OptimizerKind::kAdamW);
  mics.zero.mics_shard_size = 8;
  const EstimateOptions flat8 = options(8, 3, DType::kFloat16, OptimizerKind::kAdamW);
  const MemoryEstimate e = estimate_memory(paper, mics);
  CHECK(e.model_state_bytes == estimate_memory(paper, flat8).model_state_bytes);
  CHECK(e.paper_bytes == 16.0 * 7.5e9 / 8);
  // Stages 0-2 ignore it, as DeepSpeed builds MiCS at stage 3 only.
  for (int stage : {0, 1, 2}) {
    CAPTURE(stage);
    EstimateOptions o = mics;
    o.zero.stage = stage;
    CHECK(estimate_memory(paper, o).model_state_bytes ==
          estimate_memory(paper, options(64, stage, DType::kFloat16, OptimizerKind::kAdamW)).model_state_bytes);
  }
  EstimateOptions bad = mics;
  bad.zero.mics_shard_size = 6;
  CHECK_THROWS_WITH_AS(estimate_memory(paper, bad), doctest::Contains("set mics_shard_size to a divisor of 64"), Error);

  ModelDescription m;  // engine_harness.h's model, in layout order
  m.units = {{"a", {91, 7}, 1}, {"b", {35, 5, 1}, 1}, {"c", {33}, 1}};
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    EngineConfig config = test::base_config(3);
    config.bf16 = bf16;
    config.gradient_accumulation_steps = 2;
    const MemoryEstimate flat4 = estimate_memory(m, EstimateOptions::from_config(config, 4));
    const MemoryEstimate flat2 = estimate_memory(m, EstimateOptions::from_config(config, 2));

    EngineConfig in_groups = config;
    in_groups.zero.mics_shard_size = 2;
    const MemoryEstimate got = estimate_memory(m, EstimateOptions::from_config(in_groups, 4));
    CHECK(got.model_state_bytes == flat2.model_state_bytes);
    check_measured(got, test::run_engine(in_groups, test::runs(4, 2)));

    EngineConfig secondary = config;
    secondary.zero.zero_hpz_partition_size = 2;
    const MemoryEstimate hpz = estimate_memory(m, EstimateOptions::from_config(secondary, 4));
    // 3 units of 4 x 256 padded elements, half of each.
    const int64_t copies = 3 * 512 * (bf16 ? 2 : 4);
    CHECK(hpz.model_state_bytes == flat4.model_state_bytes);
    CHECK(hpz[MemoryCategory::kParameters].peak == flat4[MemoryCategory::kParameters].peak + copies);
    CHECK(hpz.peak_bytes == flat4.peak_bytes + copies);
    check_measured(hpz, test::run_engine(secondary, test::runs(4, 2)));
  }
}

// The same contract with offload_optimizer: the device's bytes and the
// host allocator's, category by category.
TEST_CASE("with offload_optimizer (and offload_param at stage 3), the engine's device and host bytes equal the estimate") {
  ModelDescription m;
  m.units = {{"a", {91, 7}, 1}, {"b", {35, 5, 1}, 1}, {"c", {33}, 1}};
  struct Case {
    double ratio;
    bool delayed;
    bool params = false;  // offload_param, at stage 3
  };
  for (int world : {1, 3}) {
    for (int stage : {1, 2, 3}) {
      // fp32; bf16; bf16 master weights over fp32 state; bf16 master and state
      for (const int precision : {0, 1, 2, 3}) {
        for (const Case k : {Case{1.0, false}, Case{0.5, false}, Case{1.0, true}, Case{1.0, false, true},
                             Case{1.0, true, true}}) {
          if (k.params && stage != 3) continue;
          CAPTURE(world);
          CAPTURE(stage);
          CAPTURE(precision);
          CAPTURE(k.ratio);
          CAPTURE(k.delayed);
          CAPTURE(k.params);
          EngineConfig config = test::base_config(stage);
          config.bf16 = precision > 0;
          config.bf16_master_weights_and_grads = precision >= 2;
          config.bf16_optimizer_states = precision == 3;
          config.offload_optimizer.device = OffloadDevice::kCpu;
          config.offload_optimizer.ratio = k.ratio;
          config.offload_optimizer.delayed_update = k.delayed;
          if (k.params) config.offload_param.device = OffloadDevice::kCpu;
          const MemoryEstimate e = estimate_memory(m, EstimateOptions::from_config(config, world));
          REQUIRE(e.host_numel > 0);
          check_measured(e, test::run_engine(config, test::runs(world, 2)));
        }
      }
    }
  }
}

TEST_CASE("step()'s norm workspace is O(shard) at 7.5B parameters, and the engine allocates just that") {
  // 7.5B parameters: one double per 256 owned elements plus 22 words; the
  // all-gather it replaced held (N+1) x 7.5e9/256/N doubles (~234 MB) on
  // every rank at every N.
  for (int world : {1, 8, 64, 512}) {
    CAPTURE(world);
    EstimateOptions o = options(world, 3, DType::kBFloat16, OptimizerKind::kAdamW);
    const MemoryEstimate e = estimate_memory(ModelDescription::from_total(7'500'000'000), o);
    CHECK(e.norm_bytes == static_cast<int64_t>(8 * (e.owned_numel / kShardQuantum + kExactWords)));
    CHECK(e.norm_bytes <= static_cast<int64_t>(8 * (7'500'000'000 / kShardQuantum / world + 1 + kExactWords)));
  }
  // The engine: comm_buffers' peak while step() runs (finalize's staging
  // excluded) is the estimate's norm workspace, at 1, 2 and 4 ranks.
  ModelDescription m;
  m.units = {{"big", {4 * 64 * 256}, 1}, {"small", {100}, 1}};
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    EngineConfig config = test::base_config(2);
    const MemoryEstimate e = estimate_memory(m, EstimateOptions::from_config(config, world));
    std::vector<int64_t> peaks(static_cast<size_t>(world));
    std::vector<double> norms(static_cast<size_t>(world));
    run_inprocess(world, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      const OwnedStream stream(Device::host());
      Engine engine(config, comm, alloc, stream);
      engine.add_unit("big", {{"big.w", {4 * 64 * 256}}});
      engine.add_unit("small", {{"small.w", {100}}});
      engine.finalize([](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.0f); });
      alloc.reset_peak_stats();
      for (int u = 1; u >= 0; --u) {
        UnitHandle h = engine.gather(u);
        GradHandle g = engine.grads(u);
        std::span<float> gv = g.grad<float>(u == 0 ? "big.w" : "small.w");
        std::fill(gv.begin(), gv.end(), 0.5f);
        g.done();
      }
      const StepResult r = engine.step();
      peaks[static_cast<size_t>(comm.rank())] = engine.memory_report()[MemoryCategory::kCommBuffers].peak;
      norms[static_cast<size_t>(comm.rank())] = r.grad_norm;
    });
    for (int r = 0; r < world; ++r) {
      CHECK(peaks[static_cast<size_t>(r)] == e.norm_bytes);
      CHECK(norms[static_cast<size_t>(r)] == std::sqrt(0.25 * (4 * 64 * 256 + 100)));
    }
  }
}

TEST_CASE("the peak criterion keeps a reserve for the CUDA context and NCCL's buffers") {
  // Note [runtime reserve]: the context alone on one rank, NCCL's buffers too
  // on more.
  CHECK(default_runtime_reserve_bytes(1) == kCudaContextReserveBytes);
  CHECK(default_runtime_reserve_bytes(8) == kCudaContextReserveBytes + kNcclReserveBytes);
  CHECK(kCudaContextReserveBytes == int64_t{512} << 20);
  CHECK(kNcclReserveBytes == int64_t{1} << 30);
  const ModelDescription model = ModelDescription::from_total(1'000'000'000);
  EstimateOptions o = options(8, 2, DType::kBFloat16, OptimizerKind::kAdamW);
  const MemoryEstimate e = estimate_memory(model, o);
  CHECK(e.runtime_reserve_bytes == int64_t{1536} << 20);
  o.runtime_reserve_bytes = int64_t{3} << 30;  // as a run measured it
  const MemoryEstimate measured = estimate_memory(model, o);
  CHECK(measured.runtime_reserve_bytes == int64_t{3} << 30);
  CHECK(measured.peak_bytes == e.peak_bytes);  // the engine's bytes do not change
  // The fit leaves exactly the reserve free: a reserve of 0 fits more, and
  // the bytes of the largest fit plus the reserve stay within the device.
  const int64_t device = int64_t{80} << 30;
  const FitOptions peak{FitCriterion::kPeak, 100'000'000, std::nullopt, std::nullopt};
  const size_t with_reserve = largest_fitting_model(device, o, peak);
  const MemoryEstimate at = estimate_memory(ModelDescription::from_total(with_reserve, 100'000'000), o);
  CHECK(at.peak_bytes + (int64_t{3} << 30) <= device);
  const MemoryEstimate next = estimate_memory(ModelDescription::from_total(with_reserve + 1, 100'000'000), o);
  CHECK(next.peak_bytes + (int64_t{3} << 30) > device);
  o.runtime_reserve_bytes = 0;
  CHECK(largest_fitting_model(device, o, peak) > with_reserve);
  // The paper's model-states criterion is the paper's: no reserve.
  const FitOptions states{FitCriterion::kModelStates, 0, std::nullopt, std::nullopt};
  const size_t zero_reserve = largest_fitting_model(device, o, states);
  o.runtime_reserve_bytes = int64_t{3} << 30;
  CHECK(largest_fitting_model(device, o, states) == zero_reserve);
  o.runtime_reserve_bytes = -1;
  CHECK_THROWS_WITH_AS(estimate_memory(model, o), doctest::Contains("runtime_reserve_bytes is -1"), Error);
}
