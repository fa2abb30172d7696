// Builds without CUDA: the NCCL backend's entry points exist, so programs
// that choose their backend at run time link everywhere, and say how to get it.
#include "zest/comm/nccl_comm.h"

namespace zest {
namespace {

[[noreturn]] void no_nccl(const char* what) {
  ZEST_FAIL("{}: this build of ZEST has no NCCL backend; build with the CUDA toolkit and NCCL "
            "(-DZEST_CUDA=ON), or use the MPI or in-process backend",
            what);
}

}  // namespace

NcclUniqueId nccl_unique_id() { no_nccl("zest::nccl_unique_id"); }

std::unique_ptr<Communicator> make_nccl_communicator(int /*rank*/, int /*world_size*/,
                                                     const NcclUniqueId& /*unique_id_bytes*/,
                                                     int /*device*/, CommOptions /*options*/) {
  no_nccl("zest::make_nccl_communicator");
}

}  // namespace zest
