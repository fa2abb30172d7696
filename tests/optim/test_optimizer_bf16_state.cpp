// bf16 master weights and optimizer state (Note [bf16 master weights and
// optimizer state] in optim/optimizer.h): every element is the fp32 update
// of its widened values, rounded to nearest-even bf16 on the way back, on
// every instruction set and thread count; the unsupported pairs are refused.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"
#include "zest/core/float16.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/detail/optimizer_impl.h"

using namespace zest;

namespace {

constexpr size_t kN = 3 * 2048 + 101;  // three whole host blocks and a ragged one
constexpr int kSteps = 4;

std::vector<float> normal_values(std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(kN);
  for (float& v : x) v = normal(rng);
  return x;
}

template <typename T>
std::vector<T> stored(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = T(x[i]);
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The shard as kept: bf16 master weights, TS state.
template <typename TS>
struct Kept {
  std::vector<bf16> w;
  std::vector<TS> m, v;
};

// The reference: one element at a time, widened, the fp32 update of
// optimizer_impl.h, each kept value rounded by bf16's constructor
// (core/float16.h: round to nearest even, as torch's bf16 copy_).
template <typename TS, typename TG>
void step_reference(const OptimizerConfig& c, const StepScalars& k, Kept<TS>& s, const std::vector<TG>& g) {
  for (size_t i = 0; i < kN; ++i) {
    float w = static_cast<float>(s.w[i]);
    float m = static_cast<float>(s.m[i]);
    float v = static_cast<float>(s.v[i]);
    if (c.kind == OptimizerKind::kSgd) {
      detail::sgd_update(detail::sgd_step(c, k), static_cast<float>(g[i]), w, c.momentum != 0.0f ? &m : nullptr);
    } else {
      detail::adam_update(detail::adam_step(c, k), static_cast<float>(g[i]), w, m, v);
    }
    s.w[i] = bf16(w);
    s.m[i] = TS(m);
    s.v[i] = TS(v);
  }
}

template <typename TS, typename TG>
void check_against_reference(const OptimizerConfig& c) {
  std::mt19937 rng(23);
  Kept<TS> engine{stored<bf16>(normal_values(rng, 1.0f)), std::vector<TS>(kN, TS(0.0f)), std::vector<TS>(kN, TS(0.0f))};
  Kept<TS> reference = engine;
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<TG> g = stored<TG>(normal_values(rng, 4.0f));
    const StepScalars k{0.01f, 0.1f, t, 0.5f};
    ShardBuffers s;
    s.master = engine.w.data();
    s.master_dtype = DType::kBFloat16;
    s.state[0] = engine.m.data();
    s.state[1] = engine.v.data();
    s.state_dtype = dtype_of_v<TS>;
    s.grad = g.data();
    s.grad_dtype = dtype_of_v<TG>;
    s.numel = kN;
    optimizer_step(Stream::default_for(Device::host()), c, s, k);
    step_reference(c, k, reference, g);
  }
  INFO(optimizer_name(c.kind), " momentum ", c.momentum, " state ", dtype_name(dtype_of_v<TS>), " gradients ",
       dtype_name(dtype_of_v<TG>), " threads ", c.host_threads);
  CHECK(same_bits(engine.w, reference.w));
  if (c.kind != OptimizerKind::kSgd || c.momentum != 0.0f) CHECK(same_bits(engine.m, reference.m));
  if (c.kind != OptimizerKind::kSgd) CHECK(same_bits(engine.v, reference.v));
  // The weights moved: equality of two runs that did nothing would pass too.
  std::mt19937 again(23);
  CHECK_FALSE(same_bits(engine.w, stored<bf16>(normal_values(again, 1.0f))));
}

std::vector<OptimizerConfig> optimizers() {
  OptimizerConfig adamw;
  adamw.kind = OptimizerKind::kAdamW;
  OptimizerConfig adam = adamw;
  adam.kind = OptimizerKind::kAdam;
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.momentum = 0.9f;
  sgd.nesterov = true;
  OptimizerConfig plain = sgd;
  plain.momentum = 0.0f;
  plain.nesterov = false;
  return {adamw, adam, sgd, plain};
}

}  // namespace

TEST_CASE("bf16 master weights with bf16 or fp32 state: the rounded fp32 update, element by element, on every "
          "instruction set and thread count") {
  for (CpuIsa isa : supported_cpu_isas()) {
    ScopedCpuIsa force(isa);
    INFO("instruction set ", cpu_isa_name(isa));
    for (OptimizerConfig c : optimizers()) {
      for (int threads : {1, 3}) {
        c.host_threads = threads;
        check_against_reference<bf16, bf16>(c);
        check_against_reference<float, bf16>(c);
        check_against_reference<bf16, float>(c);
      }
    }
  }
}

TEST_CASE("bf16 state is half the bytes and not fp32's values: the rounding is real") {
  // The same gradients with fp32 and with bf16 state end in different
  // weights (a kept moment lost bits), so the bf16 path is not fp32 in disguise.
  OptimizerConfig c;
  std::mt19937 rng(5);
  const std::vector<bf16> w0 = stored<bf16>(normal_values(rng, 1.0f));
  const std::vector<bf16> g = stored<bf16>(normal_values(rng, 4.0f));
  std::vector<bf16> w_bf(w0), w_fp(w0);
  std::vector<bf16> m_bf(kN, bf16(0.0f)), v_bf(kN, bf16(0.0f));
  std::vector<float> m_fp(kN, 0.0f), v_fp(kN, 0.0f);
  for (int t = 1; t <= kSteps; ++t) {
    for (int kept = 0; kept < 2; ++kept) {
      ShardBuffers s;
      s.master = kept == 0 ? w_bf.data() : w_fp.data();
      s.master_dtype = DType::kBFloat16;
      s.state[0] = kept == 0 ? static_cast<void*>(m_bf.data()) : m_fp.data();
      s.state[1] = kept == 0 ? static_cast<void*>(v_bf.data()) : v_fp.data();
      s.state_dtype = kept == 0 ? DType::kBFloat16 : DType::kFloat32;
      s.grad = g.data();
      s.grad_dtype = DType::kBFloat16;
      s.numel = kN;
      optimizer_step(Stream::default_for(Device::host()), c, s, StepScalars{1e-3f, 0.0f, t, 1.0f});
    }
  }
  CHECK_FALSE(same_bits(w_bf, w_fp));
}

TEST_CASE("master and state dtypes outside fp32/fp32, bf16/fp32 and bf16/bf16 are refused by name") {
  std::vector<float> f(16, 0.0f);
  std::vector<bf16> h(16, bf16(0.0f));
  const auto error = [&](DType master, DType state, bool out) {
    ShardBuffers s;
    s.master = master == DType::kFloat32 ? static_cast<void*>(f.data()) : h.data();
    s.master_dtype = master;
    s.state[0] = state == DType::kFloat32 ? static_cast<void*>(f.data()) : h.data();
    s.state[1] = s.state[0];
    s.state_dtype = state;
    s.grad = h.data();
    s.grad_dtype = DType::kBFloat16;
    if (out) {
      s.param_out = h.data();
      s.param_dtype = DType::kBFloat16;
    }
    s.numel = 16;
    try {
      optimizer_step(Stream::default_for(Device::host()), OptimizerConfig{}, s, StepScalars{1e-3f, 0.0f, 1, 1.0f});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error(DType::kFloat32, DType::kBFloat16, false).find("master weights of dtype fp32 with optimizer state of "
                                                             "dtype bf16 are not supported") != std::string::npos);
  CHECK(error(DType::kFloat16, DType::kFloat16, false).find("master weights of dtype fp16") != std::string::npos);
  CHECK(error(DType::kBFloat16, DType::kBFloat16, true).find("bf16 master weights are the parameters themselves") !=
        std::string::npos);
  CHECK(error(DType::kBFloat16, DType::kBFloat16, false).empty());
}
