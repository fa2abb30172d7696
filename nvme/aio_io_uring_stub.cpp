// The io_uring back end in a build without liburing (ZEST_IO_URING=OFF):
// never available, so make_aio_backend chooses the thread pool (and says
// why: aio_io_uring_built() is false).
#include <cerrno>

#include "zest/nvme/aio_backend.h"

namespace zest::detail {

std::unique_ptr<AioBackend> make_io_uring_backend(const AioConfig&, int& error) {
  error = ENOSYS;
  return nullptr;
}

}  // namespace zest::detail
