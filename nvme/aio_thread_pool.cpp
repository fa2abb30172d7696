// The thread-pool back end of the NVMe tier's I/O engine: intra_op_parallelism
// threads doing pread/pwrite on block_size pieces of each transfer. The
// fallback where io_uring is refused or not built, and the reference the
// io_uring back end is tested against.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "zest/core/check.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/detail/aio_pieces.h"

namespace zest::detail {
namespace {

class ThreadPoolBackend final : public AioBackend {
 public:
  explicit ThreadPoolBackend(const AioConfig& config) : block_(static_cast<size_t>(config.block_size)) {
    threads_.reserve(static_cast<size_t>(config.intra_op_parallelism));
    for (int i = 0; i < config.intra_op_parallelism; ++i) threads_.emplace_back([this] { work(); });
  }

  ~ThreadPoolBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    // Queued pieces still run: their buffers belong to callers that may be
    // unwinding, and a half-done write is no worse than an undone one.
    for (std::thread& t : threads_) t.join();
  }

  std::string_view name() const override { return "thread pool"; }

  AioHandle submit(const AioRequest& r) override {
    auto transfer = std::make_shared<TransferState>();
    const AioHandle h = next_++;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for_each_piece(r, block_, [&](std::byte* buffer, size_t bytes, uint64_t offset) {
        ++transfer->pending;
        queue_.push_back(Piece{transfer, r.op, r.fd, buffer, bytes, offset});
      });
      transfers_.emplace(h, transfer);
    }
    work_cv_.notify_all();
    return h;
  }

  AioResult wait(AioHandle h) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = transfers_.find(h);
    ZEST_INTERNAL_ASSERT(it != transfers_.end(), "AioBackend::wait on handle {}, not submitted or already waited for",
                         h);
    std::shared_ptr<TransferState> t = it->second;
    done_cv_.wait(lock, [&] { return t->pending == 0; });
    transfers_.erase(it);
    return t->result;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      Piece p = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      const PieceOutcome out = transfer_all(p.op, p.fd, p.buffer, p.bytes, p.offset);
      lock.lock();
      p.transfer->record(out, p.offset);
      if (--p.transfer->pending == 0) done_cv_.notify_all();
    }
  }

  const size_t block_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Piece> queue_;
  std::unordered_map<AioHandle, std::shared_ptr<TransferState>> transfers_;
  AioHandle next_ = 1;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<AioBackend> make_thread_pool_backend(const AioConfig& config) {
  return std::make_unique<ThreadPoolBackend>(config);
}

}  // namespace zest::detail
