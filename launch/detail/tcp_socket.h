// Internal to the TCP rendezvous: non-blocking POSIX sockets that never wait
// past a Deadline. The calls that can fail partway return an errno value
// (0 for success) rather than throwing, so that the protocol, which knows
// what a failure means for the rendezvous, words the error; plain misuse
// throws zest::Error.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <string>

#include "zest/launch/rendezvous.h"

namespace zest::tcp {

// Owns a file descriptor; closes it at scope end.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept;
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

// The time left before the deadline (at most `cap`) as poll()'s timeout.
int poll_ms(const Deadline& deadline,
            std::chrono::milliseconds cap = std::chrono::milliseconds(INT_MAX));

// 0 once all `n` bytes are sent, else ETIMEDOUT or the errno that stopped it.
int write_all(int fd, const void* data, size_t n, const Deadline& deadline);

// read_exact's result when the peer closed the connection first.
inline constexpr int kClosed = -1;

// 0 once `n` bytes are read; kClosed when the peer closed first; else
// ETIMEDOUT or the errno that stopped it.
int read_exact(int fd, void* data, size_t n, const Deadline& deadline);

// "[::1]" -> "::1": the brackets of an IPv6 literal in MASTER_ADDR.
std::string unbracket(const std::string& host);

// getaddrinfo's list, freed at scope end.
struct AddrList {
  addrinfo* head = nullptr;
  AddrList() = default;
  AddrList(const AddrList&) = delete;
  AddrList& operator=(const AddrList&) = delete;
  ~AddrList();
};

// getaddrinfo's code (0 on success) for host:port, TCP; `passive` for an
// address to bind.
int resolve(const std::string& host, int port, bool passive, AddrList& out);

// gai_strerror, or errno's text for EAI_SYSTEM.
std::string gai_text(int rc);

// A socket listening on `addr` with SO_REUSEADDR (and dual stack for IPv6),
// or an invalid one with `err` set.
Socket try_listen(const sockaddr* addr, socklen_t len, int family, int& err);

// Listening on every interface at `port`: IPv6 and IPv4 together where the
// host has IPv6, IPv4 alone where not; or an invalid one with `err` set.
Socket listen_any(int port, int& err);

// The port a bound socket has (the one the system chose, for port 0).
int bound_port(int fd);

// A connected socket to `ai`, waiting at most `cap` (and never past the
// deadline); or an invalid one, with `last_error` saying why.
Socket try_connect(const addrinfo& ai, const Deadline& deadline, std::chrono::milliseconds cap,
                   std::string& last_error);

}  // namespace zest::tcp
