// What the NVMe offload tests look at besides the master weights: the swap
// files in a directory, and the compute-dtype parameters a gather gives.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "zest/engine/engine.h"
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

}  // namespace zest::test
