// Point-to-point transfers: a pipeline's exchange between two neighbours
// (each sends B bytes to the other and receives B, one send_recv), timed per
// message size, against memcpy of B bytes (what the in-process backend must
// at least do: one copy per direction, the two running on the two ranks'
// threads at once).
//
//   p2p_bench                     2 in-process ranks
//   mpirun -np 2 p2p_bench --mpi  2 processes over MPI
//
// Prints the median of 7 timed rounds, each the mean over enough exchanges
// to take ~20 ms.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>


#include "cli/cli.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/comm/mpi_comm.h"

using namespace zest;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kSizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20};

// `comm` (nullptr: a local measurement) lines the ranks up before each
// round and makes them agree on the repetitions: the slowest rank's time
// decides, so both run the same number of exchanges.
template <typename Fn>
double median_us(Fn&& fn, Communicator* comm) {
  const Stream stream = Stream::default_for(Device::host());
  int reps = 1;
  for (;;) {  // calibrate to ~20 ms per round
    if (comm) comm->barrier(stream);
    const auto t = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    int64_t us = static_cast<int64_t>(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
    if (comm) comm->all_reduce(&us, &us, 1, DType::kInt64, ReduceOp::kMax, stream);
    if (us > 20000 || reps >= (1 << 20)) break;
    reps *= 2;
  }
  std::vector<double> rounds;
  for (int k = 0; k < 7; ++k) {
    if (comm) comm->barrier(stream);
    const auto t = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    rounds.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / reps);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[3];
}

void bench(Communicator& comm, const char* backend) {
  const Stream stream = Stream::default_for(Device::host());
  const int peer = 1 - comm.rank();
  if (comm.rank() == 0) std::printf("p2p_bench (%s build)\n", ZEST_BENCH_BUILD_TYPE);
  for (const size_t bytes : kSizes) {
    std::vector<char> out(bytes, 1), in(bytes);
    const P2POp ops[] = {P2POp::send(out.data(), bytes, DType::kUInt8, peer),
                         P2POp::recv(in.data(), bytes, DType::kUInt8, peer)};
    const double us = median_us([&] { comm.send_recv(ops, stream); }, &comm);
    std::vector<char> a(bytes, 1), b(bytes);
    const double copy_us = median_us([&] {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");  // the copy is used
    }, nullptr);
    if (comm.rank() == 0) {
      std::printf("%-10s %9zu B  exchange %9.2f us  %7.2f GB/s per direction   memcpy %8.2f us  (%.2fx memcpy)\n",
                  backend, bytes, us, static_cast<double>(bytes) / us / 1e3, copy_us, us / copy_us);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool mpi = false;
  cli::App app("p2p_bench: a pipeline neighbours' exchange (one send_recv each way) against memcpy of its bytes");
  app.add_flag("--mpi", mpi, "2 processes over MPI (run under mpirun -np 2); default: 2 in-process ranks");
  try {
    app.parse(argc, argv);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("p2p_bench", e, app.help());  // the help, or the error naming the flag
  }
  if (!mpi) {
    run_inprocess(2, [](Communicator& comm) { bench(comm, "in-process"); });
    return 0;
  }
  MpiEnvironment env(&argc, &argv);
  std::unique_ptr<Communicator> world = make_mpi_world();
  if (world->size() != 2) {
    if (world->rank() == 0) std::fprintf(stderr, "p2p_bench --mpi: run with mpirun -np 2\n");
    return 1;
  }
  bench(*world, "mpi");
  return 0;
}
