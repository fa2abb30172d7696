// Every collective of the MPI backend, bit for bit, and the same bits as the
// in-process backend: each process runs the conformance checks over MPI, then
// runs an in-process group of the same size on its own threads, and compares
// every rank's digest.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/conformance.h"
#include "comm/mpi/mpi_test_util.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/comm/mpi_comm.h"

using namespace zest;
using test::host_stream;

namespace {

// Each rank's digest of the conformance checks, on every rank.
std::vector<uint64_t> gather_digests(Communicator& comm, uint64_t mine) {
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  const auto m = static_cast<int64_t>(mine);
  comm.all_gather(&m, all.data(), 1, DType::kInt64, host_stream());
  return {all.begin(), all.end()};
}

}  // namespace

TEST_CASE("MPI collectives are exact for every dtype, count and in-place form") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  CHECK(world->backend_name() == "mpi");
  CHECK(world->device() == Device::host());
  test::check_all_collectives(*world, host_stream());
  CHECK_FALSE(world->aborted());
}

// Note [one exchange per collective] in comm/detail/mpi_exchange.h: a call whose data
// fits one exchange message (4 KiB) rides on the agreement; a larger one
// agrees first, then moves its data with MPI's collectives. 4096 elements are
// carried for 1-byte types and not for the others, 1024 for 4-byte types and
// not 1025; 70001 are never carried (and give ranks unequal chunks). Over
// 3 KiB the payload is split in two messages (Note [exchange messages stay
// eager]): 768 4-byte elements fit the first, 769 do not.
TEST_CASE("MPI collectives at and past the size one exchange message carries are exact") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  constexpr size_t kLarge[] = {768, 769, 1024, 1025, 4096, 70001};
  const std::vector<uint64_t> mpi_digests =
      gather_digests(*world, test::check_all_collectives(*world, host_stream(), kLarge));
  std::vector<uint64_t> inprocess_digests(static_cast<size_t>(world->size()));
  run_inprocess(world->size(), [&](Communicator& comm) {
    inprocess_digests[static_cast<size_t>(comm.rank())] = test::check_all_collectives(comm, host_stream(), kLarge);
  });
  CHECK(mpi_digests == inprocess_digests);
  CHECK_FALSE(world->aborted());
}

TEST_CASE("MPI and in-process runs of the same size give identical results on every rank") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  const std::vector<uint64_t> mpi_digests =
      gather_digests(*world, test::check_all_collectives(*world, host_stream()));

  std::vector<uint64_t> inprocess_digests(static_cast<size_t>(w));
  run_inprocess(w, [&](Communicator& comm) {
    inprocess_digests[static_cast<size_t>(comm.rank())] =
        test::check_all_collectives(comm, host_stream());
  });
  for (int r = 0; r < w; ++r) {
    CAPTURE(r);
    CHECK(mpi_digests[static_cast<size_t>(r)] == inprocess_digests[static_cast<size_t>(r)]);
  }
}

TEST_CASE("fp16 and bf16 sums round once, not at every step") {
  // Rank 0 adds 1, the others 2^-11 (fp16) or 2^-8 (bf16): each step alone
  // would round back to 1, but the float sum rounded once does not, from 3
  // ranks on.
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  const bool first = world->rank() == 0;
  fp16 h(first ? 1.0f : 1.0f / 2048.0f);
  world->all_reduce(&h, &h, 1, DType::kFloat16, ReduceOp::kSum, host_stream());
  CHECK(h.bits == fp16(1.0f + static_cast<float>(w - 1) / 2048.0f).bits);
  bf16 b(first ? 1.0f : 1.0f / 256.0f);
  world->all_reduce(&b, &b, 1, DType::kBFloat16, ReduceOp::kSum, host_stream());
  CHECK(b.bits == bf16(1.0f + static_cast<float>(w - 1) / 256.0f).bits);
  if (w >= 3) {
    CHECK(static_cast<float>(h) > 1.0f);
    CHECK(static_cast<float>(b) > 1.0f);
  }
  // The average divides the float sum, then rounds.
  fp16 a(static_cast<float>(world->rank()) + 0.5f);
  world->all_reduce(&a, &a, 1, DType::kFloat16, ReduceOp::kAvg, host_stream());
  CHECK(a.bits == fp16(static_cast<float>(w - 1) / 2.0f + 0.5f).bits);
}

TEST_CASE("max propagates NaN and integer sums wrap, as in-process") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  const int me = world->rank();
  float v[2] = {static_cast<float>(me), me == w / 2 ? NAN : 1.0f};
  world->all_reduce(v, v, 2, DType::kFloat32, ReduceOp::kMax, host_stream());
  CHECK(v[0] == static_cast<float>(w - 1));
  CHECK(std::isnan(v[1]));
  // Long enough for vectorized reduction kernels (Open MPI 4.1's saturate
  // 8- and 16-bit sums from 16 elements on).
  std::vector<int32_t> big(64, 2000000000);
  world->all_reduce(big.data(), big.data(), big.size(), DType::kInt32, ReduceOp::kSum,
                    host_stream());
  CHECK(big == std::vector<int32_t>(64, static_cast<int32_t>(int64_t{2000000000} * w)));
  std::vector<uint8_t> bytes(64, 200);
  world->all_reduce(bytes.data(), bytes.data(), bytes.size(), DType::kUInt8, ReduceOp::kSum,
                    host_stream());
  CHECK(bytes == std::vector<uint8_t>(64, static_cast<uint8_t>(200 * w)));
  int64_t neg = -5 - me;
  world->all_reduce(&neg, &neg, 1, DType::kInt64, ReduceOp::kMax, host_stream());
  CHECK(neg == -5);
}

TEST_CASE("float max picks the same NaN payload and signed zero as in-process") {
  // Order-sensitive inputs: NaNs with a different payload per rank, and +0
  // and -0 ties. Max combines in rank order, so these match bit for bit.
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  constexpr size_t kN = 64;
  auto inputs = [](int rank, std::vector<float>& out) {
    out.resize(kN);
    for (size_t i = 0; i < kN; ++i) {
      const uint32_t payload = 0x7fc00000u | static_cast<uint32_t>(rank * 64 + static_cast<int>(i));
      float nan;
      std::memcpy(&nan, &payload, sizeof nan);
      switch ((i + static_cast<size_t>(rank)) % 4) {
        case 0: out[i] = nan; break;
        case 1: out[i] = (i % 2) ? 0.0f : -0.0f; break;
        case 2: out[i] = -0.0f; break;
        default: out[i] = -1.0f; break;
      }
    }
  };
  std::vector<float> mine;
  inputs(world->rank(), mine);
  std::vector<float> reduced(kN), scattered(kN);
  world->all_reduce(mine.data(), reduced.data(), kN, DType::kFloat32, ReduceOp::kMax,
                    host_stream());
  std::vector<float> big;
  big.reserve(kN * static_cast<size_t>(w));
  for (int k = 0; k < w; ++k) big.insert(big.end(), mine.begin(), mine.end());
  world->reduce_scatter(big.data(), scattered.data(), kN, DType::kFloat32, ReduceOp::kMax,
                        host_stream());

  std::vector<float> expect_reduced(kN);
  run_inprocess(w, [&](Communicator& comm) {
    std::vector<float> in;
    inputs(comm.rank(), in);
    std::vector<float> out(kN);
    comm.all_reduce(in.data(), out.data(), kN, DType::kFloat32, ReduceOp::kMax, host_stream());
    if (comm.rank() == 0) expect_reduced = out;
  });
  CHECK(std::memcmp(reduced.data(), expect_reduced.data(), kN * sizeof(float)) == 0);
  // reduce_scatter of w copies of the inputs: this rank's part is the same
  // reduction of all kN elements.
  CHECK(std::memcmp(scattered.data(), expect_reduced.data(), kN * sizeof(float)) == 0);
}

TEST_CASE("float sums whose bits depend on the order of additions match in-process") {
  // Random values of mixed magnitudes: every sum of three or more rounds
  // differently in another order, so only the in-process order (rank 0 +
  // rank 1 + ...) gives these bits. An odd count gives ranks unequal chunks.
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  constexpr size_t kN = 1001;
  auto inputs = [](int rank, DType t, size_t n) {
    std::mt19937 rng(static_cast<unsigned>(1234 + rank));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<unsigned char> out(n * elem_size(t));
    for (size_t i = 0; i < n; ++i) {
      const float x = std::ldexp(normal(rng), static_cast<int>(i % 13) - 6);
      const uint16_t half = t == DType::kBFloat16 ? bf16(x).bits : fp16(x).bits;
      if (t == DType::kFloat32) {
        std::memcpy(out.data() + i * 4, &x, 4);
      } else {
        std::memcpy(out.data() + i * 2, &half, 2);
      }
    }
    return out;
  };
  auto run = [&](Communicator& comm, DType t, ReduceOp op, std::vector<unsigned char>& reduced,
                 std::vector<unsigned char>& scattered) {
    const std::vector<unsigned char> in = inputs(comm.rank(), t, kN);
    reduced.assign(in.size(), 0);
    comm.all_reduce(in.data(), reduced.data(), kN, t, op, host_stream());
    const size_t part = kN / static_cast<size_t>(comm.size());
    scattered.assign(part * elem_size(t), 0);
    comm.reduce_scatter(in.data(), scattered.data(), part, t, op, host_stream());
  };
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      CAPTURE(dtype_name(t));
      CAPTURE(static_cast<int>(op));
      std::vector<unsigned char> reduced, scattered;
      run(*world, t, op, reduced, scattered);
      std::vector<unsigned char> expect_reduced, expect_scattered;
      run_inprocess(w, [&](Communicator& comm) {
        std::vector<unsigned char> r, sc;
        run(comm, t, op, r, sc);
        if (comm.rank() == world->rank()) {
          expect_reduced = r;
          expect_scattered = sc;
        }
      });
      CHECK(reduced == expect_reduced);
      CHECK(scattered == expect_scattered);
    }
  }
}

TEST_CASE("an in-place reduce_scatter changes only this rank's part of the buffer") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const auto w = static_cast<size_t>(world->size());
  const auto me = static_cast<size_t>(world->rank());
  constexpr size_t kPart = 100;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kInt32}) {
    CAPTURE(dtype_name(t));
    const size_t part = kPart * elem_size(t);
    const std::vector<unsigned char> before = test::make_input(t, world->rank(), 0, kPart * w, 1);
    std::vector<unsigned char> buf = before;
    world->reduce_scatter(buf.data(), buf.data() + me * part, kPart, t, ReduceOp::kSum,
                          host_stream());
    for (size_t r = 0; r < w; ++r) {
      if (r == me) continue;
      CAPTURE(r);
      CHECK(std::memcmp(buf.data() + r * part, before.data() + r * part, part) == 0);
    }
  }
}
