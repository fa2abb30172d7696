// One real rank of a data-parallel world of `size` ranks whose other ranks
// are not run: every one of them is taken to hold this rank's data, so each
// collective's result is what it would be if they did (an average is the
// value itself, a sum `size` times it, a gather the value in every slot).
// For tests of what one rank allocates and does at a world size, and so a
// model size, that threads could not run.
#pragma once

#include <cstring>
#include <memory>

#include "zest/comm/communicator.h"
#include "zest/core/check.h"

namespace zest::test {

class SimulatedWorld final : public Communicator {
 public:
  SimulatedWorld(int rank, int size) : Communicator(rank, size, Device::host(), CommOptions{}) {}
  std::string_view backend_name() const override { return "simulated"; }

 protected:
  void do_all_reduce(const CollectiveDesc& d, const void* send, void* recv, const Stream&) override {
    if (send != recv) std::memmove(recv, send, d.count * elem_size(d.dtype));
    if (d.op != ReduceOp::kSum) return;  // avg and max of equal values: the value
    ZEST_CHECK(d.dtype == DType::kInt64, "SimulatedWorld sums int64 only, got {}", dtype_name(d.dtype));
    auto* v = static_cast<int64_t*>(recv);
    for (uint64_t i = 0; i < d.count; ++i) v[i] *= size();
  }
  void do_reduce_scatter(const CollectiveDesc& d, const void* send, void* recv, const Stream&) override {
    ZEST_CHECK(d.op != ReduceOp::kSum, "SimulatedWorld reduce-scatters avg or max only");
    const size_t bytes = d.count * elem_size(d.dtype);
    std::memmove(recv, static_cast<const char*>(send) + bytes * static_cast<size_t>(rank()), bytes);
  }
  void do_all_gather(const CollectiveDesc& d, const void* send, void* recv, const Stream&) override {
    const size_t bytes = d.count * elem_size(d.dtype);
    auto* out = static_cast<char*>(recv);
    for (int r = 0; r < size(); ++r) {
      if (out + bytes * static_cast<size_t>(r) != send) std::memmove(out + bytes * static_cast<size_t>(r), send, bytes);
    }
  }
  void do_broadcast(const CollectiveDesc& d, const void* send, void* recv, const Stream&) override {
    ZEST_CHECK(rank() == d.root, "SimulatedWorld broadcasts from its own rank only");
    if (send != recv) std::memmove(recv, send, d.count * elem_size(d.dtype));
  }
  void do_barrier(const CollectiveDesc&, const Stream&) override {}
  std::unique_ptr<Communicator> do_split(const CollectiveDesc&, int color, int, bool) override {
    ZEST_CHECK(color == 0, "SimulatedWorld splits into one group only");
    return std::make_unique<SimulatedWorld>(rank(), size());
  }
};

}  // namespace zest::test
