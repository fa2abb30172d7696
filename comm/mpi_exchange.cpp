#include "zest/comm/mpi_exchange.h"

#include <algorithm>
#include <cstring>

#include "zest/core/check.h"
#include "zest/core/mpi_check.h"

namespace zest::mpi {

Exchange::Exchange(int rank, int size)
    : rank_(rank),
      size_(size),
      statuses_(2 * static_cast<size_t>(size)),
      all_(static_cast<size_t>(size) * kDescWords),
      got_(static_cast<size_t>(size)) {
  requests_.reserve(2 * static_cast<size_t>(size));
}

std::span<MPI_Request> Exchange::start(MPI_Comm comm, const DescWords& mine,
                                       const std::function<Part(int peer)>& part_for) {
  // Allocated at the first exchange: a communicator that never collects
  // costs nothing.
  const size_t slot = slot_bytes();
  if (recv_.empty()) {
    send_.resize(slot * static_cast<size_t>(size_));
    recv_.resize(slot * static_cast<size_t>(size_));
  }
  std::copy(mine.begin(), mine.end(), all_.begin() + static_cast<ptrdiff_t>(rank_) * kDescWords);
  requests_.clear();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    requests_.push_back(MPI_REQUEST_NULL);
    ZEST_MPI_CHECK(MPI_Irecv(recv_.data() + slot * static_cast<size_t>(r), static_cast<int>(slot), MPI_BYTE, r,
                             kTag, comm, &requests_.back()));
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Part part = part_for(r);
    ZEST_INTERNAL_ASSERT(part.bytes <= kPayloadLimit, "exchange payload of {} bytes over the limit of {}",
                         part.bytes, kPayloadLimit);
    char* out = send_.data() + slot * static_cast<size_t>(r);
    std::memcpy(out, mine.data(), sizeof(DescWords));
    if (part.bytes > 0) std::memcpy(out + sizeof(DescWords), part.data, part.bytes);
    requests_.push_back(MPI_REQUEST_NULL);
    ZEST_MPI_CHECK(MPI_Isend(out, static_cast<int>(sizeof(DescWords) + part.bytes), MPI_BYTE, r, kTag, comm,
                             &requests_.back()));
  }
  return requests_;
}

const char* Exchange::payload(int r) const {
  if (r == rank_) return nullptr;
  return recv_.data() + slot_bytes() * static_cast<size_t>(r) + sizeof(DescWords);
}

void Exchange::finish() {
  const size_t slot = slot_bytes();
  got_[static_cast<size_t>(rank_)] = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    // The receives were posted in rank order, skipping this rank.
    const MPI_Status& status = statuses_[static_cast<size_t>(r < rank_ ? r : r - 1)];
    int bytes = 0;
    ZEST_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &bytes));
    // Only ZEST's exchanges use the tag, on a communicator only ZEST uses.
    ZEST_INTERNAL_ASSERT(bytes >= static_cast<int>(sizeof(DescWords)), "exchange message of {} bytes from rank {}",
                         bytes, r);
    const char* in = recv_.data() + slot * static_cast<size_t>(r);
    std::memcpy(all_.data() + static_cast<size_t>(r) * kDescWords, in, sizeof(DescWords));
    got_[static_cast<size_t>(r)] = static_cast<size_t>(bytes) - sizeof(DescWords);
  }
}

}  // namespace zest::mpi
