#include "dist/store.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <thread>

#include "dist/error.h"
#include "dist/socket.h"
#include "multi_process.h"

namespace trainer {
namespace {

using namespace testing;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const DistError& e) {
    return e.what();
  }
  return "";
}

TEST(TcpStore, SetGetAddCheckRemove) {
  TcpStore server(store_options(0, true));
  TcpStore client(store_options(server.port(), false));
  client.set("a", std::string("x\0y", 3));
  EXPECT_EQ(server.get("a", 1s), std::string("x\0y", 3));
  EXPECT_EQ(client.add("n", 2), 2);
  EXPECT_EQ(server.add("n", 5), 7);
  EXPECT_EQ(client.get("n", 1s), "7");
  EXPECT_EQ(client.check(std::vector<std::string>{"a", "b", "n"}), (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(client.remove("a"));
  EXPECT_FALSE(client.check("a"));
  EXPECT_FALSE(client.remove("a"));
  std::string big(3 << 20, 'z');  // larger than a socket buffer
  client.set("big", big);
  EXPECT_EQ(server.get("big", 1s), big);
  EXPECT_EQ(client.local_address(), "127.0.0.1");
}

TEST(TcpStore, GetBlocksUntilAnotherRankSets) {
  TcpStore server(store_options(0, true));
  TcpStore client(store_options(server.port(), false));
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    server.set("late", "value");
  });
  const auto start = Clock::now();
  EXPECT_EQ(client.get("late", 5s), "value");
  EXPECT_GE(seconds_since(start), 0.15);
  setter.join();
  // Waiting on several keys; the store keeps answering other clients meanwhile.
  std::thread setter2([&] {
    std::this_thread::sleep_for(100ms);
    server.set("k1", "");
    server.set("k2", "");
  });
  client.wait({"k1", "k2"}, 5s);
  setter2.join();
}

TEST(TcpStore, WaitTimesOutNamingTheKey) {
  TcpStore server(store_options(0, true));
  TcpStore client(store_options(server.port(), false));
  client.set("here", "");
  const auto start = Clock::now();
  const std::string e = error_of([&] { client.wait({"here", "never"}, 300ms); });
  EXPECT_NE(e.find("timed out after 300 ms waiting for 'never'"), std::string::npos) << e;
  EXPECT_EQ(e.find("'here'"), std::string::npos) << e;
  EXPECT_LT(seconds_since(start), 2.0);
  // The connection is still usable after a timeout.
  EXPECT_EQ(client.add("c", 1), 1);
  EXPECT_NE(error_of([&] { client.get("never", 100ms); }).find("'never'"), std::string::npos);
}

// A stop signal (the trainer's SIGTERM/Ctrl-C flag) ends a long wait between its one-second slices,
// naming the signal and the keys; so it does a client still trying to reach rank 0's store. Only the
// waits of the thread that set the interrupt end early (not a watchdog's or heartbeat's). With no
// interrupt set, a wait runs to its timeout. (60 s timeouts: a broken interrupt fails the test.)
TEST(TcpStore, AStopSignalEndsAWait) {
  TcpStore server(store_options(0, true));
  TcpStore client(store_options(server.port(), false));
  {
    StopSignalAfter stop(300ms);
    const Caught waiting = stop_of([&] { client.wait({"rank/1"}, 60s); });  // a peer that never comes
    EXPECT_EQ(waiting.signal, SIGTERM) << waiting.message;
    EXPECT_NE(waiting.message.find("stopped by signal 15"), std::string::npos) << waiting.message;
    EXPECT_NE(waiting.message.find("'rank/1'"), std::string::npos) << waiting.message;
    std::vector<std::string> other_thread;
    std::thread([&] { other_thread = client.wait_for({"rank/1"}, 1500ms); }).join();
    EXPECT_EQ(other_thread, std::vector<std::string>{"rank/1"});
    const Caught connecting = stop_of([&] { TcpStore never(store_options(free_port(), false, 60s)); });
    EXPECT_EQ(connecting.signal, SIGTERM) << connecting.message;
    EXPECT_NE(connecting.message.find("while trying to reach rank 0's rendezvous store"), std::string::npos)
        << connecting.message;
  }
  EXPECT_EQ(client.wait_for({"rank/1"}, 50ms), std::vector<std::string>{"rank/1"});
}

TEST(TcpStore, PortInUse) {
  TcpStore first(store_options(0, true));
  const std::string e = error_of([&] { TcpStore second(store_options(first.port(), true)); });
  EXPECT_EQ(
      e, "MASTER_PORT " + std::to_string(first.port()) +
             " is already in use on this host. HINT: another job is running, or pick another --master-port");
}

TEST(TcpStore, UnreachableMasterRetriesUntilTheTimeout) {
  const int port = free_port();  // nothing listens there
  const auto start = Clock::now();
  const std::string e = error_of([&] { TcpStore client(store_options(port, false, 1s)); });
  const double took = seconds_since(start);
  EXPECT_NE(e.find("cannot reach rank 0 at 127.0.0.1:" + std::to_string(port) + " after 1 s"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("connection refused"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT"), std::string::npos) << e;
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 3.0);
}

TEST(TcpStore, ClientWaitsForALateServer) {
  const int port = free_port();
  std::unique_ptr<TcpStore> server;
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStore>(store_options(port, true));
    server->set("up", "1");
  });
  TcpStore client(store_options(port, false, 10s));  // retries with backoff meanwhile
  EXPECT_EQ(client.get("up", 5s), "1");
  late.join();
}

TEST(TcpStore, SomethingElseOnThePortIsRecognised) {
  // E.g. torchrun's own TCPStore: it does not speak our protocol, and we must say so.
  int err = 0;
  net::Socket listener = net::listen_on("127.0.0.1", 0, &err);
  const int port = net::local_port(listener);
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop) {
      net::Socket s = net::accept_until(listener, net::deadline_after(50ms));
      if (s.valid()) {
        const char junk[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
        ::send(s.fd(), junk, sizeof junk - 1, MSG_NOSIGNAL);
      }
    }
  });
  const std::string e = error_of([&] { TcpStore client(store_options(port, false, 2s)); });
  stop = true;
  other.join();
  EXPECT_NE(e.find("is not the trainer's rendezvous store"), std::string::npos) << e;
  EXPECT_NE(e.find("MASTER_PORT+1"), std::string::npos) << e;
}

TEST(TcpStore, AStopSignalEndsTheHandshakeWithASilentServer) {
  // A foreign service on MASTER_PORT that accepts and never answers held a rank in the handshake
  // for its whole 10 s, deaf to the launcher's SIGTERM.
  int err = 0;
  net::Socket listener = net::listen_on("127.0.0.1", 0, &err);
  const int port = net::local_port(listener);
  std::atomic<bool> stop{false};
  std::vector<net::Socket> held;
  std::thread silent([&] {
    while (!stop) {
      net::Socket s = net::accept_until(listener, net::deadline_after(50ms));
      if (s.valid()) held.push_back(std::move(s));
    }
  });
  Caught caught;
  {
    StopSignalAfter signal(300ms);
    caught = stop_of([&] { TcpStore client(store_options(port, false, 60s)); });
  }
  stop = true;
  silent.join();
  EXPECT_EQ(caught.signal, SIGTERM) << caught.message;
  EXPECT_NE(caught.message.find("handshake"), std::string::npos) << caught.message;
}

TEST(TcpStore, ClientsOfAnotherJobOrWorldSizeAreRefused) {
  TcpStoreOptions o = store_options(0, true);
  o.world_size = 4;
  o.job_id = "job-a";
  TcpStore server(o);
  TcpStoreOptions c = store_options(server.port(), false);
  c.world_size = 4;
  c.job_id = "job-a";
  TcpStore same(c);  // fine
  c.job_id = "job-b";
  std::string e = error_of([&] { TcpStore other(c); });
  EXPECT_NE(
      e.find("belongs to another run: rank 0 there runs job 'job-a' with world size 4, but this rank has job "
             "'job-b' with world size 4"),
      std::string::npos)
      << e;
  c.job_id = "job-a";
  c.world_size = 2;
  e = error_of([&] { TcpStore other(c); });
  EXPECT_NE(e.find("different WORLD_SIZE"), std::string::npos) << e;
}

TEST(TcpStore, ServerGoneIsAnErrorNotAHang) {
  auto server = std::make_unique<TcpStore>(store_options(0, true));
  TcpStore client(store_options(server->port(), false));
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  const auto start = Clock::now();
  const std::string e = error_of([&] { client.get("never", 10s); });
  killer.join();
  EXPECT_NE(e.find("lost the connection"), std::string::npos) << e;
  EXPECT_LT(seconds_since(start), 3.0);
  // Later calls fail at once with the same story.
  EXPECT_NE(error_of([&] { client.set("x", "y"); }).find("lost the connection"), std::string::npos);
}

// A rank 0 that stops answering for a while (an overloaded host; here SIGSTOP) costs the waiting
// request a timeout, not the connection: the next request reconnects. Once rank 0 is gone for good
// (SIGKILL: nothing listens on the port) requests fail at once.
TEST(TcpStore, ReconnectsAfterATimeoutButNotAfterRankZeroIsGone) {
  int port_pipe[2];
  ASSERT_EQ(::pipe(port_pipe), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 0: serve the store until killed
    TcpStore server(store_options(0, true));
    const int port = server.port();
    if (::write(port_pipe[1], &port, sizeof port) != sizeof port) ::_exit(1);
    for (;;) ::pause();
  }
  int port = 0;
  ASSERT_EQ(::read(port_pipe[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  TcpStoreOptions o = store_options(port, false);
  o.reply_timeout = 1s;
  TcpStore client(o);
  client.set("a", "1");
  ::kill(child, SIGSTOP);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);  // stopped for sure, not just signalled
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_NE(error_of([&] { client.set("b", "2"); }).find("no reply to set 'b' in time"), std::string::npos);
  ::kill(child, SIGCONT);
  ASSERT_EQ(::waitpid(child, &status, WCONTINUED), child);
  client.set("c", "3");  // a fresh connection
  EXPECT_EQ(client.get("a", 1s), "1");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto start = Clock::now();
  const std::string gone = error_of([&] { client.set("d", "4"); });
  EXPECT_FALSE(gone.empty());
  EXPECT_NE(error_of([&] { client.set("e", "5"); }), "");
  EXPECT_LT(seconds_since(start), 3.0) << gone;
  ::close(port_pipe[0]);
  ::close(port_pipe[1]);
}

TEST(TcpStore, BarrierAndMissingRanks) {
  ThreadWorld w(3);
  std::vector<std::string> errors = run_threads(3, [&](int rank) {
    auto store = w.client();
    for (int i = 0; i < 3; ++i) store->barrier("epoch", rank, 3, 5s);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // Rank 2 never comes.
  errors = run_threads(2, [&](int rank) {
    auto store = w.client();
    store->barrier("lonely", rank, 3, 500ms);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("barrier 'lonely' timed out after 500 ms: 2 of 3 ranks arrived; missing rank(s): 2"),
              std::string::npos)
        << e;
  }
  auto store = w.client();
  store->set("ready/0", "");
  store->set("ready/2", "");
  const std::string e = error_of([&] { store->wait_for_ranks("ready/", 4, 200ms, "start-up"); });
  EXPECT_NE(e.find("start-up timed out after 200 ms: 2 of 4 ranks arrived; missing rank(s): 1, 3"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace trainer
