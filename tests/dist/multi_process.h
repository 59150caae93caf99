#pragma once
// Runs N ranks of a test for real: as forked child processes (each its own address space, sockets and
// exit, so a rank can die like a real one) or as threads of this process (quicker, for the store and
// the communicator). Everything talks over 127.0.0.1 on ports the kernel hands out.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/cpu_comm.h"
#include "dist/error.h"
#include "dist/store.h"
#include "test_ports.h"

namespace trainer::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Whether `op` (::bind or ::connect) succeeds for a fresh TCP socket and 127.0.0.1:port.
template <class Op>
bool loopback_port_op(int port, Op op) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = op(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Whether something accepts TCP connections on 127.0.0.1:port (a probe that, unlike binding, cannot
// take the port from the process about to listen on it).
inline bool accepts_connections(int port) { return loopback_port_op(port, ::connect); }

// For tests of the stop-signal interrupt (set_store_wait_interrupt): from `after` on, this thread's
// store waits and connection loops see SIGTERM. The destructor joins the timer thread and clears the
// interrupt, whatever the test threw, so a failure cannot leak into the tests after it.
class StopSignalAfter {
 public:
  explicit StopSignalAfter(std::chrono::milliseconds after)
      : thread_([this, after] {
          std::this_thread::sleep_for(after);
          signal_ = SIGTERM;
        }) {
    set_store_wait_interrupt([this] { return signal_.load(); });
  }
  ~StopSignalAfter() {
    thread_.join();
    set_store_wait_interrupt(nullptr);
  }
  StopSignalAfter(const StopSignalAfter&) = delete;
  StopSignalAfter& operator=(const StopSignalAfter&) = delete;

 private:
  std::atomic<int> signal_{0};
  std::thread thread_;
};

// What a test of the interrupt caught: the signal (0: none) and the message.
struct Caught {
  int signal = 0;
  std::string message;
};
inline Caught stop_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const WaitInterrupted& e) {
    return {e.signal(), e.what()};
  } catch (const DistError& e) {
    return {0, e.what()};
  }
  return {};
}

inline bool port_is_free(int port) { return loopback_port_op(port, ::bind); }

// A port nothing uses right now, with `count` free ports from it on, reserved for this test process
// (tests/test_ports.h).
inline int free_port(int count = 1) { return reserve_port(count); }

struct RankOutcome {
  int exit_code = -1;  // -1 when killed by a signal (or never finished)
  int signal = 0;
  std::string error;     // what the rank's function threw
  double seconds = 0.0;  // from start until the rank's process ended
  bool ok() const { return exit_code == 0 && error.empty(); }
};

// Forks `world` children running fn(rank); a child that throws reports the message and exits 1. The
// children are killed after `limit` (a test failure: something hung).
inline std::vector<RankOutcome> run_processes(int world, const std::function<void(int rank)>& fn,
                                              std::chrono::seconds limit = 30s) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(world);
  std::vector<int> pipes(world);
  const auto start = Clock::now();
  for (int r = 0; r < world; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      ::alarm(static_cast<unsigned>(limit.count()) + 5);  // never outlive the test
      std::string error;
      try {
        fn(r);
      } catch (const std::exception& e) {
        error = e.what();
        if (error.empty()) error = "(empty exception message)";
      } catch (...) {
        error = "non-standard exception";
      }
      if (!error.empty()) {
        [[maybe_unused]] ssize_t n = ::write(fds[1], error.data(), error.size());
      }
      ::_exit(error.empty() ? 0 : 1);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    pids[r] = pid;
    pipes[r] = fds[0];
  }
  std::vector<RankOutcome> out(world);
  std::vector<bool> done(world, false);
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(pipes[r], buf, sizeof buf)) > 0) out[r].error.append(buf, static_cast<size_t>(n));
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        out[r].seconds = seconds_since(start);
        if (WIFEXITED(status)) out[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) out[r].signal = WTERMSIG(status);
      }
    }
    if (remaining > 0 && Clock::now() - start > limit) {
      for (int r = 0; r < world; ++r)
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          out[r].error +=
              " [killed by the test: still running after " + std::to_string(limit.count()) + " s]";
          done[r] = true;
        }
      remaining = 0;
    }
    if (remaining > 0) std::this_thread::sleep_for(5ms);
  }
  for (int r = 0; r < world; ++r) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipes[r], buf, sizeof buf)) > 0) out[r].error.append(buf, static_cast<size_t>(n));
    ::close(pipes[r]);
  }
  return out;
}

// Runs fn(rank) on `world` threads; returns what each threw ("" when it returned).
inline std::vector<std::string> run_threads(int world, const std::function<void(int rank)>& fn) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline std::string all_errors(const std::vector<RankOutcome>& outcomes) {
  std::string s;
  for (size_t r = 0; r < outcomes.size(); ++r)
    s += "\nrank " + std::to_string(r) + ": exit " + std::to_string(outcomes[r].exit_code) + " signal " +
         std::to_string(outcomes[r].signal) + " after " + std::to_string(outcomes[r].seconds) +
         " s: " + outcomes[r].error;
  return s;
}

inline TcpStoreOptions store_options(int port, bool server, std::chrono::milliseconds connect_timeout = 10s) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.bind_host = "127.0.0.1";
  o.port = port;
  o.is_server = server;
  o.connect_timeout = connect_timeout;
  return o;
}

// One rank's store and communicator on loopback; rank 0 serves the store on `port`.
struct Rank {
  std::unique_ptr<TcpStore> store;
  std::shared_ptr<CpuComm> comm;

  Rank(int rank, int world, int port, std::chrono::milliseconds timeout = 10s) {
    store = std::make_unique<TcpStore>(store_options(port, rank == 0));
    CpuCommOptions o;
    o.listen_address = "127.0.0.1";
    o.timeout = timeout;
    o.connect_timeout = 10s;
    comm = CpuComm::create(*store, rank, world, o);
  }
};

// For thread ranks: a store server on a kernel-chosen port, created before the threads start, so no
// port can be taken in between. Rank 0 uses it as its own client.
struct ThreadWorld {
  int world;
  std::unique_ptr<TcpStore> server;
  int port;

  explicit ThreadWorld(int world) : world(world) {
    server = std::make_unique<TcpStore>(store_options(0, true));
    port = server->port();
  }
  // This rank's store client (rank 0: the server's own).
  std::unique_ptr<TcpStore> client() { return std::make_unique<TcpStore>(store_options(port, false)); }
  std::shared_ptr<CpuComm> comm(Store& store, int rank, std::chrono::milliseconds timeout = 10s) {
    CpuCommOptions o;
    o.timeout = timeout;
    o.connect_timeout = 10s;
    return CpuComm::create(store, rank, world, o);
  }
};

}  // namespace trainer::testing
