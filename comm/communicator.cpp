// Argument checks, numbering, counting and abort handling shared by every
// backend; the backends only move and reduce data.
#include "zest/comm/communicator.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "zest/core/host_queue.h"

namespace zest {
namespace {

struct Range {
  uintptr_t begin;
  uintptr_t end;
  bool overlaps(const Range& o) const { return begin < o.end && o.begin < end; }
};

Range range(const void* p, size_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  return {b, b + bytes};
}

}  // namespace

namespace {

// A number of seconds from 0.001 to 1e6 in the environment variable `name`,
// else `fallback`; `what` says what it sets, for the error.
std::chrono::milliseconds seconds_from_env(const char* name, std::string_view what,
                                           std::chrono::milliseconds fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  ZEST_CHECK(end != text && *end == '\0' && std::isfinite(seconds) && seconds >= 0.001 &&
                 seconds <= 1e6,
             "{} is '{}', not a number of seconds from 0.001 to 1e6; set it to {} (e.g. {}=600), "
             "or unset it for the default of {} minutes",
             name, text, what, name,
             std::chrono::duration_cast<std::chrono::minutes>(fallback).count());
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

}  // namespace

std::chrono::milliseconds default_comm_timeout() {
  return seconds_from_env("ZEST_COMM_TIMEOUT", "how long a collective may wait for the other ranks",
                          std::chrono::minutes(10));
}

std::chrono::milliseconds default_comm_init_timeout() {
  return seconds_from_env("ZEST_COMM_INIT_TIMEOUT",
                          "how long creating a communicator or splitting one may take",
                          std::chrono::minutes(10));
}

void check_comm_options(const CommOptions& options) {
  ZEST_CHECK(options.timeout.count() > 0, "CommOptions::timeout must be positive, got {} ms",
             options.timeout.count());
  ZEST_CHECK(options.spin.count() >= 0 && options.spin <= options.timeout,
             "CommOptions::spin must be between 0 and the timeout ({} ms), got {} us",
             options.timeout.count(), options.spin.count());
  ZEST_CHECK(options.init_timeout.count() > 0,
             "CommOptions::init_timeout must be positive, got {} ms; it bounds creating and "
             "splitting a communicator", options.init_timeout.count());
}

Communicator::Communicator(int rank, int size, Device device, CommOptions options)
    : rank_(rank), size_(size), device_(device), options_(options) {
  ZEST_CHECK(size >= 1 && rank >= 0 && rank < size,
             "a communicator needs 0 <= rank < size, got rank {} of {}", rank, size);
  check_comm_options(options);
  sent_seq_.assign(static_cast<size_t>(size), 0);
  received_seq_.assign(static_cast<size_t>(size), 0);
}

Communicator::~Communicator() { finish_queued(); }

void Communicator::mark_aborted(const std::string& reason) {
  const std::lock_guard<std::mutex> lock(abort_mutex_);
  if (aborted_.load(std::memory_order_relaxed)) return;
  abort_reason_ = reason.empty() ? "unknown failure" : reason;
  aborted_.store(true, std::memory_order_release);
}

// Note [issue order across threads]. A collective issued on a host stream
// with its own thread (HostWork::kOwnThread) is numbered and counted when it
// is issued and runs later, on that thread. Every rank must still run a
// communicator's collectives in the order it numbered them, and no backend
// serves two threads at once on one communicator. So a call on any other
// stream (the caller's own thread, or another host stream's) first waits
// until the last queued collective has run; one on the same stream is queued
// behind it. That is the order NCCL keeps for one communicator across
// streams, and it costs a caller that mixes streams the wait a GPU's host
// would spend in the same place.
void Communicator::wait_for_queued(const Stream& stream) {
  if (!queued_on_ || queued_on_.get() == stream.host_queue() || queued_on_->on_own_thread()) return;
  const std::shared_ptr<HostQueue> queue = std::move(queued_on_);
  queue->wait(queued_ticket_);
}

void Communicator::finish_queued() noexcept {
  if (queued_on_) queued_on_->wait_quietly(queued_ticket_);
}

std::string Communicator::current_exception_message() { return current_exception_text(); }

void Communicator::abort(std::string_view reason) noexcept {
  try {
    const std::string message = fmt::format("rank {} failed: {}", rank_,
                                            reason.empty() ? std::string_view("unknown failure") : reason);
    mark_aborted(message);
    close_group_after_abort();
    do_abort(message);
  } catch (...) {
    // Out of memory formatting the message: the communicator cannot be
    // aborted any better than by the failure that follows.
  }
}

void Communicator::refuse_if_aborted(std::string_view what) const {
  if (!aborted()) return;
  throw CommError(CommError::Reason::kAborted,
                  fmt::format("{} on the {} communicator (rank {} of {}) refused: it was aborted "
                              "by an earlier failure: {}. Create a new communicator.",
                              what, backend_name(), rank_, size_, abort_reason_),
                  __FILE__, __LINE__);
}

void Communicator::close_group_after_abort() noexcept {
  if (!aborted() || group_depth_ == 0) return;
  group_depth_ = 0;
  try {
    do_group_end();
  } catch (...) {
    // Expected: the group held the failed call. The failure that aborted the
    // communicator is the one reported.
  }
}

CollectiveDesc Communicator::begin(CollectiveKind kind, DType dtype, ReduceOp op, int root,
                                   size_t count, const Stream& stream, uint64_t tag) {
  wait_for_queued(stream);
  refuse_if_aborted(collective_name(kind));
  ZEST_CHECK(stream.device() == device_,
             "{}: the stream is on {} but the communicator is on {}; pass a stream of {}",
             collective_name(kind), stream.device().str(), device_.str(), device_.str());
  ZEST_CHECK(op != ReduceOp::kAvg || is_floating(dtype),
             "{}: avg is defined for floating types only, not {}; sum and divide yourself",
             collective_name(kind), dtype_name(dtype));
  ZEST_CHECK(count < (uint64_t{1} << 48), "{}: count {} is not a plausible element count",
             collective_name(kind), count);
  CollectiveDesc desc;
  desc.kind = kind;
  desc.dtype = dtype;
  desc.op = op;
  desc.root = root;
  desc.count = count;
  desc.tag = tag;
  // Numbered, not yet counted: run() commits the number once the arguments
  // passed their checks, so a refused call does not shift this rank's
  // numbering against the others'.
  desc.seq = seq_ + 1;
  return desc;
}

template <typename Fn>
void Communicator::run(const CollectiveDesc& desc, const Stream& stream, Fn&& fn) {
  seq_ = desc.seq;
  if (HostQueue* queue = queue_for(stream)) {
    // Counted when issued, as a device backend's are. A failure there aborts
    // the communicator as one here does; a group left open by it is closed
    // by the issuing thread's group_end.
    counters_.record(desc, rank_, size_);
    queued_ticket_ = queue->submit([this, fn = std::forward<Fn>(fn)]() mutable {
      try {
        fn();
      } catch (const CommError& e) {
        mark_aborted(e.message());
        throw;
      }
    });
    queued_on_ = queue->shared_from_this();
    return;
  }
  try {
    fn();
  } catch (const CommError& e) {
    mark_aborted(e.message());
    close_group_after_abort();
    throw;
  } catch (...) {
    close_group_after_abort();  // if the backend found this failure fatal
    throw;
  }
  counters_.record(desc, rank_, size_);
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              const Stream& stream, uint64_t tag) {
  const CollectiveDesc desc = begin(CollectiveKind::kAllReduce, dtype, op, -1, count, stream, tag);
  const size_t bytes = count * elem_size(dtype);
  ZEST_CHECK(count == 0 || (send != nullptr && recv != nullptr),
             "{}: send and recv must not be null", desc.str());
  ZEST_CHECK(send == recv || !range(send, bytes).overlaps(range(recv, bytes)),
             "{}: send and recv overlap without being the same buffer; use one buffer for an "
             "in-place all_reduce or two that do not overlap", desc.str());
  run(desc, stream, [=, this] { do_all_reduce(desc, send, recv, stream); });
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                  ReduceOp op, const Stream& stream, uint64_t tag) {
  const CollectiveDesc desc =
      begin(CollectiveKind::kReduceScatter, dtype, op, -1, recv_count, stream, tag);
  const size_t part = recv_count * elem_size(dtype);
  ZEST_CHECK(recv_count == 0 || (send != nullptr && recv != nullptr),
             "{}: send and recv must not be null", desc.str());
  const bool in_place = static_cast<const char*>(send) + static_cast<size_t>(rank_) * part == recv;
  ZEST_CHECK(in_place || !range(send, part * static_cast<size_t>(size_)).overlaps(range(recv, part)),
             "{}: recv overlaps send without being this rank's part of it (send + rank x "
             "recv_count); use that for in-place, or buffers that do not overlap", desc.str());
  run(desc, stream, [=, this] { do_reduce_scatter(desc, send, recv, stream); });
}

void Communicator::all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                              const Stream& stream, uint64_t tag) {
  const CollectiveDesc desc =
      begin(CollectiveKind::kAllGather, dtype, ReduceOp::kSum, -1, send_count, stream, tag);
  const size_t part = send_count * elem_size(dtype);
  ZEST_CHECK(send_count == 0 || (send != nullptr && recv != nullptr),
             "{}: send and recv must not be null", desc.str());
  const bool in_place = static_cast<const char*>(recv) + static_cast<size_t>(rank_) * part == send;
  ZEST_CHECK(in_place || !range(send, part).overlaps(range(recv, part * static_cast<size_t>(size_))),
             "{}: send overlaps recv without being this rank's part of it (recv + rank x "
             "send_count); use that for in-place, or buffers that do not overlap", desc.str());
  run(desc, stream, [=, this] { do_all_gather(desc, send, recv, stream); });
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                             const Stream& stream, uint64_t tag) {
  ZEST_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this communicator "
                                        "(0..{})", root, size_ - 1);
  const CollectiveDesc desc =
      begin(CollectiveKind::kBroadcast, dtype, ReduceOp::kSum, root, count, stream, tag);
  const size_t bytes = count * elem_size(dtype);
  // Only the root reads send; the others may pass nullptr.
  ZEST_CHECK(count == 0 || (recv != nullptr && (rank_ != root || send != nullptr)),
             "{}: recv (and send on the root) must not be null", desc.str());
  ZEST_CHECK(rank_ != root || send == recv || !range(send, bytes).overlaps(range(recv, bytes)),
             "{}: send and recv overlap without being the same buffer", desc.str());
  run(desc, stream, [=, this] { do_broadcast(desc, send, recv, stream); });
}

void Communicator::barrier(const Stream& stream) {
  const CollectiveDesc desc = begin(CollectiveKind::kBarrier, DType::kUInt8, ReduceOp::kSum, -1, 0, stream);
  run(desc, stream, [=, this] { do_barrier(desc, stream); });
}

void Communicator::send(const void* buffer, size_t count, DType dtype, int peer, const Stream& stream,
                        uint64_t tag) {
  const P2POp op = P2POp::send(buffer, count, dtype, peer, tag);
  send_recv(std::span<const P2POp>(&op, 1), stream);
}

void Communicator::recv(void* buffer, size_t count, DType dtype, int peer, const Stream& stream,
                        uint64_t tag) {
  const P2POp op = P2POp::recv(buffer, count, dtype, peer, tag);
  send_recv(std::span<const P2POp>(&op, 1), stream);
}

void Communicator::send_recv(std::span<const P2POp> ops, const Stream& stream) {
  // Transfers run in the caller's thread whatever the stream: a pipeline
  // stage's host code waits for each anyway.
  if (queue_for(stream) != nullptr) stream.synchronize();
  wait_for_queued(Stream::default_for(device_));
  refuse_if_aborted(ops.size() == 1 ? (ops[0].is_send ? "send" : "recv") : "send_recv");
  ZEST_CHECK(group_depth_ == 0,
             "send/recv inside a group_start/group_end block: pass the transfers that must start "
             "together to one send_recv call instead");
  ZEST_CHECK(stream.device() == device_,
             "send/recv: the stream is on {} but the communicator is on {}; pass a stream of {}",
             stream.device().str(), device_.str(), device_.str());
  if (ops.empty()) return;
  // Checked before any is numbered, so a refused call shifts no numbering.
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const char* what = op.is_send ? "send" : "recv";
    ZEST_CHECK(op.peer >= 0 && op.peer < size_ && op.peer != rank_,
               "{} {} of {}: peer {} is not another rank of this communicator of {} ranks (0..{}, "
               "not this rank, {})",
               what, i + 1, ops.size(), op.peer, size_, size_ - 1, rank_);
    ZEST_CHECK(op.count < (uint64_t{1} << 48), "{} to/from rank {}: count {} is not a plausible "
               "element count", what, op.peer, op.count);
    ZEST_CHECK(op.count == 0 || op.buffer != nullptr, "{} of {} x {} with rank {}: the buffer is null",
               what, op.count, dtype_name(op.dtype), op.peer);
    if (op.is_send || op.count == 0) continue;
    const Range mine = range(op.buffer, op.count * elem_size(op.dtype));
    for (size_t j = 0; j < ops.size(); ++j) {
      const P2POp& other = ops[j];
      if (j == i || other.count == 0) continue;
      ZEST_CHECK(!mine.overlaps(range(other.buffer, other.count * elem_size(other.dtype))),
                 "send_recv: the buffer of recv {} (from rank {}) overlaps that of {} {} (rank {}); "
                 "a received message must have its own buffer",
                 i + 1, op.peer, other.is_send ? "send" : "recv", j + 1, other.peer);
    }
  }
  p2p_calls_.clear();
  for (const P2POp& op : ops) {
    P2PCall call;
    call.desc.kind = op.is_send ? CollectiveKind::kSend : CollectiveKind::kRecv;
    call.desc.dtype = op.dtype;
    call.desc.root = op.peer;
    call.desc.count = op.count;
    call.desc.tag = op.tag;
    uint64_t& last = (op.is_send ? sent_seq_ : received_seq_)[static_cast<size_t>(op.peer)];
    call.desc.seq = ++last;
    call.buffer = op.buffer;
    p2p_calls_.push_back(call);
  }
  try {
    do_send_recv(p2p_calls_, stream);
  } catch (const CommError& e) {
    mark_aborted(e.message());
    throw;
  }
  for (const P2PCall& call : p2p_calls_) counters_.record(call.desc, rank_, size_);
}

void Communicator::do_send_recv(std::span<const P2PCall> calls, const Stream& /*stream*/) {
  ZEST_FAIL("{}: the {} communicator has no point-to-point transfers; use the in-process, MPI or NCCL "
            "backend", calls.front().desc.str(), backend_name());
}

void Communicator::group_start() {
  refuse_if_aborted("group_start");
  if (group_depth_++ > 0) return;
  try {
    do_group_start();
  } catch (...) {
    // No group was opened, and the backend's grouping state is unknown.
    group_depth_ = 0;
    mark_aborted(current_exception_message());
    throw;
  }
}

void Communicator::group_end() {
  close_group_after_abort();  // aborted inside the group, outside run()
  refuse_if_aborted("group_end");
  ZEST_CHECK(group_depth_ > 0, "group_end without a matching group_start");
  if (--group_depth_ > 0) return;
  try {
    do_group_end();
  } catch (...) {
    // The group's collectives may have been launched on some ranks and not
    // on others: nothing later can be matched up.
    mark_aborted(current_exception_message());
    throw;
  }
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, bool share_resources) {
  refuse_if_aborted("split");
  ZEST_CHECK(group_depth_ == 0, "split inside a group_start/group_end block; split outside it");
  const CollectiveDesc desc =
      begin(CollectiveKind::kSplit, DType::kUInt8, ReduceOp::kSum, -1, 0, Stream::default_for(device_));
  std::unique_ptr<Communicator> child;
  run(desc, Stream::default_for(device_), [&] { child = do_split(desc, color, key, share_resources); });
  return child;
}

}  // namespace zest
