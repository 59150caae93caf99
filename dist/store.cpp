#include "dist/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "dist/error.h"

namespace trainer {
namespace {

using namespace std::chrono_literals;
using net::Clock;
using net::Deadline;

constexpr char kHello[] = "trainer-store/1";
constexpr uint32_t kMaxFrame = 256u << 20;
constexpr auto kHandshakeTimeout = 10s;
// A WAIT's reply comes when the server's own timer fires; allow this much for it to arrive.
constexpr auto kWaitReplyGrace = 10s;
std::mutex g_wait_interrupt_mutex;
std::function<int()>& g_wait_interrupt = *new std::function<int()>();  // never destroyed: read at exit
std::thread::id g_wait_interrupt_thread;  // the thread that set it: only its waits are interrupted

// Whether this thread's waits can be ended by a stop signal (set_store_wait_interrupt).
bool interruptible_here() {
  std::lock_guard<std::mutex> lock(g_wait_interrupt_mutex);
  return g_wait_interrupt && std::this_thread::get_id() == g_wait_interrupt_thread;
}

enum Cmd : uint8_t { kCmdHello = 1, kCmdSet, kCmdGet, kCmdAdd, kCmdCheck, kCmdWait, kCmdDelete };

// Little-endian encoding of the request and reply bodies.
class Writer {
 public:
  Writer& u8(uint8_t v) {
    buf_ += static_cast<char>(v);
    return *this;
  }
  Writer& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  Writer& str(const std::string& s) {
    u64(s.size());
    buf_ += s;
    return *this;
  }
  Writer& strs(const std::vector<std::string>& v) {
    u64(v.size());
    for (const auto& s : v) str(s);
    return *this;
  }
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string buf) : buf_(std::move(buf)) {}
  uint8_t u8() {
    if (!need(1)) return 0;
    return static_cast<uint8_t>(buf_[pos_++]);
  }
  uint64_t u64() {
    if (!need(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(buf_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    if (!need(n)) return {};
    std::string s = buf_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::vector<std::string> strs() {
    const uint64_t n = u64();
    std::vector<std::string> v;
    for (uint64_t i = 0; i < n && ok_; ++i) v.push_back(str());
    return v;
  }
  bool ok() const { return ok_; }

 private:
  bool need(uint64_t n) {
    if (!ok_ || buf_.size() - pos_ < n) ok_ = false;
    return ok_;
  }
  std::string buf_;  // owned: readers are built from temporaries
  size_t pos_ = 0;
  bool ok_ = true;
};

std::string frame(const std::string& body) {
  std::string out(4, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + body;
}

uint32_t frame_length(const char* p) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return n;
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) s += " and " + std::to_string(keys.size() - 8) + " more";
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The server: one thread, poll() over the listener and every client. WAIT requests park until their
// keys exist or their deadline passes; the server answers either way, so a client never waits on a
// reply that cannot come.
class StoreServer {
 public:
  StoreServer(net::Socket listener, int world_size, std::string job_id)
      : listener_(std::move(listener)), world_size_(world_size), job_id_(std::move(job_id)) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw DistError("store: pipe2 failed: " + net::errno_text(errno));
    thread_ = std::thread([this] { run(); });
  }
  ~StoreServer() {
    stop_ = true;
    const char c = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &c, 1);
    thread_.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

 private:
  struct Client {
    net::Socket socket;
    std::string in, out;
    bool dead = false;
    bool waiting = false;
    std::vector<std::string> wait_keys;
    Deadline wait_deadline;
  };

  void run() {
    while (!stop_) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listener_.fd(), POLLIN, 0}};
      int timeout = -1;
      for (const auto& c : clients_) {
        fds.push_back({c->socket.fd(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
        if (c->waiting) {
          const int t = net::poll_timeout_ms(c->wait_deadline);
          timeout = timeout < 0 ? t : std::min(timeout, t);
        }
      }
      if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) break;
      if (stop_) break;
      if (fds[1].revents & POLLIN) {
        for (;;) {
          net::Socket s = net::accept_until(listener_, Clock::now());
          if (!s.valid()) break;
          auto c = std::make_unique<Client>();
          c->socket = std::move(s);
          clients_.push_back(std::move(c));
        }
      }
      for (size_t i = 0; i + 2 < fds.size() && i < clients_.size(); ++i) {
        Client& c = *clients_[i];
        if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) read_from(c);
      }
      process_all();
      for (auto& c : clients_) flush(*c);
      std::erase_if(clients_, [](const std::unique_ptr<Client>& c) { return c->dead; });
    }
  }

  void read_from(Client& c) {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(c.socket.fd(), buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.dead = true;
      return;
    }
  }

  void flush(Client& c) {
    while (!c.out.empty() && !c.dead) {
      const ssize_t n = ::send(c.socket.fd(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
      } else {
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.dead = true;
        return;
      }
    }
  }

  // Handles complete requests and resolves waits until nothing changes (a SET may release a WAIT of
  // another client, whose next request may then be handled).
  void process_all() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (auto& cp : clients_) {
        Client& c = *cp;
        if (c.dead) continue;
        if (c.waiting) {
          const bool all = std::all_of(c.wait_keys.begin(), c.wait_keys.end(),
                                       [&](const std::string& k) { return data_.count(k) > 0; });
          if (!all && Clock::now() < c.wait_deadline) continue;
          c.out += frame(Writer().u8(all ? 1 : 0).bytes());
          c.waiting = false;
          progress = true;
        }
        while (!c.waiting && c.in.size() >= 4) {
          const uint32_t n = frame_length(c.in.data());
          if (n > kMaxFrame) {
            c.dead = true;  // not one of ours
            break;
          }
          if (c.in.size() < 4 + n) break;
          const std::string body = c.in.substr(4, n);
          c.in.erase(0, 4 + n);
          if (!handle(c, body)) {
            c.dead = true;
            break;
          }
          progress = true;
        }
      }
    }
  }

  bool handle(Client& c, const std::string& body) {
    Reader r(body);
    Writer w;
    switch (r.u8()) {
      case kCmdHello: {
        if (r.str() != kHello) return false;
        const int64_t world = static_cast<int64_t>(r.u64());
        const std::string job = r.str();
        // A client of another job (same port) or with another WORLD_SIZE must not join this one.
        std::string refusal;
        if ((world_size_ > 0 && world > 0 && world != world_size_) || job != job_id_)
          refusal = "rank 0 there runs job '" + job_id_ + "' with world size " + std::to_string(world_size_);
        w.str(kHello).str(refusal);
        break;
      }
      case kCmdSet: {
        std::string key = r.str();
        data_[key] = r.str();
        break;
      }
      case kCmdGet: {
        auto it = data_.find(r.str());
        w.u8(it != data_.end() ? 1 : 0).str(it != data_.end() ? it->second : std::string());
        break;
      }
      case kCmdAdd: {
        std::string& value = data_[r.str()];
        const int64_t delta = static_cast<int64_t>(r.u64());
        const int64_t now = (value.empty() ? 0 : std::stoll(value)) + delta;
        value = std::to_string(now);
        w.u64(static_cast<uint64_t>(now));
        break;
      }
      case kCmdCheck: {
        const auto keys = r.strs();
        w.u64(keys.size());
        for (const auto& k : keys) w.u8(data_.count(k) ? 1 : 0);
        break;
      }
      case kCmdWait: {
        const auto timeout_ms = r.u64();
        c.wait_keys = r.strs();
        c.wait_deadline = net::deadline_after(std::chrono::milliseconds(timeout_ms));
        c.waiting = true;
        return r.ok();  // answered by process_all when the keys exist or time is up
      }
      case kCmdDelete:
        w.u8(data_.erase(r.str()) ? 1 : 0);
        break;
      default:
        return false;
    }
    if (!r.ok()) return false;
    c.out += frame(w.bytes());
    return true;
  }

  net::Socket listener_;
  int world_size_;
  std::string job_id_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<Client>> clients_;
  std::map<std::string, std::string> data_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------------

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto missing = wait_for(keys, timeout);
  if (!missing.empty())
    throw DistError("timed out after " + net::format_duration(timeout) + " waiting for " +
                    quoted_keys(missing) + " in the rendezvous store at " + address() +
                    ". HINT: a rank crashed or is stuck before setting it (see the other ranks' logs)");
}

namespace {

DistError ranks_timeout(const std::string& what, std::chrono::milliseconds timeout, int world_size,
                        const std::vector<int>& missing) {
  return DistError(
      what + " timed out after " + net::format_duration(timeout) + ": " +
      std::to_string(world_size - static_cast<int>(missing.size())) + " of " + std::to_string(world_size) +
      " ranks arrived; missing rank(s): " + format_ranks(missing) +
      ". HINT: those ranks crashed or are stuck before this point (see their logs), or were started "
      "with a different WORLD_SIZE / MASTER_ADDR / MASTER_PORT; raise the timeout if they are "
      "merely slow");
}

std::vector<std::string> rank_keys(const std::string& prefix, int world_size) {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  return keys;
}

}  // namespace

void Store::wait_for_ranks(const std::string& prefix, int world_size, std::chrono::milliseconds timeout,
                           const std::string& what) {
  const auto missing = wait_for(rank_keys(prefix, world_size), timeout);
  if (missing.empty()) return;
  std::vector<int> ranks;
  for (const auto& k : missing) ranks.push_back(std::stoi(k.substr(prefix.size())));
  throw ranks_timeout(what, timeout, world_size, ranks);
}

void Store::barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) {
  int64_t generation;
  {
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    generation = barrier_generation_[name]++;
  }
  const std::string base = "barrier/" + name + "/" + std::to_string(generation);
  set(base + "/arrived/" + std::to_string(rank), "");
  if (add(base + "/count", 1) == world_size) set(base + "/done", "");
  if (wait_for({base + "/done"}, timeout).empty()) return;
  // Time is up: name the ranks that never arrived (if all did after all, the barrier holds).
  const std::vector<bool> present = check(rank_keys(base + "/arrived/", world_size));
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r)
    if (!present[r]) missing.push_back(r);
  if (!missing.empty()) throw ranks_timeout("barrier '" + name + "'", timeout, world_size, missing);
}

void set_store_wait_interrupt(std::function<int()> pending_signal) {
  std::lock_guard<std::mutex> lock(g_wait_interrupt_mutex);
  g_wait_interrupt = std::move(pending_signal);
  g_wait_interrupt_thread = std::this_thread::get_id();
}

int pending_stop_signal() {
  std::lock_guard<std::mutex> lock(g_wait_interrupt_mutex);
  if (!g_wait_interrupt || std::this_thread::get_id() != g_wait_interrupt_thread) return 0;
  return g_wait_interrupt();
}

void throw_stopped(int signal, const std::string& doing) {
  throw WaitInterrupted(
      "stopped by signal " + std::to_string(signal) + " (" + strsignal(signal) + ") while " + doing, signal);
}

void throw_if_stop_pending(const std::string& doing) {
  if (const int signal = pending_stop_signal()) throw_stopped(signal, doing);
}

std::function<void()> stop_check(const std::string& doing) {
  if (!interruptible_here()) return {};
  return [doing] { throw_if_stop_pending(doing); };
}

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options), port_(options.port) {
  if (options.is_server) {
    int err = 0;
    net::Socket listener = net::listen_on(options.bind_host, options.port, &err);
    if (!listener.valid()) {
      if (err == EADDRINUSE)
        throw DistError(options.port_name + " " + std::to_string(options.port) +
                        " is already in use on this host. HINT: another job is running, or pick another "
                        "--master-port");
      throw DistError("cannot listen on " +
                      net::endpoint_str(options.bind_host.empty() ? "*" : options.bind_host, options.port) +
                      " for the rendezvous store: " + net::errno_text(err) +
                      ". HINT: MASTER_ADDR must name this host (rank 0's)");
    }
    port_ = net::local_port(listener);
    server_ = std::make_unique<StoreServer>(std::move(listener), options.world_size, options.job_id);
  }
  const std::string where = net::endpoint_str(options.host, port_);
  net::ConnectError error = net::ConnectError::none;
  std::string error_text;
  socket_ = net::connect_with_retry(options.host, port_, net::deadline_after(options.connect_timeout), &error,
                                    &error_text,
                                    stop_check("trying to reach rank 0's rendezvous store at " + where));
  if (!socket_.valid()) {
    std::string why = error == net::ConnectError::refused ? "connection refused: nothing listens there"
                      : error == net::ConnectError::unresolved
                          ? "cannot resolve '" + options.host + "': " + error_text
                          : error_text;
    throw DistError(
        "cannot reach rank 0 at " + where + " after " + net::format_duration(options.connect_timeout) + " (" +
        why +
        "). HINT: check that rank 0 is running and got this far (see its log), that every rank has the "
        "same MASTER_ADDR and MASTER_PORT, and that no firewall blocks the port");
  }
  local_address_ = net::local_ip(socket_);
  // Handshake: the service on this port must be a trainer store.
  const std::string reply = handshake(Writer()
                                          .u8(kCmdHello)
                                          .str(kHello)
                                          .u64(static_cast<uint64_t>(options.world_size))
                                          .str(options.job_id)
                                          .bytes(),
                                      net::deadline_after(kHandshakeTimeout));
  Reader r(reply);
  if (r.str() != kHello)
    throw DistError("the service at " + where +
                    " is not the trainer's rendezvous store (it did not answer the handshake). HINT: another "
                    "program uses this port (under torchrun, its own store holds MASTER_PORT and ours uses "
                    "MASTER_PORT+1); pick another --master-port or set TRAINER_STORE_PORT");
  if (const std::string refusal = r.str(); !refusal.empty())
    throw DistError(
        "the rendezvous store at " + where + " belongs to another run: " + refusal +
        ", but this rank has job '" + options.job_id + "' with world size " +
        std::to_string(options.world_size) +
        ". HINT: two jobs share MASTER_ADDR:MASTER_PORT (give each its own --master-port), or the ranks "
        "were started with different WORLD_SIZE");
  broken_.clear();
}

TcpStore::~TcpStore() {
  socket_.close();
  server_.reset();
}

std::string TcpStore::address() const { return net::endpoint_str(options_.host, port_); }

net::IoStatus TcpStore::exchange(const std::string& body, Deadline deadline, const std::string& what,
                                 std::string& reply, std::string& why) {
  int err = 0;
  const std::string out = frame(body);
  net::IoStatus st = net::send_all(socket_.fd(), out.data(), out.size(), deadline, &err);
  char len_bytes[4];
  if (st == net::IoStatus::ok) st = net::recv_all(socket_.fd(), len_bytes, 4, deadline, &err);
  if (st == net::IoStatus::ok) {
    const uint32_t n = frame_length(len_bytes);
    if (n > kMaxFrame) {
      why = "garbled reply to " + what;
      return net::IoStatus::error;
    }
    reply.resize(n);
    st = net::recv_all(socket_.fd(), reply.data(), n, deadline, &err);
  }
  switch (st) {
    case net::IoStatus::ok:
      break;
    case net::IoStatus::timeout:
      why = "no reply to " + what + " in time (rank 0 is stuck or the network is down)";
      break;
    case net::IoStatus::closed:
      why = "lost the connection during " + what + " (rank 0 exited or crashed)";
      break;
    case net::IoStatus::error:
      why = what + " failed: " + net::errno_text(err);
      break;
  }
  return st;
}

// The service that accepted may not be ours (another program on MASTER_PORT) and may never answer:
// the reply is awaited in slices of net::kStopCheckInterval with a stop check between them, so that
// the launcher's SIGTERM ends it at once instead of after kHandshakeTimeout. Returns "" when no
// well-formed reply came (the caller names the port's service as foreign).
std::string TcpStore::handshake(const std::string& body, Deadline deadline) {
  const auto stop = stop_check("in the handshake with the service at " + address());
  int err = 0;
  const std::string out = frame(body);
  if (net::send_all(socket_.fd(), out.data(), out.size(), deadline, &err) != net::IoStatus::ok) return {};
  for (;;) {
    pollfd p{socket_.fd(), POLLIN, 0};
    const Deadline slice = std::min(deadline, net::deadline_after(net::kStopCheckInterval));
    const int rc = ::poll(&p, 1, net::poll_timeout_ms(slice));
    if (rc > 0) break;
    if (rc < 0 && errno != EINTR) return {};
    if (stop) stop();
    if (std::chrono::steady_clock::now() >= deadline) return {};
  }
  char len_bytes[4];
  if (net::recv_all(socket_.fd(), len_bytes, 4, deadline, &err) != net::IoStatus::ok) return {};
  const uint32_t n = frame_length(len_bytes);
  if (n > kMaxFrame) return {};
  std::string reply(n, '\0');
  if (net::recv_all(socket_.fd(), reply.data(), n, deadline, &err) != net::IoStatus::ok) return {};
  return reply;
}

void TcpStore::reconnect(Deadline deadline) {
  net::ConnectError error = net::ConnectError::none;
  std::string text;
  socket_ = net::connect_with_retry(options_.host, port_, deadline, &error, &text);
  std::string reply, why;
  if (socket_.valid()) {
    const std::string hello = Writer()
                                  .u8(kCmdHello)
                                  .str(kHello)
                                  .u64(static_cast<uint64_t>(options_.world_size))
                                  .str(options_.job_id)
                                  .bytes();
    if (exchange(hello, deadline, "handshake", reply, why) == net::IoStatus::ok) {
      broken_.clear();
      return;
    }
    socket_.close();
  } else {
    why = "cannot reconnect: " + text;
    // Nothing listens on the port any more: rank 0 is gone, and no later call will reach it either.
    reconnectable_ = error != net::ConnectError::refused;
  }
  broken_ = "rendezvous store at " + address() + ": " + why +
            ". HINT: rank 0 serves the store; if it exited or crashed, its log says why";
  throw DistError(broken_);
}

std::string TcpStore::request(const std::string& body, Deadline deadline, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) {
    // A reply that came too late left the stream unusable, but rank 0 may only have been slow (an
    // overloaded host): a fresh connection tells. Once the connection was lost or refused, it is gone.
    if (!reconnectable_) throw DistError(broken_);
    reconnect(deadline);
  }
  std::string reply, why;
  const net::IoStatus st = exchange(body, deadline, what, reply, why);
  if (st == net::IoStatus::ok) return reply;
  reconnectable_ = st == net::IoStatus::timeout;
  broken_ = "rendezvous store at " + address() + ": " + why +
            ". HINT: rank 0 serves the store; if it exited or crashed, its log says why";
  socket_.close();
  throw DistError(broken_);
}

void TcpStore::set(const std::string& key, const std::string& value) {
  request(Writer().u8(kCmdSet).str(key).str(value).bytes(), net::deadline_after(options_.reply_timeout),
          "set '" + key + "'");
}

std::string TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  Reader r(request(Writer().u8(kCmdGet).str(key).bytes(), net::deadline_after(options_.reply_timeout),
                   "get '" + key + "'"));
  const bool found = r.u8() != 0;
  std::string value = r.str();
  if (!found) throw DistError("key '" + key + "' vanished from the rendezvous store at " + address());
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Reader r(request(Writer().u8(kCmdAdd).str(key).u64(static_cast<uint64_t>(delta)).bytes(),
                   net::deadline_after(options_.reply_timeout), "add '" + key + "'"));
  return static_cast<int64_t>(r.u64());
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys) {
  Reader r(request(Writer().u8(kCmdCheck).strs(keys).bytes(), net::deadline_after(options_.reply_timeout),
                   "check " + quoted_keys(keys)));
  std::vector<bool> present(r.u64());
  for (size_t i = 0; i < present.size(); ++i) present[i] = r.u8() != 0;
  present.resize(keys.size(), false);
  return present;
}

std::vector<std::string> TcpStore::wait_for(const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout) {
  // Where a stop signal can end it, in slices of net::kStopCheckInterval, checked between them;
  // elsewhere (the watchdog's and heartbeat's threads, the training loop) one request.
  const std::chrono::milliseconds most = interruptible_here() ? net::kStopCheckInterval : timeout;
  const std::string what = "wait for " + quoted_keys(keys);
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    const auto slice = std::clamp(left, std::chrono::milliseconds(0), most);
    Reader r(request(Writer().u8(kCmdWait).u64(static_cast<uint64_t>(slice.count())).strs(keys).bytes(),
                     net::deadline_after(slice + kWaitReplyGrace), what));
    if (r.u8() == 1) return {};
    if (const int signal = pending_stop_signal())
      throw_stopped(signal, "waiting for " + quoted_keys(keys) + " in the rendezvous store at " + address());
    if (left <= slice) break;
  }
  const std::vector<bool> present = check(keys);
  std::vector<std::string> missing;
  for (size_t i = 0; i < keys.size(); ++i)
    if (!present[i]) missing.push_back(keys[i]);
  return missing;
}

bool TcpStore::remove(const std::string& key) {
  Reader r(request(Writer().u8(kCmdDelete).str(key).bytes(), net::deadline_after(options_.reply_timeout),
                   "delete '" + key + "'"));
  return r.u8() != 0;
}

}  // namespace trainer
