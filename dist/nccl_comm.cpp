// NCCL behind the Comm interface; see dist/nccl_comm.h for the stream protocol and failure handling.
// Built with the CUDA backend only (CMake leaves it out otherwise).
#include "dist/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "dist/error.h"
#include "dist/peer_liveness.h"
#include "dist/socket.h"
#include "dist/store.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/format_bytes.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

const char* kTimeoutHint =
    "HINT: a rank died, is stuck, or issued a different sequence of collectives (the first error in the "
    "other ranks' logs is the cause; NCCL_DEBUG=WARN adds NCCL's view); if one rank legitimately works "
    "alone for long (writing a checkpoint), raise the distributed timeout";
const char* kErrorHint =
    "HINT: ncclRemoteError / ncclSystemError usually mean another rank died (see its log) or the network "
    "between hosts failed; run with NCCL_DEBUG=WARN for NCCL's reason (and NCCL_NVLS_ENABLE=0 on "
    "NVSwitch hosts where multicast is not available)";

std::string hex_encode(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

bool hex_decode(const std::string& text, void* out, size_t n) {
  if (text.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

bool nccl_dtype(DType d, ncclDataType_t* out) {
  switch (d) {
    case DType::f32:
      *out = ncclFloat32;
      return true;
    case DType::f64:
      *out = ncclFloat64;
      return true;
    case DType::f16:
      *out = ncclFloat16;
      return true;
    case DType::bf16:
      *out = ncclBfloat16;
      return true;
    case DType::i64:
      *out = ncclInt64;
      return true;
    case DType::u8:
      *out = ncclUint8;
      return true;
  }
  return false;
}

const char* kDeadPeerHint =
    "HINT: the first error in that rank's log is the cause; one that died without a word was killed (out of "
    "memory: see dmesg; the launcher or scheduler says by which signal); restart the job (torchrun "
    "--max-restarts, or train --resume auto from the last checkpoint)";

// ncclCommAbort blocks, in non-blocking mode too. It should return as soon as the abort flag has stopped
// the kernels, but a hang there would turn a clear error into a hung rank, so it runs on a thread of its
// own; after `limit` the caller goes on without it (the communicator leaks; the process is about to end
// with its error).
void abort_bounded(ncclComm_t comm, int device, std::chrono::milliseconds limit) {
  struct State {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
  };
  auto state = std::make_shared<State>();
  std::thread([comm, device, state] {
    cudaSetDevice(device);
    ncclCommAbort(comm);
    std::lock_guard<std::mutex> lock(state->m);
    state->done = true;
    state->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(state->m);
  if (!state->cv.wait_for(lock, limit, [&] { return state->done; }))
    std::fprintf(stderr, "trainer: warning: ncclCommAbort did not return within %s; going on without it\n",
                 net::format_duration(limit).c_str());
}

void cuda_or_throw(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess)
    throw DistError("NCCL communicator: " + what + " failed: " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ")");
}

// One collective in flight: its done event on the communication stream and the tensors it uses.
struct Pending {
  std::string op;        // "all_reduce"
  std::string describe;  // "#3, 1.0 KiB of f32, avg"
  Clock::time_point start;
  cudaEvent_t done = nullptr;
  std::vector<Tensor> keep_alive;
  std::atomic<bool> finished{false};  // the communication stream passed `done`
  std::atomic<bool> failed{false};
  bool captured = false;  // recorded into a CUDA graph being captured: never run or watched itself

  ~Pending() {
    if (done) cudaEventDestroy(done);
  }
};

}  // namespace

struct NcclComm::Impl {
  int rank = 0;
  int world = 1;
  NcclCommOptions options;
  std::string key_prefix;  // "nccl/<name>/<generation>/"

  // NCCL calls and the communicator handle: the caller's thread issues, the watchdog aborts.
  std::mutex call_mutex;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the communication stream
  cudaEvent_t ready = nullptr;    // recorded on the compute stream at each issue (call_mutex)
  uint64_t next_seq = 0;          // call_mutex
  Tensor barrier_buf;             // [1] f32 on the device

  mutable std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Pending>> pending;
  // Collectives recorded by a capture, kept (with their tensors) until a replay of the graph is watched:
  // by then the capture is over.
  std::vector<std::shared_ptr<Pending>> captured;
  std::string failure;  // the first error; the communicator is unusable once set
  std::atomic<bool> failed{false};
  bool closed = false;
  bool stopping = false;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  std::unique_ptr<PeerWatch> peer_watch;  // the watchdog thread's only; null when off
  std::thread watchdog;

  ~Impl() {
    if (ready) cudaEventDestroy(ready);
    if (stream) cudaStreamDestroy(stream);
  }

  std::string where() const { return "rank " + std::to_string(rank) + " of " + std::to_string(world); }

  std::string failure_text() const {
    std::lock_guard<std::mutex> lock(mutex);
    return failure;
  }

  void throw_if_unusable(const char* op) const {
    std::lock_guard<std::mutex> lock(mutex);
    if (closed) throw DistError(std::string("NCCL ") + op + " on " + where() + " after shutdown()");
    if (!failure.empty()) throw DistError("the NCCL communicator failed earlier: " + failure);
  }

  // Aborts the NCCL communicator (its kernels exit) unless done already. The caller's NCCL calls are
  // short (non-blocking mode; settle() gives up once `failed` is set), so call_mutex is free soon. The
  // handle is taken out under the lock, so no other call can use it while it is aborted.
  void abort_nccl() {
    ncclComm_t c = nullptr;
    {
      std::lock_guard<std::mutex> lock(call_mutex);
      std::swap(c, comm);
    }
    if (c) abort_bounded(c, options.device, options.abort_limit);
  }

  // First failure wins: records it, fails every pending collective, aborts NCCL, and (tell_peers)
  // posts the reason to the store so the other ranks' watchdogs fail at once.
  void fail(const std::string& message, bool tell_peers) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure.empty()) return;
      failure = message;
      failed = true;
      for (auto& p : pending) p->failed = true;
      cv.notify_all();
    }
    abort_nccl();
    if (tell_peers && options.watchdog_store && world > 1) {
      try {
        options.watchdog_store->set(key_prefix + "abort", message);
      } catch (const std::exception&) {
        // Rank 0's store is gone too: the peers find out through their own timeout.
      }
    }
  }

  // In non-blocking mode an NCCL call may return ncclInProgress: poll until it settles. Returns the
  // error text, "" on success. Holds call_mutex (the caller's).
  std::string settle(ncclResult_t result, const std::string& what, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (result == ncclInProgress) {
      if (failed) return "";  // the watchdog failed us; the caller throws the recorded failure
      if (Clock::now() > deadline)
        return "NCCL " + what + " did not complete within " + net::format_duration(limit) + " on " + where() +
               ": a rank probably died or diverged. " + kTimeoutHint;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (ncclCommGetAsyncError(comm, &result) != ncclSuccess && result == ncclInProgress) break;
    }
    if (result == ncclSuccess) return "";
    const char* last = ncclGetLastError(comm);
    return "NCCL " + what + " failed on " + where() + ": " + ncclGetErrorString(result) +
           (last && *last ? std::string(" (") + last + ")" : std::string()) + ". " + kErrorHint;
  }

  // Orders the collective after the compute stream's queued work, issues it on the communication
  // stream and registers its done event with the watchdog. `keep` stays alive until the stream passed it.
  std::shared_ptr<Pending> launch(const char* op, const std::string& detail, std::vector<Tensor> keep,
                                  const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call) {
    throw_if_unusable(op);
    auto p = std::make_shared<Pending>();
    std::string error;
    {
      std::lock_guard<std::mutex> lock(call_mutex);
      if (!comm) throw DistError("the NCCL communicator failed earlier: " + failure_text());
      cudaStream_t compute = cuda_stream();
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      cuda_or_throw(cudaStreamIsCapturing(compute, &capture), "cudaStreamIsCapturing");
      p->captured = capture != cudaStreamCaptureStatusNone;
      const uint64_t seq = next_seq++;
      p->op = op;
      p->describe = "#" + std::to_string(seq) + (detail.empty() ? "" : ", " + detail) + ", " + where() +
                    (p->captured ? ", in a CUDA graph" : "");
      cuda_or_throw(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "cudaEventCreate");
      cuda_or_throw(cudaEventRecord(ready, compute), "cudaEventRecord (compute stream)");
      cuda_or_throw(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent (communication stream)");
      error = settle(call(comm, stream), std::string(op) + " (" + p->describe + ")", timeout_now());
      if (error.empty() && !failed)
        cuda_or_throw(cudaEventRecord(p->done, stream), "cudaEventRecord (communication stream)");
    }
    if (!error.empty()) {
      fail(error, true);
      throw DistError(error);
    }
    p->keep_alive = std::move(keep);
    p->start = Clock::now();
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty()) throw DistError("the NCCL communicator failed earlier: " + failure);
    if (p->captured)
      captured.push_back(p);
    else
      pending.push_back(p);
    return p;
  }

  // Watches everything queued on the compute stream so far (a graph replay) as one collective would be.
  void watch_compute_stream(const std::string& op, const std::string& describe) {
    throw_if_unusable(op.c_str());
    auto p = std::make_shared<Pending>();
    p->op = op;
    p->describe = describe + ", " + where();
    cuda_or_throw(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "cudaEventCreate");
    cuda_or_throw(cudaEventRecord(p->done, cuda_stream()), "cudaEventRecord (after a graph replay)");
    p->start = Clock::now();
    std::vector<std::shared_ptr<Pending>> capture_over;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure.empty()) throw DistError("the NCCL communicator failed earlier: " + failure);
      pending.push_back(p);
      capture_over.swap(captured);
    }
    capture_over.clear();  // frees their tensors outside the lock
  }

  std::chrono::milliseconds timeout_now() const {
    std::lock_guard<std::mutex> lock(mutex);
    return timeout;
  }

  void throw_if_failed(const Pending& p) const {
    if (p.failed || failed) {
      const std::string f = failure_text();
      throw DistError(f.empty() ? "NCCL " + p.op + " (" + p.describe + ") failed" : f);
    }
  }

  // The compute stream waits for the collective; the host does not.
  void stream_wait(const Pending& p) const {
    throw_if_failed(p);
    if (p.finished) return;
    cuda_or_throw(cudaStreamWaitEvent(cuda_stream(), p.done, 0), "cudaStreamWaitEvent (compute stream)");
  }

  // The host waits for the collective, polling so that a failure (timeout, abort) ends the wait.
  void host_wait(const Pending& p) const {
    if (p.captured)
      throw DistError("NCCL " + p.op + " (" + p.describe +
                      "): the host cannot wait for a collective recorded in a CUDA graph capture. HINT: "
                      "barrier(), all_gather and collectives on CPU tensors cannot be captured; issue them "
                      "outside the captured step");
    auto nap = std::chrono::microseconds(2);
    for (;;) {
      throw_if_failed(p);
      if (p.finished) return;
      const cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_or_throw(q, "waiting for NCCL " + p.op);
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(500));
    }
  }

  void watchdog_loop() {
    cudaSetDevice(options.device);
    auto last_store_poll = Clock::now();
    auto last_peer_poll = Clock::now() - std::chrono::seconds(1);
    bool store_usable = options.watchdog_store != nullptr && world > 1;
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      cv.wait_for(lock, options.watchdog_interval);
      if (stopping) break;
      if (!failure.empty()) continue;
      // Completed collectives leave in issue order (one stream); their tensors are released here.
      std::string error;
      const auto now = Clock::now();
      while (!pending.empty()) {
        Pending& p = *pending.front();
        const cudaError_t q = cudaEventQuery(p.done);
        if (q == cudaSuccess) {
          p.finished = true;
          auto done = std::move(pending.front());
          pending.pop_front();
          lock.unlock();
          done.reset();  // frees its tensors outside the lock
          lock.lock();
          continue;
        }
        if (q != cudaErrorNotReady) {
          error = "NCCL " + p.op + " (" + p.describe + ") failed on the GPU: " + cudaGetErrorName(q) + " (" +
                  cudaGetErrorString(q) + ")";
        } else if (now - p.start > timeout) {
          error = "NCCL " + p.op + " did not complete within " + net::format_duration(timeout) + " (" +
                  p.describe + "): a rank probably died or diverged. " + kTimeoutHint;
        }
        break;
      }
      const bool old_pending = !pending.empty() && now - pending.front()->start > std::chrono::seconds(1);
      std::shared_ptr<Pending> oldest = old_pending ? pending.front() : nullptr;
      if (!error.empty() && peer_watch) {  // a timeout: say which peers went silent, if any did
        const std::string silent = describe_silent_peers(peer_watch->liveness().silent(now));
        if (!silent.empty()) error += " Meanwhile " + silent + ".";
      }
      lock.unlock();
      if (error.empty()) {
        // NCCL's own view: a network error, a peer that closed its connections, an abort.
        std::lock_guard<std::mutex> call_lock(call_mutex);
        ncclResult_t async = ncclSuccess;
        if (comm && ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          const char* last = ncclGetLastError(comm);
          error = "NCCL reported an error on " + where() + ": " + ncclGetErrorString(async) +
                  (last && *last ? std::string(" (") + last + ")" : std::string()) + ". " + kErrorHint;
        }
      }
      bool from_peer = false;
      if (error.empty() && store_usable && old_pending && now - last_store_poll > std::chrono::seconds(1)) {
        last_store_poll = now;
        try {
          if (options.watchdog_store->check(key_prefix + "abort")) {
            error = "NCCL communicator '" + options.name + "' on " + where() +
                    " was aborted by another rank: " +
                    options.watchdog_store->get(key_prefix + "abort", std::chrono::seconds(5));
            from_peer = true;
          }
        } catch (const std::exception&) {
          store_usable = false;  // rank 0's store is gone: the peer watch names rank 0
        }
      }
      if (error.empty() && peer_watch && oldest && now - last_peer_poll >= std::chrono::seconds(1)) {
        last_peer_poll = now;
        const auto silent = peer_watch->poll(now);
        // Only while that collective is still not done: it may have completed during the poll.
        if (!silent.empty() && cudaEventQuery(oldest->done) == cudaErrorNotReady)
          error =
              "NCCL " + oldest->op + " (" + oldest->describe +
              ") cannot complete: " + describe_silent_peers(silent) +
              "; that process died or is frozen (NCCL does not notice a dead peer by itself, so this rank "
              "aborted the communicator). " +
              kDeadPeerHint;
      }
      if (!error.empty()) fail(error, !from_peer);
      oldest.reset();  // outside the lock, like the tensors of completed collectives
      lock.lock();
    }
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }

  // Waits (bounded) for the communication stream, then drops the pending collectives' tensors. If the
  // stream does not drain, they are leaked rather than handed back while NCCL may still use them.
  void drain(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (cudaStreamQuery(stream) == cudaErrorNotReady && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mutex);
    if (cudaStreamQuery(stream) == cudaSuccess) {
      pending.clear();
      captured.clear();
    } else {
      for (auto& p : pending) new std::shared_ptr<Pending>(p);  // leaked on purpose
      for (auto& p : captured) new std::shared_ptr<Pending>(p);
      pending.clear();
      captured.clear();
    }
  }
};

namespace {

enum class CopyBack { none, device, host };

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm::Impl> impl, std::shared_ptr<Pending> pending, Tensor target,
           Tensor buffer, CopyBack copy_back)
      : impl_(std::move(impl)),
        pending_(std::move(pending)),
        target_(std::move(target)),
        buffer_(std::move(buffer)),
        copy_back_(copy_back) {}

  // Device tensors: the compute stream waits, the host returns at once. CPU tensors: the host waits.
  void wait() override {
    if (waited_) {
      impl_->throw_if_failed(*pending_);
      return;
    }
    if (copy_back_ == CopyBack::host) {
      impl_->host_wait(*pending_);
    } else {
      impl_->stream_wait(*pending_);
    }
    waited_ = true;
    if (copy_back_ != CopyBack::none) target_.copy_(buffer_);
  }

  bool completed() const override {
    if (pending_->captured) return false;  // it runs in each replay, not now
    return pending_->finished || pending_->failed || impl_->failed ||
           cudaEventQuery(pending_->done) == cudaSuccess;
  }

 private:
  std::shared_ptr<NcclComm::Impl> impl_;
  std::shared_ptr<Pending> pending_;
  Tensor target_, buffer_;
  CopyBack copy_back_;
  bool waited_ = false;
};

class DoneWork : public Work {
 public:
  void wait() override {}
  bool completed() const override { return true; }
};

// Throws unless `t` is on the host or on this communicator's GPU (never silently another GPU's).
void check_device_of(const Tensor& t, Device dev, const std::string& op) {
  if (t.device().is_cuda() && t.device() != dev)
    throw DistError("NCCL " + op + ": the tensor is on " + t.device().str() +
                    " but this communicator drives " + dev.str());
}

// A contiguous buffer on `dev` holding `t`, and how a result in it goes back into `t`.
struct Staged {
  Tensor buffer;
  CopyBack copy_back = CopyBack::none;
};
Staged stage(const Tensor& t, Device dev) {
  if (t.device().is_cpu()) return {t.to(dev).contiguous(), CopyBack::host};
  if (!t.is_contiguous()) return {t.contiguous(), CopyBack::device};
  return {t, CopyBack::none};
}

// NCCL's dtype and reduction for a reducing collective, or DistError naming `op`.
std::pair<ncclDataType_t, ncclRedOp_t> reduction_of(DType dt, ReduceOp op, const std::string& op_name) {
  ncclDataType_t nt;
  if (!nccl_dtype(dt, &nt))
    throw DistError("NCCL " + op_name + ": unsupported dtype " + std::string(dtype_name(dt)));
  if ((dt == DType::i64 || dt == DType::u8) && op == ReduceOp::avg)
    throw DistError(op_name + ": avg of an integer tensor is not an integer; use sum and divide");
  return {nt, op == ReduceOp::sum ? ncclSum : op == ReduceOp::avg ? ncclAvg : ncclMax};
}

}  // namespace

// -------------------------------------------------------------------------------------------------

namespace {

// NCCL runs on the GPU this process's CUDA backend drives, which must be the one options name.
void check_backend_device(const NcclCommOptions& options) {
  int current = -1;
  try {
    current = cuda_context().device;
  } catch (const std::exception&) {
    throw DistError(
        "NCCL communicator: the CUDA backend is not initialised. HINT: call "
        "init_cuda_backend(LOCAL_RANK) before creating the process group");
  }
  if (current != options.device)
    throw DistError("NCCL communicator for GPU " + std::to_string(options.device) +
                    " but this process drives GPU " + std::to_string(current) +
                    ". HINT: pass DistOptions::device = the device of init_cuda_backend");
}

// Rank 0 asks NCCL for the communicator's unique id and publishes it under `key`; the others read it.
ncclUniqueId exchange_unique_id(Store& store, int rank, const std::string& key,
                                const NcclCommOptions& options) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw DistError(std::string("ncclGetUniqueId failed on rank 0: ") + ncclGetErrorString(r) +
                      ". HINT: NCCL could not find a network interface: set NCCL_SOCKET_IFNAME, and run "
                      "with NCCL_DEBUG=INFO");
    store.set(key, hex_encode(&id, sizeof id));
  } else {
    const std::string text = store.get(key, options.connect_timeout);
    if (!hex_decode(text, &id, sizeof id))
      throw DistError("NCCL communicator '" + options.name + "': the unique id in the store is malformed (" +
                      std::to_string(text.size()) + " characters). HINT: ranks run different trainer builds");
  }
  return id;
}

// Waits for a non-blocking ncclCommInitRankConfig (r: what it returned) to complete within
// options.connect_timeout; a stop signal meanwhile aborts it and throws. Returns why it failed, or "".
std::string wait_for_init(ncclComm_t comm, ncclResult_t r, const NcclCommOptions& options) {
  if (r != ncclSuccess && r != ncclInProgress)
    return std::string(ncclGetErrorString(r)) +
           (comm ? std::string(" (") + ncclGetLastError(comm) + ")" : "");
  const auto deadline = Clock::now() + options.connect_timeout;
  auto next_stop_check = Clock::now() + net::kStopCheckInterval;
  while (r == ncclInProgress) {
    if (Clock::now() > deadline)
      return "did not complete within " + net::format_duration(options.connect_timeout);
    if (Clock::now() > next_stop_check) {  // a stop signal at start-up (set_store_wait_interrupt)
      next_stop_check = Clock::now() + net::kStopCheckInterval;
      if (const int signal = pending_stop_signal()) {
        ncclCommAbort(comm);
        throw_stopped(signal, "setting up NCCL communicator '" + options.name + "'");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) return std::string(ncclGetErrorString(r)) + " (" + ncclGetLastError(comm) + ")";
  return "";
}

// NCCL's communicator for this rank. Non-blocking mode: set-up and every call return at once (or
// ncclInProgress), so a rank that never arrives is a timeout here, and the watchdog can always abort.
ncclComm_t init_nccl_comm(const ncclUniqueId& id, int rank, int world_size, const NcclCommOptions& options) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  const std::string error = wait_for_init(comm, r, options);
  if (!error.empty()) {
    if (comm) ncclCommAbort(comm);
    throw DistError(
        "NCCL communicator '" + options.name + "' set-up on rank " + std::to_string(rank) + " of " +
        std::to_string(world_size) + " (GPU " + std::to_string(options.device) + ") " + error +
        ". HINT: a rank died during start-up (see its log), or NCCL cannot reach the other hosts: "
        "run with NCCL_DEBUG=INFO, set NCCL_SOCKET_IFNAME, and NCCL_NVLS_ENABLE=0 on NVSwitch hosts");
  }
  return comm;
}

}  // namespace

std::shared_ptr<NcclComm> NcclComm::create(Store& store, int rank, int world_size,
                                           const NcclCommOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw DistError("NcclComm: rank " + std::to_string(rank) + " outside a world of size " +
                    std::to_string(world_size));
  check_backend_device(options);
  cuda_stream();  // makes our device current on this thread

  auto impl = std::make_shared<Impl>();
  impl->rank = rank;
  impl->world = world_size;
  impl->options = options;
  impl->timeout = options.timeout;
  // Every rank counts its creations of this name: the k-th communicator of a name gets generation k on
  // every rank (creation is collective), so a second one never reads the first one's id.
  const std::string base = "nccl/" + options.name + "/";
  const int64_t generation = (store.add(base + "created", 1) - 1) / world_size;
  impl->key_prefix = base + std::to_string(generation) + "/";
  const ncclUniqueId id = exchange_unique_id(store, rank, impl->key_prefix + "unique_id", options);

  int least = 0, greatest = 0;
  cuda_or_throw(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  // High priority: NCCL's kernels get SMs while backward's kernels fill the GPU, as in PyTorch.
  cuda_or_throw(cudaStreamCreateWithPriority(&impl->stream, cudaStreamNonBlocking, greatest),
                "cudaStreamCreateWithPriority");
  cuda_or_throw(cudaEventCreateWithFlags(&impl->ready, cudaEventDisableTiming), "cudaEventCreate");

  impl->comm = init_nccl_comm(id, rank, world_size, options);
  impl->barrier_buf = Tensor::zeros({1}, DType::f32, Device::cuda(options.device));
  if (options.watchdog_store && world_size > 1 && options.peer_silent_after.count() > 0)
    impl->peer_watch = std::make_unique<PeerWatch>(*options.watchdog_store, rank, world_size,
                                                   options.peer_silent_after, std::chrono::milliseconds(0));
  impl->watchdog = std::thread([p = impl.get()] { p->watchdog_loop(); });
  return std::shared_ptr<NcclComm>(new NcclComm(std::move(impl)));
}

NcclComm::~NcclComm() {
  Impl& s = *impl_;
  bool closed, failed;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    closed = s.closed;
    failed = !s.failure.empty();
  }
  if (!closed) {
    if (!failed)
      s.fail(
          "rank " + std::to_string(s.rank) +
              " destroyed its NCCL communicator without shutdown() (it hit an error or returned early; see "
              "its log)",
          true);
    s.abort_nccl();
    s.stop_watchdog();
    s.drain(std::chrono::seconds(10));
  }
}

int NcclComm::rank() const { return impl_->rank; }
int NcclComm::world_size() const { return impl_->world; }
runtime::Stream NcclComm::stream() const { return runtime::Stream(impl_->stream); }

void NcclComm::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->timeout = timeout;
}

std::chrono::milliseconds NcclComm::timeout() const { return impl_->timeout_now(); }

std::shared_ptr<Work> NcclComm::all_reduce_async(Tensor tensor, ReduceOp op) {
  const DType dt = tensor.dtype();
  const auto [nt, red] = reduction_of(dt, op, "all_reduce");
  const Device dev = Device::cuda(impl_->options.device);
  check_device_of(tensor, dev, "all_reduce");
  if (tensor.numel() == 0) return std::make_shared<DoneWork>();
  const Staged staged = stage(tensor, dev);
  const Tensor& buffer = staged.buffer;
  const std::string detail = format_bytes(buffer.nbytes()) + " of " + std::string(dtype_name(dt)) + ", " +
                             std::string(reduce_op_name(op));
  void* data = buffer.raw_data();
  const size_t count = static_cast<size_t>(buffer.numel());
  auto p = impl_->launch("all_reduce", detail, {buffer}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(data, data, count, nt, red, c, s);
  });
  return std::make_shared<NcclWork>(impl_, std::move(p), tensor, buffer, staged.copy_back);
}

void NcclComm::reduce_scatter(Tensor& input, Tensor& output, ReduceOp op) {
  check_reduce_scatter_shapes(input, output, impl_->world);
  const DType dt = input.dtype();
  const auto [nt, red] = reduction_of(dt, op, "reduce_scatter");
  const Device dev = Device::cuda(impl_->options.device);
  check_device_of(input, dev, "reduce_scatter");
  check_device_of(output, dev, "reduce_scatter");
  if (output.numel() == 0) return;
  const Tensor send = input.device() == dev ? input.contiguous() : input.to(dev).contiguous();
  const Staged recv = stage(output, dev);
  const std::string detail = format_bytes(send.nbytes()) + " of " + std::string(dtype_name(dt)) + ", " +
                             std::string(reduce_op_name(op));
  const void* send_data = send.raw_data();
  void* recv_data = recv.buffer.raw_data();
  const size_t count = static_cast<size_t>(recv.buffer.numel());
  auto p = impl_->launch("reduce_scatter", detail, {send, recv.buffer}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclReduceScatter(send_data, recv_data, count, nt, red, c, s);
  });
  NcclWork(impl_, std::move(p), output, recv.buffer, recv.copy_back).wait();
}

void NcclComm::broadcast(Tensor& tensor, int root) {
  if (root < 0 || root >= impl_->world)
    throw DistError("broadcast from root " + std::to_string(root) + " in a world of size " +
                    std::to_string(impl_->world));
  const Device dev = Device::cuda(impl_->options.device);
  check_device_of(tensor, dev, "broadcast");
  if (tensor.numel() == 0) return;
  const Staged staged = stage(tensor, dev);
  const Tensor& buffer = staged.buffer;
  void* data = buffer.raw_data();
  const size_t bytes = buffer.nbytes();
  const std::string detail = format_bytes(bytes) + " of " + std::string(dtype_name(tensor.dtype())) +
                             " from rank " + std::to_string(root);
  auto p = impl_->launch("broadcast", detail, {buffer}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclBroadcast(data, data, bytes, ncclUint8, root, c, s);
  });
  NcclWork(impl_, std::move(p), tensor, buffer, staged.copy_back).wait();
}

std::vector<Tensor> NcclComm::all_gather(const Tensor& tensor) {
  const Device dev = Device::cuda(impl_->options.device);
  check_device_of(tensor, dev, "all_gather");
  const int world = impl_->world;
  const Tensor mine = tensor.device().is_cpu() ? tensor.to(dev).contiguous() : tensor.contiguous();

  // Phase 1: every rank's dtype and shape (kGatherMetaWords x i64 each).
  const std::vector<int64_t> meta = gather_meta(mine);
  Tensor meta_dev = Tensor::from_vector<int64_t>(meta, {kGatherMetaWords}).to(dev);
  Tensor metas_dev = Tensor::empty({kGatherMetaWords * world}, DType::i64, dev);
  {
    void* send = meta_dev.raw_data();
    void* recv = metas_dev.raw_data();
    auto p = impl_->launch("all_gather", "sizes", {meta_dev, metas_dev}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(send, recv, kGatherMetaWords, ncclInt64, c, s);
    });
    impl_->host_wait(*p);
  }
  const std::vector<int64_t> metas = metas_dev.to_vector<int64_t>();
  const std::vector<Shape> shapes = check_gather_meta(metas.data(), world, "NCCL all_gather");

  // Phase 2: the data, each rank's rows padded to the largest dim 0, then trimmed.
  auto rows_of = [](const Shape& s) -> int64_t { return s.empty() ? 1 : s[0]; };
  int64_t row_numel = 1;
  for (size_t d = 1; d < shapes[0].size(); ++d) row_numel *= shapes[0][d];
  int64_t max_rows = 0;
  for (const Shape& s : shapes) max_rows = std::max(max_rows, rows_of(s));
  const int64_t block = max_rows * row_numel;  // elements per rank, padded
  std::vector<Tensor> result(world);
  if (block == 0) {
    for (int p = 0; p < world; ++p) result[p] = Tensor::empty(shapes[p], mine.dtype(), tensor.device());
    return result;
  }
  Tensor send = mine.reshape({mine.numel()});
  if (mine.numel() != block) {
    send = Tensor::empty({block}, mine.dtype(), dev);
    if (mine.numel() > 0) send.slice(0, 0, mine.numel()).copy_(mine.reshape({mine.numel()}));
  }
  Tensor recv = Tensor::empty({block * world}, mine.dtype(), dev);
  {
    void* s_ptr = send.raw_data();
    void* r_ptr = recv.raw_data();
    const size_t bytes = send.nbytes();
    auto p = impl_->launch(
        "all_gather",
        format_bytes(bytes) + " of " + std::string(dtype_name(mine.dtype())) + " per rank (padded)",
        {send, recv},
        [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(s_ptr, r_ptr, bytes, ncclUint8, c, s); });
    if (tensor.device().is_cpu())
      impl_->host_wait(*p);
    else
      impl_->stream_wait(*p);
  }
  for (int p = 0; p < world; ++p) {
    result[p] = recv.slice(0, p * block, p * block + rows_of(shapes[p]) * row_numel).view(shapes[p]);
    if (tensor.device().is_cpu()) result[p] = result[p].to(Device::cpu());
  }
  return result;
}

void NcclComm::barrier() {
  void* data = impl_->barrier_buf.raw_data();
  auto p = impl_->launch("barrier", "", {}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, c, s);
  });
  impl_->host_wait(*p);
}

void NcclComm::watch_graph_replay(const std::string& what) {
  impl_->watch_compute_stream("CUDA graph replay", what);
}

size_t NcclComm::pending_count() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->pending.size();
}

size_t NcclComm::captured_count() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->captured.size();
}

void NcclComm::throw_if_failed() const {
  if (!impl_->failed) return;
  const std::string f = impl_->failure_text();
  throw DistError(f.empty() ? "the NCCL communicator failed" : "the NCCL communicator failed earlier: " + f);
}

void NcclComm::abort(const std::string& reason) {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.closed) return;
  }
  s.fail(
      "NCCL communicator '" + s.options.name + "' aborted by rank " + std::to_string(s.rank) + ": " + reason,
      true);
}

void NcclComm::shutdown() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.closed) return;
  }
  // A last barrier: no rank tears down its connections while another still communicates. It also
  // drains the communication stream (it is the last thing on it).
  std::string error;
  if (!s.failed) {
    try {
      barrier();
    } catch (const DistError& e) {
      error = e.what();
    }
  }
  s.stop_watchdog();
  {
    std::unique_lock<std::mutex> lock(s.call_mutex);
    if (s.comm) {
      if (s.failed || !error.empty()) {
        lock.unlock();
        s.abort_nccl();
      } else {
        ncclResult_t r = ncclCommFinalize(s.comm);
        const auto deadline = Clock::now() + s.timeout_now();
        while (r == ncclInProgress && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          if (ncclCommGetAsyncError(s.comm, &r) != ncclSuccess) break;
        }
        if (r == ncclSuccess) {
          ncclCommDestroy(s.comm);
          s.comm = nullptr;
        } else {
          lock.unlock();
          s.abort_nccl();
        }
      }
    }
  }
  s.drain(std::chrono::seconds(10));
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.closed = true;
  }
  if (!error.empty()) throw DistError(error);
}

}  // namespace trainer
