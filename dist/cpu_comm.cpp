#include "dist/cpu_comm.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "dist/error.h"
#include "dist/store.h"
#include "nn/format_bytes.h"

namespace trainer {
namespace {

using net::Clock;

constexpr uint32_t kMagic = 0x4d435254;  // "TRCM"
constexpr size_t kFlatAllReduceBytes = 64 << 10;
constexpr size_t kMaxAbortReason = 1 << 20;

enum FrameKind : uint8_t { kData = 1, kAbort = 2 };
enum OpCode : uint8_t {
  kHello = 1,
  kAllReduce,
  kBroadcast,
  kAllGatherMeta,
  kAllGatherData,
  kBarrier,
  kShutdown,
  kReduceScatter
};

const char* op_name(uint8_t op) {
  switch (op) {
    case kHello:
      return "connect";
    case kAllReduce:
      return "all_reduce";
    case kBroadcast:
      return "broadcast";
    case kAllGatherMeta:
      return "all_gather (sizes)";
    case kAllGatherData:
      return "all_gather";
    case kBarrier:
      return "barrier";
    case kShutdown:
      return "shutdown";
    case kReduceScatter:
      return "reduce_scatter";
  }
  return "unknown";
}

// Every message starts with this header; the receiver checks it against the collective it is in.
struct FrameHeader {
  uint32_t magic = kMagic;
  uint8_t kind = kData;
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t reduce = 0;
  uint32_t aux = 0;     // ring step, broadcast root, hello: sender's rank
  uint32_t origin = 0;  // abort: the rank where the failure began
  uint64_t seq = 0;     // the collective's sequence number; hello: hash of the communicator name
  uint64_t total = 0;   // bytes of the sender's whole tensor (checked to match); hello: world size
  uint64_t nbytes = 0;  // payload bytes that follow
};
static_assert(sizeof(FrameHeader) == 40, "the wire header must have no padding");
constexpr size_t kHeader = sizeof(FrameHeader);

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A failure with the rank where it began and its original text, so that ABORT messages relayed through
// other ranks keep the root cause.
class CommFailure : public DistError {
 public:
  CommFailure(const std::string& message, int origin, std::string root)
      : DistError(message), origin(origin), root(std::move(root)) {}
  int origin;
  std::string root;
};

template <class T>
void reduce_into(T* acc, const T* src, size_t n, ReduceOp op) {
  if (op == ReduceOp::max) {
    for (size_t i = 0; i < n; ++i)
      if (src[i] > acc[i] || src[i] != src[i]) acc[i] = src[i];  // NaN wins, like torch.max
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += src[i];
  }
}

void reduce_bytes(char* acc, const char* src, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32:
      return reduce_into(reinterpret_cast<float*>(acc), reinterpret_cast<const float*>(src), count, op);
    case DType::f64:
      return reduce_into(reinterpret_cast<double*>(acc), reinterpret_cast<const double*>(src), count, op);
    case DType::i64:
      return reduce_into(reinterpret_cast<int64_t*>(acc), reinterpret_cast<const int64_t*>(src), count, op);
    default:
      throw DistError("all_reduce: unsupported dtype");
  }
}

void divide_bytes(char* data, size_t count, DType dtype, int world) {
  if (dtype == DType::f32) {
    float* p = reinterpret_cast<float*>(data);
    for (size_t i = 0; i < count; ++i) p[i] /= static_cast<float>(world);
  } else if (dtype == DType::f64) {
    double* p = reinterpret_cast<double*>(data);
    for (size_t i = 0; i < count; ++i) p[i] /= world;
  }
}

const char* kTimeoutHint =
    "HINT: a rank is stuck, much slower than the others, or issued a different number of collectives (e.g. "
    "it "
    "runs more steps per epoch: the step-count check names it); if one rank legitimately works alone for "
    "long "
    "(writing a checkpoint), raise the distributed timeout";
const char* kClosedHint =
    "HINT: the first error in that rank's log is the cause; a rank that died without one was killed (out of "
    "memory: see dmesg; or by the scheduler)";
const char* kMismatchHint =
    "HINT: every rank must issue the same collectives in the same order with the same shapes; a rank took a "
    "different path (an extra step from uneven data, evaluation or checkpointing on one rank only, a "
    "different model or batch size)";

}  // namespace

// ---------------------------------------------------------------------------------------------------

struct CpuComm::OpContext {
  uint8_t op = 0;
  uint64_t seq = 0;
  uint64_t total = 0;  // bytes of this rank's tensor; 0 = not compared (all_gather)
  uint8_t dtype = 0;
  uint8_t reduce = 0;
  bool flat = false;   // every peer sends to us: the ones that did not are "not arrived"
  std::string detail;  // where in the algorithm we are, for timeouts
  std::chrono::milliseconds timeout{0};
  net::Deadline deadline;

  std::string describe() const {
    std::string s = std::string(op_name(op)) + " #" + std::to_string(seq);
    if (total > 0) {
      s += " (" + format_bytes(total) + " of " + std::string(dtype_name(static_cast<DType>(dtype)));
      if (op == kAllReduce || op == kReduceScatter)
        s += ", " + std::string(reduce_op_name(static_cast<ReduceOp>(reduce)));
      s += ")";
    }
    return s;
  }
};

struct CpuComm::Transfer {
  int peer = 0;
  bool is_send = false;
  FrameHeader header;  // send: what goes out; recv: what arrived
  uint32_t expect_aux = 0;
  char* data = nullptr;
  size_t len = 0;
  size_t done = 0;  // bytes moved, header included
  bool finished() const { return done == kHeader + len; }
};

class CpuComm::CpuWork : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    if (!error_.empty()) throw DistError(error_);
  }
  bool completed() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  void finish(const std::string& error) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = error;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
};

// ---------------------------------------------------------------------------------------------------
// Set-up

CpuComm::CpuComm(int rank, int world_size, const CpuCommOptions& options)
    : rank_(rank),
      world_size_(world_size),
      options_(options),
      peers_(world_size),
      send_mid_frame_(world_size, false),
      unsent_(world_size),
      recv_mid_frame_(world_size, false),
      timeout_(options.timeout) {
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw DistError("CpuComm: pipe2: " + net::errno_text(errno));
}

std::shared_ptr<CpuComm> CpuComm::create(Store& store, int rank, int world_size,
                                         const CpuCommOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw DistError("CpuComm: rank " + std::to_string(rank) + " outside a world of size " +
                    std::to_string(world_size));
  std::shared_ptr<CpuComm> comm(new CpuComm(rank, world_size, options));
  if (world_size > 1) {
    const std::string prefix = "comm/" + options.name + "/";
    const std::string what = "communicator '" + options.name + "' set-up";
    int err = 0;
    net::Socket listener = net::listen_on(options.listen_address, 0, &err);
    if (!listener.valid())
      throw DistError("rank " + std::to_string(rank) + " cannot listen on " + options.listen_address +
                      " for its peers: " + net::errno_text(err) +
                      ". HINT: the address must belong to this host");
    store.set(prefix + "addr/" + std::to_string(rank),
              options.listen_address + " " + std::to_string(net::local_port(listener)));
    store.wait_for_ranks(prefix + "addr/", world_size, options.connect_timeout, what);
    const net::Deadline deadline = net::deadline_after(options.connect_timeout);
    const uint64_t name_hash = fnv1a(options.name);
    // Connect to every lower rank (they accept below), then accept every higher one.
    for (int p = 0; p < rank; ++p) {
      const std::string addr = store.get(prefix + "addr/" + std::to_string(p), options.connect_timeout);
      const size_t space = addr.rfind(' ');
      const std::string host = addr.substr(0, space);
      const int port = std::stoi(addr.substr(space + 1));
      net::ConnectError error;
      std::string error_text;
      net::Socket s = net::connect_with_retry(host, port, deadline, &error, &error_text,
                                              stop_check(what + ": connecting to rank " + std::to_string(p)));
      if (!s.valid())
        throw DistError(what + ": rank " + std::to_string(rank) + " cannot connect to rank " +
                        std::to_string(p) + " at " + net::endpoint_str(host, port) + " (" + error_text +
                        "). HINT: rank " + std::to_string(p) +
                        " may have died (see its log), or a firewall blocks connections between the hosts");
      FrameHeader hello;
      hello.op = kHello;
      hello.aux = static_cast<uint32_t>(rank);
      hello.seq = name_hash;
      hello.total = static_cast<uint64_t>(world_size);
      int io_err = 0;
      if (net::send_all(s.fd(), &hello, kHeader, deadline, &io_err) != net::IoStatus::ok)
        throw DistError(what + ": rank " + std::to_string(p) + " dropped the connection from rank " +
                        std::to_string(rank) + ". " + kClosedHint);
      comm->peers_[p] = std::move(s);
    }
    for (int accepted = 0; accepted < world_size - 1 - rank; ++accepted) {
      net::Socket s = net::accept_until(listener, deadline,
                                        stop_check(what + ": waiting for the higher ranks to connect"));
      if (!s.valid()) {
        std::vector<int> missing;
        for (int p = rank + 1; p < world_size; ++p)
          if (!comm->peers_[p].valid()) missing.push_back(p);
        throw DistError(what + " timed out after " + net::format_duration(options.connect_timeout) +
                        ": rank(s) " + format_ranks(missing) + " did not connect to rank " +
                        std::to_string(rank) +
                        ". HINT: they died during start-up (see their logs), or cannot reach this host at " +
                        options.listen_address);
      }
      FrameHeader hello;
      int io_err = 0;
      const bool ok = net::recv_all(s.fd(), &hello, kHeader, deadline, &io_err) == net::IoStatus::ok;
      const int peer = static_cast<int>(hello.aux);
      if (!ok || hello.magic != kMagic || hello.op != kHello || hello.seq != name_hash ||
          hello.total != static_cast<uint64_t>(world_size) || peer <= rank || peer >= world_size ||
          comm->peers_[peer].valid())
        throw DistError(
            what + ": rank " + std::to_string(rank) +
            " got a connection that is not a peer of this communicator (wrong world size, name or rank)."
            " HINT: two jobs share MASTER_ADDR:MASTER_PORT, or ranks were started with different "
            "WORLD_SIZE");
      comm->peers_[peer] = std::move(s);
    }
  }
  comm->worker_ = std::thread([c = comm.get()] { c->worker_loop(); });
  return comm;
}

CpuComm::~CpuComm() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // Left without shutdown(): tell the peers (their collectives fail with this reason at once).
    if (!closed_ && failure_.empty() && abort_request_.empty() && world_size_ > 1)
      abort_request_ =
          "rank " + std::to_string(rank_) +
          " destroyed its communicator without shutdown() (it hit an error or returned early; see its "
          "log)";
  }
  const char c = 1;
  [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &c, 1);
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

// ---------------------------------------------------------------------------------------------------
// The worker

std::shared_ptr<CpuComm::CpuWork> CpuComm::enqueue(const char* op, Task task) {
  auto work = std::make_shared<CpuWork>();
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) {
    work->finish(std::string(op) + " on rank " + std::to_string(rank_) +
                 " after shutdown() of the communicator");
  } else if (!failure_.empty()) {
    work->finish("the communicator failed earlier: " + failure_);
  } else {
    queue_.emplace_back(work, std::move(task));
    cv_.notify_all();
  }
  return work;
}

void CpuComm::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || (!abort_request_.empty() && !abort_sent_); });
    if (!abort_request_.empty() && !abort_sent_ && queue_.empty()) {
      const std::string reason = abort_request_;
      if (failure_.empty()) failure_ = reason;
      abort_sent_ = true;
      lock.unlock();
      send_abort_to_peers(reason, rank_);
      lock.lock();
      cv_.notify_all();
      continue;
    }
    if (queue_.empty()) {
      if (stopping_) return;
      continue;
    }
    auto [work, task] = std::move(queue_.front());
    queue_.pop_front();
    if (!failure_.empty() || stopping_) {
      const std::string why = failure_.empty() ? "the communicator was destroyed" : failure_;
      lock.unlock();
      work->finish("the communicator failed earlier: " + why);
      lock.lock();
      continue;
    }
    OpContext ctx;
    ctx.seq = next_seq_++;
    ctx.timeout = timeout_;
    ctx.deadline = net::deadline_after(timeout_);
    lock.unlock();
    std::string error, root;
    int origin = rank_;
    try {
      task(ctx);
    } catch (const CommFailure& e) {
      error = e.what();
      origin = e.origin;
      root = e.root;
    } catch (const std::exception& e) {
      error = e.what();
      root = error;
    }
    if (!error.empty()) {
      lock.lock();
      if (failure_.empty()) failure_ = error;
      const bool send = !abort_sent_;
      abort_sent_ = true;
      lock.unlock();
      if (send) send_abort_to_peers(root, origin);
      lock.lock();
      cv_.notify_all();
      lock.unlock();
    }
    work->finish(error);
    lock.lock();
  }
}

void CpuComm::send_abort_to_peers(const std::string& reason, int origin) {
  const std::string text = reason.substr(0, kMaxAbortReason);
  FrameHeader h;
  h.kind = kAbort;
  h.origin = static_cast<uint32_t>(origin);
  h.nbytes = text.size();
  std::string frame(reinterpret_cast<const char*>(&h), kHeader);
  frame += text;
  // Peers with no cut-off message get the ABORT at once; then each peer reading a cut-off message gets
  // its end first, with a deadline of its own (a peer that stopped reading hears only the closed
  // connection, and does not use up the time of the others).
  auto send_abort = [&](int p, net::Deadline deadline) {
    int err = 0;
    if (!send_mid_frame_[p]) net::send_all(peers_[p].fd(), frame.data(), frame.size(), deadline, &err);
    peers_[p].shutdown_write();
  };
  for (int p = 0; p < world_size_; ++p)
    if (p != rank_ && peers_[p].valid() && !send_mid_frame_[p])
      send_abort(p, net::deadline_after(std::chrono::milliseconds(200)));
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_ || !peers_[p].valid() || !send_mid_frame_[p]) continue;
    const net::Deadline deadline = net::deadline_after(std::chrono::milliseconds(1000));
    int err = 0;
    const std::string& rest = unsent_[p].bytes;
    if (!rest.empty() &&
        net::send_all(peers_[p].fd(), rest.data(), rest.size(), deadline, &err) == net::IoStatus::ok)
      send_mid_frame_[p] = false;
    unsent_[p] = UnsentRest{};
    send_abort(p, deadline);
  }
}

void CpuComm::remember_unsent(const std::vector<Transfer>& transfers) {
  for (const Transfer& t : transfers) {
    if (!t.is_send || t.done == 0 || t.finished()) continue;
    std::string& rest = unsent_[t.peer].bytes;
    rest.clear();
    if (t.done < kHeader) rest.assign(reinterpret_cast<const char*>(&t.header) + t.done, kHeader - t.done);
    const size_t payload_done = t.done > kHeader ? t.done - kHeader : 0;
    rest.append(t.data + payload_done, t.len - payload_done);
  }
}

void CpuComm::abort(const std::string& reason) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_ || abort_sent_ || world_size_ == 1) return;
    if (abort_request_.empty()) abort_request_ = reason;
  }
  const char c = 1;
  [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &c, 1);
  cv_.notify_all();
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, std::chrono::seconds(5), [&] { return abort_sent_; });
}

void CpuComm::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout_ = timeout;
}

std::chrono::milliseconds CpuComm::timeout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeout_;
}

// ---------------------------------------------------------------------------------------------------
// Moving bytes

namespace {

CpuComm::Transfer make_send(int peer, const CpuComm::OpContext& ctx, uint32_t aux, const void* data,
                            size_t len) {
  CpuComm::Transfer t;
  t.peer = peer;
  t.is_send = true;
  t.header.op = ctx.op;
  t.header.seq = ctx.seq;
  t.header.total = ctx.total;
  t.header.dtype = ctx.dtype;
  t.header.reduce = ctx.reduce;
  t.header.aux = aux;
  t.header.nbytes = len;
  t.data = const_cast<char*>(static_cast<const char*>(data));
  t.len = len;
  return t;
}

CpuComm::Transfer make_recv(int peer, uint32_t aux, void* data, size_t len) {
  CpuComm::Transfer t;
  t.peer = peer;
  t.expect_aux = aux;
  t.data = static_cast<char*>(data);
  t.len = len;
  return t;
}

// One sendmsg or recv of what is left of t (its header, then its payload) on fd; returns its result.
ssize_t transfer_some(CpuComm::Transfer& t, int fd) {
  if (t.is_send) {
    iovec iov[2];
    int count = 0;
    if (t.done < kHeader) iov[count++] = {reinterpret_cast<char*>(&t.header) + t.done, kHeader - t.done};
    const size_t payload_done = t.done > kHeader ? t.done - kHeader : 0;
    if (t.len > payload_done) iov[count++] = {t.data + payload_done, t.len - payload_done};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    return ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  }
  if (t.done < kHeader) return ::recv(fd, reinterpret_cast<char*>(&t.header) + t.done, kHeader - t.done, 0);
  return ::recv(fd, t.data + (t.done - kHeader), t.len - (t.done - kHeader), 0);
}

// Why data header h from t's peer does not belong to the collective ctx; "" when it does.
std::string header_mismatch(const FrameHeader& h, const CpuComm::Transfer& t, const CpuComm::OpContext& ctx) {
  const std::string peer = "rank " + std::to_string(t.peer);
  if (h.op == kShutdown && ctx.op != kShutdown)
    return peer + " has already finished (called shutdown) while this rank is in " + ctx.describe() +
           ": the ranks issued different numbers of collectives";
  if (h.op != ctx.op || h.seq != ctx.seq)
    return "collective mismatch: this rank is in " + ctx.describe() + " but " + peer + " sent " +
           op_name(h.op) + " #" + std::to_string(h.seq);
  if (h.total != ctx.total || h.dtype != ctx.dtype || h.reduce != ctx.reduce) {
    std::string mismatch = "tensor mismatch in " + ctx.describe() + ": " + peer + " has " +
                           format_bytes(h.total) + " of " +
                           std::string(dtype_name(static_cast<DType>(h.dtype)));
    if (ctx.op == kAllReduce)
      mismatch += " (" + std::string(reduce_op_name(static_cast<ReduceOp>(h.reduce))) + ")";
    return mismatch;
  }
  if (h.aux != t.expect_aux)
    return "collective mismatch in " + ctx.describe() + ": " + peer +
           (ctx.op == kBroadcast
                ? " broadcasts from root " + std::to_string(h.aux) + ", this rank from " +
                      std::to_string(t.expect_aux)
                : " is at step " + std::to_string(h.aux) + ", this rank at " + std::to_string(t.expect_aux));
  if (h.nbytes != t.len)
    return "size mismatch in " + ctx.describe() + ": " + peer + " sent " + std::to_string(h.nbytes) +
           " bytes where this rank expects " + std::to_string(t.len);
  return "";
}

}  // namespace

void CpuComm::fail_peer_closed(int peer, OpContext& ctx) {
  const std::string here = ctx.describe() + " failed on rank " + std::to_string(rank_) + ": ";
  // The peer may have sent an ABORT with its reason before closing: read up to it.
  if (!recv_mid_frame_[peer]) {
    const net::Deadline deadline = net::deadline_after(std::chrono::milliseconds(1000));
    std::vector<char> skip;
    for (;;) {
      FrameHeader h;
      int err = 0;
      if (net::recv_all(peers_[peer].fd(), &h, kHeader, deadline, &err) != net::IoStatus::ok ||
          h.magic != kMagic)
        break;
      if (h.nbytes > (1ull << 32)) break;
      skip.resize(h.nbytes);
      if (net::recv_all(peers_[peer].fd(), skip.data(), skip.size(), deadline, &err) != net::IoStatus::ok)
        break;
      if (h.kind == kAbort) {
        const std::string reason(skip.begin(), skip.end());
        throw CommFailure(here + "rank " + std::to_string(h.origin) + " failed: " + reason,
                          static_cast<int>(h.origin), reason);
      }
    }
  }
  recv_mid_frame_[peer] = true;  // the stream position is unknown now
  const std::string root = "rank " + std::to_string(peer) +
                           " closed its connection (the process exited or was killed). " + kClosedHint;
  throw CommFailure(here + root, peer, ctx.describe() + " failed: " + root);
}

void CpuComm::fail_timeout(const std::vector<Transfer>& transfers, OpContext& ctx) {
  std::vector<int> not_received, not_sent;
  for (const Transfer& t : transfers) {
    if (t.finished()) continue;
    (t.is_send ? not_sent : not_received).push_back(t.peer);
  }
  std::string what;
  if (!not_received.empty() && ctx.flat) {
    what = "rank(s) " + format_ranks(not_received) + " did not arrive";
  } else if (!not_received.empty()) {
    what = "still waiting for data from rank " + format_ranks(not_received);
    if (!ctx.detail.empty()) what += " (" + ctx.detail + ")";
  } else {
    what = "rank(s) " + format_ranks(not_sent) + " are not reading what this rank sends";
  }
  const std::string message = ctx.describe() + " timed out after " + net::format_duration(ctx.timeout) +
                              " on rank " + std::to_string(rank_) + ": " + what + ". " + kTimeoutHint;
  throw CommFailure(message, rank_, message);
}

void CpuComm::progress(std::vector<Transfer>& transfers, OpContext& ctx) {
  try {
    move_transfers(transfers, ctx);
  } catch (...) {
    remember_unsent(transfers);
    throw;
  }
}

void CpuComm::move_transfers(std::vector<Transfer>& transfers, OpContext& ctx) {
  // Only the peers of unfinished transfers are polled. A peer that delivered its part may finish the
  // collective and leave before us; that is not our failure. A failure further away reaches us all
  // the same: the rank waiting on the failed one fails and sends ABORT to everyone waiting on it, so
  // the error travels along every chain of waits (ring or flat) as fast as the data would have.
  std::vector<pollfd> fds;
  std::vector<int> owner;  // index into transfers
  for (;;) {
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    owner.assign(1, 0);
    for (size_t i = 0; i < transfers.size(); ++i) {
      const Transfer& t = transfers[i];
      if (t.finished()) continue;
      fds.push_back({peers_[t.peer].fd(), static_cast<short>(t.is_send ? POLLOUT : POLLIN), 0});
      owner.push_back(static_cast<int>(i));
    }
    if (fds.size() == 1) return;
    const int rc = ::poll(fds.data(), fds.size(), net::poll_timeout_ms(ctx.deadline));
    if (rc < 0 && errno != EINTR)
      throw DistError(ctx.describe() + ": poll failed: " + net::errno_text(errno));
    if (fds[0].revents & POLLIN) throw_if_abort_requested(ctx);
    for (size_t k = 1; k < fds.size(); ++k)
      if (fds[k].revents != 0) advance(transfers[owner[k]], ctx);
    if (Clock::now() >= ctx.deadline) {
      bool all = true;
      for (const Transfer& t : transfers) all = all && t.finished();
      if (!all) fail_timeout(transfers, ctx);
    }
  }
}

void CpuComm::throw_if_abort_requested(OpContext& ctx) {
  char drain[64];
  while (::read(wake_[0], drain, sizeof drain) > 0) {
  }
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason = abort_request_;
  }
  if (!reason.empty())
    throw CommFailure(ctx.describe() + " aborted on rank " + std::to_string(rank_) + ": " + reason, rank_,
                      reason);
}

void CpuComm::advance(Transfer& t, OpContext& ctx) {
  while (!t.finished()) {
    const ssize_t n = transfer_some(t, peers_[t.peer].fd());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) fail_peer_closed(t.peer, ctx);
    const bool header_was_incomplete = t.done < kHeader;
    t.done += static_cast<size_t>(n);
    (t.is_send ? send_mid_frame_ : recv_mid_frame_)[t.peer] = !t.finished();
    if (!t.is_send && header_was_incomplete && t.done >= kHeader) check_arrived_header(t, ctx);
  }
}

void CpuComm::check_arrived_header(const Transfer& t, OpContext& ctx) {
  const FrameHeader& h = t.header;
  const std::string here = ctx.describe() + " on rank " + std::to_string(rank_);
  if (h.magic != kMagic)
    throw CommFailure(here + ": garbled data from rank " + std::to_string(t.peer) + " (not a trainer peer?)",
                      rank_, "garbled data");
  if (h.kind == kAbort) {
    std::string reason(std::min<uint64_t>(h.nbytes, kMaxAbortReason), '\0');
    int err = 0;
    net::recv_all(peers_[t.peer].fd(), reason.data(), reason.size(),
                  net::deadline_after(std::chrono::seconds(1)), &err);
    recv_mid_frame_[t.peer] = true;
    throw CommFailure(here + " stopped because rank " + std::to_string(h.origin) + " failed: " + reason,
                      static_cast<int>(h.origin), reason);
  }
  if (const std::string mismatch = header_mismatch(h, t, ctx); !mismatch.empty()) {
    const std::string message = mismatch + " (seen on rank " + std::to_string(rank_) + "). " + kMismatchHint;
    throw CommFailure(message, rank_, message);
  }
}

void CpuComm::run_flat_exchange(const void* send, size_t send_len, const std::vector<char*>& recv,
                                const std::vector<size_t>& recv_len, uint32_t aux, OpContext& ctx) {
  std::vector<Transfer> transfers;
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    transfers.push_back(make_send(p, ctx, aux, send, send_len));
    transfers.push_back(make_recv(p, aux, recv[p], recv_len[p]));
  }
  ctx.flat = true;
  progress(transfers, ctx);
  ctx.flat = false;
}

std::vector<char*> CpuComm::scratch_buffers(size_t bytes_each) {
  scratch_.resize(world_size_);
  std::vector<char*> out(world_size_, nullptr);
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    if (scratch_[p].size() < bytes_each) scratch_[p].resize(bytes_each);  // grows once, then reused
    out[p] = scratch_[p].data();
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Collectives

void CpuComm::all_reduce_flat(char* data, size_t count, DType dtype, ReduceOp op, OpContext& ctx) {
  const size_t nbytes = count * dtype_size(dtype);
  const std::vector<char*> recv = scratch_buffers(nbytes);
  run_flat_exchange(data, nbytes, recv, std::vector<size_t>(world_size_, nbytes), 0, ctx);
  // Reduce in rank order ((r0 + r1) + r2) ... on every rank: identical bits everywhere. Rank 0
  // accumulates in place; the others accumulate into rank 0's received copy.
  char* acc = rank_ == 0 ? data : recv[0];
  for (int p = 1; p < world_size_; ++p) reduce_bytes(acc, p == rank_ ? data : recv[p], count, dtype, op);
  if (op == ReduceOp::avg) divide_bytes(acc, count, dtype, world_size_);
  if (acc != data && nbytes) std::memcpy(data, acc, nbytes);
}

int CpuComm::ring_reduce_scatter(char* data, size_t count, DType dtype, ReduceOp op, int offset,
                                 OpContext& ctx) {
  const int n = world_size_, r = rank_;
  const size_t es = dtype_size(dtype);
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  auto begin = [&](int c) { return count * static_cast<size_t>(c) / static_cast<size_t>(n); };
  auto length = [&](int c) { return begin(c + 1) - begin(c); };
  char* tmp = scratch_buffers((count / n + 1) * es)[left];
  // After n-1 steps rank r holds the full reduction of chunk r+1+offset.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (r - s + offset + n) % n, recv_c = (r - s - 1 + offset + 2 * n) % n;
    std::vector<Transfer> transfers{make_send(right, ctx, s, data + begin(send_c) * es, length(send_c) * es),
                                    make_recv(left, s, tmp, length(recv_c) * es)};
    ctx.detail = "ring reduce-scatter step " + std::to_string(s + 1) + " of " + std::to_string(n - 1) +
                 "; in a ring, the rank that is behind may be further up";
    progress(transfers, ctx);
    reduce_bytes(data + begin(recv_c) * es, tmp, length(recv_c), dtype, op);
  }
  const int owned = (r + 1 + offset) % n;
  if (op == ReduceOp::avg) divide_bytes(data + begin(owned) * es, length(owned), dtype, n);
  return owned;
}

void CpuComm::all_reduce_ring(char* data, size_t count, DType dtype, ReduceOp op, OpContext& ctx) {
  const int n = world_size_, r = rank_;
  const size_t es = dtype_size(dtype);
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  auto begin = [&](int c) { return count * static_cast<size_t>(c) / static_cast<size_t>(n); };
  auto length = [&](int c) { return begin(c + 1) - begin(c); };
  ring_reduce_scatter(data, count, dtype, op, 0, ctx);
  // All-gather: pass the finished chunks around the ring.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (r + 1 - s + n) % n, recv_c = (r - s + n) % n;
    const uint32_t step = static_cast<uint32_t>(n - 1 + s);
    std::vector<Transfer> transfers{
        make_send(right, ctx, step, data + begin(send_c) * es, length(send_c) * es),
        make_recv(left, step, data + begin(recv_c) * es, length(recv_c) * es)};
    ctx.detail = "ring all-gather step " + std::to_string(s + 1) + " of " + std::to_string(n - 1) +
                 "; in a ring, the rank that is behind may be further up";
    progress(transfers, ctx);
  }
}

void CpuComm::run_all_reduce(Tensor& t, ReduceOp op, OpContext& ctx) {
  ctx.op = kAllReduce;
  ctx.total = t.nbytes();
  ctx.dtype = static_cast<uint8_t>(t.dtype());
  ctx.reduce = static_cast<uint8_t>(op);
  char* data = static_cast<char*>(t.raw_data());
  const size_t count = static_cast<size_t>(t.numel());
  if (world_size_ == 1) return;
  if (t.nbytes() <= kFlatAllReduceBytes || world_size_ == 2) {
    all_reduce_flat(data, count, t.dtype(), op, ctx);
  } else {
    all_reduce_ring(data, count, t.dtype(), op, ctx);
  }
}

std::shared_ptr<Work> CpuComm::all_reduce_async(Tensor tensor, ReduceOp op) {
  const DType dt = tensor.dtype();
  if (dt != DType::f32 && dt != DType::f64 && dt != DType::i64)
    throw DistError("all_reduce on the CPU communicator supports f32, f64 and i64 tensors, got " +
                    std::string(dtype_name(dt)));
  if (dt == DType::i64 && op == ReduceOp::avg)
    throw DistError("all_reduce: avg of an i64 tensor is not an integer; use sum and divide");
  const bool direct = tensor.device().is_cpu() && tensor.is_contiguous();
  Tensor buffer = direct ? tensor : tensor.to(Device::cpu()).contiguous();
  return enqueue("all_reduce", [this, tensor, buffer, op, direct](OpContext& ctx) mutable {
    run_all_reduce(buffer, op, ctx);
    if (!direct) tensor.copy_(buffer);
  });
}

void CpuComm::reduce_scatter(Tensor& input, Tensor& output, ReduceOp op) {
  check_reduce_scatter_shapes(input, output, world_size_);
  const DType dt = input.dtype();
  if (dt != DType::f32 && dt != DType::f64 && dt != DType::i64)
    throw DistError("reduce_scatter on the CPU communicator supports f32, f64 and i64 tensors, got " +
                    std::string(dtype_name(dt)));
  if (dt == DType::i64 && op == ReduceOp::avg)
    throw DistError("reduce_scatter: avg of an i64 tensor is not an integer; use sum and divide");
  // The ring accumulates in place: straight in the caller's input when it is a contiguous CPU tensor.
  Tensor buffer =
      input.device().is_cpu() && input.is_contiguous() ? input : input.to(Device::cpu()).contiguous();
  const int64_t k = output.numel();
  enqueue("reduce_scatter", [this, &buffer, op](OpContext& ctx) {
    ctx.op = kReduceScatter;
    ctx.total = buffer.nbytes();
    ctx.dtype = static_cast<uint8_t>(buffer.dtype());
    ctx.reduce = static_cast<uint8_t>(op);
    if (world_size_ == 1) return;
    // offset n-1: rank r ends up owning chunk r, as the contract says.
    ring_reduce_scatter(static_cast<char*>(buffer.raw_data()), static_cast<size_t>(buffer.numel()),
                        buffer.dtype(), op, world_size_ - 1, ctx);
  })->wait();
  output.copy_(buffer.reshape({buffer.numel()}).slice(0, rank_ * k, (rank_ + 1) * k));
}

void CpuComm::broadcast(Tensor& tensor, int root) {
  if (root < 0 || root >= world_size_)
    throw DistError("broadcast from root " + std::to_string(root) + " in a world of size " +
                    std::to_string(world_size_));
  const bool direct = tensor.device().is_cpu() && tensor.is_contiguous();
  Tensor buffer = direct ? tensor : tensor.to(Device::cpu()).contiguous();
  enqueue("broadcast", [this, &buffer, root](OpContext& ctx) {
    ctx.op = kBroadcast;
    ctx.total = buffer.nbytes();
    ctx.dtype = static_cast<uint8_t>(buffer.dtype());
    char* data = static_cast<char*>(buffer.raw_data());
    std::vector<Transfer> transfers;
    if (rank_ == root) {
      for (int p = 0; p < world_size_; ++p)
        if (p != rank_) transfers.push_back(make_send(p, ctx, root, data, buffer.nbytes()));
      ctx.detail = "the root sends to every rank";
    } else {
      transfers.push_back(make_recv(root, root, data, buffer.nbytes()));
      ctx.detail = "rank " + std::to_string(root) + " is the root";
    }
    progress(transfers, ctx);
  })->wait();
  if (!direct) tensor.copy_(buffer);
}

std::vector<Tensor> CpuComm::all_gather(const Tensor& tensor) {
  Tensor mine = tensor.to(Device::cpu()).contiguous();
  const std::vector<int64_t> meta = gather_meta(mine);  // checked before anything is sent
  std::vector<Tensor> result(world_size_);
  enqueue("all_gather", [this, &mine, &meta, &result](OpContext& ctx) {
    // Phase 1: every rank's dtype and shape.
    ctx.op = kAllGatherMeta;
    const size_t meta_bytes = meta.size() * sizeof(int64_t);
    const std::vector<char*> recv = scratch_buffers(meta_bytes);
    run_flat_exchange(meta.data(), meta_bytes, recv, std::vector<size_t>(world_size_, meta_bytes), 0, ctx);
    std::vector<int64_t> metas(static_cast<size_t>(kGatherMetaWords) * world_size_);
    for (int p = 0; p < world_size_; ++p)
      std::memcpy(metas.data() + kGatherMetaWords * p,
                  p == rank_ ? meta.data() : reinterpret_cast<const int64_t*>(recv[p]), meta_bytes);
    std::vector<Shape> shapes;
    try {
      shapes = check_gather_meta(metas.data(), world_size_, "all_gather #" + std::to_string(ctx.seq));
    } catch (const DistError& e) {
      throw CommFailure(e.what(), rank_, e.what());
    }
    // Phase 2: the data.
    ctx.op = kAllGatherData;
    // Straight into the result tensors: no staging copy.
    std::vector<size_t> lens(world_size_);
    std::vector<char*> into(world_size_, nullptr);
    for (int p = 0; p < world_size_; ++p) {
      result[p] = p == rank_ ? mine : Tensor::empty(shapes[p], mine.dtype());  // dtypes agree
      lens[p] = result[p].nbytes();
      into[p] = static_cast<char*>(result[p].raw_data());
    }
    run_flat_exchange(mine.raw_data(), mine.nbytes(), into, lens, 1, ctx);
  })->wait();
  if (!tensor.device().is_cpu())
    for (Tensor& t : result) t = t.to(tensor.device());
  return result;
}

void CpuComm::barrier() {
  enqueue("barrier", [this](OpContext& ctx) {
    ctx.op = kBarrier;
    run_flat_exchange(nullptr, 0, std::vector<char*>(world_size_, nullptr),
                      std::vector<size_t>(world_size_, 0), 0, ctx);
  })->wait();
}

void CpuComm::shutdown() {
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    failed = !failure_.empty();
  }
  std::string error;
  if (!failed && world_size_ > 1) {
    try {
      enqueue("shutdown", [this](OpContext& ctx) {
        ctx.op = kShutdown;
        run_flat_exchange(nullptr, 0, std::vector<char*>(world_size_, nullptr),
                          std::vector<size_t>(world_size_, 0), 0, ctx);
      })->wait();
    } catch (const DistError& e) {
      error = e.what();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (auto& p : peers_) p.close();
  if (!error.empty()) throw DistError(error);
}

}  // namespace trainer
