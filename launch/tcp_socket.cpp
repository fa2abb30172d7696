#include "zest/launch/detail/tcp_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"

namespace zest::tcp {

Socket::Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

int Socket::release() { return std::exchange(fd_, -1); }

void Socket::reset() {
  // Linux frees the descriptor even when close reports an error, so there
  // is nothing to retry; the error is only worth a line in the log.
  if (fd_ >= 0 && ::close(fd_) != 0 && errno != EINTR) {
    ZEST_LOG_WARN("closing a rendezvous socket failed: {}", errno_text(errno));
  }
  fd_ = -1;
}

int poll_ms(const Deadline& deadline, std::chrono::milliseconds cap) {
  return static_cast<int>(std::clamp<int64_t>(std::min(deadline.remaining(), cap).count(), 0, INT_MAX));
}

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

std::string unbracket(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

AddrList::~AddrList() {
  if (head != nullptr) freeaddrinfo(head);
}

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

Socket listen_any(int port, int& err) {
  sockaddr_in6 any6{};
  any6.sin6_family = AF_INET6;
  any6.sin6_addr = in6addr_any;
  any6.sin6_port = htons(static_cast<uint16_t>(port));
  Socket s = try_listen(reinterpret_cast<const sockaddr*>(&any6), sizeof(any6), AF_INET6, err);
  if (s.valid() || err == EADDRINUSE) return s;
  // No IPv6 here: IPv4 alone.
  sockaddr_in any4{};
  any4.sin_family = AF_INET;
  any4.sin_addr.s_addr = htonl(INADDR_ANY);
  any4.sin_port = htons(static_cast<uint16_t>(port));
  return try_listen(reinterpret_cast<const sockaddr*>(&any4), sizeof(any4), AF_INET, err);
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ZEST_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0,
             "TCP rendezvous: getsockname failed: {}", errno_text(errno));
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
}

Socket try_connect(const addrinfo& ai, const Deadline& deadline, std::chrono::milliseconds cap,
                   std::string& last_error) {
  Socket s(::socket(ai.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol));
  if (!s.valid()) {
    last_error = errno_text(errno);
    return {};
  }
  if (::connect(s.get(), ai.ai_addr, ai.ai_addrlen) == 0) return s;
  if (errno != EINPROGRESS) {
    last_error = errno_text(errno);
    return {};
  }
  pollfd pfd{s.get(), POLLOUT, 0};
  const int n = ::poll(&pfd, 1, poll_ms(deadline, cap));
  if (n < 0) {
    last_error = errno_text(errno);
    return {};
  }
  if (n == 0) {
    last_error = "connect timed out";
    return {};
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    last_error = errno_text(err);
    return {};
  }
  return s;
}

}  // namespace zest::tcp
