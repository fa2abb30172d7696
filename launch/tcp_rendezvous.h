// The TCP rendezvous: rank 0 listens at MASTER_ADDR:port, the other ranks
// connect (retrying until rank 0 is up, so rank 0 may start last), each says
// hello with its rank, world size and job id, and once all world_size - 1
// have, rank 0 sends every one of them the blob.
//
//   // zest-example
//   RendezvousMember me{.rank = 1, .world_size = 8};
//   std::string id_on_rank0;  // rank 0's blob; ignored on the others
//   std::string id = tcp_rendezvous("node17", 29501, me, id_on_rank0);
//
// Rank 0 checks every hello: a rank started with another world size, or two
// processes claiming one rank, end the rendezvous with a CommError
// (kMismatch) on rank 0, on the offending rank, and on every rank already
// connected. A connection that does not speak the protocol (a port scanner)
// is dropped and waited past; one from another job (a different non-empty
// job id) is refused and named if the rendezvous then times out.
#pragma once

#include <string>
#include <string_view>

#include "zest/launch/rendezvous.h"

namespace zest {

// Rank 0's side, split from the serving so that the port is known before
// the others are started (tests bind port 0 and pass port() on).
class TcpRendezvousServer {
 public:
  // Listens on bind_host:port. An empty bind_host listens on every interface
  // (what other hosts reach MASTER_ADDR on); port 0 takes a free port.
  // SO_REUSEADDR, so a port an earlier run left in TIME_WAIT is usable.
  TcpRendezvousServer(const std::string& bind_host, int port);
  ~TcpRendezvousServer();
  TcpRendezvousServer(const TcpRendezvousServer&) = delete;
  TcpRendezvousServer& operator=(const TcpRendezvousServer&) = delete;

  int port() const { return port_; }

  // Waits for the hellos of ranks 1..world_size-1, then sends each `blob`.
  // `me.rank` must be 0. Returns once all have been sent.
  void serve(const RendezvousMember& me, std::string_view blob);

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string where_;  // "host:port" for messages
};

// Any rank but 0: connects to host:port, says hello and returns rank 0's blob.
std::string tcp_rendezvous_fetch(const std::string& host, int port, const RendezvousMember& me);

// Rank 0 serves `blob` (listening on bind_host, every interface when empty);
// the others fetch it (their `blob` is ignored). Returns the blob on every rank.
std::string tcp_rendezvous(const std::string& host, int port, const RendezvousMember& me,
                           std::string_view blob, const std::string& bind_host = "");

// A TCP port that was free on 127.0.0.1 a moment ago (bound to port 0 and
// released), for tests that must name rank 0's port before rank 0 starts.
int pick_free_loopback_port();

}  // namespace zest
