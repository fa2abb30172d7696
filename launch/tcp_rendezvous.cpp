// The TCP rendezvous protocol: rank 0 gathers every rank's hello, checks it,
// and answers each with the blob or with why the rendezvous ended. The
// sockets under it, with their deadlines, are tcp_socket.h's.
#include "zest/launch/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/launch/detail/rendezvous_wire.h"
#include "zest/launch/detail/tcp_socket.h"
#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"

namespace zest {
namespace {

using std::chrono::milliseconds;
using tcp::Socket;

// The wire format, big-endian:
//   hello (rank -> rank 0): magic, version, rank, world size, job hash (u64)
//   reply (rank 0 -> rank): magic, status, world size, length, then `length`
//                           bytes: the blob (kOk) or rank 0's reason (others)
constexpr uint32_t kMagic = 0x5a455354;  // "ZEST"
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloBytes = 24;
constexpr size_t kReplyBytes = 16;

enum Status : uint32_t {
  kOk = 0,
  kWorldSizeMismatch = 1,
  kDuplicateRank = 2,
  kBadRank = 3,
  kOtherJob = 4,
  kVersionMismatch = 5,
  kAborted = 6,  // another rank's hello ended the rendezvous
};

// 0 for "no job id", so that only two named jobs can disagree.
uint64_t job_hash(std::string_view id) {
  if (id.empty()) return 0;
  const uint64_t h = wire::fnv1a(id);
  return h == 0 ? 1 : h;
}

std::string hello(const RendezvousMember& me) {
  std::string out;
  wire::put32(out, kMagic);
  wire::put32(out, kVersion);
  wire::put32(out, static_cast<uint32_t>(me.rank));
  wire::put32(out, static_cast<uint32_t>(me.world_size));
  wire::put64(out, job_hash(me.job_id));
  return out;
}

std::string reply(Status status, int world_size, std::string_view payload) {
  std::string out;
  wire::put32(out, kMagic);
  wire::put32(out, status);
  wire::put32(out, static_cast<uint32_t>(world_size));
  wire::put32(out, static_cast<uint32_t>(payload.size()));
  out.append(payload);
  return out;
}

// Names and IP literals only: a typo is reported as one, not looked up.
void check_host(const std::string& host, std::string_view role) {
  const std::string h = tcp::unbracket(host);
  const bool ok = !h.empty() && h.size() <= 253 && std::all_of(h.begin(), h.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
  });
  ZEST_CHECK(ok, "TCP rendezvous: '{}' is not a host name or IP address; set {} to rank 0's host "
                 "name or IP address",
             host, role);
}

void check_port(int port, int lowest) {
  ZEST_CHECK(port >= lowest && port <= 65535,
             "TCP rendezvous: port {} is not a TCP port; use {}..65535 (MASTER_PORT, or "
             "ZEST_MASTER_PORT)",
             port, lowest);
}

}  // namespace

TcpRendezvousServer::TcpRendezvousServer(const std::string& bind_host, int port) {
  check_port(port, 0);
  if (!bind_host.empty()) check_host(bind_host, "the bind address");
  int err = 0;
  Socket s;
  if (bind_host.empty()) {
    s = tcp::listen_any(port, err);
  } else {
    tcp::AddrList addrs;
    const int rc = tcp::resolve(bind_host, port, true, addrs);
    ZEST_CHECK(rc == 0, "TCP rendezvous: cannot resolve the address '{}' for rank 0 to listen on: "
                        "{}; set MASTER_ADDR to this host's name or IP address",
               bind_host, tcp::gai_text(rc));
    for (addrinfo* ai = addrs.head; ai != nullptr && !s.valid(); ai = ai->ai_next) {
      s = tcp::try_listen(ai->ai_addr, ai->ai_addrlen, ai->ai_family, err);
    }
  }
  const std::string where = fmt::format("{}:{}", bind_host.empty() ? "*" : bind_host, port);
  ZEST_CHECK(s.valid(), "TCP rendezvous: rank 0 cannot listen on {}: {}{}", where, errno_text(err),
             err == EADDRINUSE ? ". Another process holds the port (an earlier run, or torchrun's "
                                 "own store): choose another MASTER_PORT, or set ZEST_MASTER_PORT"
                               : "");
  port_ = tcp::bound_port(s.get());
  where_ = fmt::format("{}:{}", bind_host.empty() ? "*" : bind_host, port_);
  fd_ = s.release();
}

TcpRendezvousServer::~TcpRendezvousServer() { Socket closing(fd_); }

void TcpRendezvousServer::serve(const RendezvousMember& me, std::string_view blob) {
  check_rendezvous_member(me, "TCP");
  ZEST_CHECK(me.rank == 0, "TCP rendezvous: only rank 0 serves, not rank {}", me.rank);
  check_rendezvous_blob(blob, "TCP");
  const Deadline deadline(me.timeout);
  const int world = me.world_size;
  const uint64_t my_job = job_hash(me.job_id);

  struct Pending {
    Socket sock;
    char hello[kHelloBytes] = {};
    size_t got = 0;
  };
  std::vector<Pending> pending;  // connected, hello not complete yet
  std::vector<Socket> ranks(static_cast<size_t>(world));  // by rank, once they said hello
  int arrived = 0;
  std::string refused;  // connections from other jobs, for the timeout message

  // Tells every rank already here why the rendezvous ended, so that they
  // fail now with rank 0's reason instead of at their own timeout.
  auto tell_all = [&](const std::string& why) {
    const std::string note = reply(kAborted, world, why);
    const Deadline brief(milliseconds(1000));
    for (Socket& s : ranks) {
      if (s.valid()) (void)tcp::write_all(s.get(), note.data(), note.size(), brief);
    }
  };
  auto fail = [&](CommError::Reason reason, const std::string& why) {
    tell_all(why);
    throw CommError(reason, fmt::format("TCP rendezvous at {} on rank 0: {}", where_, why),
                    __FILE__, __LINE__);
  };
  auto answer = [&](Socket& s, Status status, const std::string& why) {
    const std::string r = reply(status, world, why);
    const Deadline brief(std::min(deadline.remaining(), milliseconds(1000)));
    (void)tcp::write_all(s.get(), r.data(), r.size(), brief);
  };

  // Returns whether the connection is kept (a valid rank of this job).
  auto take_hello = [&](Pending& p) {
    wire::Cursor h(std::string_view(p.hello, kHelloBytes));
    if (h.u32() != kMagic) {
      ZEST_LOG_WARN("TCP rendezvous at {}: dropped a connection that did not greet as a ZEST rank",
                    where_);
      return;
    }
    const uint32_t version = h.u32();
    const int rank = static_cast<int>(h.u32());
    const int their_world = static_cast<int>(h.u32());
    const uint64_t their_job = h.u64();
    if (version != kVersion) {
      const std::string why = fmt::format(
          "rank {} speaks rendezvous protocol {} but rank 0 speaks {}: every rank must run the "
          "same build of ZEST", rank, version, kVersion);
      answer(p.sock, kVersionMismatch, why);
      fail(CommError::Reason::kMismatch, why);
    }
    if (my_job != 0 && their_job != 0 && my_job != their_job) {
      // Not ours: a rank of another run that found this port. Turn it away
      // and keep waiting for our own.
      answer(p.sock, kOtherJob, fmt::format("rank 0 at {} belongs to job '{}', not this rank's: "
                                            "MASTER_ADDR/MASTER_PORT name another run's rank 0",
                                            where_, me.job_id));
      refused += fmt::format("; turned away a rank {} of another job", rank);
      return;
    }
    if (their_world != world) {
      const std::string why = fmt::format(
          "rank {} was started for a world of {} ranks but rank 0 for {}: every rank must be "
          "started with the same world size (WORLD_SIZE, -np or -n)", rank, their_world, world);
      answer(p.sock, kWorldSizeMismatch, why);
      fail(CommError::Reason::kMismatch, why);
    }
    if (rank <= 0 || rank >= world) {
      const std::string why = fmt::format(
          "a process connected as rank {}, which is {} in a world of {}: check each process's "
          "RANK (or its launcher's rank variable)", rank, rank == 0 ? "rank 0's own" : "not a rank",
          world);
      answer(p.sock, kBadRank, why);
      fail(CommError::Reason::kMismatch, why);
    }
    if (ranks[static_cast<size_t>(rank)].valid()) {
      const std::string why = fmt::format(
          "two processes connected as rank {}: every process needs its own rank (check RANK, or "
          "that two jobs do not share MASTER_ADDR/MASTER_PORT)", rank);
      answer(p.sock, kDuplicateRank, why);
      fail(CommError::Reason::kMismatch, why);
    }
    ranks[static_cast<size_t>(rank)] = std::move(p.sock);
    ++arrived;
  };

  while (arrived < world - 1) {
    if (deadline.passed()) {
      std::vector<int> here;
      std::vector<int> missing;
      for (int r = 1; r < world; ++r) (ranks[static_cast<size_t>(r)].valid() ? here : missing).push_back(r);
      const std::string message = rendezvous_timeout_message(
          "TCP", where_, me, deadline,
          fmt::format("{} connected, {} did not{}. Start every rank with the same MASTER_ADDR and "
                      "MASTER_PORT, and check that they can reach this host",
                      rank_list(here), rank_list(missing), refused));
      tell_all(message);
      throw CommError(CommError::Reason::kTimeout, message, __FILE__, __LINE__);
    }
    std::vector<pollfd> fds;
    fds.push_back({fd_, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.sock.get(), POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), tcp::poll_ms(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      ZEST_FAIL("TCP rendezvous at {}: poll failed on rank 0: {}", where_, errno_text(errno));
    }
    if (n == 0) continue;
    // Hellos first: `pending` grows below, which would shift fds.
    std::vector<bool> drop(pending.size(), false);
    for (size_t i = 0; i < pending.size(); ++i) {
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Pending& p = pending[i];
      const ssize_t r = ::recv(p.sock.get(), p.hello + p.got, kHelloBytes - p.got, 0);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (r <= 0) {  // closed or reset before its hello: nothing to answer
        drop[i] = true;
        continue;
      }
      p.got += static_cast<size_t>(r);
      if (p.got == kHelloBytes) {
        take_hello(p);
        drop[i] = true;  // kept connections were moved into `ranks`
      }
    }
    for (size_t i = pending.size(); i-- > 0;) {
      if (drop[i]) pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (fds[0].revents & (POLLERR | POLLNVAL)) {
      ZEST_FAIL("TCP rendezvous at {}: the listening socket failed on rank 0", where_);
    }
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c >= 0) {
          pending.push_back(Pending{Socket(c)});
          continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        // A connection that went away before it was taken: not an error.
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        fail(CommError::Reason::kBackend, fmt::format("accept failed: {}", errno_text(errno)));
      }
    }
  }

  const std::string ok = reply(kOk, world, blob);
  for (int r = 1; r < world; ++r) {
    const int err = tcp::write_all(ranks[static_cast<size_t>(r)].get(), ok.data(), ok.size(), deadline);
    if (err != 0) {
      fail(CommError::Reason::kBackend,
           fmt::format("could not send the blob to rank {}: {}", r,
                       err == ETIMEDOUT ? "timed out" : errno_text(err)));
    }
  }
}

std::string tcp_rendezvous_fetch(const std::string& host, int port, const RendezvousMember& me) {
  check_rendezvous_member(me, "TCP");
  ZEST_CHECK(me.rank != 0, "TCP rendezvous: rank 0 serves the blob; it does not fetch it");
  check_port(port, 1);
  check_host(host, "MASTER_ADDR");
  const std::string where = fmt::format("{}:{}", host, port);
  const Deadline deadline(me.timeout);
  auto timeout = [&](const std::string& what) {
    throw CommError(CommError::Reason::kTimeout,
                    rendezvous_timeout_message("TCP", where, me, deadline, what), __FILE__, __LINE__);
  };

  // Connect, retrying: rank 0 may not be listening yet.
  Socket sock;
  std::string last_error = "none";
  milliseconds backoff(10);
  while (!sock.valid()) {
    if (deadline.passed()) {
      timeout(fmt::format("could not connect to rank 0 (last error: {}). Check that rank 0 is "
                          "running and that MASTER_ADDR and MASTER_PORT are the same on every rank",
                          last_error));
    }
    tcp::AddrList addrs;
    const int rc = tcp::resolve(host, port, false, addrs);
    if (rc == EAI_AGAIN) {  // the resolver is busy or unreachable for now
      last_error = tcp::gai_text(rc);
    } else {
      ZEST_CHECK(rc == 0, "TCP rendezvous: rank {} cannot resolve MASTER_ADDR '{}': {}; set it to "
                          "rank 0's host name or IP address",
                 me.rank, host, tcp::gai_text(rc));
      for (addrinfo* ai = addrs.head; ai != nullptr && !sock.valid(); ai = ai->ai_next) {
        sock = tcp::try_connect(*ai, deadline, milliseconds(1000), last_error);
      }
    }
    if (!sock.valid()) {
      sleep_within(deadline, backoff);
      backoff = std::min(backoff * 2, milliseconds(250));
    }
  }

  const std::string greeting = hello(me);
  int err = tcp::write_all(sock.get(), greeting.data(), greeting.size(), deadline);
  if (err == ETIMEDOUT) timeout("could not send its hello to rank 0");
  ZEST_CHECK(err == 0, "TCP rendezvous at {}: rank {} could not send its hello to rank 0: {}",
             where, me.rank, errno_text(err));

  char head[kReplyBytes];
  err = tcp::read_exact(sock.get(), head, sizeof(head), deadline);
  if (err == ETIMEDOUT) {
    timeout(fmt::format("connected to rank 0, but it had not answered: rank 0 answers once all {} "
                        "ranks have connected, and some did not (or MASTER_PORT is another "
                        "service's port, such as torchrun's store: set ZEST_MASTER_PORT)",
                        me.world_size));
  }
  ZEST_CHECK(err != tcp::kClosed,
             "TCP rendezvous at {}: rank 0 closed the connection of rank {} without an answer; "
             "see rank 0's log for why",
             where, me.rank);
  ZEST_CHECK(err == 0, "TCP rendezvous at {}: rank {} lost its connection to rank 0: {}", where,
             me.rank, errno_text(err));
  wire::Cursor answer(std::string_view(head, kReplyBytes));
  ZEST_CHECK(answer.u32() == kMagic, "TCP rendezvous: {} answered rank {}, but not as ZEST's rank "
                                     "0: is MASTER_PORT another service's port (torchrun's store)? "
                                     "Set ZEST_MASTER_PORT to a free port",
             where, me.rank);
  const uint32_t status = answer.u32();
  (void)answer.u32();  // rank 0's world size: unused, a mismatch comes with rank 0's reason
  const uint32_t length = answer.u32();
  ZEST_CHECK(length <= kMaxRendezvousBlob, "TCP rendezvous at {}: rank 0 announced {} bytes, more "
                                           "than a rendezvous carries",
             where, length);
  std::string payload(length, '\0');
  err = tcp::read_exact(sock.get(), payload.data(), length, deadline);
  if (err == ETIMEDOUT) timeout("rank 0's answer did not arrive in full");
  ZEST_CHECK(err == 0, "TCP rendezvous at {}: rank {} lost its connection to rank 0 during its "
                       "answer: {}",
             where, me.rank, err == tcp::kClosed ? "closed" : errno_text(err));
  if (status != kOk) {
    const auto reason = status == kAborted ? CommError::Reason::kAborted : CommError::Reason::kMismatch;
    throw CommError(reason,
                    fmt::format("TCP rendezvous at {} refused rank {} of {}: rank 0 says: {}", where,
                                me.rank, me.world_size, payload),
                    __FILE__, __LINE__);
  }
  return payload;
}

std::string tcp_rendezvous(const std::string& host, int port, const RendezvousMember& me,
                           std::string_view blob, const std::string& bind_host) {
  if (me.rank != 0) return tcp_rendezvous_fetch(host, port, me);
  check_port(port, 1);
  TcpRendezvousServer server(bind_host, port);
  server.serve(me, blob);
  return std::string(blob);
}

int pick_free_loopback_port() {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ZEST_CHECK(s.valid(), "socket failed: {}", errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ZEST_CHECK(::bind(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0,
             "binding 127.0.0.1:0 failed: {}", errno_text(errno));
  return tcp::bound_port(s.get());
}

}  // namespace zest
