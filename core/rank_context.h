// Which rank (and device) the calling thread works for, so that log lines and
// error messages can say it.
//
// In a multi-process job the rank comes from the launcher's environment
// (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID). With the in-process
// backend several ranks share one process, one thread each, so the rank is
// kept per thread: the communicator sets it when it starts a rank's thread.
#pragma once

namespace zest {

struct RankContext {
  int rank = -1;        // -1: unknown (single process, no launcher)
  int world_size = 0;   // 0: unknown
};

// The calling thread's rank, falling back to the launcher's environment.
RankContext this_rank();

// Sets the calling thread's rank until reset or the thread ends.
void set_thread_rank(int rank, int world_size);
void clear_thread_rank();

// Sets the calling thread's rank for a scope and restores the previous one.
class ScopedRank {
 public:
  ScopedRank(int rank, int world_size);
  ~ScopedRank();
  ScopedRank(const ScopedRank&) = delete;
  ScopedRank& operator=(const ScopedRank&) = delete;

 private:
  RankContext saved_;
  bool had_thread_rank_;
};

}  // namespace zest
