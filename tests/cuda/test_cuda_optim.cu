// optim's CUDA kernels against its host implementation, which the host tests
// (tests/optim) check against references: the optimizer step and the grad
// ops must give the host's bits (NaN payloads aside), the chunked sums of
// squares the host's value to 1e-12 relative. Also copy_bytes and fill_zero
// across host and device memory, and their ordering on the stream.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/stream_gate.h"
#include "zest/core/cuda_check.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/copy.h"
#include "zest/optim/chunk_sum_order.h"
#include "zest/optim/grad_norm.h"
#include "zest/optim/grad_ops.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/step_decision.h"

using namespace zest;

namespace {

using zest::detail::bits_float;
using zest::detail::float_bits;

constexpr size_t kN = 4099;  // odd: no vector width or block size divides it

Stream host() { return Stream::default_for(Device::host()); }

struct Gpu {
  CachingAllocator alloc{make_cuda_allocator(0), AllocatorConfig{}};
  OwnedStream stream{Device::cuda(0)};

  template <typename T>
  Buffer upload(const std::vector<T>& v) {
    Buffer b = alloc.allocate_buffer(std::max<size_t>(1, v.size() * sizeof(T)), stream);
    copy_bytes(stream, b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }
  template <typename T>
  std::vector<T> download(const Buffer& b, size_t n) {
    std::vector<T> v(n);
    copy_bytes(stream, v.data(), b.data(), n * sizeof(T));
    stream.get().synchronize();
    return v;
  }
};

bool is_nan(float x) { return std::isnan(x); }
bool is_nan(fp16 x) { return std::isnan(static_cast<float>(x)); }
bool is_nan(bf16 x) { return std::isnan(static_cast<float>(x)); }

// Device results must have the host's bits; where the host has a NaN the
// device need only have one (its own canonical NaN).
template <typename T>
void check_same_bits(const char* what, const std::vector<T>& device, const std::vector<T>& expected) {
  REQUIRE(device.size() == expected.size());
  size_t bad = 0;
  for (size_t i = 0; i < device.size(); ++i) {
    const bool same = is_nan(expected[i]) ? is_nan(device[i])
                                          : std::memcmp(&device[i], &expected[i], sizeof(T)) == 0;
    if (!same && ++bad <= 4) {
      FAIL_CHECK(what << "[" << i << "]: device " << static_cast<float>(device[i]) << ", host "
                      << static_cast<float>(expected[i]));
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << device.size() << " elements differ");
}

// Normal values over a wide range of magnitudes (fp16 subnormals included,
// fp16 overflow not), and a few zeros.
template <typename T>
std::vector<T> random_values(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-22, 8);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = T(i % 97 == 0 ? 0.0f : std::ldexp(normal(rng), exponent(rng)) * scale);
  }
  return v;
}

// Steps a shard on the host and, from the same start, on the GPU; every
// output must agree bit for bit after each step.
template <typename TG, typename TP>
void compare_optimizer(const OptimizerConfig& c) {
  CAPTURE(optimizer_name(c.kind));
  CAPTURE(c.momentum);
  CAPTURE(c.nesterov);
  CAPTURE(c.bias_correction);
  constexpr bool kOut = !std::is_void_v<TP>;
  using Out = std::conditional_t<kOut, TP, float>;
  std::mt19937 rng(17);
  std::vector<float> w = random_values<float>(rng, kN, 4.0f);
  std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
  std::vector<Out> out(kN);
  Gpu gpu;
  Buffer dw = gpu.upload(w), dm = gpu.upload(m), dv = gpu.upload(v), dout = gpu.upload(out);
  const int states = c.state_buffers();
  for (int t = 1; t <= 5; ++t) {
    CAPTURE(t);
    const std::vector<TG> g = random_values<TG>(rng, kN, 1.0f);
    Buffer dg = gpu.upload(g);
    const StepScalars k{0.01f, t == 3 ? 0.0f : 0.1f, t, t == 2 ? 0.37f : 1.0f / 1024};
    ShardBuffers hs{w.data(), DType::kFloat32, {states > 0 ? m.data() : nullptr, states > 1 ? v.data() : nullptr},
                    DType::kFloat32, g.data(), dtype_of_v<TG>, kOut ? out.data() : nullptr, dtype_of_v<Out>, kN};
    ShardBuffers ds{dw.as<float>(), DType::kFloat32,
                    {states > 0 ? dm.as<float>() : nullptr, states > 1 ? dv.as<float>() : nullptr},
                    DType::kFloat32, dg.data(), dtype_of_v<TG>, kOut ? dout.data() : nullptr, dtype_of_v<Out>, kN};
    optimizer_step(host(), c, hs, k);
    optimizer_step(gpu.stream, c, ds, k);
    check_same_bits("master", gpu.download<float>(dw, kN), w);
    if (states > 0) check_same_bits("state[0]", gpu.download<float>(dm, kN), m);
    if (states > 1) check_same_bits("state[1]", gpu.download<float>(dv, kN), v);
    if (kOut) check_same_bits("param_out", gpu.download<Out>(dout, kN), out);
  }
}

template <typename TG>
void compare_all_optimizers() {
  std::vector<OptimizerConfig> configs(8);
  configs[1].kind = OptimizerKind::kAdam;
  configs[2].kind = OptimizerKind::kAdam;
  configs[2].bias_correction = false;
  configs[3].beta1 = 0.8f;
  configs[3].beta2 = 0.99f;
  configs[3].eps = 1e-6f;
  for (size_t i = 4; i < configs.size(); ++i) {
    configs[i].kind = OptimizerKind::kSgd;
    configs[i].momentum = i == 4 ? 0.0f : 0.9f;
  }
  configs[6].dampening = 0.1f;
  configs[7].nesterov = true;
  for (const OptimizerConfig& c : configs) {
    compare_optimizer<TG, void>(c);
    compare_optimizer<TG, float>(c);
    compare_optimizer<TG, fp16>(c);
    compare_optimizer<TG, bf16>(c);
  }
}

// bf16 master weights with TS state (Note [bf16 master weights and
// optimizer state]): the GPU's rounded updates have the host's bits.
template <typename TS>
void compare_bf16_master(const OptimizerConfig& c) {
  CAPTURE(optimizer_name(c.kind));
  CAPTURE(c.momentum);
  std::mt19937 rng(29);
  std::vector<bf16> w = random_values<bf16>(rng, kN, 4.0f);
  std::vector<TS> m(kN, TS(0.0f)), v(kN, TS(0.0f));
  Gpu gpu;
  Buffer dw = gpu.upload(w), dm = gpu.upload(m), dv = gpu.upload(v);
  const int states = c.state_buffers();
  for (int t = 1; t <= 5; ++t) {
    CAPTURE(t);
    const std::vector<bf16> g = random_values<bf16>(rng, kN, 1.0f);
    Buffer dg = gpu.upload(g);
    const StepScalars k{0.01f, t == 3 ? 0.0f : 0.1f, t, t == 2 ? 0.37f : 1.0f / 1024};
    ShardBuffers hs{w.data(), DType::kBFloat16, {states > 0 ? m.data() : nullptr, states > 1 ? v.data() : nullptr},
                    dtype_of_v<TS>, g.data(), DType::kBFloat16, nullptr, DType::kBFloat16, kN};
    ShardBuffers ds{dw.data(), DType::kBFloat16, {states > 0 ? dm.data() : nullptr, states > 1 ? dv.data() : nullptr},
                    dtype_of_v<TS>, dg.data(), DType::kBFloat16, nullptr, DType::kBFloat16, kN};
    optimizer_step(host(), c, hs, k);
    optimizer_step(gpu.stream, c, ds, k);
    check_same_bits("master", gpu.download<bf16>(dw, kN), w);
    if (states > 0) check_same_bits("state[0]", gpu.download<TS>(dm, kN), m);
    if (states > 1) check_same_bits("state[1]", gpu.download<TS>(dv, kN), v);
  }
}

// Every 16-bit pattern, or for fp32 random bit patterns (every exponent,
// Infs, NaNs) and values on and next to the rounding midpoints of fp16 and
// bf16, where an off-by-one in rounding would show.
template <typename T>
std::vector<T> all_kinds_of_values(std::mt19937& rng) {
  std::vector<T> v;
  if constexpr (std::is_same_v<T, float>) {
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 300000; ++i) v.push_back(bits_float(bits(rng)));
    for (uint32_t b = 0; b < 0x7c00; b += 3) {
      const double lo = fp16_bits_to_float(static_cast<uint16_t>(b));
      const double hi = fp16_bits_to_float(static_cast<uint16_t>(b + 1));
      const auto mid = static_cast<float>((lo + hi) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), -mid}) v.push_back(x);
    }
    for (uint32_t b = 0; b < 0x7f80; b += 3) {
      const float mid = bits_float((b << 16) | 0x8000u);  // halfway to the next bf16
      for (float x : {mid, std::nextafter(mid, 0.0f), -mid}) v.push_back(x);
    }
  } else {
    for (uint32_t b = 0; b <= 0xffff; ++b) v.push_back(T::from_bits(static_cast<uint16_t>(b)));
  }
  return v;
}

template <typename TS, typename TD>
void compare_convert(const std::vector<TS>& src) {
  CAPTURE(dtype_name(dtype_of_v<TS>));
  CAPTURE(dtype_name(dtype_of_v<TD>));
  std::vector<TD> expected(src.size());
  convert(host(), src.data(), dtype_of_v<TS>, expected.data(), dtype_of_v<TD>, src.size());
  Gpu gpu;
  Buffer dsrc = gpu.upload(src);
  Buffer ddst = gpu.alloc.allocate_buffer(src.size() * sizeof(TD), gpu.stream);
  convert(gpu.stream, dsrc.data(), dtype_of_v<TS>, ddst.data(), dtype_of_v<TD>, src.size());
  const std::vector<TD> got = gpu.download<TD>(ddst, src.size());
  if constexpr (std::is_same_v<TS, TD>) {
    CHECK(std::memcmp(got.data(), src.data(), src.size() * sizeof(TS)) == 0);  // a copy: all bits
  } else {
    check_same_bits("convert", got, expected);
  }
}

template <typename TS>
void compare_convert_from() {
  std::mt19937 rng(5);
  const std::vector<TS> src = all_kinds_of_values<TS>(rng);
  compare_convert<TS, float>(src);
  compare_convert<TS, fp16>(src);
  compare_convert<TS, bf16>(src);
}

template <typename T>
void compare_accumulate() {
  CAPTURE(dtype_name(dtype_of_v<T>));
  std::mt19937 rng(9);
  std::vector<T> a = all_kinds_of_values<T>(rng);
  std::vector<T> b = a;
  std::shuffle(b.begin(), b.end(), rng);  // pairs of every kind, sums near ties included
  const std::vector<T> near = random_values<T>(rng, a.size(), 1.0f);
  a.insert(a.end(), near.begin(), near.end());
  const std::vector<T> near2 = random_values<T>(rng, near.size(), 1.0f);
  b.insert(b.end(), near2.begin(), near2.end());
  Gpu gpu;
  Buffer da = gpu.upload(a), db = gpu.upload(b);
  accumulate(host(), a.data(), b.data(), dtype_of_v<T>, a.size());
  accumulate(gpu.stream, da.data(), db.data(), dtype_of_v<T>, a.size());
  check_same_bits("accumulate", gpu.download<T>(da, a.size()), a);
  accumulate(host(), a.data(), a.data(), dtype_of_v<T>, a.size());  // in place onto itself
  accumulate(gpu.stream, da.data(), da.data(), dtype_of_v<T>, a.size());
  check_same_bits("accumulate onto itself", gpu.download<T>(da, a.size()), a);
  // One element in: not 16-byte aligned, so the one-element kernel runs
  // (Note [16-byte vectors]); the bits are the same.
  const size_t n = a.size() - 1;
  accumulate(host(), a.data() + 1, b.data() + 1, dtype_of_v<T>, n);
  accumulate(gpu.stream, da.as<T>() + 1, db.as<T>() + 1, dtype_of_v<T>, n);
  check_same_bits("accumulate, unaligned", gpu.download<T>(da, a.size()), a);
}

// Gradients of a 16-bit compute dtype accumulated into fp32 (the engine's
// grad_accum_dtype), against the host's bits.
template <typename TS>
void compare_accumulate_into_fp32() {
  CAPTURE(dtype_name(dtype_of_v<TS>));
  std::mt19937 rng(11);
  const std::vector<TS> src = all_kinds_of_values<TS>(rng);
  std::vector<float> acc = random_values<float>(rng, src.size(), 1.0f);
  Gpu gpu;
  Buffer dacc = gpu.upload(acc), dsrc = gpu.upload(src);
  accumulate(host(), acc.data(), DType::kFloat32, src.data(), dtype_of_v<TS>, acc.size());
  accumulate(gpu.stream, dacc.data(), DType::kFloat32, dsrc.data(), dtype_of_v<TS>, acc.size());
  check_same_bits("accumulate into fp32", gpu.download<float>(dacc, acc.size()), acc);
}

template <typename T>
void compare_chunk_sums() {
  CAPTURE(dtype_name(dtype_of_v<T>));
  std::mt19937 rng(23);
  const size_t n = 200003;
  const std::vector<T> g = random_values<T>(rng, n, 1.0f);
  Gpu gpu;
  Buffer dg = gpu.upload(g);
  // Chunks of one element, shorter and longer than a block, and over the
  // kernel's block cap (100002 chunks of 2).
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{7}, size_t{256}, size_t{1000}, size_t{65536}, n + 5}) {
    CAPTURE(chunk);
    const size_t chunks = (n + chunk - 1) / chunk;
    const float scale = 1.0f / 3;
    std::vector<double> expected(chunks);
    chunk_sums_of_squares(host(), g.data(), dtype_of_v<T>, n, chunk, scale, expected.data());
    Buffer dout = gpu.alloc.allocate_buffer(chunks * sizeof(double), gpu.stream);
    chunk_sums_of_squares(gpu.stream, dg.data(), dtype_of_v<T>, n, chunk, scale, dout.as<double>());
    const std::vector<double> got = gpu.download<double>(dout, chunks);
    size_t bad = 0;
    for (size_t c = 0; c < chunks; ++c) {
      if (std::fabs(got[c] - expected[c]) <= 1e-12 * expected[c]) continue;
      if (++bad <= 4) FAIL_CHECK("chunk " << c << ": device " << got[c] << ", host " << expected[c]);
    }
    CHECK(bad == 0);
    // The bits of the host's run of the kernel's order (chunk_sum_order.h).
    size_t differ = 0;
    const auto load = [&](size_t i) { return static_cast<float>(g[i]); };
    for (size_t c = 0; c < chunks; ++c) {
      const double want = warp_order_sum_of_squares(load, c * chunk, std::min(n, c * chunk + chunk), scale);
      differ += std::memcmp(&want, &got[c], sizeof want) != 0 ? 1 : 0;
    }
    CHECK(differ == 0);

    // A shard starting at a later chunk boundary gets the same bits for the
    // chunks it holds: the sums do not depend on where a chunk lies.
    const size_t skip = chunks / 2;
    const size_t rest = chunks - skip;
    Buffer dpart = gpu.alloc.allocate_buffer(rest * sizeof(double), gpu.stream);
    chunk_sums_of_squares(gpu.stream, dg.as<T>() + skip * chunk, dtype_of_v<T>, n - skip * chunk, chunk,
                          scale, dpart.as<double>());
    const std::vector<double> part = gpu.download<double>(dpart, rest);
    CHECK(std::memcmp(part.data(), got.data() + skip, rest * sizeof(double)) == 0);
  }
}

}  // namespace

TEST_CASE("CUDA optimizer steps match the host bit for bit with fp32 gradients") {
  compare_all_optimizers<float>();
}
TEST_CASE("CUDA optimizer steps match the host bit for bit with fp16 gradients") {
  compare_all_optimizers<fp16>();
}
TEST_CASE("CUDA optimizer steps match the host bit for bit with bf16 gradients") {
  compare_all_optimizers<bf16>();
}
TEST_CASE("CUDA optimizer steps with bf16 master weights and bf16 or fp32 state match the host bit for bit") {
  std::vector<OptimizerConfig> configs(4);
  configs[1].kind = OptimizerKind::kAdam;
  configs[2].kind = OptimizerKind::kSgd;
  configs[2].momentum = 0.9f;
  configs[3].kind = OptimizerKind::kSgd;
  for (const OptimizerConfig& c : configs) {
    compare_bf16_master<bf16>(c);
    compare_bf16_master<float>(c);
  }
}

TEST_CASE("CUDA chunk sums of squares match the host and do not depend on the shard") {
  compare_chunk_sums<float>();
  compare_chunk_sums<fp16>();
  compare_chunk_sums<bf16>();
}

TEST_CASE("CUDA chunk sums flag Inf and NaN in their chunk") {
  std::vector<fp16> g(1000, fp16(1.0f));
  g[600] = fp16::from_bits(0x7c00);
  g[900] = fp16::from_bits(0x7e00);
  Gpu gpu;
  Buffer dg = gpu.upload(g);
  Buffer dout = gpu.alloc.allocate_buffer(4 * sizeof(double), gpu.stream);
  chunk_sums_of_squares(gpu.stream, dg.data(), DType::kFloat16, g.size(), 250, 1.0f, dout.as<double>());
  const std::vector<double> got = gpu.download<double>(dout, 4);
  CHECK(got[0] == 250.0);
  CHECK(got[1] == 250.0);
  CHECK(std::isinf(got[2]));
  CHECK(std::isnan(got[3]));
}

TEST_CASE("CUDA chunk sums take the double fallback where the host does, with its bits") {
  // Note [float lanes, double fallback]: chunks of 256 bf16 whose squares
  // overflow float (2^70), underflow it ((1 + 2^-7) 2^-75), are all zero, are
  // ordinary, or hold an Inf or a NaN; a warp decides for all its lanes.
  const size_t chunk = 256;
  const float values[] = {std::ldexp(1.0f, 70), std::ldexp(1.0f + std::ldexp(1.0f, -7), -75), 0.0f, 0.75f};
  std::vector<bf16> g;
  for (float v : values) g.insert(g.end(), chunk, bf16(v));
  g.insert(g.end(), 2 * chunk, bf16(1.0f));
  g[4 * chunk + 3] = bf16::from_bits(0x7f80);    // Inf
  g[5 * chunk + 100] = bf16::from_bits(0x7fc0);  // NaN
  const size_t chunks = g.size() / chunk;
  Gpu gpu;
  Buffer dg = gpu.upload(g);
  for (const float scale : {1.0f, 0.5f}) {
    CAPTURE(scale);
    std::vector<double> want(chunks);
    chunk_sums_of_squares(host(), g.data(), DType::kBFloat16, g.size(), chunk, scale, want.data());
    Buffer dout = gpu.alloc.allocate_buffer(chunks * sizeof(double), gpu.stream);
    chunk_sums_of_squares(gpu.stream, dg.data(), DType::kBFloat16, g.size(), chunk, scale, dout.as<double>());
    const std::vector<double> got = gpu.download<double>(dout, chunks);
    for (size_t c = 0; c < 4; ++c) {
      CAPTURE(c);
      CHECK(std::memcmp(&got[c], &want[c], sizeof(double)) == 0);
    }
    CHECK(got[0] == 256.0 * std::ldexp(1.0, 140) * scale * scale);
    CHECK(std::isinf(got[4]));
    CHECK(std::isnan(got[5]));
  }
}

TEST_CASE("CUDA step decisions have the host's bits, and the optimizer follows one") {
  Gpu gpu;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::vector<double>> cases = {{9.0, 16.0}, {0.0}, {1e10, 3.0, 1e-30}, {1.0, inf}};
  for (const auto& values : cases) {
    for (const double max_norm : {0.0, 1.0, 1e6}) {
      std::vector<int64_t> words(kExactWords, 0);
      for (double v : values) REQUIRE(exact_add(words.data(), v));
      exact_normalize(words.data());
      Buffer dw = gpu.upload(words);
      decide_step(gpu.stream, dw.as<int64_t>(), 1.0 / 3.0, max_norm);
      decide_step(host(), words.data(), 1.0 / 3.0, max_norm);
      const std::vector<int64_t> got = gpu.download<int64_t>(dw, kExactWords);
      CHECK(std::memcmp(got.data(), words.data(), sizeof(StepDecision)) == 0);
    }
  }
  // A skipped decision leaves the shard as it was; the kernel read it on the GPU.
  std::vector<int64_t> bad(kExactWords, 0);
  REQUIRE(exact_add(bad.data(), inf));
  Buffer dbad = gpu.upload(bad);
  decide_step(gpu.stream, dbad.as<int64_t>(), 1.0, 0.0);
  const std::vector<float> w(kN, 0.5f), zeros(kN, 0.0f), g(kN, 1.0f);
  Buffer dw = gpu.upload(w), dm = gpu.upload(zeros), dv = gpu.upload(zeros), dg = gpu.upload(g);
  StepScalars k{0.01f, 0.1f, 1, 1.0f};
  k.decision = decision_at(dbad.as<int64_t>());
  ShardBuffers ds{dw.as<float>(), DType::kFloat32, {dm.as<float>(), dv.as<float>()}, DType::kFloat32, dg.data(), DType::kFloat32, nullptr,
                  DType::kFloat32, kN};
  optimizer_step(gpu.stream, OptimizerConfig{}, ds, k);
  check_same_bits("skipped master", gpu.download<float>(dw, kN), w);
}

TEST_CASE("CUDA accumulate matches the host bit for bit") {
  compare_accumulate<float>();
  compare_accumulate<fp16>();
  compare_accumulate<bf16>();
  compare_accumulate_into_fp32<fp16>();
  compare_accumulate_into_fp32<bf16>();
}

TEST_CASE("CUDA convert matches the host bit for bit for every pair of dtypes") {
  compare_convert_from<float>();
  compare_convert_from<fp16>();
  compare_convert_from<bf16>();
}

TEST_CASE("copy_bytes and fill_zero move bytes between host, pinned and device memory") {
  Gpu gpu;
  CachingAllocator pinned(make_cuda_pinned_allocator(), AllocatorConfig{});
  std::vector<uint8_t> src(10000);
  for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<uint8_t>(7 * k + 3);
  Buffer d1 = gpu.alloc.allocate_buffer(src.size(), gpu.stream);
  Buffer d2 = gpu.alloc.allocate_buffer(src.size(), gpu.stream);
  Buffer p = pinned.allocate_buffer(src.size(), host());  // pinned memory is the host's
  copy_bytes(gpu.stream, d1.data(), src.data(), src.size());  // pageable -> device
  copy_bytes(gpu.stream, d2.data(), d1.data(), src.size());   // device -> device
  fill_zero(gpu.stream, d2.as<uint8_t>() + 100, 1000);
  copy_bytes(gpu.stream, p.data(), d2.data(), src.size());    // device -> pinned
  gpu.stream.get().synchronize();
  for (size_t k = 0; k < src.size(); ++k) {
    const uint8_t want = k >= 100 && k < 1100 ? 0 : src[k];
    if (p.as<uint8_t>()[k] != want) {
      FAIL("byte " << k << ": " << int{p.as<uint8_t>()[k]} << ", expected " << int{want});
    }
  }
  CHECK_THROWS_WITH_AS(copy_bytes(gpu.stream, d1.data(), nullptr, 4),
                       doctest::Contains("the source pointer is null for a copy of 4 bytes on cuda:0"),
                       Error);
  CHECK_THROWS_WITH_AS(copy_bytes(gpu.stream, d1.as<uint8_t>() + 1, d1.data(), 4),
                       doctest::Contains("overlap"), Error);
}

TEST_CASE("copy_bytes and fill_zero are queued on the stream, after its earlier work") {
  Gpu gpu;
  CachingAllocator pinned(make_cuda_pinned_allocator(), AllocatorConfig{});
  Buffer p = pinned.allocate_buffer(256, host());
  std::memset(p.data(), 0x5a, 256);
  Buffer d = gpu.alloc.allocate_buffer(256, gpu.stream);
  zest::test::StreamGate gate;
  gate.hold(static_cast<cudaStream_t>(gpu.stream.get().native()));
  fill_zero(gpu.stream, d.data(), 256);
  copy_bytes(gpu.stream, p.data(), d.data(), 256);  // pinned: returns before it runs
  CHECK(p.as<uint8_t>()[0] == 0x5a);
  CHECK_FALSE(gpu.stream.get().query());
  gate.open();
  gpu.stream.get().synchronize();
  CHECK(p.as<uint8_t>()[0] == 0);
  CHECK(p.as<uint8_t>()[255] == 0);
}
