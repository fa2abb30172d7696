// zest-info: what this build of ZEST contains and what it sees on this
// machine; the first thing to run, and to paste into a bug report.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "zest/core/device.h"
#include "zest/core/logging.h"
#include "zest/core/platform.h"
#include "zest/core/rank_context.h"
#include "zest/core/units.h"
#include "zest/memory/allocator_config.h"
#include "zest/memory/raw_allocator.h"

namespace {
const char* on_off(bool b) { return b ? "yes" : "no"; }
const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}
}  // namespace

int main() {
  try {
    std::printf("ZEST %s\n", ZEST_VERSION_STRING);
    std::printf("  CUDA backend   %s\n", on_off(ZEST_WITH_CUDA));
    std::printf("  NCCL           %s\n", on_off(ZEST_WITH_NCCL));
    std::printf("  MPI backend    %s\n", on_off(ZEST_WITH_MPI));

    const zest::RawMemoryInfo host = zest::make_host_allocator()->memory_info();
    std::printf("devices\n  host           %s total, %s available\n",
                zest::format_bytes(static_cast<int64_t>(host.total_bytes)).c_str(),
                zest::format_bytes(static_cast<int64_t>(host.free_bytes)).c_str());
    const int gpus = zest::cuda_device_count();
    for (int i = 0; i < gpus; ++i) {
      const zest::RawMemoryInfo m = zest::make_cuda_allocator(i)->memory_info();
      std::printf("  cuda:%-9d %s total, %s free\n", i,
                  zest::format_bytes(static_cast<int64_t>(m.total_bytes)).c_str(),
                  zest::format_bytes(static_cast<int64_t>(m.free_bytes)).c_str());
    }
    if (gpus == 0) std::printf("  (no CUDA device visible)\n");

    const zest::RankContext rank = zest::this_rank();
    std::printf("environment\n");
    std::printf("  rank           %d of %d (from the launcher's variables; -1/0: none)\n",
                rank.rank, rank.world_size);
    std::printf("  ZEST_LOG_LEVEL %s\n", env_or("ZEST_LOG_LEVEL", "(unset: info)"));
    const zest::AllocatorConfig cfg = zest::AllocatorConfig::from_env();
    std::printf("  ZEST_ALLOC_CONF %s (max_split_size %s)\n", env_or("ZEST_ALLOC_CONF", "(unset)"),
                cfg.max_split_size == SIZE_MAX
                    ? "unlimited"
                    : zest::format_bytes(static_cast<int64_t>(cfg.max_split_size)).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zest-info: %s\n", e.what());
    return 2;
  }
  return 0;
}
