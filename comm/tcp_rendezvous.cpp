#include "zest/comm/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/core/check.h"
#include "zest/core/logging.h"

namespace zest {
namespace {

using std::chrono::milliseconds;

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

void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (24 - 8 * i));
}
uint32_t get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | p[i];
  return v;
}
void put64(unsigned char* p, uint64_t v) {
  put32(p, static_cast<uint32_t>(v >> 32));
  put32(p + 4, static_cast<uint32_t>(v));
}
uint64_t get64(const unsigned char* p) { return (uint64_t{get32(p)} << 32) | get32(p + 4); }

// 0 for "no job id", so that only two named jobs can disagree.
uint64_t job_hash(std::string_view id) {
  if (id.empty()) return 0;
  uint64_t h = 1469598103934665603ull;
  for (char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    // Linux frees the descriptor even when close reports an error, so there
    // is nothing to retry; the error is only worth a line in the log.
    if (fd_ >= 0 && ::close(fd_) != 0 && errno != EINTR) {
      ZEST_LOG_WARN("closing a rendezvous socket failed: {}", errno_text(errno));
    }
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

int poll_ms(const Deadline& deadline, milliseconds cap = milliseconds(INT_MAX)) {
  return static_cast<int>(std::clamp<int64_t>(std::min(deadline.remaining(), cap).count(), 0, INT_MAX));
}

// 0 once all `n` bytes are sent, else ETIMEDOUT or the errno that stopped it.
int write_all(int fd, const void* data, size_t n, const Deadline& deadline) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    if (deadline.passed()) return ETIMEDOUT;
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, poll_ms(deadline)) < 0 && errno != EINTR) return errno;
  }
  return 0;
}

constexpr int kClosed = -1;

// 0 once `n` bytes are read; kClosed when the peer closed first; else
// ETIMEDOUT or the errno that stopped it.
int read_exact(int fd, void* data, size_t n, const Deadline& deadline) {
  auto* p = static_cast<unsigned char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    if (deadline.passed()) return ETIMEDOUT;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, poll_ms(deadline)) < 0 && errno != EINTR) return errno;
  }
  return 0;
}

std::string reply(Status status, int world_size, std::string_view payload) {
  std::string out(kReplyBytes, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  put32(p, kMagic);
  put32(p + 4, status);
  put32(p + 8, static_cast<uint32_t>(world_size));
  put32(p + 12, static_cast<uint32_t>(payload.size()));
  out.append(payload);
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

std::string unbracket(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// Names and IP literals only: a typo is reported as one, not looked up.
void check_host(const std::string& host, std::string_view role) {
  const std::string h = unbracket(host);
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

void check_member(const RendezvousMember& me, std::string_view kind) {
  ZEST_CHECK(me.world_size >= 1 && me.rank >= 0 && me.rank < me.world_size,
             "{} rendezvous: rank {} is not a rank of a world of {}", kind, me.rank, me.world_size);
  ZEST_CHECK(me.timeout.count() > 0, "{} rendezvous: the timeout must be positive, got {} ms",
             kind, me.timeout.count());
}

struct AddrList {
  addrinfo* head = nullptr;
  AddrList() = default;
  AddrList(const AddrList&) = delete;
  AddrList& operator=(const AddrList&) = delete;
  ~AddrList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

// getaddrinfo's code (0 on success); `passive` for an address to bind.
int resolve(const std::string& host, int port, bool passive, AddrList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  const std::string h = unbracket(host);
  return getaddrinfo(h.c_str(), service.c_str(), &hints, &out.head);
}

std::string gai_text(int rc) { return rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc); }

// A listening socket on `addr`, or an invalid one with `err` set.
Socket try_listen(const sockaddr* addr, socklen_t len, int family, int& err) {
  Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) {
    err = errno;
    return {};
  }
  const int one = 1;
  if (::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    err = errno;
    return {};
  }
  if (family == AF_INET6) {
    // Dual stack: IPv4 peers reach "::" too.
    const int zero = 0;
    if (::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) != 0) {
      err = errno;
      return {};
    }
  }
  if (::bind(s.get(), addr, len) != 0 || ::listen(s.get(), SOMAXCONN) != 0) {
    err = errno;
    return {};
  }
  return s;
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ZEST_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0,
             "TCP rendezvous: getsockname failed: {}", errno_text(errno));
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
}

}  // namespace

TcpRendezvousServer::TcpRendezvousServer(const std::string& bind_host, int port) {
  check_port(port, 0);
  if (!bind_host.empty()) check_host(bind_host, "the bind address");
  int err = 0;
  Socket s;
  if (bind_host.empty()) {
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(static_cast<uint16_t>(port));
    s = try_listen(reinterpret_cast<const sockaddr*>(&any6), sizeof(any6), AF_INET6, err);
    if (!s.valid() && err != EADDRINUSE) {  // no IPv6 here: IPv4 alone
      sockaddr_in any4{};
      any4.sin_family = AF_INET;
      any4.sin_addr.s_addr = htonl(INADDR_ANY);
      any4.sin_port = htons(static_cast<uint16_t>(port));
      s = try_listen(reinterpret_cast<const sockaddr*>(&any4), sizeof(any4), AF_INET, err);
    }
  } else {
    AddrList addrs;
    const int rc = resolve(bind_host, port, true, addrs);
    ZEST_CHECK(rc == 0, "TCP rendezvous: cannot resolve the address '{}' for rank 0 to listen on: "
                        "{}; set MASTER_ADDR to this host's name or IP address",
               bind_host, gai_text(rc));
    for (addrinfo* ai = addrs.head; ai != nullptr && !s.valid(); ai = ai->ai_next) {
      s = try_listen(ai->ai_addr, ai->ai_addrlen, ai->ai_family, err);
    }
  }
  const std::string where = fmt::format("{}:{}", bind_host.empty() ? "*" : bind_host, port);
  ZEST_CHECK(s.valid(), "TCP rendezvous: rank 0 cannot listen on {}: {}{}", where, errno_text(err),
             err == EADDRINUSE ? ". Another process holds the port (an earlier run, or torchrun's "
                                 "own store): choose another MASTER_PORT, or set ZEST_MASTER_PORT"
                               : "");
  port_ = bound_port(s.get());
  where_ = fmt::format("{}:{}", bind_host.empty() ? "*" : bind_host, port_);
  fd_ = s.release();
}

TcpRendezvousServer::~TcpRendezvousServer() { Socket closing(fd_); }

void TcpRendezvousServer::serve(const RendezvousMember& me, std::string_view blob) {
  check_member(me, "TCP");
  ZEST_CHECK(me.rank == 0, "TCP rendezvous: only rank 0 serves, not rank {}", me.rank);
  ZEST_CHECK(blob.size() <= kMaxRendezvousBlob, "TCP rendezvous: a blob of {} bytes is more than "
                                                "the {} a rendezvous carries",
             blob.size(), kMaxRendezvousBlob);
  const Deadline deadline(me.timeout);
  const int world = me.world_size;
  const uint64_t my_job = job_hash(me.job_id);

  struct Pending {
    Socket sock;
    unsigned char hello[kHelloBytes] = {};
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
      if (s.valid()) (void)write_all(s.get(), note.data(), note.size(), brief);
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
    (void)write_all(s.get(), r.data(), r.size(), brief);
  };

  // Returns whether the connection is kept (a valid rank of this job).
  auto take_hello = [&](Pending& p) {
    const unsigned char* h = p.hello;
    if (get32(h) != kMagic) {
      ZEST_LOG_WARN("TCP rendezvous at {}: dropped a connection that did not greet as a ZEST rank",
                    where_);
      return;
    }
    const uint32_t version = get32(h + 4);
    const int rank = static_cast<int>(get32(h + 8));
    const int their_world = static_cast<int>(get32(h + 12));
    const uint64_t their_job = get64(h + 16);
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
      const std::string message = fmt::format(
          "TCP rendezvous at {} timed out on rank 0 of {} after {} ms: {} connected, {} did "
          "not{}. Start every rank with the same MASTER_ADDR and MASTER_PORT, and check that "
          "they can reach this host",
          where_, world, deadline.elapsed().count(), rank_list(here), rank_list(missing), refused);
      tell_all(message);
      throw CommError(CommError::Reason::kTimeout, message, __FILE__, __LINE__);
    }
    std::vector<pollfd> fds;
    fds.push_back({fd_, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.sock.get(), POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), poll_ms(deadline));
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
    const int err = write_all(ranks[static_cast<size_t>(r)].get(), ok.data(), ok.size(), deadline);
    if (err != 0) {
      fail(CommError::Reason::kBackend,
           fmt::format("could not send the blob to rank {}: {}", r,
                       err == ETIMEDOUT ? "timed out" : errno_text(err)));
    }
  }
}

std::string tcp_rendezvous_fetch(const std::string& host, int port, const RendezvousMember& me) {
  check_member(me, "TCP");
  ZEST_CHECK(me.rank != 0, "TCP rendezvous: rank 0 serves the blob; it does not fetch it");
  check_port(port, 1);
  check_host(host, "MASTER_ADDR");
  const std::string where = fmt::format("{}:{}", host, port);
  const Deadline deadline(me.timeout);
  auto timeout = [&](const std::string& what) {
    throw CommError(CommError::Reason::kTimeout,
                    fmt::format("TCP rendezvous at {} timed out on rank {} of {} after {} ms: {}",
                                where, me.rank, me.world_size, deadline.elapsed().count(), what),
                    __FILE__, __LINE__);
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
    AddrList addrs;
    const int rc = resolve(host, port, false, addrs);
    if (rc == EAI_AGAIN) {  // the resolver is busy or unreachable for now
      last_error = gai_text(rc);
    } else {
      ZEST_CHECK(rc == 0, "TCP rendezvous: rank {} cannot resolve MASTER_ADDR '{}': {}; set it to "
                          "rank 0's host name or IP address",
                 me.rank, host, gai_text(rc));
      for (addrinfo* ai = addrs.head; ai != nullptr && !sock.valid(); ai = ai->ai_next) {
        Socket s(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
        if (!s.valid()) {
          last_error = errno_text(errno);
          continue;
        }
        if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
          sock = std::move(s);
          break;
        }
        if (errno != EINPROGRESS) {
          last_error = errno_text(errno);
          continue;
        }
        pollfd pfd{s.get(), POLLOUT, 0};
        const int n = ::poll(&pfd, 1, poll_ms(deadline, milliseconds(1000)));
        if (n < 0) {
          last_error = errno_text(errno);
          continue;
        }
        if (n == 0) {
          last_error = "connect timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err == 0) {
          sock = std::move(s);
        } else {
          last_error = errno_text(err);
        }
      }
    }
    if (!sock.valid()) {
      sleep_within(deadline, backoff);
      backoff = std::min(backoff * 2, milliseconds(250));
    }
  }

  unsigned char hello[kHelloBytes];
  put32(hello, kMagic);
  put32(hello + 4, kVersion);
  put32(hello + 8, static_cast<uint32_t>(me.rank));
  put32(hello + 12, static_cast<uint32_t>(me.world_size));
  put64(hello + 16, job_hash(me.job_id));
  int err = write_all(sock.get(), hello, sizeof(hello), deadline);
  if (err == ETIMEDOUT) timeout("could not send its hello to rank 0");
  ZEST_CHECK(err == 0, "TCP rendezvous at {}: rank {} could not send its hello to rank 0: {}",
             where, me.rank, errno_text(err));

  unsigned char head[kReplyBytes];
  err = read_exact(sock.get(), head, sizeof(head), deadline);
  if (err == ETIMEDOUT) {
    timeout(fmt::format("connected to rank 0, but it had not answered: rank 0 answers once all {} "
                        "ranks have connected, and some did not (or MASTER_PORT is another "
                        "service's port, such as torchrun's store: set ZEST_MASTER_PORT)",
                        me.world_size));
  }
  ZEST_CHECK(err != kClosed, "TCP rendezvous at {}: rank 0 closed the connection of rank {} "
                             "without an answer; see rank 0's log for why",
             where, me.rank);
  ZEST_CHECK(err == 0, "TCP rendezvous at {}: rank {} lost its connection to rank 0: {}", where,
             me.rank, errno_text(err));
  ZEST_CHECK(get32(head) == kMagic, "TCP rendezvous: {} answered rank {}, but not as ZEST's rank "
                                    "0: is MASTER_PORT another service's port (torchrun's store)? "
                                    "Set ZEST_MASTER_PORT to a free port",
             where, me.rank);
  const uint32_t status = get32(head + 4);
  const uint32_t length = get32(head + 12);
  ZEST_CHECK(length <= kMaxRendezvousBlob, "TCP rendezvous at {}: rank 0 announced {} bytes, more "
                                           "than a rendezvous carries",
             where, length);
  std::string payload(length, '\0');
  err = read_exact(sock.get(), payload.data(), length, deadline);
  if (err == ETIMEDOUT) timeout("rank 0's answer did not arrive in full");
  ZEST_CHECK(err == 0, "TCP rendezvous at {}: rank {} lost its connection to rank 0 during its "
                       "answer: {}",
             where, me.rank, err == kClosed ? "closed" : errno_text(err));
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
  return bound_port(s.get());
}

}  // namespace zest
