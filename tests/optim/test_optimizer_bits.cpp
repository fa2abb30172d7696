// The host optimizer's blocked, vectorized loop against the same element
// updates applied one element at a time, as the CUDA kernel applies them:
// bit for bit (NaN payloads aside), for every optimizer and dtype pair, over
// a size that crosses block boundaries and values that test the edges of
// float (NaN, infinities, signed zeros, subnormals, overflow), on every
// instruction set this CPU has (Note [ISA dispatch] in core/cpu_isa.h).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "zest/core/cpu_isa.h"
#include "zest/optim/detail/host_kernels.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/detail/optimizer_impl.h"

using namespace zest;

namespace {

constexpr size_t kN = 2 * 2048 + 37;  // two whole host blocks and a ragged one
constexpr int kSteps = 3;

// Equal bits, or both NaN: which NaN an operation with two NaN operands
// returns is not part of the promise.
bool same_float(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

template <typename T>
bool same_stored(T a, T b) {
  return same_float(static_cast<float>(a), static_cast<float>(b)) &&
         (std::isnan(static_cast<float>(a)) || std::memcmp(&a, &b, sizeof(T)) == 0);
}

std::vector<float> values(std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(kN);
  for (float& v : x) v = normal(rng);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 1e-40f, -3e-39f,
                            3e38f, -65520.0f, 1e-8f};
  // Scattered, some in each block, one at the very last element.
  for (size_t k = 0; k < std::size(specials); ++k) x[(k * 997 + 11) % kN] = specials[k];
  x[kN - 1] = specials[1];
  return x;
}

template <typename T>
std::vector<T> stored(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = T(x[i]);
  return out;
}

struct State {
  std::vector<float> w, m, v;
};

// One element at a time through optimizer_impl.h, the order the kernel uses.
template <typename TG, typename TP>
void step_elementwise(const OptimizerConfig& c, const StepScalars& k, State& s, const std::vector<TG>& g,
                      std::vector<std::conditional_t<std::is_void_v<TP>, float, TP>>& out) {
  if (c.kind == OptimizerKind::kSgd) {
    const detail::SgdStep st = detail::sgd_step(c, k);
    for (size_t i = 0; i < kN; ++i) {
      detail::sgd_update(st, static_cast<float>(g[i]), s.w[i], c.momentum != 0.0f ? &s.m[i] : nullptr);
      if constexpr (!std::is_void_v<TP>) out[i] = TP(s.w[i]);
    }
  } else {
    const detail::AdamStep a = detail::adam_step(c, k);
    for (size_t i = 0; i < kN; ++i) {
      detail::adam_update(a, static_cast<float>(g[i]), s.w[i], s.m[i], s.v[i]);
      if constexpr (!std::is_void_v<TP>) out[i] = TP(s.w[i]);
    }
  }
}

template <typename TG, typename TP>
void check_pair(const OptimizerConfig& c) {
  using Out = std::conditional_t<std::is_void_v<TP>, float, TP>;
  std::mt19937 rng(11);
  State blocked{values(rng, 1.0f), std::vector<float>(kN, 0.0f), std::vector<float>(kN, 0.0f)};
  State single = blocked;
  std::vector<Out> out_blocked(kN), out_single(kN);
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<TG> g = stored<TG>(values(rng, 4.0f));
    const StepScalars k{0.01f, 0.1f, t, 0.5f};
    ShardBuffers s;
    s.master = blocked.w.data();
    s.state[0] = blocked.m.data();
    s.state[1] = blocked.v.data();
    s.grad = g.data();
    s.grad_dtype = dtype_of_v<TG>;
    if constexpr (!std::is_void_v<TP>) {
      s.param_out = out_blocked.data();
      s.param_dtype = dtype_of_v<TP>;
    }
    s.numel = kN;
    optimizer_step(Stream::default_for(Device::host()), c, s, k);
    step_elementwise<TG, TP>(c, k, single, g, out_single);
  }
  size_t differing = 0;
  size_t first = kN;
  for (size_t i = 0; i < kN; ++i) {
    const bool same = same_float(blocked.w[i], single.w[i]) && same_float(blocked.m[i], single.m[i]) &&
                      same_float(blocked.v[i], single.v[i]) && same_stored(out_blocked[i], out_single[i]);
    if (!same && differing++ == 0) first = i;
  }
  INFO(optimizer_name(c.kind), " momentum ", c.momentum, " nesterov ", c.nesterov, ": first differing element ",
       first);
  CHECK(differing == 0);
}

template <typename TG>
void check_outputs(const OptimizerConfig& c) {
  check_pair<TG, void>(c);
  check_pair<TG, float>(c);
  check_pair<TG, fp16>(c);
  check_pair<TG, bf16>(c);
}

void check_all_dtypes(const OptimizerConfig& c) {
  check_outputs<float>(c);
  check_outputs<fp16>(c);
  check_outputs<bf16>(c);
}

// Runs fn() with the host loops of each instruction set the CPU has.
template <typename Fn>
void on_every_isa(Fn&& fn) {
  for (CpuIsa isa : supported_cpu_isas()) {
    ScopedCpuIsa force(isa);
    INFO("instruction set ", cpu_isa_name(isa));
    // Unless ZEST_CPU_ISA caps it, the forced set's loops are the ones run.
    if (std::getenv("ZEST_CPU_ISA") == nullptr) REQUIRE(detail::host_kernels().isa == isa);
    fn();
  }
}

}  // namespace

TEST_CASE("the host loop gives the bits of one element at a time: AdamW and Adam") {
  on_every_isa([] {
    OptimizerConfig c;
    check_all_dtypes(c);
    c.kind = OptimizerKind::kAdam;
    check_all_dtypes(c);
  });
}

TEST_CASE("the host loop gives the bits of one element at a time: SGD with and without momentum") {
  on_every_isa([] {
    OptimizerConfig c;
    c.kind = OptimizerKind::kSgd;
    check_all_dtypes(c);
    c.momentum = 0.9f;
    c.dampening = 0.1f;
    check_all_dtypes(c);
    c.dampening = 0.0f;
    c.nesterov = true;
    check_all_dtypes(c);
  });
}

// The fp16 conversions of the host loop (F16C's instructions where the CPU
// has them) against core/float16.h's, bit for bit, NaN payloads included:
// SGD at lr 1 from zero weights gives w = -g for every fp16 gradient
// pattern; with zero gradients it leaves the weights of a sweep over all
// floats (infinities aside: 0 * Inf is NaN) as they are, and narrows them
// into the fp16 copy.
TEST_CASE("the host loop converts fp16 with core/float16.h's bits, NaN payloads included") {
  on_every_isa([] {
    OptimizerConfig c;
    c.kind = OptimizerKind::kSgd;
    c.weight_decay = 0.0f;
    const StepScalars k{1.0f, 0.0f, 1, 1.0f};
    const Stream& host = Stream::default_for(Device::host());

    std::vector<fp16> grads(65536);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = fp16::from_bits(static_cast<uint16_t>(i));
    std::vector<float> w(grads.size(), 0.0f), expect(grads.size(), 0.0f);
    std::vector<fp16> out(grads.size());
    ShardBuffers s;
    s.master = w.data();
    s.grad = grads.data();
    s.grad_dtype = DType::kFloat16;
    s.param_out = out.data();
    s.param_dtype = DType::kFloat16;
    s.numel = grads.size();
    optimizer_step(host, c, s, k);
    const detail::SgdStep st = detail::sgd_step(c, k);
    size_t differing = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      float no_momentum = 0.0f;  // not read or written without momentum
      detail::sgd_update(st, static_cast<float>(grads[i]), expect[i], &no_momentum);
      differing += std::memcmp(&w[i], &expect[i], sizeof(float)) != 0 || out[i].bits != fp16(expect[i]).bits;
    }
    CHECK(differing == 0);

    std::vector<float> sweep;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
      const auto bits = static_cast<uint32_t>(u);
      if ((bits & 0x7fffffffu) == 0x7f800000u) continue;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      sweep.push_back(f);
    }
    const std::vector<float> zeros(sweep.size(), 0.0f);
    std::vector<fp16> narrowed(sweep.size());
    s.master = sweep.data();
    s.grad = zeros.data();
    s.grad_dtype = DType::kFloat32;
    s.param_out = narrowed.data();
    s.numel = sweep.size();
    optimizer_step(host, c, s, k);
    differing = 0;
    for (size_t i = 0; i < sweep.size(); ++i) differing += narrowed[i].bits != fp16(sweep[i]).bits;
    CHECK(differing == 0);
});
}

// OptimizerConfig::host_threads splits the shard between threads: the same
// bits as one thread, over parts that end mid-shard and a ragged last part,
// with 16-bit gradients and parameter copies (whose offsets are in bytes).
TEST_CASE("the host update has the same bits on any number of threads") {
  constexpr size_t n = 3 * 65536 + 1000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<bf16> grad(n);
  for (bf16& g : grad) g = bf16(normal(rng));
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    std::vector<std::vector<float>> w(2, std::vector<float>(n)), m(2, std::vector<float>(n, 0.1f)),
        v(2, std::vector<float>(n, 0.2f));
    for (size_t i = 0; i < n; ++i) w[0][i] = w[1][i] = normal(rng);
    std::vector<std::vector<fp16>> out(2, std::vector<fp16>(n));
    for (int run = 0; run < 2; ++run) {
      OptimizerConfig c;
      c.kind = kind;
      c.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f;
      c.host_threads = run == 0 ? 1 : 3;
      ShardBuffers s;
      s.master = w[run].data();
      s.state[0] = m[run].data();
      s.state[1] = v[run].data();
      s.grad = grad.data();
      s.grad_dtype = DType::kBFloat16;
      s.param_out = out[run].data();
      s.param_dtype = DType::kFloat16;
      s.numel = n;
      for (int64_t t = 1; t <= 2; ++t) {
        optimizer_step(Stream::default_for(Device::host()), c, s, StepScalars{0.01f, 0.1f, t, 1.0f});
      }
    }
    INFO(optimizer_name(kind));
    CHECK(std::memcmp(w[0].data(), w[1].data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(m[0].data(), m[1].data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(v[0].data(), v[1].data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(out[0].data(), out[1].data(), n * sizeof(fp16)) == 0);
    CHECK(w[0][n - 1] != 0.0f);
  }
  OptimizerConfig bad;
  bad.host_threads = 0;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("host_threads must be 1 to 1024, got 0"), Error);
}
