#include "zest/comm/detail/mpi_exchange.h"

#include <algorithm>
#include <cstring>

#include "zest/core/check.h"
#include "zest/core/mpi_check.h"

namespace zest::mpi {

Round::Round(int rank, int size, size_t slot_bytes)
    : rank_(rank),
      size_(size),
      slot_(slot_bytes),
      send_(slot_bytes * static_cast<size_t>(size)),
      recv_(slot_bytes * static_cast<size_t>(size)),
      statuses_(3 * static_cast<size_t>(size)),
      tail_statuses_(static_cast<size_t>(size)),
      all_(static_cast<size_t>(size) * kDescWords),
      got_(static_cast<size_t>(size)) {
  requests_.reserve(3 * static_cast<size_t>(size));
  tail_requests_.reserve(static_cast<size_t>(size));
  tail_from_.reserve(static_cast<size_t>(size));
}

const char* Round::payload(int r) const {
  if (r == rank_) return nullptr;
  return recv_.data() + slot_ * static_cast<size_t>(r) + sizeof(DescWords);
}

Exchange::Exchange(int rank, int size) : rank_(rank), size_(size) { rounds_.resize(max_pending() + 1); }

size_t Exchange::max_pending() const {
  // 4 rounds below 64 KiB of slots each (16 ranks), then fewer, at least one.
  const size_t round_bytes = 2 * slot_bytes() * static_cast<size_t>(size_);
  return std::clamp<size_t>((256 * 1024) / round_bytes, 1, 4);
}

Round& Exchange::start(MPI_Comm comm, const DescWords& mine, const std::function<Part(int peer)>& part_for,
                       const std::function<size_t(int peer)>& expect) {
  ZEST_INTERNAL_ASSERT(pending_count_ < max_pending(), "{} exchange rounds pending, at most {} allowed",
                       pending_count_, max_pending());
  current_ = (oldest_ + pending_count_) % rounds_.size();
  std::unique_ptr<Round>& slot_round = rounds_[current_];
  if (!slot_round) slot_round = std::make_unique<Round>(rank_, size_, slot_bytes());
  Round& round = *slot_round;
  const size_t slot = round.slot_;
  std::copy(mine.begin(), mine.end(), round.all_.begin() + static_cast<ptrdiff_t>(rank_) * kDescWords);
  round.requests_.clear();
  round.tail_requests_.clear();
  round.tail_from_.clear();
  const size_t head = sizeof(DescWords) + kHeadPayload;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    char* in = round.recv_.data() + slot * static_cast<size_t>(r);
    round.requests_.push_back(MPI_REQUEST_NULL);
    ZEST_MPI_CHECK(MPI_Irecv(in, static_cast<int>(head), MPI_BYTE, r, kTag, comm, &round.requests_.back()));
    if (expect(r) > kHeadPayload) {
      // Room for the largest tail, whatever the peer sends.
      round.tail_requests_.push_back(MPI_REQUEST_NULL);
      round.tail_from_.push_back(r);
      ZEST_MPI_CHECK(MPI_Irecv(in + head, static_cast<int>(slot - head), MPI_BYTE, r, kTailTag, comm,
                               &round.tail_requests_.back()));
    }
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Part part = part_for(r);
    ZEST_INTERNAL_ASSERT(part.bytes <= kPayloadLimit, "exchange payload of {} bytes over the limit of {}",
                         part.bytes, kPayloadLimit);
    char* out = round.send_.data() + slot * static_cast<size_t>(r);
    std::memcpy(out, mine.data(), sizeof(DescWords));
    if (part.bytes > 0) std::memcpy(out + sizeof(DescWords), part.data, part.bytes);
    round.requests_.push_back(MPI_REQUEST_NULL);
    ZEST_MPI_CHECK(MPI_Isend(out, static_cast<int>(sizeof(DescWords) + std::min(part.bytes, kHeadPayload)), MPI_BYTE,
                             r, kTag, comm, &round.requests_.back()));
    if (part.bytes > kHeadPayload) {
      round.requests_.push_back(MPI_REQUEST_NULL);
      ZEST_MPI_CHECK(MPI_Isend(out + head, static_cast<int>(part.bytes - kHeadPayload), MPI_BYTE, r, kTailTag, comm,
                               &round.requests_.back()));
    }
  }
  return round;
}

void Exchange::finish(Round& round) {
  const size_t slot = round.slot_;
  round.got_[static_cast<size_t>(rank_)] = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    // The receives were posted in rank order, skipping this rank.
    const MPI_Status& status = round.statuses_[static_cast<size_t>(r < rank_ ? r : r - 1)];
    int bytes = 0;
    ZEST_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &bytes));
    // Only ZEST's exchanges use the tag, on a communicator only ZEST uses.
    ZEST_INTERNAL_ASSERT(bytes >= static_cast<int>(sizeof(DescWords)), "exchange message of {} bytes from rank {}",
                         bytes, r);
    const char* in = round.recv_.data() + slot * static_cast<size_t>(r);
    std::memcpy(round.all_.data() + static_cast<size_t>(r) * kDescWords, in, sizeof(DescWords));
    round.got_[static_cast<size_t>(r)] = static_cast<size_t>(bytes) - sizeof(DescWords);
  }
}

void Exchange::finish_tails(Round& round) {
  for (size_t i = 0; i < round.tail_from_.size(); ++i) {
    int bytes = 0;
    ZEST_MPI_CHECK(MPI_Get_count(&round.tail_statuses_[i], MPI_BYTE, &bytes));
    round.got_[static_cast<size_t>(round.tail_from_[i])] += static_cast<size_t>(bytes);
  }
}

void Exchange::leave_pending() {
  ZEST_INTERNAL_ASSERT(current_ == (oldest_ + pending_count_) % rounds_.size() && pending_count_ < max_pending(),
                       "only the round just started can be left pending");
  ++pending_count_;
}

Round* Exchange::oldest_pending() { return pending_count_ > 0 ? rounds_[oldest_].get() : nullptr; }

void Exchange::settled_oldest() {
  ZEST_INTERNAL_ASSERT(pending_count_ > 0, "no exchange round is pending");
  oldest_ = (oldest_ + 1) % rounds_.size();
  --pending_count_;
}

DescWords encode_desc(const CollectiveDesc& d) {
  return {static_cast<uint64_t>(d.kind),  static_cast<uint64_t>(d.dtype),
          static_cast<uint64_t>(d.op),    static_cast<uint64_t>(static_cast<int64_t>(d.root)),
          d.count,                        d.seq,
          d.tag};
}

CollectiveDesc decode_desc(const uint64_t* w) {
  CollectiveDesc d;
  d.kind = static_cast<CollectiveKind>(w[0]);
  d.dtype = static_cast<DType>(w[1]);
  d.op = static_cast<ReduceOp>(w[2]);
  d.root = static_cast<int32_t>(static_cast<int64_t>(w[3]));
  d.count = w[4];
  d.seq = w[5];
  d.tag = w[6];
  return d;
}

}  // namespace zest::mpi
