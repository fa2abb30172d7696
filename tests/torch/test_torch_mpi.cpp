// The torch-equivalence check of test_torch_equivalence.cpp on 2 MPI
// processes (one rank each, host buffers): stages 0-3 against plain libtorch
// on the global batch, within the same tolerance and for the same reasons,
// and bit for bit with each other.
#include <cmath>
#include <cstring>

#include "torch_harness.h"
#include "torch_doctest.h"
#include "comm/mpi/mpi_test_util.h"
#include "zest/comm/mpi_comm.h"

using namespace zest;
using namespace zest::test;

namespace {

constexpr double kTolerance = 5e-6;  // test_torch_equivalence.cpp says why

// The mean of every rank's value (ranks' slices are equal, so the mean of
// their means is the global batch's).
double mean_over_ranks(Communicator& comm, double mine) {
  CachingAllocator alloc(make_host_allocator());
  const Stream& s = host_stream();
  const size_t w = static_cast<size_t>(comm.size());
  Buffer buf = alloc.allocate_buffer((w + 1) * sizeof(double), s, MemoryCategory::kCommBuffers);
  buf.as<double>()[w] = mine;
  // The doubles' bits, moved as int64 and added in rank order.
  comm.all_gather(buf.as<double>() + w, buf.data(), 1, DType::kInt64, s);
  s.synchronize();
  double sum = 0.0;
  for (size_t r = 0; r < w; ++r) sum += buf.as<double>()[r];
  return sum / static_cast<double>(w);
}

}  // namespace

TEST_CASE("2 MPI processes: stages 0-3 match torch::optim::AdamW on the global batch, and each other bit for bit") {
  torch::set_num_threads(1);
  std::unique_ptr<Communicator> world = make_mpi_world(mpi_test_options());
  for (Model model : {Model::kMlp, Model::kTransformer}) {
    CAPTURE(static_cast<int>(model));
    TrainSpec spec;
    spec.model = model;
    const Trace ref = train_torch(spec);
    Trace stage0;
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(stage);
      Trace z = train_zest_rank(spec, stage, *world);
      for (size_t s = 0; s < z.loss.size(); ++s) {
        CAPTURE(s);
        z.loss[s] = mean_over_ranks(*world, z.loss[s]);
        CHECK(std::abs(z.loss[s] - ref.loss[s]) <= kTolerance * std::max(1.0, std::abs(ref.loss[s])));
        for (const auto& [name, want] : ref.params[s]) {
          CAPTURE(name);
          const std::vector<float>& got = z.params[s].at(name);
          REQUIRE(got.size() == want.size());
          double worst = 0.0;
          for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
          CHECK(worst <= kTolerance);
        }
      }
      if (stage == 0) {
        stage0 = z;
      } else {
        CHECK(std::memcmp(z.loss.data(), stage0.loss.data(), z.loss.size() * sizeof(double)) == 0);
        CHECK(z.params == stage0.params);
      }
    }
  }
}
