// Point-to-point transfers: one rank's buffer to another rank's, as a
// pipeline moves activations forward and their gradients back between
// stages (Communicator::send, recv and send_recv in communicator.h).
//
//   // zest-example: prelude=buffers
//   // Stage s sends its output to s + 1 and receives the gradient of it
//   // back, both at once: a lone send on the host backends waits for its
//   // receive, so two neighbours that each sent first would wait forever.
//   const int next = (comm.rank() + 1) % comm.size();
//   const int prev = (comm.rank() + comm.size() - 1) % comm.size();
//   const zest::P2POp ops[] = {zest::P2POp::send(grads, n, zest::DType::kFloat32, next),
//                              zest::P2POp::recv(grad_shard, n, zest::DType::kFloat32, prev)};
//   comm.send_recv(ops, stream);
//
// Every message is checked like a collective: the sender's and the
// receiver's dtype, element count and tag must agree, message by message in
// the order each pair of ranks sends them (the n-th send from A to B meets
// B's n-th recv from A); a disagreement is a CommError (kMismatch) on both
// ranks naming both calls, never a truncated or reinterpreted buffer. A
// peer that does not post its side within CommOptions::timeout, or that
// left, ends the call in a CommError naming it, and the communicator is
// aborted as for a collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zest/comm/collective.h"
#include "zest/core/dtype.h"

namespace zest {

// One side of a message, for Communicator::send_recv.
struct P2POp {
  bool is_send = true;
  void* buffer = nullptr;  // read for a send, written for a recv
  size_t count = 0;        // elements of `dtype`
  DType dtype = DType::kFloat32;
  int peer = -1;           // the other rank, in this communicator
  uint64_t tag = 0;        // what the message is for; must be the same on both sides

  static P2POp send(const void* buffer, size_t count, DType dtype, int peer, uint64_t tag = 0) {
    // The buffer is only read: the cast keeps one field for both directions.
    return P2POp{true, const_cast<void*>(buffer), count, dtype, peer, tag};
  }
  static P2POp recv(void* buffer, size_t count, DType dtype, int peer, uint64_t tag = 0) {
    return P2POp{false, buffer, count, dtype, peer, tag};
  }
};

// One numbered side of a message, as a backend gets it: desc.kind is kSend
// or kRecv, desc.root the peer, desc.seq the message's number on that pair
// and direction.
struct P2PCall {
  CollectiveDesc desc;
  void* buffer = nullptr;
};

// Whether `send` (on rank `sender`) and `recv` (on rank `receiver`) are two
// sides of one message: the same number, dtype, count and tag, each naming
// the other rank.
bool p2p_match(const CollectiveDesc& send, int sender, const CollectiveDesc& recv, int receiver);

// The error both sides report when they do not match:
//   "<who> transfer mismatch: rank 0's send #2 (8 x fp32, to rank 1) meets
//    rank 1's recv #2 (4 x fp32, from rank 0). ..."
std::string p2p_mismatch_message(std::string_view who, const CollectiveDesc& send, int sender,
                                 const CollectiveDesc& recv, int receiver);

}  // namespace zest
