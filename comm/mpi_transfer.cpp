#include "zest/comm/detail/mpi_transfer.h"

#include "zest/core/mpi_check.h"

namespace zest::mpi {
namespace {

// Apart from the exchanges' tag (mpi_exchange.h), on a communicator only ZEST
// uses; MPI's non-overtaking rule matches each call's messages in order.
constexpr int kTransferTag = 0x2e59;

}  // namespace

std::span<MPI_Request> start_transfer(std::vector<MPI_Request>& requests, MPI_Comm comm, int rank, int size,
                                      MPI_Datatype type, const std::function<Block(int peer)>& send_to,
                                      const std::function<Block(int peer)>& recv_from) {
  requests.clear();
  for (int k = 1; k < size; ++k) {
    const int peer = (rank + k) % size;
    const Block in = recv_from(peer);
    if (in.count == 0) continue;
    requests.push_back(MPI_REQUEST_NULL);
    // MPI_Irecv's buffer is not const; the block is the caller's output.
    ZEST_MPI_CHECK(MPI_Irecv(const_cast<void*>(in.data), in.count, type, peer, kTransferTag, comm, &requests.back()));
  }
  for (int k = 1; k < size; ++k) {
    const int peer = (rank + k) % size;
    const Block out = send_to(peer);
    if (out.count == 0) continue;
    requests.push_back(MPI_REQUEST_NULL);
    ZEST_MPI_CHECK(MPI_Isend(out.data, out.count, type, peer, kTransferTag, comm, &requests.back()));
  }
  return requests;
}

}  // namespace zest::mpi
