#include "zest/core/rank_context.h"

#include <cstdlib>
#include <optional>
#include <string>

namespace zest {
namespace {

thread_local std::optional<RankContext> t_thread_rank;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0' && x >= 0 && x < (1 << 24)) ? static_cast<int>(x) : -1;
}

RankContext launcher_rank() {
  static const RankContext ctx = [] {
    struct Pair {
      const char* rank;
      const char* size;
    };
    // torchrun, OpenMPI, MPICH/PMI, Slurm: the first one present wins.
    static constexpr Pair kVars[] = {{"RANK", "WORLD_SIZE"},
                                     {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                     {"PMI_RANK", "PMI_SIZE"},
                                     {"SLURM_PROCID", "SLURM_NTASKS"}};
    for (const Pair& p : kVars) {
      const int r = env_int(p.rank);
      if (r >= 0) {
        const int n = env_int(p.size);
        return RankContext{r, n > 0 ? n : 0};
      }
    }
    return RankContext{};
  }();
  return ctx;
}

}  // namespace

RankContext this_rank() { return t_thread_rank ? *t_thread_rank : launcher_rank(); }

void set_thread_rank(int rank, int world_size) { t_thread_rank = RankContext{rank, world_size}; }

void clear_thread_rank() { t_thread_rank.reset(); }

ScopedRank::ScopedRank(int rank, int world_size)
    : saved_(t_thread_rank.value_or(RankContext{})), had_thread_rank_(t_thread_rank.has_value()) {
  set_thread_rank(rank, world_size);
}

ScopedRank::~ScopedRank() {
  if (had_thread_rank_) {
    t_thread_rank = saved_;
  } else {
    t_thread_rank.reset();
  }
}

}  // namespace zest
