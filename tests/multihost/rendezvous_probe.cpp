// One rank of a torchrun-style job (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by hand on each simulated
// host): reads its place from the environment, meets rank 0 through ZEST's
// TCP rendezvous (what init_distributed uses to share NCCL's unique id; a
// host-only multi-process job needs MPI for its data, so the rendezvous is
// driven directly here) and prints what it learned, for multihost.sh:
//
//   rendezvous: rank 2 of 4 (local 0 of 2, torchrun) on zest-h1 got 'from rank 0 on zest-h0'
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "zest/launch/bootstrap.h"
#include "zest/launch/launch_env.h"

int main() {
  try {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) {
      fmt::print(stderr, "rendezvous_probe: gethostname: {}\n", std::strerror(errno));
      return 1;
    }
    const zest::LaunchEnv env = zest::detect_launch_env();
    const std::string blob = fmt::format("from rank 0 on {}", host);
    const std::string got =
        zest::share_from_rank0(env, zest::process_env(), blob, std::chrono::seconds(20));
    fmt::print("rendezvous: {} on {} got '{}'\n", env.str(), host, got);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "rendezvous_probe: {}\n", e.what());
    return 1;
  }
}
