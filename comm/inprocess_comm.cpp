#include "zest/comm/inprocess_comm.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "zest/comm/host_reduce.h"
#include "zest/comm/detail/inprocess_data.h"
#include "zest/core/rank_context.h"
#include "zest/core/spin_wait.h"
#include "zest/memory/copy.h"

namespace zest {
namespace {

// What a rank posts when it enters a collective.
struct Post {
  CollectiveDesc desc;
  const void* send = nullptr;
  void* recv = nullptr;
  int color = 0;  // split only
  int key = 0;
};

// State shared by the ranks of one group.
class Group {
 public:
  Group(int world_size, Device device, CommOptions options)
      : size_(world_size), device_(device), options_(options), spin_(spin_budget(world_size, options)),
        posts_(world_size), arrived_gen_(world_size, ~uint64_t{0}), in_data_(world_size, 0),
        departed_(static_cast<size_t>(world_size), 0), last_p2p_(static_cast<size_t>(world_size)),
        sends_(static_cast<size_t>(world_size) * static_cast<size_t>(world_size)) {}

  int size() const { return size_; }
  Device device() const { return device_; }
  const CommOptions& options() const { return options_; }

  // Posts this rank's call and waits for every rank's. Returns everyone's
  // posts (valid until depart()).
  const std::vector<Post>& arrive(int rank, const Post& post) {
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_aborted(rank, post.desc);
    for (int r = 0; r < size_; ++r) {
      if (departed_[static_cast<size_t>(r)]) {
        abort_locked(CommError::Reason::kAborted, departure_message(r), r);
        throw_if_aborted(rank, post.desc);
      }
    }
    posts_[rank] = post;
    // Compare with the ranks already here: a divergence is reported now,
    // not at the timeout.
    for (int r = 0; r < size_; ++r) {
      if (r != rank && arrived_gen_[r] == generation_ && !(posts_[r].desc == post.desc)) {
        abort_locked(CommError::Reason::kMismatch, mismatch_message(rank), rank);
        throw_if_aborted(rank, post.desc);
      }
    }
    wait_for_all(lock, rank, post.desc, /*enter_data=*/true);
    return posts_;
  }

  // Waits until every rank is done with the others' buffers.
  void depart(int rank, const CollectiveDesc& desc) {
    std::unique_lock<std::mutex> lock(mutex_);
    leave_locked(rank);
    if (!abort_reason_.empty()) drain_and_throw(lock, rank, desc);
    wait_for_all(lock, rank, desc, /*enter_data=*/false);
  }

  // This rank's part failed: the group is aborted with `message`, and the
  // rank returns (to unwind and free its buffers) only once no other rank
  // is still reading or writing them.
  void fail(int rank, CommError::Reason reason, std::string message) {
    std::unique_lock<std::mutex> lock(mutex_);
    leave_locked(rank);
    abort_locked(reason, std::move(message), rank);
    drain(lock);
  }

  // `rank` failed outside a collective (Communicator::abort): the others'
  // pending and later calls end at once with `message`, here and in every
  // group split from this one, whose ranks would wait for it just the same.
  void abort_from(int rank, std::string message) {
    std::vector<std::weak_ptr<Group>> descendants;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      abort_locked(CommError::Reason::kAborted, message, rank);
      descendants = descendants_;
    }
    for (const std::weak_ptr<Group>& weak : descendants) {
      if (std::shared_ptr<Group> child = weak.lock()) child->abort_from(-1, message);
    }
  }

  // `rank`'s function returned (run_inprocess): it calls no more
  // collectives or transfers here, so a rank still waiting for it, or
  // calling another collective, or a transfer with it, fails at once naming
  // it instead of waiting out the timeout. Collectives it took part in are
  // done (it left their last barrier, so every rank arrived there), and so
  // are its transfers (it returned from them). Ranks that go on exchanging
  // among themselves (a pipeline's later stages) are left alone. Groups
  // split from this one are left alone too: their ranks need not include it.
  void depart(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    departed_[static_cast<size_t>(rank)] = 1;
    // Ranks waiting in a collective now wait for a rank that will not come.
    if (arrived_ > 0) abort_locked(CommError::Reason::kAborted, departure_message(rank), rank);
    p2p_progress_locked();
  }

  // Point-to-point: this rank's sides of `calls` (p2p.h). Sends are posted
  // for their receivers, which copy straight from the sender's buffer; this
  // rank copies its receives from the senders' buffers; it returns once
  // every side is done.
  void transfer(int rank, std::span<const P2PCall> calls, const Stream& stream) {
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_aborted(rank, calls.front().desc);
    std::vector<std::shared_ptr<SendPost>> sends;
    std::vector<const P2PCall*> recvs;
    for (const P2PCall& c : calls) {
      last_p2p_[static_cast<size_t>(rank)] = c.desc;
      if (c.desc.kind == CollectiveKind::kSend) {
        auto post = std::make_shared<SendPost>(SendPost{c.desc, rank, c.buffer});
        sends_[pair_index(rank, c.desc.root)].push_back(post);
        sends.push_back(std::move(post));
      } else {
        recvs.push_back(&c);
      }
    }
    p2p_progress_locked();
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    std::vector<char> received(recvs.size(), 0);
    size_t pending_recvs = recvs.size();
    for (;;) {
      // Receive whatever has been posted for us, in order per sender.
      bool progressed = false;
      for (size_t i = 0; i < recvs.size() && abort_reason_.empty(); ++i) {
        if (received[i]) continue;
        const CollectiveDesc& want = recvs[i]->desc;
        std::deque<std::shared_ptr<SendPost>>& queue = sends_[pair_index(want.root, rank)];
        if (queue.empty()) continue;
        std::shared_ptr<SendPost> post = queue.front();
        if (!p2p_match(post->desc, post->from, want, rank)) {
          abort_locked(CommError::Reason::kMismatch,
                       p2p_mismatch_message("in-process", post->desc, post->from, want, rank), rank);
          break;
        }
        queue.pop_front();
        post->claimed = true;
        lock.unlock();
        try {
          const size_t bytes = want.count * elem_size(want.dtype);
          if (bytes > 0) copy_bytes(stream, recvs[i]->buffer, post->buffer, bytes);
          inprocess::synchronize(stream);
        } catch (...) {
          lock.lock();
          post->done = true;
          abort_locked(CommError::Reason::kBackend,
                       fmt::format("in-process {} failed on rank {}: {}", want.str(), rank,
                                   current_exception_text()),
                       rank);
          p2p_progress_locked();
          drain_sends(lock, sends);
          throw;
        }
        lock.lock();
        post->done = true;
        received[i] = 1;
        --pending_recvs;
        progressed = true;
        p2p_progress_locked();
      }
      if (!abort_reason_.empty()) break;
      if (progressed) continue;
      bool sends_done = true;
      for (const auto& post : sends) sends_done = sends_done && post->done;
      if (sends_done && pending_recvs == 0) return;
      // A peer that left will not come for what is still pending with it.
      int gone = -1;
      for (size_t i = 0; i < recvs.size() && gone < 0; ++i) {
        if (!received[i] && departed_[static_cast<size_t>(recvs[i]->desc.root)]) gone = recvs[i]->desc.root;
      }
      for (const auto& post : sends) {
        if (gone < 0 && !post->claimed && departed_[static_cast<size_t>(post->desc.root)]) gone = post->desc.root;
      }
      if (gone >= 0) {
        abort_locked(CommError::Reason::kAborted, departure_message(gone), gone);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        abort_locked(CommError::Reason::kTimeout,
                     p2p_timeout_message(rank, calls, received, recvs, sends), rank);
        break;
      }
      // A condition variable, not a spin: on a loaded machine a spinning
      // rank takes the core its peer needs (p2p_bench, 4 KiB exchanges on
      // 2 cores at load 8-9: 112-319 us spinning 50 us first, 18-37 us
      // waiting at once; docs/BENCHMARKS.md).
      const uint64_t seen = p2p_progress_.load(std::memory_order_relaxed);
      p2p_cv_.wait_until(lock, deadline, [&] { return p2p_progress_.load(std::memory_order_relaxed) != seen; });
    }
    drain_sends(lock, sends);
    throw_if_aborted(rank, calls.front().desc);
    ZEST_INTERNAL_ASSERT(false, "an in-process transfer ended without completing or failing");
  }

  // The rank whose failure aborted the group (-1: none did, or not known).
  int abort_origin() {
    std::lock_guard<std::mutex> lock(mutex_);
    return abort_origin_;
  }

  // Split: the first rank to ask creates a color's child group and the others
  // of that color find it. Rank 0 clears the table once every rank has
  // departed the split; no rank can post the next split before rank 0 has.
  std::shared_ptr<Group> child_for(int color, int child_size) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Group>& slot = children_[color];
    if (!slot) {
      slot = std::make_shared<Group>(child_size, device_, options_);
      std::erase_if(descendants_, [](const std::weak_ptr<Group>& g) { return g.expired(); });
      descendants_.push_back(slot);
    }
    return slot;
  }
  void clear_children() {
    std::lock_guard<std::mutex> lock(mutex_);
    children_.clear();
  }

 private:
  // A send posted for its receiver, who copies from `buffer`: the sender
  // returns only once it is done (or, aborted, once no receiver that
  // claimed it is still copying).
  struct SendPost {
    CollectiveDesc desc;
    int from = 0;
    const void* buffer = nullptr;
    bool claimed = false;
    bool done = false;
  };
  void p2p_progress_locked() {
    p2p_progress_.fetch_add(1, std::memory_order_release);
    p2p_cv_.notify_all();
  }

  size_t pair_index(int from, int to) const {
    return static_cast<size_t>(from) * static_cast<size_t>(size_) + static_cast<size_t>(to);
  }

  std::string departure_message(int rank) const {
    return fmt::format("rank {} left: its function returned, so it calls no more collectives on "
                       "this communicator (nor transfers)",
                       rank);
  }

  // Aborted: this rank's sends leave the queues, and it waits (bounded by the
  // timeout: a copy waits on no one) until no receiver still copies from them.
  void drain_sends(std::unique_lock<std::mutex>& lock,
                   const std::vector<std::shared_ptr<SendPost>>& sends) {
    for (const auto& post : sends) {
      if (post->claimed) continue;
      auto& queue = sends_[pair_index(post->from, post->desc.root)];
      std::erase(queue, post);
    }
    p2p_cv_.wait_for(lock, options_.timeout, [&] {
      for (const auto& post : sends) {
        if (post->claimed && !post->done) return false;
      }
      return true;
    });
  }

  // Names each side still pending and what its peer is doing.
  std::string p2p_timeout_message(int rank, std::span<const P2PCall> calls,
                                  const std::vector<char>& received,
                                  const std::vector<const P2PCall*>& recvs,
                                  const std::vector<std::shared_ptr<SendPost>>& sends) const {
    std::string pending;
    std::vector<int> peers;
    const auto add = [&](const CollectiveDesc& d, const char* verb) {
      pending += fmt::format("{}{} ({})", pending.empty() ? "" : "; ", d.str(),
                             fmt::format(fmt::runtime(verb), d.root));
      if (std::find(peers.begin(), peers.end(), d.root) == peers.end()) peers.push_back(d.root);
    };
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (!received[i]) add(recvs[i]->desc, "rank {} did not send it");
    }
    for (const auto& post : sends) {
      if (!post->claimed) add(post->desc, "rank {} did not receive it");
    }
    std::string doing;
    for (int peer : peers) {
      const CollectiveDesc& p2p = last_p2p_[static_cast<size_t>(peer)];
      const CollectiveDesc& coll = posts_[static_cast<size_t>(peer)].desc;
      doing += fmt::format("; rank {}'s last transfer was {}, its last collective {}", peer,
                           p2p.seq == 0 ? std::string("none") : p2p.str(),
                           coll.seq == 0 ? std::string("none") : coll.str());
    }
    return fmt::format("in-process {} timed out after {} ms on rank {}: {}{}",
                       calls.size() == 1 ? calls.front().desc.str()
                                         : fmt::format("send_recv of {} transfers", calls.size()),
                       options_.timeout.count(), rank, pending, doing);
  }

  // A cyclic barrier whose wait ends in an error when the group is aborted or
  // the timeout passes. Ranks count as arrived for generation_ when
  // arrived_gen_[r] equals it.
  // `enter_data`: the barrier before the data phase, which puts every rank
  // in it once all have arrived.
  void wait_for_all(std::unique_lock<std::mutex>& lock, int rank, const CollectiveDesc& desc,
                    bool enter_data) {
    const uint64_t gen = generation_;
    arrived_gen_[rank] = gen;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      if (enter_data) {
        std::fill(in_data_.begin(), in_data_.end(), 1);
        busy_ = size_;
      }
      cv_.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    if (spin_.count() > 0) {
      // The last rank to arrive releases the others within a microsecond or
      // two: seen by spinning, not a condition variable's wake-up.
      lock.unlock();
      spin_until(spin_, [&] {
        return generation_.load(std::memory_order_acquire) != gen ||
               aborted_.load(std::memory_order_acquire);
      });
      lock.lock();
    }
    while (generation_ == gen && abort_reason_.empty()) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == gen &&
          abort_reason_.empty()) {
        abort_locked(CommError::Reason::kTimeout, timeout_message(rank, desc, gen), rank);
      }
    }
    // Released: every rank arrived, so this barrier is done even if the
    // group was aborted since (a rank failing right after it); the abort
    // meets this rank at its next wait. Throwing here would fail a
    // collective that completed.
    if (generation_ != gen) return;
    // Aborted before every rank arrived: this rank does no data work, but
    // others may be doing theirs on its buffers.
    leave_locked(rank);
    drain_and_throw(lock, rank, desc);
  }

  // Ranks between the two barriers of a collective read and write the
  // others' buffers. A rank that throws waits for them first, so it never
  // frees memory another rank is still copying (bounded by the timeout: data
  // work does not wait on anyone).
  void leave_locked(int rank) {
    if (!in_data_[static_cast<size_t>(rank)]) return;
    in_data_[static_cast<size_t>(rank)] = 0;
    if (--busy_ == 0) cv_.notify_all();
  }
  void drain(std::unique_lock<std::mutex>& lock) {
    cv_.wait_for(lock, options_.timeout, [&] { return busy_ == 0; });
  }
  [[noreturn]] void drain_and_throw(std::unique_lock<std::mutex>& lock, int rank,
                                    const CollectiveDesc& desc) {
    drain(lock);
    throw_if_aborted(rank, desc);
    ZEST_INTERNAL_ASSERT(false, "drain_and_throw on a group that is not aborted");
  }

  void abort_locked(CommError::Reason reason, std::string message, int origin) {
    if (!abort_reason_.empty()) return;
    abort_kind_ = reason;
    abort_reason_ = std::move(message);
    aborted_.store(true, std::memory_order_release);
    abort_origin_ = origin;
    cv_.notify_all();
    p2p_progress_locked();
  }

  // Timeouts, mismatches and failures inside a collective already name the
  // operation; an abort from outside one says which call it ended.
  void throw_if_aborted(int rank, const CollectiveDesc& desc) const {
    if (abort_reason_.empty()) return;
    if (abort_kind_ != CommError::Reason::kAborted) {
      throw CommError(abort_kind_, abort_reason_, __FILE__, __LINE__);
    }
    throw CommError(abort_kind_,
                    fmt::format("in-process {} on rank {} ended: {}", desc.str(), rank,
                                abort_reason_),
                    __FILE__, __LINE__);
  }

  std::string timeout_message(int rank, const CollectiveDesc& desc, uint64_t gen) const {
    std::vector<int> here;
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) (arrived_gen_[r] == gen ? here : missing).push_back(r);
    std::string last;
    for (int r : missing) {
      last += fmt::format("; rank {}'s last call was {}", r,
                          posts_[r].desc.seq == 0 ? std::string("none") : posts_[r].desc.str());
    }
    return fmt::format("in-process {} timed out after {} ms on rank {}: {} arrived, {} did not{}",
                       desc.str(), options_.timeout.count(), rank, rank_list(here),
                       rank_list(missing), last);
  }

  // The calls of the ranks here: the detecting one and those that arrived.
  std::string mismatch_message(int detecting_rank) const {
    std::vector<std::pair<int, CollectiveDesc>> calls;
    for (int r = 0; r < size_; ++r) {
      if (r == detecting_rank || arrived_gen_[r] == generation_) {
        calls.emplace_back(r, posts_[r].desc);
      }
    }
    return divergence_message("in-process", calls);
  }

  // CommOptions::spin, or none when the ranks outnumber the hardware
  // threads: then the rank waited for may need the very core that spins.
  static std::chrono::microseconds spin_budget(int size, const CommOptions& options) {
    const unsigned threads = std::thread::hardware_concurrency();
    return threads != 0 && static_cast<unsigned>(size) > threads ? std::chrono::microseconds(0)
                                                                  : options.spin;
  }

  const int size_;
  const Device device_;
  const CommOptions options_;
  const std::chrono::microseconds spin_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Post> posts_;
  std::vector<uint64_t> arrived_gen_;
  std::vector<char> in_data_;  // per rank: inside a collective's data phase
  int busy_ = 0;               // how many are
  // Written under mutex_; atomic so that a spinning rank may read them
  // without it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> aborted_{false};
  int arrived_ = 0;
  CommError::Reason abort_kind_ = CommError::Reason::kAborted;
  std::string abort_reason_;
  int abort_origin_ = -1;
  std::map<int, std::shared_ptr<Group>> children_;
  // Point-to-point: who left, each rank's last transfer (for timeouts), the
  // sends posted from rank a to rank b at sends_[a * size + b], and the
  // condition their waits use (apart from the collectives' barrier).
  std::vector<char> departed_;
  std::vector<CollectiveDesc> last_p2p_;
  std::vector<std::deque<std::shared_ptr<SendPost>>> sends_;
  std::condition_variable p2p_cv_;
  // Bumped, under mutex_, whenever a transfer may have progressed (a post,
  // a copy done, an abort, a departure): what the waits wait for.
  std::atomic<uint64_t> p2p_progress_{0};
  std::vector<std::weak_ptr<Group>> descendants_;  // every group split from this one
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank)
      : Communicator(rank, group->size(), group->device(), group->options()),
        group_(std::move(group)),
        in_(static_cast<size_t>(size())),
        out_(static_cast<size_t>(size())) {}
  ~InProcessCommunicator() override { finish_queued(); }

  std::string_view backend_name() const override { return "in-process"; }

 protected:
  // Rank r reduces chunk r of every send buffer and writes it to chunk r of
  // every recv buffer: each element is reduced once, and chunks never
  // overlap, so in-place use is safe.
  void do_all_reduce(const CollectiveDesc& desc, const void* send, void* recv,
                     const Stream& stream) override {
    exchange(desc, send, recv, stream, [&](const std::vector<Post>& posts) {
      const size_t es = elem_size(desc.dtype);
      const ReduceChunk mine = all_reduce_chunk(desc.count, size(), rank());
      if (mine.count > 0) {
        for (size_t r = 0; r < in_.size(); ++r) {
          in_[r] = static_cast<const char*>(posts[r].send) + mine.begin * es;
          out_[r] = static_cast<char*>(posts[r].recv) + mine.begin * es;
        }
        inprocess::reduce_into(stream, in_.data(), size(), out_.data(), size(), mine.count, desc.dtype,
                               desc.op);
      }
    });
  }
  void do_reduce_scatter(const CollectiveDesc& desc, const void* send, void* recv,
                         const Stream& stream) override {
    exchange(desc, send, recv, stream, [&](const std::vector<Post>& posts) {
      const size_t part = desc.count * elem_size(desc.dtype);
      for (int r = 0; r < size(); ++r) {
        in_[r] = static_cast<const char*>(posts[r].send) + static_cast<size_t>(rank()) * part;
      }
      void* out[] = {recv};
      if (desc.count > 0) {
        inprocess::reduce_into(stream, in_.data(), size(), out, 1, desc.count, desc.dtype, desc.op);
      }
    });
  }
  void do_all_gather(const CollectiveDesc& desc, const void* send, void* recv,
                     const Stream& stream) override {
    exchange(desc, send, recv, stream, [&](const std::vector<Post>& posts) {
      const size_t part = desc.count * elem_size(desc.dtype);
      for (int r = 0; r < size() && part > 0; ++r) {
        copy_bytes(stream, static_cast<char*>(recv) + static_cast<size_t>(r) * part, posts[r].send,
                   part);
      }
    });
  }
  void do_broadcast(const CollectiveDesc& desc, const void* send, void* recv,
                    const Stream& stream) override {
    exchange(desc, send, recv, stream, [&](const std::vector<Post>& posts) {
      const size_t bytes = desc.count * elem_size(desc.dtype);
      if (bytes > 0) copy_bytes(stream, recv, posts[desc.root].send, bytes);
    });
  }
  void do_barrier(const CollectiveDesc& desc, const Stream& stream) override {
    exchange(desc, nullptr, nullptr, stream, [](const std::vector<Post>&) {});
  }
  void do_send_recv(std::span<const P2PCall> calls, const Stream& stream) override {
    // The peers read our sends and write our receives from their threads:
    // work queued on our stream comes first.
    inprocess::synchronize(stream);
    group_->transfer(rank(), calls, stream);
  }
  std::unique_ptr<Communicator> do_split(const CollectiveDesc& desc, int color, int key,
                                         bool /*share_resources: threads share everything*/) override {
    std::unique_ptr<Communicator> child;
    guarded(desc, [&] { child = split_part(desc, color, key); });
    return child;
  }
  void do_abort(const std::string& message) override { group_->abort_from(rank(), message); }

 public:
  Group& group() { return *group_; }

 private:
  // Runs this rank's part of a collective. An exception out of it that is
  // not the group's own CommError (a failure in the data path: a CUDA
  // error, a dtype a kernel lacks, bad_alloc) aborts the group: the others
  // may be waiting for this rank inside the collective, and fail at once,
  // naming it and its error, instead of at the timeout. This rank gets its
  // own exception, and its communicator refuses every later call.
  template <typename Fn>
  void guarded(const CollectiveDesc& desc, Fn&& fn, const Stream* stream = nullptr) {
    try {
      fn();
    } catch (const CommError&) {
      throw;  // from the group, which is aborted already
    } catch (...) {
      const std::string reason = fmt::format("in-process {} failed on rank {}: {}", desc.str(),
                                             rank(), current_exception_message());
      // Copies or a kernel this rank queued on the others' buffers may still
      // run: they finish before failing the group lets the others return.
      if (stream != nullptr) {
        try {
          inprocess::synchronize(*stream);
        } catch (...) {  // the stream's own error; the first one is reported
        }
      }
      mark_aborted(reason);
      group_->fail(rank(), CommError::Reason::kBackend, reason);
      throw;
    }
  }

  std::unique_ptr<Communicator> split_part(const CollectiveDesc& desc, int color, int key) {
    Post post;
    post.desc = desc;
    post.color = color;
    post.key = key;
    const std::vector<Post>& posts = group_->arrive(rank(), post);
    std::unique_ptr<Communicator> child;
    if (color >= 0) {
      std::vector<std::pair<int, int>> members;  // (key, parent rank)
      for (int r = 0; r < size(); ++r) {
        if (posts[r].color == color) members.emplace_back(posts[r].key, r);
      }
      std::sort(members.begin(), members.end());
      const int child_rank = static_cast<int>(
          std::find(members.begin(), members.end(), std::make_pair(key, rank())) - members.begin());
      child = std::make_unique<InProcessCommunicator>(
          group_->child_for(color, static_cast<int>(members.size())), child_rank);
    }
    group_->depart(rank(), desc);
    // Everyone holds its child now; the next split starts a new set.
    if (rank() == 0) group_->clear_children();
    return child;
  }

  // This rank's part of every collective but split: posts its buffers, runs
  // work(every rank's posts) once all have arrived, and leaves once all are
  // done with each other's buffers.
  template <typename Work>
  void exchange(const CollectiveDesc& desc, const void* send, void* recv, const Stream& stream,
                Work&& work) {
    guarded(desc, [&] {
      // The others read our send buffer and write our recv buffer from their
      // threads: work queued on our stream must be done first. What `work`
      // queues on the others' buffers must be done before this rank departs,
      // since each may reuse its buffers once every rank has.
      inprocess::synchronize(stream);
      work(group_->arrive(rank(), Post{desc, send, recv, 0, 0}));
      inprocess::synchronize(stream);
      group_->depart(rank(), desc);
    }, &stream);
  }

  std::shared_ptr<Group> group_;
  // The reductions' pointers into every rank's buffers, kept between calls
  // so that a collective allocates nothing. Only this rank's thread touches
  // them (a communicator is used by one thread at a time), and reduce_into
  // is done with them when it returns (the CUDA kernel gets a copy).
  std::vector<const void*> in_;
  std::vector<void*> out_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_inprocess_group(int world_size, Device device,
                                                                CommOptions options) {
  ZEST_CHECK(world_size >= 1 && world_size <= 4096,
             "an in-process group needs 1 to 4096 ranks, got {}", world_size);
  check_device_available(device);
  auto group = std::make_shared<Group>(world_size, device, options);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world_size; ++r) comms.push_back(std::make_unique<InProcessCommunicator>(group, r));
  return comms;
}

void run_inprocess(int world_size, const std::function<void(Communicator&)>& fn, Device device,
                   CommOptions options) {
  std::vector<std::unique_ptr<Communicator>> comms = make_inprocess_group(world_size, device, options);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      ScopedRank scoped(r, world_size);
      Communicator& comm = *comms[static_cast<size_t>(r)];
      try {
        fn(comm);
        static_cast<InProcessCommunicator&>(comm).group().depart(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        // The others may be waiting for this rank in a collective, or about
        // to: they fail now, quoting this error, not at the timeout.
        comm.abort(current_exception_text());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The failure that started it, not the aborts it caused on the others.
  const int origin = static_cast<InProcessCommunicator&>(*comms[0]).group().abort_origin();
  if (origin >= 0 && errors[static_cast<size_t>(origin)]) {
    std::rethrow_exception(errors[static_cast<size_t>(origin)]);
  }
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace zest
