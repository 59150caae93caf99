#include "dist/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

namespace trainer::net {
namespace {

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head) freeaddrinfo(head);
  }
};

// getaddrinfo for TCP; returns the gai error code (0 on success).
int resolve(const std::string& host, int port, bool passive, AddrInfoList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->head);
}

std::string address_text(const sockaddr_storage& addr) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, buf, sizeof buf);
  } else if (addr.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) {
      inet_ntop(AF_INET, &a6.sin6_addr.s6_addr[12], buf, sizeof buf);
    } else {
      inet_ntop(AF_INET6, &a6.sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

// One non-blocking connect attempt to one address, bounded by `deadline`. Returns the fd or -1 with
// *err set.
int connect_once(const addrinfo& ai, Deadline deadline, int* err) {
  const int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  if (::connect(fd, ai.ai_addr, ai.ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    *err = errno;
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  // A single attempt waits at most 5 s so that a dropped SYN is retried rather than waited out.
  const Deadline attempt_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
  int rc;
  do {
    rc = ::poll(&p, 1, poll_timeout_ms(attempt_deadline));
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) {
    *err = ETIMEDOUT;
    ::close(fd);
    return -1;
  }
  int so_error = 0;
  socklen_t len = sizeof so_error;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
  if (rc < 0 || so_error != 0) {
    *err = rc < 0 ? errno : so_error;
    ::close(fd);
    return -1;
  }
  return fd;
}

bool wait_fd(int fd, short events, Deadline deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the caller's read/write report the error
  }
}

}  // namespace

Deadline deadline_after(std::chrono::milliseconds timeout) {
  // Saturate: "no timeout" is expressed as a very long one.
  const auto now = Clock::now();
  if (timeout > std::chrono::hours(24 * 365)) return now + std::chrono::hours(24 * 365);
  return now + timeout;
}

int poll_timeout_ms(Deadline deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

std::string format_duration(std::chrono::milliseconds d) {
  const int64_t ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  return buf;
}

std::string errno_text(int err) { return std::strerror(err); }

std::string endpoint_str(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Socket listen_on(const std::string& host, int port, int* error) {
  *error = 0;
  AddrInfoList list;
  if (const int gai = resolve(host, port, true, &list); gai != 0) {
    *error = EADDRNOTAVAIL;
    return Socket();
  }
  int last = EADDRNOTAVAIL;
  // Prefer IPv4 when listening on every interface: MASTER_ADDR is almost always an IPv4 name.
  std::vector<const addrinfo*> order;
  for (const addrinfo* ai = list.head; ai; ai = ai->ai_next)
    if (ai->ai_family == AF_INET) order.push_back(ai);
  for (const addrinfo* ai = list.head; ai; ai = ai->ai_next)
    if (ai->ai_family != AF_INET) order.push_back(ai);
  for (const addrinfo* ai : order) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!s.valid()) {
      last = errno;
      continue;
    }
    // SO_REUSEADDR lets a restarted job rebind a port whose old connections linger in TIME_WAIT; a
    // port with a live listener still fails with EADDRINUSE, which is what we want to report.
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s.fd(), 1024) != 0) {
      last = errno;
      continue;
    }
    return s;
  }
  *error = last;
  return Socket();
}

int local_port(const Socket& socket) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in&>(addr).sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6&>(addr).sin6_port);
  return -1;
}

std::string local_ip(const Socket& socket) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  return address_text(addr);
}

namespace {

// The deadline of one wait in a loop that runs `between` checks: the next check's time, or `deadline`
// without checks.
Deadline until_next_check(Deadline deadline, const std::function<void()>& between) {
  return between ? std::min(deadline, Clock::now() + kStopCheckInterval) : deadline;
}

}  // namespace

Socket connect_with_retry(const std::string& host, int port, Deadline deadline, ConnectError* error,
                          std::string* error_text, const std::function<void()>& between) {
  auto backoff = std::chrono::milliseconds(50);

  for (;;) {
    AddrInfoList list;
    const int gai = resolve(host, port, false, &list);
    if (gai != 0) {
      *error = ConnectError::unresolved;
      *error_text = gai_strerror(gai);
    } else {
      for (const addrinfo* ai = list.head; ai; ai = ai->ai_next) {
        int err = 0;
        // With a check between attempts, no attempt may outlast its interval (a SYN into a firewall
        // that drops it).
        const int fd = connect_once(*ai, until_next_check(deadline, between), &err);
        if (fd >= 0) {
          set_nodelay(fd);
          *error = ConnectError::none;
          error_text->clear();
          return Socket(fd);
        }
        *error = err == ECONNREFUSED ? ConnectError::refused
                 : err == ETIMEDOUT  ? ConnectError::timed_out
                                     : ConnectError::unreachable;
        *error_text = errno_text(err);
      }
    }
    if (between) between();
    const auto now = Clock::now();
    if (now >= deadline) return Socket();
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Socket accept_until(const Socket& listener, Deadline deadline, const std::function<void()>& between) {
  for (;;) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      set_nodelay(fd);
      return Socket(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) return Socket();
    if (Clock::now() >= deadline) return Socket();
    if (between) between();
    wait_fd(listener.fd(), POLLIN,
            between ? std::min(deadline, Clock::now() + std::chrono::seconds(1)) : deadline);
  }
}

IoStatus send_all(int fd, const void* data, size_t size, Deadline deadline, int* err) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (Clock::now() >= deadline) return IoStatus::timeout;
      wait_fd(fd, POLLOUT, deadline);
      continue;
    }
    *err = errno;
    return (errno == EPIPE || errno == ECONNRESET) ? IoStatus::closed : IoStatus::error;
  }
  return IoStatus::ok;
}

IoStatus recv_all(int fd, void* data, size_t size, Deadline deadline, int* err) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      *err = 0;
      return IoStatus::closed;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (Clock::now() >= deadline) return IoStatus::timeout;
      wait_fd(fd, POLLIN, deadline);
      continue;
    }
    *err = errno;
    return errno == ECONNRESET ? IoStatus::closed : IoStatus::error;
  }
  return IoStatus::ok;
}

}  // namespace trainer::net
