// Collectives over device buffers: the in-process backend with its ranks on
// one GPU (bit for bit against the host reduction; its point-to-point
// transfers too), and a 1-rank NCCL
// communicator running every collective, group, split and its watchdog.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "comm/conformance.h"
#include "cuda/stream_gate.h"
#include "zest/comm/host_reduce.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/comm/nccl_comm.h"
#include "zest/core/cuda_check.h"

using namespace zest;
using namespace zest::test;
using namespace std::chrono_literals;

namespace {

constexpr Device kCuda0 = Device::cuda(0);

// cudaMalloc'd bytes, freed at scope end; also conformance.h's buffer type.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    DeviceGuard guard(kCuda0);
    ZEST_CUDA_CHECK(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
  }
  explicit DeviceBuffer(const std::vector<unsigned char>& initial) : DeviceBuffer(initial.size()) {
    upload(initial.data(), initial.size());
  }
  ~DeviceBuffer() { ZEST_CUDA_WARN(cudaFree(ptr_)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }
  // Both end with a device synchronize: a cudaMemcpy from pageable memory may
  // return before the bytes land, and cudaMemset does not wait at all, both
  // on the legacy stream, for which ZEST's non-blocking streams do not wait.
  void upload(const void* src, size_t bytes, size_t offset = 0) {
    if (bytes == 0) return;
    DeviceGuard guard(kCuda0);
    ZEST_CUDA_CHECK(cudaMemcpy(get() + offset, src, bytes, cudaMemcpyHostToDevice));
    ZEST_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void fill(unsigned char byte) {
    DeviceGuard guard(kCuda0);
    ZEST_CUDA_CHECK(cudaMemset(ptr_, byte, bytes_ == 0 ? 1 : bytes_));
    ZEST_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Waits for `stream` first: ZEST's streams do not wait for the legacy
  // stream that cudaMemcpy uses.
  std::vector<unsigned char> download(const Stream& stream, size_t bytes, size_t offset = 0) const {
    stream.synchronize();
    std::vector<unsigned char> out(bytes + 1);
    if (bytes > 0) ZEST_CUDA_CHECK(cudaMemcpy(out.data(), get() + offset, bytes, cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<unsigned char> read(const Stream& stream, size_t offset, size_t bytes) const {
    return download(stream, bytes, offset);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// conformance.h's check_all_collectives, with every buffer on the device.
void check_collectives_on_device(Communicator& comm, const Stream& stream) {
  check_all_collectives_in<DeviceBuffer>(comm, stream);
}

// Random bits: every float class (NaN, Inf, subnormals, sums that round).
std::vector<unsigned char> random_bytes(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> out(bytes + 1);
  for (unsigned char& b : out) b = static_cast<unsigned char>(rng() >> 56);
  return out;
}

bool is_nan(DType t, const unsigned char* p) {
  uint32_t u32 = 0;
  uint16_t u16 = 0;
  switch (t) {
    case DType::kFloat32:
      std::memcpy(&u32, p, 4);
      return (u32 & 0x7fffffffu) > 0x7f800000u;
    case DType::kFloat16:
      std::memcpy(&u16, p, 2);
      return (u16 & 0x7fffu) > 0x7c00u;
    case DType::kBFloat16:
      std::memcpy(&u16, p, 2);
      return (u16 & 0x7fffu) > 0x7f80u;
    default:
      return false;
  }
}

}  // namespace

TEST_CASE("in-process collectives on one GPU are exact for every dtype, count and world size") {
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    run_inprocess(
        w,
        [](Communicator& comm) {
          OwnedStream stream(kCuda0);
          check_collectives_on_device(comm, stream);
        },
        kCuda0, CommOptions{std::chrono::seconds(60)});
  }
}

TEST_CASE("in-process send_recv between device buffers on one GPU is exact, in a ring on 2 and 3 ranks") {
  for (const int w : {2, 3}) {
    CAPTURE(w);
    run_inprocess(
        w,
        [](Communicator& comm) {
          OwnedStream stream(kCuda0);
          const int next = (comm.rank() + 1) % comm.size();
          const int prev = (comm.rank() + comm.size() - 1) % comm.size();
          for (const DType t : kAllDTypes) {
            for (const size_t count : {size_t{0}, size_t{7}, size_t{4099}}) {
              CAPTURE(dtype_name(t));
              CAPTURE(count);
              const size_t bytes = count * elem_size(t);
              DeviceBuffer out(make_input(t, comm.rank(), 0, count, 1));
              DeviceBuffer in(make_poisoned(bytes));
              const P2POp ops[] = {P2POp::send(out.get(), count, t, next), P2POp::recv(in.get(), count, t, prev)};
              comm.send_recv(ops, stream);
              CHECK(same_bytes(make_input(t, prev, 0, count, 1), in.download(stream, bytes).data(), bytes));
            }
          }
        },
        kCuda0, CommOptions{std::chrono::seconds(60)});
  }
}

TEST_CASE("the GPU reduction gives the host reduction's bits, rounding and all") {
  constexpr size_t kCount = 5003;
  for (int w = 1; w <= 4; ++w) {
    for (DType t : kAllDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        if (op == ReduceOp::kAvg && !is_floating(t)) continue;
        CAPTURE(w);
        CAPTURE(dtype_name(t));
        CAPTURE(reduce_op_name(op));
        const size_t bytes = kCount * elem_size(t);
        std::vector<std::vector<unsigned char>> inputs;
        std::vector<const void*> in_ptrs;
        for (int r = 0; r < w; ++r) inputs.push_back(random_bytes(bytes, 1000u * static_cast<uint64_t>(w) + static_cast<uint64_t>(r)));
        for (const auto& in : inputs) in_ptrs.push_back(in.data());
        std::vector<unsigned char> expect(bytes + 1);
        host_reduce(in_ptrs.data(), w, expect.data(), kCount, t, op);

        std::vector<std::vector<unsigned char>> results(static_cast<size_t>(w));
        run_inprocess(
            w,
            [&](Communicator& comm) {
              OwnedStream stream(kCuda0);
              DeviceBuffer send(bytes), recv(bytes);
              send.upload(inputs[static_cast<size_t>(comm.rank())].data(), bytes);
              comm.all_reduce(send.get(), recv.get(), kCount, t, op, stream);
              results[static_cast<size_t>(comm.rank())] = recv.download(stream, bytes);
            },
            kCuda0);
        const size_t es = elem_size(t);
        for (int r = 0; r < w; ++r) {
          CAPTURE(r);
          size_t differing = 0;
          for (size_t i = 0; i < kCount; ++i) {
            const unsigned char* a = expect.data() + i * es;
            const unsigned char* b = results[static_cast<size_t>(r)].data() + i * es;
            if (std::memcmp(a, b, es) == 0) continue;
            // x86 keeps a NaN operand's payload through an add, the GPU
            // returns its canonical NaN: NaN-ness agrees, payloads may not.
            if (op != ReduceOp::kMax && is_nan(t, a) && is_nan(t, b)) continue;
            ++differing;
          }
          CHECK(differing == 0);
        }
      }
    }
  }
}

TEST_CASE("in-process collectives on a GPU refuse more ranks than they carry pointers for") {
  CHECK_THROWS_WITH_AS(run_inprocess(
                           65,
                           [](Communicator& comm) {
                             DeviceBuffer buf(65 * 4);
                             OwnedStream stream(kCuda0);
                             comm.all_reduce(buf.get(), buf.get(), 65, DType::kFloat32,
                                             ReduceOp::kSum, stream);
                           },
                           kCuda0, CommOptions{std::chrono::seconds(10)}),
                       doctest::Contains("support 1 to 64 ranks"), Error);
}

namespace {

std::unique_ptr<Communicator> one_rank_nccl(std::chrono::milliseconds timeout) {
  // One rank meets itself; keep NCCL's bootstrap socket on the loopback.
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  return make_nccl_communicator(0, 1, nccl_unique_id(), 0, CommOptions{timeout});
}

}  // namespace

TEST_CASE("a 1-rank NCCL communicator runs every collective") {
  std::unique_ptr<Communicator> comm = one_rank_nccl(60s);
  CHECK(comm->backend_name() == "nccl");
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->device() == kCuda0);
  OwnedStream stream(kCuda0);
  check_collectives_on_device(*comm, stream);
  auto& nccl = dynamic_cast<NcclCommunicator&>(*comm);
  CHECK(nccl.native() != nullptr);
  CHECK_NOTHROW(nccl.check());

  SUBCASE("group") {
    DeviceBuffer a(16 * 4), b(16 * 4);
    std::vector<float> ones(16, 1.0f);
    a.upload(ones.data(), 64);
    b.upload(ones.data(), 64);
    comm->group_start();
    comm->all_reduce(a.get(), a.get(), 16, DType::kFloat32, ReduceOp::kSum, stream);
    comm->all_reduce(b.get(), b.get(), 16, DType::kFloat32, ReduceOp::kMax, stream);
    comm->group_end();
    const auto got = b.download(stream, 64);
    CHECK(std::memcmp(got.data(), ones.data(), 64) == 0);
    CHECK_NOTHROW(nccl.check());
  }
  SUBCASE("split") {
    std::unique_ptr<Communicator> child = comm->split(0, 0);
    REQUIRE(child != nullptr);
    CHECK(child->size() == 1);
    CHECK(child->backend_name() == "nccl");
    check_collectives_on_device(*child, stream);
    CHECK(comm->split(-1, 0) == nullptr);
  }
  SUBCASE("a barrier inside a group is refused") {
    comm->group_start();
    CHECK_THROWS_WITH_AS(comm->barrier(stream), doctest::Contains("inside group_start/group_end"), Error);
    comm->group_end();
  }
}

TEST_CASE("the NCCL watchdog aborts a collective that does not complete in time") {
  std::unique_ptr<Communicator> comm = one_rank_nccl(500ms);
  auto& nccl = dynamic_cast<NcclCommunicator&>(*comm);
  OwnedStream stream(kCuda0);
  DeviceBuffer buf(16 * 4);
  buf.fill(0);
  StreamGate gate;
  gate.hold(static_cast<cudaStream_t>(stream.get().native()));
  comm->all_reduce(buf.get(), buf.get(), 16, DType::kFloat32, ReduceOp::kSum, stream);
  const uint64_t seq = comm->sequence();

  std::string message;
  CommError::Reason reason = CommError::Reason::kBackend;
  const auto t0 = std::chrono::steady_clock::now();
  while (message.empty() && std::chrono::steady_clock::now() - t0 < 10s) {
    try {
      nccl.check();
      std::this_thread::sleep_for(20ms);
    } catch (const CommError& e) {
      message = e.message();
      reason = e.reason();
    }
  }
  gate.open();
  CHECK(reason == CommError::Reason::kTimeout);
  CHECK_MESSAGE(message.find(fmt::format("NCCL all_reduce #{} (16 x fp32, sum) on rank 0 of 1 (cuda:0) "
                                         "did not complete within 500 ms", seq)) != std::string::npos,
                message);
  CHECK(comm->aborted());
  CHECK_THROWS_WITH_AS(comm->all_reduce(buf.get(), buf.get(), 16, DType::kFloat32, ReduceOp::kSum, stream),
                       doctest::Contains("refused: it was aborted"), CommError);
  CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get().native())) == cudaSuccess);
}

TEST_CASE("abort() aborts the NCCL communicator at once, and its destructor does not wait") {
  std::unique_ptr<Communicator> comm = one_rank_nccl(60s);
  auto& nccl = dynamic_cast<NcclCommunicator&>(*comm);
  OwnedStream stream(kCuda0);
  DeviceBuffer buf(16 * 4);
  buf.fill(0);
  StreamGate gate;
  gate.hold(static_cast<cudaStream_t>(stream.get().native()));
  // Pending until the gate opens: a peer that never comes, as far as this
  // rank can tell.
  comm->all_reduce(buf.get(), buf.get(), 16, DType::kFloat32, ReduceOp::kSum, stream);
  comm->abort("the training loop failed");
  CHECK(comm->aborted());
  CHECK(nccl.native() == nullptr);  // ncclCommAbort, not only refusals
  CHECK_THROWS_WITH_AS(nccl.check(), doctest::Contains("rank 0 failed: the training loop failed"), CommError);
  const auto t0 = std::chrono::steady_clock::now();
  comm.reset();  // before the fix: waited up to the 60 s timeout for the held collective
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  gate.open();
  CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get().native())) == cudaSuccess);
}

TEST_CASE("NCCL creation is bounded by init_timeout, not by a short collective timeout") {
  // The watchdog test's 500 ms for collectives; creation, the blocking
  // child's split and the warm-up collective get CommOptions::init_timeout.
  CommOptions options{500ms};
  options.init_timeout = 120s;
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  std::unique_ptr<Communicator> comm = make_nccl_communicator(0, 1, nccl_unique_id(), 0, options);
  CHECK(comm->options().timeout == 500ms);
  CHECK(comm->options().init_timeout == 120s);
  std::unique_ptr<Communicator> child = comm->split(0, 0, /*share_resources=*/true);
  REQUIRE(child != nullptr);
  CHECK(child->options().init_timeout == 120s);
  OwnedStream stream(kCuda0);
  check_collectives_on_device(*child, stream);
}
