// What both I/O back ends share (nvme/aio_backend.h): cutting a transfer
// into block_size pieces, the synchronous pread/pwrite loop that finishes a
// piece, and a transfer's outcome gathered from its pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "zest/nvme/aio_backend.h"

namespace zest::detail {

// Calls fn(buffer, bytes, offset) for each piece of at most `block` bytes.
template <typename Fn>
void for_each_piece(const AioRequest& r, size_t block, Fn&& fn) {
  auto* base = static_cast<std::byte*>(r.buffer);
  size_t done = 0;
  do {
    const size_t n = r.bytes - done < block ? r.bytes - done : block;
    fn(base + done, n, r.offset + done);
    done += n;
  } while (done < r.bytes);
}

struct PieceOutcome {
  int error = 0;      // errno, 0 if none
  size_t bytes = 0;   // transferred
};

// pread/pwrite until all `bytes` are done, the file ends (a short read) or
// a call fails; EINTR retried.
PieceOutcome transfer_all(AioOp op, int fd, std::byte* buffer, size_t bytes, uint64_t offset);

// A transfer's pieces in flight and its result so far.
struct TransferState {
  int pending = 0;
  AioResult result;
  void record(const PieceOutcome& out, uint64_t piece_offset) {
    result.bytes += out.bytes;
    if (out.error != 0 && (result.error == 0 || piece_offset < result.error_offset)) {
      result.error = out.error;
      result.error_offset = piece_offset;
    }
  }
};

// One block_size piece of a transfer, queued or in flight.
struct Piece {
  std::shared_ptr<TransferState> transfer;
  AioOp op;
  int fd;
  std::byte* buffer;
  size_t bytes;
  uint64_t offset;
};

}  // namespace zest::detail
