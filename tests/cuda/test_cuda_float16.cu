// fp16 / bf16 conversions on the GPU. ZEST's __host__ __device__ conversions
// must give the same bits in a kernel as on the host (ZEST converts on either
// side and promises identical results), and the same bits as CUDA's own
// intrinsics, which the kernels that read ZEST's buffers use.
#include <doctest/doctest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ios>
#include <vector>

#include "zest/core/cuda_check.h"
#include "zest/core/float16.h"
#include "zest/memory/caching_allocator.h"

namespace {

using zest::detail::bits_float;
using zest::detail::float_bits;

// float16.h promises that arrays of its types can be passed as CUDA's.
static_assert(sizeof(zest::fp16) == sizeof(__half) && alignof(zest::fp16) == alignof(__half));
static_assert(sizeof(zest::bf16) == sizeof(__nv_bfloat16) &&
              alignof(zest::bf16) == alignof(__nv_bfloat16));

constexpr int kThreads = 256;
constexpr size_t kPatterns = 65536;

// Outputs are four planes of n: ZEST fp16, CUDA fp16, ZEST bf16, CUDA bf16.
// ZEST goes through its storage types so that they are covered on the device.
__global__ void widen_all_patterns(uint32_t* out) {
  constexpr size_t n = kPatterns;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const auto b = static_cast<uint16_t>(i);
    out[i] = __float_as_uint(static_cast<float>(zest::fp16::from_bits(b)));
    out[n + i] = __float_as_uint(__half2float(__ushort_as_half(b)));
    out[2 * n + i] = __float_as_uint(static_cast<float>(zest::bf16::from_bits(b)));
    out[3 * n + i] = __float_as_uint(__bfloat162float(__ushort_as_bfloat16(b)));
  }
}

__global__ void narrow(const float* in, uint16_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float f = in[i];
    out[i] = zest::fp16(f).bits;
    out[n + i] = __half_as_ushort(__float2half_rn(f));
    out[2 * n + i] = zest::bf16(f).bits;
    out[3 * n + i] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
}

// A grid-stride loop over a capped grid, so large inputs also take the loop.
unsigned grid_for(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 4096));
}

struct Gpu {
  zest::CachingAllocator alloc{zest::make_cuda_allocator(0), zest::AllocatorConfig{}};
  zest::OwnedStream stream{zest::Device::cuda(0)};
  cudaStream_t native() const { return static_cast<cudaStream_t>(stream.get().native()); }
};

// Runs `launch` twice, over outputs poisoned with 0xff bytes and then with
// 0x00: an output the kernel left unwritten differs between the runs (no
// value equals both poisons), a written one is the same. The memsets are
// queued on the kernel's stream: a plain cudaMemset goes to the legacy stream,
// which ZEST's non-blocking streams are not ordered with.
template <typename T, typename Launch>
std::vector<T> run_poisoned(Gpu& gpu, const zest::Buffer& out, size_t count, Launch launch) {
  std::vector<T> ff(count);
  std::vector<T> zero(count);
  for (std::vector<T>* host : {&ff, &zero}) {
    const int poison = host == &ff ? 0xff : 0x00;
    ZEST_CUDA_CHECK(cudaMemsetAsync(out.data(), poison, count * sizeof(T), gpu.native()));
    launch();
    ZEST_CUDA_CHECK(cudaMemcpyAsync(host->data(), out.data(), count * sizeof(T),
                                    cudaMemcpyDeviceToHost, gpu.native()));
    gpu.stream.get().synchronize();
  }
  const auto diff = std::mismatch(ff.begin(), ff.end(), zero.begin());
  INFO("first output left unwritten: index " << (diff.first - ff.begin()));
  REQUIRE(diff.first == ff.end());
  return ff;
}

bool fp16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }
bool float_bits_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
bool float_nan(float f) { return std::isnan(f); }
uint32_t bits_of(uint16_t b) { return b; }
uint32_t bits_of(float f) { return float_bits(f); }

// Device ZEST must equal host ZEST bit for bit, NaNs included, since it is the
// same code. CUDA's intrinsic must equal it too, except that from a NaN input
// it need only return a NaN (CUDA has its own canonical NaN).
template <typename In, typename Out>
void check_agreement(const char* name, const std::vector<In>& inputs, const Out* device_zest,
                     const Out* cuda, Out (*host_zest)(In), bool (*in_nan)(In),
                     bool (*out_nan)(Out)) {
  size_t bad = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Out expected = host_zest(inputs[i]);
    const bool cuda_ok = in_nan(inputs[i]) ? out_nan(cuda[i]) : cuda[i] == expected;
    if (device_zest[i] == expected && cuda_ok) continue;
    if (++bad <= 8) {
      FAIL_CHECK(name << ": input bits 0x" << std::hex << bits_of(inputs[i]) << ": host ZEST 0x"
                      << expected << ", device ZEST 0x" << device_zest[i] << ", CUDA 0x"
                      << cuda[i]);
    }
  }
  INFO(name << ": " << bad << " of " << inputs.size() << " inputs disagree");
  CHECK(bad == 0);
}

// Around the midpoint of every pair of adjacent finite positive 16-bit values
// (and, past the largest, the point where rounding goes to Inf), both signs:
// where an off-by-one in rounding would show.
void add_rounding_boundaries(std::vector<float>& v, float (*to_float)(uint16_t),
                             uint16_t max_finite) {
  for (uint32_t a = 0; a <= max_finite; ++a) {
    const double fa = to_float(static_cast<uint16_t>(a));
    const double fb = a < max_finite ? to_float(static_cast<uint16_t>(a + 1))
                                     : 2 * fa - to_float(static_cast<uint16_t>(a - 1));
    const auto mid = static_cast<float>((fa + fb) / 2);  // exact: one more significand bit
    for (float f : {mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)}) {
      v.push_back(f);
      v.push_back(-f);
    }
  }
}

std::vector<float> narrowing_inputs() {
  std::vector<float> v;
  v.reserve(17'700'000);
  for (uint32_t i = 0; i < kPatterns; ++i) {
    v.push_back(zest::fp16_bits_to_float(static_cast<uint16_t>(i)));
    v.push_back(zest::bf16_bits_to_float(static_cast<uint16_t>(i)));
  }
  add_rounding_boundaries(v, zest::fp16_bits_to_float, 0x7bff);
  add_rounding_boundaries(v, zest::bf16_bits_to_float, 0x7f7f);
  // Every 251st float bit pattern (a prime stride varies every mantissa bit):
  // all exponents, subnormals, Infs and many NaN payloads.
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251)
    v.push_back(bits_float(static_cast<uint32_t>(u)));
  return v;
}

}  // namespace

TEST_CASE("all 65536 fp16 and bf16 patterns widen to the same float on device, host and CUDA") {
  Gpu gpu;
  const size_t count = 4 * kPatterns;
  zest::Buffer out = gpu.alloc.allocate_buffer(count * sizeof(uint32_t), gpu.stream);
  const std::vector<uint32_t> got = run_poisoned<uint32_t>(gpu, out, count, [&] {
    widen_all_patterns<<<grid_for(kPatterns), kThreads, 0, gpu.native()>>>(out.as<uint32_t>());
    ZEST_CUDA_KERNEL_CHECK();
  });

  std::vector<uint16_t> patterns(kPatterns);
  for (size_t i = 0; i < kPatterns; ++i) patterns[i] = static_cast<uint16_t>(i);
  const uint32_t* plane = got.data();
  check_agreement<uint16_t, uint32_t>(
      "fp16 -> float", patterns, plane, plane + kPatterns,
      +[](uint16_t b) { return float_bits(zest::fp16_bits_to_float(b)); }, fp16_nan,
      float_bits_nan);
  check_agreement<uint16_t, uint32_t>(
      "bf16 -> float", patterns, plane + 2 * kPatterns, plane + 3 * kPatterns,
      +[](uint16_t b) { return float_bits(zest::bf16_bits_to_float(b)); }, bf16_nan,
      float_bits_nan);
}

TEST_CASE("floats narrow to the same fp16 and bf16 bits on device, host and CUDA") {
  const std::vector<float> inputs = narrowing_inputs();
  const size_t n = inputs.size();
  Gpu gpu;
  zest::Buffer in = gpu.alloc.allocate_buffer(n * sizeof(float), gpu.stream);
  zest::Buffer out = gpu.alloc.allocate_buffer(4 * n * sizeof(uint16_t), gpu.stream);
  ZEST_CUDA_CHECK(cudaMemcpyAsync(in.data(), inputs.data(), n * sizeof(float),
                                  cudaMemcpyHostToDevice, gpu.native()));
  const std::vector<uint16_t> got = run_poisoned<uint16_t>(gpu, out, 4 * n, [&] {
    narrow<<<grid_for(n), kThreads, 0, gpu.native()>>>(in.as<float>(), out.as<uint16_t>(), n);
    ZEST_CUDA_KERNEL_CHECK();
  });

  const uint16_t* plane = got.data();
  check_agreement<float, uint16_t>("float -> fp16", inputs, plane, plane + n,
                                   zest::float_to_fp16_bits, float_nan, fp16_nan);
  check_agreement<float, uint16_t>("float -> bf16", inputs, plane + 2 * n, plane + 3 * n,
                                   zest::float_to_bf16_bits, float_nan, bf16_nan);
}
