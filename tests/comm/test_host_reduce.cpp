// host_reduce's blocked, vectorized loops against one element at a time
// through reduction:: (the order the CUDA kernel uses), bit for bit, for
// every dtype, op, a few input counts, one output and two, in place and
// not, on every instruction set this CPU has (Note [ISA dispatch] in
// core/cpu_isa.h).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "zest/comm/host_reduce.h"
#include "zest/comm/detail/reduce_element.h"
#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"

using namespace zest;

namespace {

constexpr size_t kN = 2 * 2048 + 37;  // two whole blocks and a ragged one

template <typename T>
std::vector<T> random_values(std::mt19937& rng) {
  std::vector<T> x(kN);
  if constexpr (std::is_same_v<T, float>) {
    std::normal_distribution<float> normal(0.0f, 100.0f);
    for (float& v : x) v = normal(rng);
    const float inf = std::numeric_limits<float>::infinity();
    const float specials[] = {NAN, inf, -inf, 0.0f, -0.0f, 1e-40f, -3e-39f, 3e38f, -3e38f};
    for (size_t k = 0; k < std::size(specials); ++k) x[(k * 997 + rng() % 97) % kN] = specials[k];
  } else if constexpr (std::is_same_v<T, fp16> || std::is_same_v<T, bf16>) {
    // Every bit pattern: NaNs, infinities and subnormals included.
    for (T& v : x) v = T::from_bits(static_cast<uint16_t>(rng()));
  } else {
    for (T& v : x) v = static_cast<T>(static_cast<uint64_t>(rng()) << 32 | rng());
  }
  return x;
}

// The reduction one element at a time: acc = in0, then op with each next
// input in rank order, / n for avg, one rounding at the store.
template <typename T>
T reference(const std::vector<std::vector<T>>& in, size_t i, ReduceOp op) {
  using A = typename reduction::Acc<T>::type;
  A acc = reduction::load(in[0][i]);
  for (size_t k = 1; k < in.size(); ++k) {
    const A x = reduction::load(in[k][i]);
    acc = op == ReduceOp::kMax ? reduction::max<T>(acc, x) : reduction::add<T>(acc, x);
  }
  if constexpr (std::is_floating_point_v<A>) {
    if (op == ReduceOp::kAvg) acc /= static_cast<A>(in.size());
  }
  return static_cast<T>(acc);
}

// Equal bits, or both NaN (which NaN an operation on two returns is not
// promised).
template <typename T>
bool same(T a, T b) {
  if constexpr (!std::is_integral_v<T>) {
    if (std::isnan(static_cast<float>(a)) && std::isnan(static_cast<float>(b))) return true;
  }
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
void check_dtype(DType dtype, std::initializer_list<ReduceOp> ops) {
  std::mt19937 rng(7);
  for (ReduceOp op : ops) {
    for (int n : {1, 2, 3, 5}) {
      std::vector<std::vector<T>> in;
      for (int k = 0; k < n; ++k) in.push_back(random_values<T>(rng));
      // In place: the second output is the last input's own memory.
      std::vector<std::vector<T>> work = in;
      std::vector<const void*> inputs;
      for (const auto& v : work) inputs.push_back(v.data());
      std::vector<T> out(kN);
      void* outputs[] = {out.data(), work.back().data()};
      host_reduce(inputs.data(), n, outputs, 2, kN, dtype, op);
      size_t differing = 0;
      size_t first = kN;
      for (size_t i = 0; i < kN; ++i) {
        const T want = reference(in, i, op);
        if ((!same(out[i], want) || !same(work.back()[i], want)) && differing++ == 0) first = i;
      }
      INFO(dtype_name(dtype), " op ", static_cast<int>(op), " inputs ", n, ": first differing element ", first);
      CHECK(differing == 0);
      // One output (a reduce-scatter's; two inputs take their own loop):
      // apart, and in place of each input in turn.
      for (int into = -1; into < n; ++into) {
        std::vector<std::vector<T>> one = in;
        std::vector<const void*> from;
        for (const auto& v : one) from.push_back(v.data());
        std::vector<T> apart(kN);
        void* to[] = {into < 0 ? apart.data() : one[static_cast<size_t>(into)].data()};
        host_reduce(from.data(), n, to, 1, kN, dtype, op);
        const T* got = static_cast<const T*>(to[0]);
        size_t wrong = 0;
        for (size_t i = 0; i < kN; ++i) wrong += same(got[i], reference(in, i, op)) ? 0 : 1;
        INFO(dtype_name(dtype), " op ", static_cast<int>(op), " inputs ", n, ", one output, in place of input ",
             into);
        CHECK(wrong == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("host_reduce gives the bits of one element at a time in rank order, on every ISA") {
  for (CpuIsa isa : supported_cpu_isas()) {
    ScopedCpuIsa force(isa);
    INFO("instruction set ", cpu_isa_name(isa));
    const auto fops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
    check_dtype<float>(DType::kFloat32, fops);
    check_dtype<fp16>(DType::kFloat16, fops);
    check_dtype<bf16>(DType::kBFloat16, fops);
    const auto iops = {ReduceOp::kSum, ReduceOp::kMax};
    check_dtype<int32_t>(DType::kInt32, iops);
    check_dtype<int64_t>(DType::kInt64, iops);
    check_dtype<uint8_t>(DType::kUInt8, iops);
  }
}

TEST_CASE("ZEST_CPU_ISA and ScopedCpuIsa choose the loops, the baseline is always there") {
  const std::vector<CpuIsa> isas = supported_cpu_isas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == CpuIsa::kBaseline);
  {
    ScopedCpuIsa force(CpuIsa::kBaseline);
    CHECK(host_isa() == CpuIsa::kBaseline);
  }
  if (std::getenv("ZEST_CPU_ISA") == nullptr) CHECK(host_isa() == isas.back());
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!cpu_supports(isa)) CHECK_THROWS_WITH_AS(ScopedCpuIsa{isa}, doctest::Contains("cannot run"), Error);
  }
}
