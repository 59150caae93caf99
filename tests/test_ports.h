#pragma once
// TCP ports for tests that run beside each other (ctest -j). A port chosen here stays this test
// process's until it exits: it is reserved with flock() on /tmp/trainer-test-ports-<uid>/<port>.lock,
// which every test process takes before using a port, so no two tests pick the same one; and it lies
// below the kernel's ephemeral range (ip_local_port_range, 32768+ by default), so no outgoing
// connection of any process can take it between the choice and the bind, as a kernel-chosen port
// could be. The kernel drops a dead test's locks.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace trainer::testing {

// Whether this process can bind 127.0.0.1:port now (nothing else listens there).
inline bool can_bind_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // as the servers under test bind
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Reserves `port` for this process; false when another test process holds it. The descriptor is kept
// open (close-on-exec) until the process exits. One folder per user: another user's umask or files
// cannot stand in the way.
inline bool reserve_port_lock(int port) {
  const std::string dir = "/tmp/trainer-test-ports-" + std::to_string(::getuid());
  ::mkdir(dir.c_str(), 0700);
  const std::string path = dir + "/" + std::to_string(port) + ".lock";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  return true;  // fd stays open: the reservation lasts as long as this process
}

// The first port of the kernel's range for outgoing connections (ip_local_port_range; 32768 when it
// cannot be read).
inline int ephemeral_port_start() {
  int first = 32768, last = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &first, &last) != 2) first = 32768;
    std::fclose(f);
  }
  return first;
}

// `count` consecutive ports, reserved for this process and free now; returns the first. They lie in
// the 12,000 ports below the ephemeral range (from 1024 where that range starts lower).
inline int reserve_port(int count = 1) {
  static unsigned state = static_cast<unsigned>(::getpid()) * 2654435761u ^
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  static const int high = std::max(ephemeral_port_start() - count, 2048), low = std::max(high - 12000, 1024);
  for (int attempt = 0; attempt < 2000; ++attempt) {
    state = state * 1103515245u + 12345u;
    const int port = low + static_cast<int>((state >> 8) % static_cast<unsigned>(high - low));
    bool ok = true;
    for (int i = 0; i < count && ok; ++i) ok = can_bind_loopback(port + i);
    for (int i = 0; i < count && ok; ++i) ok = reserve_port_lock(port + i);
    // A port reserved here but found taken stays reserved (and unused): harmless, the range is large.
    for (int i = 0; i < count && ok; ++i) ok = can_bind_loopback(port + i);
    if (ok) return port;
  }
  throw std::runtime_error("no free port found below the ephemeral range");
}

}  // namespace trainer::testing
