// The io_uring back end of the NVMe tier's I/O engine (liburing): block_size
// pieces of each transfer queued in the submission ring, at most queue_depth
// in the kernel at once, submitted one by one (single_submit) or all those
// ready in one io_uring_submit; completions reaped in wait(), each of which
// tops the ring up again, so the drive always has queue_depth requests while
// there are any.
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <unordered_map>

#include "zest/core/check.h"
#include "zest/core/system_error.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/detail/aio_pieces.h"

namespace zest::detail {
namespace {

class IoUringBackend final : public AioBackend {
 public:
  // `error` is set (and nothing else may be called) where the kernel refuses.
  IoUringBackend(const AioConfig& config, int& error)
      : block_(static_cast<size_t>(config.block_size)),
        depth_(config.queue_depth),
        single_submit_(config.single_submit) {
    std::memset(&ring_, 0, sizeof ring_);
    const int rc = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0);
    error = rc < 0 ? -rc : 0;
    initialized_ = rc == 0;
  }

  ~IoUringBackend() override {
    if (!initialized_) return;
    // The kernel may still write into the callers' buffers: reap all.
    queued_.clear();
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;  // nothing more will come
      pieces_.erase(io_uring_cqe_get_data64(cqe));
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    io_uring_queue_exit(&ring_);
  }

  std::string_view name() const override { return "io_uring"; }

  AioHandle submit(const AioRequest& r) override {
    check_usable();
    auto transfer = std::make_shared<TransferState>();
    for_each_piece(r, block_, [&](std::byte* buffer, size_t bytes, uint64_t offset) {
      ++transfer->pending;
      queued_.push_back(Piece{transfer, r.op, r.fd, buffer, bytes, offset});
    });
    const AioHandle h = next_handle_++;
    transfers_.emplace(h, std::move(transfer));
    pump();
    return h;
  }

  AioResult wait(AioHandle h) override {
    auto it = transfers_.find(h);
    ZEST_INTERNAL_ASSERT(it != transfers_.end(), "AioBackend::wait on handle {}, not submitted or already waited for",
                         h);
    std::shared_ptr<TransferState> t = it->second;
    while (t->pending > 0) {
      check_usable();
      reap_one();
    }
    transfers_.erase(it);
    return t->result;
  }

 private:
  // Moves queued pieces into the ring while fewer than queue_depth are in
  // the kernel.
  void pump() {
    int prepared = 0;
    while (!queued_.empty() && in_flight_ < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;  // the submission ring is full until the next submit
      Piece p = std::move(queued_.front());
      queued_.pop_front();
      if (p.op == AioOp::kRead) {
        io_uring_prep_read(sqe, p.fd, p.buffer, static_cast<unsigned>(p.bytes), p.offset);
      } else {
        io_uring_prep_write(sqe, p.fd, p.buffer, static_cast<unsigned>(p.bytes), p.offset);
      }
      const uint64_t id = next_piece_++;
      io_uring_sqe_set_data64(sqe, id);
      pieces_.emplace(id, std::move(p));
      ++in_flight_;
      ++prepared;
      if (single_submit_) submit_prepared();
    }
    if (!single_submit_ && prepared > 0) submit_prepared();
  }

  void submit_prepared() {
    int rc;
    while ((rc = io_uring_submit(&ring_)) == -EINTR) {
    }
    if (rc < 0) {
      // The prepared entries the kernel did not take never complete: only
      // those it took are waited for (by the destructor), and every later
      // call fails with this error rather than waiting forever.
      broken_ = -rc;
      in_flight_ -= static_cast<int>(io_uring_sq_ready(&ring_));
      check_usable();
    }
  }

  void check_usable() const {
    ZEST_CHECK(broken_ == 0, "io_uring_submit failed: {}; the NVMe tier cannot queue its I/O (the transfers in "
               "flight are lost: the step fails)", errno_text(broken_));
  }

  void reap_one() {
    ZEST_INTERNAL_ASSERT(in_flight_ > 0 || !queued_.empty(), "io_uring wait with nothing in flight");
    io_uring_cqe* cqe = nullptr;
    int rc;
    while ((rc = io_uring_wait_cqe(&ring_, &cqe)) == -EINTR) {
    }
    ZEST_CHECK(rc == 0, "io_uring_wait_cqe failed: {}; the NVMe tier cannot complete its I/O", errno_text(-rc));
    const uint64_t id = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --in_flight_;
    auto it = pieces_.find(id);
    ZEST_INTERNAL_ASSERT(it != pieces_.end(), "io_uring completion for unknown piece {}", id);
    Piece p = std::move(it->second);
    pieces_.erase(it);
    PieceOutcome out;
    if (res < 0) {
      out.error = -res;
    } else if (static_cast<size_t>(res) < p.bytes && res > 0) {
      // A partial transfer (rare on regular files): the rest synchronously,
      // where a zero return then marks a short read.
      out = transfer_all(p.op, p.fd, p.buffer + res, p.bytes - static_cast<size_t>(res),
                         p.offset + static_cast<uint64_t>(res));
      out.bytes += static_cast<size_t>(res);
    } else {
      out.bytes = static_cast<size_t>(res);
    }
    p.transfer->record(out, p.offset);
    --p.transfer->pending;
    pump();
  }

  io_uring ring_;
  bool initialized_ = false;
  const size_t block_;
  const int depth_;
  const bool single_submit_;
  std::deque<Piece> queued_;
  std::unordered_map<uint64_t, Piece> pieces_;  // in the kernel, by user data
  std::unordered_map<AioHandle, std::shared_ptr<TransferState>> transfers_;
  int in_flight_ = 0;
  int broken_ = 0;  // errno of a failed io_uring_submit
  uint64_t next_piece_ = 1;
  AioHandle next_handle_ = 1;
};

}  // namespace

std::unique_ptr<AioBackend> make_io_uring_backend(const AioConfig& config, int& error) {
  auto backend = std::make_unique<IoUringBackend>(config, error);
  if (error != 0) return nullptr;
  return backend;
}

}  // namespace zest::detail
