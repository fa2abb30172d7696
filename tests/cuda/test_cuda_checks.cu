// The CUDA and NCCL error checks against real failures, and ZEST's streams and
// events on a real device: the host tests can only see their host halves.
#include <doctest/doctest.h>

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/stream_gate.h"
#include "zest/core/cuda_check.h"
#include "zest/core/nccl_check.h"
#include "zest/core/stream.h"
#include "zest/memory/caching_allocator.h"

using namespace zest;
using zest::test::StreamGate;

namespace {

constexpr Device kCuda0 = Device::cuda(0);

cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.native()); }

__global__ void fill(int* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = 3 * i + 1;
}

// Busy for `ns` nanoseconds of the GPU's global timer, whatever its clock rate.
__global__ void spin(uint64_t ns) {
  uint64_t start = 0;
  uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// The what() of the Error thrown by `f`, or "" when none is.
template <typename F>
std::string thrown_text(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// The what() of the Error `f` must throw; a failed check when none is.
template <typename F>
std::string error_text(F f) {
  std::string what = thrown_text(f);
  if (what.empty()) FAIL_CHECK("no zest::Error thrown");
  return what;
}

}  // namespace

TEST_CASE("ZEST_CUDA_CHECK reports the expression, CUDA's error, the device and the call site") {
  int expected_line = 0;
  try {
    expected_line = __LINE__ + 1;
    ZEST_CUDA_CHECK(cudaSetDevice(9999));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.message() == "CUDA error 101 (cudaErrorInvalidDevice: " +
                             std::string(cudaGetErrorString(cudaErrorInvalidDevice)) +
                             ") from `cudaSetDevice(9999)` on device cuda:0");
    // __FILE__ is relative to the source root in nvcc-compiled code too.
    CHECK(std::string(e.file()) == "tests/cuda/test_cuda_checks.cu");
    CHECK(e.line() == expected_line);
    CHECK(std::string(e.what()).ends_with(
        " (tests/cuda/test_cuda_checks.cu:" + std::to_string(expected_line) + ")"));
  }
  (void)cudaGetLastError();  // the failed call is also CUDA's last error
}

TEST_CASE("a failed ZEST_CUDA_CHECK does not resurface in the next ZEST_CUDA_KERNEL_CHECK") {
  (void)error_text([] { ZEST_CUDA_CHECK(cudaSetDevice(9999)); });
  fill<<<1, 32>>>(nullptr, 0);
  const std::string what = thrown_text([] { ZEST_CUDA_KERNEL_CHECK(); });
  CHECK_MESSAGE(what.empty(), "an error caught and handled long ago is blamed on a good launch: ", what);
  (void)cudaGetLastError();
}

TEST_CASE("ZEST_CUDA_KERNEL_CHECK catches a bad launch configuration and consumes the error") {
  (void)cudaGetLastError();
  fill<<<1, 4096>>>(nullptr, 0);  // the limit is 1024 threads per block
  const std::string what = error_text([] { ZEST_CUDA_KERNEL_CHECK(); });
  INFO("the error: ", what);
  // CUDA 12 calls a block over the limit an invalid configuration, CUDA 13
  // an invalid value.
  CHECK((what.find("CUDA error 9 (cudaErrorInvalidConfiguration: ") != std::string::npos ||
         what.find("CUDA error 1 (cudaErrorInvalidValue: ") != std::string::npos));
  CHECK(what.find("from `kernel launch` on device cuda:0") != std::string::npos);
  CHECK(what.find("(tests/cuda/test_cuda_checks.cu:") != std::string::npos);
  // Not sticky: the context is fine and no later check sees the error again.
  ZEST_CUDA_CHECK(cudaDeviceSynchronize());
  ZEST_CUDA_KERNEL_CHECK();
}

TEST_CASE("ZEST_NCCL_CHECK reports the expression and NCCL's error") {
  ncclComm_t comm = nullptr;
  const ncclUniqueId id{};
  const std::string init = error_text([&] { ZEST_NCCL_CHECK(ncclCommInitRank(&comm, 0, id, 0)); });
  CHECK(init.find("NCCL error 4 (invalid argument") != std::string::npos);
  CHECK(init.find("from `ncclCommInitRank(&comm, 0, id, 0)` on device cuda:0") !=
        std::string::npos);
  CHECK(init.find("(tests/cuda/test_cuda_checks.cu:") != std::string::npos);
  CHECK(comm == nullptr);

  int count = -1;
  const std::string query = error_text([&] { ZEST_NCCL_CHECK(ncclCommCount(nullptr, &count)); });
  CHECK(query.find("NCCL error 4 (invalid argument") != std::string::npos);
  CHECK(query.find("from `ncclCommCount(nullptr, &count)`") != std::string::npos);
}

TEST_CASE("OwnedStream makes distinct non-default CUDA streams") {
  OwnedStream a(kCuda0);
  OwnedStream b(kCuda0);
  CHECK(a.get().device() == kCuda0);
  CHECK(a.get().native() != nullptr);
  CHECK(a.get().id() != 0);
  CHECK(a.get().id() != b.get().id());
  CHECK_FALSE(a.get() == b.get());
  unsigned flags = 0;
  ZEST_CUDA_CHECK(cudaStreamGetFlags(native(a), &flags));
  CHECK(flags == cudaStreamNonBlocking);
  CHECK(a.get().query());  // nothing queued yet
  const Stream legacy = Stream::default_for(kCuda0);
  CHECK(legacy.id() == 0);
  CHECK(legacy.native() == nullptr);
}

TEST_CASE("an event completes when the work before it is done, not before") {
  OwnedStream stream(kCuda0);
  StreamGate gate;
  Event done(kCuda0);
  gate.hold(native(stream));
  done.record(stream);
  CHECK_FALSE(done.query());
  CHECK_FALSE(stream.get().query());
  gate.open();
  done.synchronize();
  CHECK(done.query());
  stream.get().synchronize();
  CHECK(stream.get().query());
}

TEST_CASE("timing events measure a kernel") {
  OwnedStream stream(kCuda0);
  Event start(kCuda0, /*timing=*/true);
  Event end(kCuda0, /*timing=*/true);
  start.record(stream);
  spin<<<1, 1, 0, native(stream)>>>(2'000'000);
  ZEST_CUDA_KERNEL_CHECK();
  end.record(stream);
  end.synchronize();
  const float ms = start.elapsed_ms(end);
  CHECK(ms > 0.0f);
  CHECK(ms >= 1.0f);  // it spins for 2 ms; 1 ms of slack for a coarse global timer
  CHECK(ms < 1000.0f);
}

TEST_CASE("Stream::wait orders work on another stream after an event") {
  CachingAllocator alloc(make_cuda_allocator(0), AllocatorConfig{});
  OwnedStream producer(kCuda0);
  OwnedStream consumer(kCuda0);
  StreamGate gate;  // after the allocator, which waits for pending events on destruction
  constexpr int kCount = 1 << 20;
  Buffer data = alloc.allocate_buffer(kCount * sizeof(int), producer);
  // Allocated before the gate closes: a cudaMalloc should not have to wait
  // for a held stream, but nothing promises it will not.
  Buffer copy = alloc.allocate_buffer(kCount * sizeof(int), consumer);
  ZEST_CUDA_CHECK(cudaMemsetAsync(data.data(), 0, kCount * sizeof(int), native(producer)));
  producer.get().synchronize();

  // The producer is held before its kernel, so a consumer that did not wait
  // would copy zeros.
  gate.hold(native(producer));
  fill<<<kCount / 256, 256, 0, native(producer)>>>(data.as<int>(), kCount);
  ZEST_CUDA_KERNEL_CHECK();
  Event filled(kCuda0);
  filled.record(producer);
  consumer.get().wait(filled);
  alloc.record_stream(data.data(), consumer);
  // Device to device: a copy to pageable host memory could block the host
  // until it ran, which the closed gate would not let happen.
  ZEST_CUDA_CHECK(cudaMemcpyAsync(copy.data(), data.data(), kCount * sizeof(int),
                                  cudaMemcpyDeviceToDevice, native(consumer)));
  CHECK_FALSE(consumer.get().query());  // waiting on the held producer

  gate.open();
  consumer.get().synchronize();
  CHECK(filled.query());
  std::vector<int> host(kCount, -1);
  ZEST_CUDA_CHECK(
      cudaMemcpy(host.data(), copy.data(), kCount * sizeof(int), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) wrong += host[i] != 3 * i + 1;
  CHECK(wrong == 0);
}

TEST_CASE("streams and events refuse a device they do not belong to") {
  OwnedStream stream(kCuda0);
  Event host_event(Device::host());
  CHECK_THROWS_AS(stream.get().wait(host_event), Error);
  CHECK_THROWS_AS(host_event.record(stream), Error);
}
