#pragma once
// TCP plumbing shared by the store and the CPU communicator (internal to dist/): RAII sockets, listen,
// connect with retry and backoff, and send/receive with a deadline. Every socket is non-blocking and
// every wait goes through poll() with a deadline, so nothing here can block forever. Sends use
// MSG_NOSIGNAL: a peer that died must produce an error, never a SIGPIPE that kills this process.
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace trainer::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

Deadline deadline_after(std::chrono::milliseconds timeout);
// Milliseconds left until `deadline` for poll(): 0 when passed, capped to fit an int.
int poll_timeout_ms(Deadline deadline);
// "30 s", "2.5 s", "120 ms": durations in messages.
std::string format_duration(std::chrono::milliseconds d);
std::string errno_text(int err);
// "host:port", or "[v6]:port".
std::string endpoint_str(const std::string& host, int port);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Sends FIN after queued data; the peer reads what was sent, then end-of-stream.
  void shutdown_write();

 private:
  int fd_ = -1;
};

// Listens on host:port (host "" = every interface; port 0 = any free port). On failure returns an
// invalid socket and sets *error to the errno (EADDRINUSE when the port is taken).
Socket listen_on(const std::string& host, int port, int* error);
int local_port(const Socket& socket);
// The local IP address of a connected socket: the address of the interface that routes to the peer,
// which is what other ranks can reach this host on.
std::string local_ip(const Socket& socket);

// How often a connection loop runs its `between` check (below), and a store wait checks for a stop
// signal (dist/store.h).
constexpr std::chrono::milliseconds kStopCheckInterval{1000};

enum class ConnectError { none, refused, unreachable, timed_out, unresolved };
// Connects to host:port, retrying with backoff (50 ms doubling to 1 s) while the peer is not
// listening yet or the name does not resolve yet, until `deadline`. On failure returns an invalid
// socket, the last error kind and its text. `between`, when given, runs between attempts and may
// throw to give up (a stop signal); each attempt then waits at most a second, so it runs at least
// that often.
Socket connect_with_retry(const std::string& host, int port, Deadline deadline, ConnectError* error,
                          std::string* error_text, const std::function<void()>& between = {});
// Waits for one connection until `deadline`; an invalid socket on timeout or on a hard error (EMFILE,
// ...). `between`, when given, runs about once a second while waiting and may throw to give up.
Socket accept_until(const Socket& listener, Deadline deadline, const std::function<void()>& between = {});

enum class IoStatus { ok, timeout, closed, error };
// Whole-buffer transfers on a non-blocking socket. `closed`: the peer closed (or reset) the
// connection; *err holds the errno for `error` (and ECONNRESET for a reset).
IoStatus send_all(int fd, const void* data, size_t size, Deadline deadline, int* err);
IoStatus recv_all(int fd, void* data, size_t size, Deadline deadline, int* err);

void set_nonblocking(int fd);
void set_nodelay(int fd);

}  // namespace trainer::net
