// What the NVMe offload tests look at besides the master weights (the swap
// files in a directory, the compute-dtype parameters a gather gives), and
// the I/O they make fail.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "zest/engine/engine.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/swap_file.h"

namespace zest::test {

// The swap files (by their name) in `dir`.
inline size_t files_in(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    n += e.path().filename().string().starts_with(kSwapFilePrefix);
  }
  return n;
}

// Every unit's gathered compute-dtype parameters, as bytes.
inline std::vector<std::vector<std::byte>> gathered_params(Engine& engine) {
  std::vector<std::vector<std::byte>> out;
  for (int u = 0; u < engine.layout().num_units(); ++u) {
    const UnitHandle h = engine.gather(u);
    const auto* p = static_cast<const std::byte*>(h.data());
    out.emplace_back(p, p + engine.layout().unit(u).padded * elem_size(engine.compute_dtype()));
  }
  return out;
}

// A swap file's I/O for set_offload_swap_io: a thread pool's whose `op`
// number `countdown` (counting from its setting) fails, a read with EIO, a
// write with ENOSPC.
class FailingIo : public AioBackend {
 public:
  FailingIo(AioOp op, std::atomic<int>& countdown)
      : inner_(make_aio_backend({}, {.kind = AioBackendKind::kThreadPool})), op_(op), countdown_(countdown) {}
  std::string_view name() const override { return "failing"; }
  AioHandle submit(const AioRequest& r) override {
    const AioHandle h = inner_->submit(r);
    if (r.op == op_ && countdown_ > 0 && --countdown_ == 0) failed_.insert(h);
    return h;
  }
  AioResult wait(AioHandle h) override {
    AioResult result = inner_->wait(h);
    if (failed_.erase(h) > 0) result.error = op_ == AioOp::kWrite ? ENOSPC : EIO;
    return result;
  }

 private:
  std::unique_ptr<AioBackend> inner_;
  AioOp op_;
  std::atomic<int>& countdown_;
  std::set<AioHandle> failed_;
};

}  // namespace zest::test
