// Checks point-to-point transfers of a Communicator, bit for bit, for every
// dtype and for counts below and above what one MPI message carries
// (4 KiB: 4099 x int64 is 32 KiB): a grouped ring (each rank sends to the
// next and receives from the previous at once, which would deadlock as lone
// sends), both neighbours at once with two messages per pair (the order of
// messages to one peer is kept), and lone send/recv pairs. Shared by the
// in-process tests and the MPI test program.
#pragma once

#include <doctest/doctest.h>

#include <vector>

#include "comm/conformance.h"

namespace zest::test {

inline constexpr size_t kP2PCounts[] = {0, 1, 7, 1000, 4099};

// The bytes rank `from` sends as message `k` of `count` elements.
inline std::vector<unsigned char> p2p_message(DType t, int from, int k, size_t count) {
  return make_input(t, from * 3 + k, 0, count, 1);
}

inline void check_p2p_transfers(Communicator& comm, const Stream& stream) {
  const int w = comm.size();
  const int r = comm.rank();
  if (w == 1) return;
  const int next = (r + 1) % w;
  const int prev = (r + w - 1) % w;
  for (const DType t : kAllDTypes) {
    for (const size_t count : kP2PCounts) {
      CAPTURE(dtype_name(t));
      CAPTURE(count);
      const size_t bytes = count * elem_size(t);
      // A ring, all at once.
      {
        const std::vector<unsigned char> out = p2p_message(t, r, 0, count);
        std::vector<unsigned char> in = make_poisoned(bytes);
        const P2POp ops[] = {P2POp::send(out.data(), count, t, next), P2POp::recv(in.data(), count, t, prev)};
        comm.send_recv(ops, stream);
        CHECK(same_bytes(p2p_message(t, prev, 0, count), in.data(), bytes));
      }
      // Both neighbours, two messages each way per pair, receives listed
      // first: messages to one peer arrive in the order they were sent.
      if (w >= 3) {
        std::vector<std::vector<unsigned char>> out, in;
        for (int k = 0; k < 4; ++k) out.push_back(p2p_message(t, r, k, count));
        for (int k = 0; k < 4; ++k) in.push_back(make_poisoned(bytes));
        const P2POp ops[] = {P2POp::recv(in[0].data(), count, t, prev, 7), P2POp::recv(in[1].data(), count, t, prev, 8),
                             P2POp::recv(in[2].data(), count, t, next, 7), P2POp::recv(in[3].data(), count, t, next, 8),
                             P2POp::send(out[0].data(), count, t, next, 7), P2POp::send(out[1].data(), count, t, next, 8),
                             P2POp::send(out[2].data(), count, t, prev, 7), P2POp::send(out[3].data(), count, t, prev, 8)};
        comm.send_recv(ops, stream);
        CHECK(same_bytes(p2p_message(t, prev, 0, count), in[0].data(), bytes));
        CHECK(same_bytes(p2p_message(t, prev, 1, count), in[1].data(), bytes));
        CHECK(same_bytes(p2p_message(t, next, 2, count), in[2].data(), bytes));
        CHECK(same_bytes(p2p_message(t, next, 3, count), in[3].data(), bytes));
      }
      // Lone send and recv: rank 2k sends to 2k + 1 (an odd world's last
      // rank sits out).
      const int partner = r ^ 1;
      if (partner < w) {
        std::vector<unsigned char> buf = r % 2 == 0 ? p2p_message(t, r, 0, count) : make_poisoned(bytes);
        if (r % 2 == 0) {
          comm.send(buf.data(), count, t, partner, stream, 42);
        } else {
          comm.recv(buf.data(), count, t, partner, stream, 42);
          CHECK(same_bytes(p2p_message(t, partner, 0, count), buf.data(), bytes));
        }
      }
    }
  }
}

}  // namespace zest::test
