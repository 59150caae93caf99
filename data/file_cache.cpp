#include "data/file_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <system_error>
#include <thread>

namespace trainer {

// The mapping: this header, then an index of one word per file (0 = not cached, else 1 + the entry's
// offset in the data area), then the data area of entries {uint64_t size; bytes; padding to 8}. The
// same layout in private and shared memory. Atomics in shared memory work across processes because
// they are lock-free (checked below).
struct FileCache::Header {
  std::atomic<uint64_t> ready;  // kReady once the creator has laid the cache out
  uint64_t files;
  uint64_t capacity;             // bytes of the data area
  std::atomic<uint64_t> used;    // bytes of the data area taken
  std::atomic<uint64_t> cached;  // entries in the index
  std::atomic<int32_t> attached;
  std::atomic<int32_t> unlinked;  // the shared name has been removed
};

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "the cache's atomics live in shared memory and must be lock-free");

constexpr uint64_t kReady = 0x7472636163686531;  // "trcache1"
constexpr uint64_t kEntryHeader = sizeof(uint64_t);

uint64_t round_up8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

std::string errno_text(const std::string& what) {
  return what + ": " + std::error_code(errno, std::generic_category()).message();
}

std::atomic<uint64_t>* index_of(void* mapping) {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(mapping) + sizeof(FileCache::Header));
}

}  // namespace

FileCache::FileCache(int64_t files, uint64_t most_bytes, FileCacheOptions options)
    : files_count_(files), options_(std::move(options)) {
  const uint64_t needed = most_bytes + static_cast<uint64_t>(files) * (kEntryHeader + 7);
  capacity_ = std::min<uint64_t>(static_cast<uint64_t>(std::max<int64_t>(0, options_.budget_bytes)), needed);
  capacity_ = round_up8(capacity_);
  mapping_size_ = sizeof(Header) + static_cast<size_t>(files) * sizeof(uint64_t) + capacity_;
  if (!options_.shared_name.empty()) {
    const std::string problem = options_.create ? create_shared() : attach_shared();
    if (problem.empty()) {
      shared_ = true;
      return;
    }
    // Each of the node's ranks now keeps a cache: together they stay within the node's budget.
    const int sharers = std::max(1, options_.sharers);
    capacity_ = round_up8(capacity_ / static_cast<uint64_t>(sharers));
    mapping_size_ = sizeof(Header) + static_cast<size_t>(files) * sizeof(uint64_t) + capacity_;
    fallback_reason_ = "shared memory " + options_.shared_name + ": " + problem + "; each of the node's " +
                       std::to_string(sharers) + " ranks caches on its own, in 1/" + std::to_string(sharers) +
                       " of data.cache_bytes";
  }
  map_private();
}

FileCache::~FileCache() {
  if (!mapping_) return;
  if (shared_ && header()->unlinked.exchange(1) == 0) ::shm_unlink(options_.shared_name.c_str());
  ::munmap(mapping_, mapping_size_);
}

FileCache::Header* FileCache::header() const { return static_cast<Header*>(mapping_); }

void FileCache::map_private() {
  // Pages are committed as entries fill them: a large budget costs nothing until used.
  mapping_ = ::mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping_ == MAP_FAILED) throw std::bad_alloc();
  Header* h = new (mapping_) Header{};
  h->files = static_cast<uint64_t>(files_count_);
  h->capacity = capacity_;
  h->ready.store(kReady);
}

std::string FileCache::create_shared() {
  const char* name = options_.shared_name.c_str();
  int fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {  // left by an earlier job of the same id that crashed
    ::shm_unlink(name);
    fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return errno_text("cannot create");
  // Writing past what tmpfs can hold would kill the process with SIGBUS: reserve all of it now (the
  // capacity is capped at what the entries can need, so this is no more than the cache can use).
  std::string problem;
  struct statvfs fs {};
  if (::ftruncate(fd, static_cast<off_t>(mapping_size_)) != 0) {
    problem = errno_text("cannot size");
  } else if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(mapping_size_)); error != 0) {
    errno = error;
    problem = errno_text("cannot reserve " + std::to_string(mapping_size_) + " bytes") +
              (::fstatvfs(fd, &fs) == 0
                   ? " (" + std::to_string(uint64_t{fs.f_bavail} * fs.f_frsize) + " bytes free in /dev/shm)"
                   : std::string());
  } else {
    mapping_ = ::mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping_ == MAP_FAILED) {
      mapping_ = nullptr;
      problem = errno_text("cannot map");
    }
  }
  ::close(fd);
  if (!problem.empty()) {
    ::shm_unlink(name);
    return problem;
  }
  Header* h = new (mapping_) Header{};  // the index is zero already (a new file)
  h->files = static_cast<uint64_t>(files_count_);
  h->capacity = capacity_;
  h->ready.store(kReady, std::memory_order_release);
  if (h->attached.fetch_add(1) + 1 >= options_.sharers && h->unlinked.exchange(1) == 0) ::shm_unlink(name);
  return "";
}

std::string FileCache::attach_shared() {
  const char* name = options_.shared_name.c_str();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.attach_timeout_seconds);
  const auto wait = [&] {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return true;
  };
  int fd = -1;
  while ((fd = ::shm_open(name, O_RDWR, 0)) < 0) {
    if (errno != ENOENT) return errno_text("cannot open");
    if (!wait())
      return "local rank 0 did not create it within " + std::to_string(options_.attach_timeout_seconds) +
             " s";
  }
  struct stat info {};
  while (::fstat(fd, &info) == 0 && static_cast<size_t>(info.st_size) < mapping_size_) {
    if (!wait()) {
      ::close(fd);
      return "it holds " + std::to_string(info.st_size) + " bytes, not the " + std::to_string(mapping_size_) +
             " this rank expects: do the ranks list the same files with the same data.cache_bytes?";
    }
  }
  mapping_ = ::mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    return errno_text("cannot map");
  }
  Header* h = header();
  while (h->ready.load(std::memory_order_acquire) != kReady) {
    if (!wait()) {
      ::munmap(mapping_, mapping_size_);
      mapping_ = nullptr;
      return "local rank 0 did not finish laying it out";
    }
  }
  if (h->files != static_cast<uint64_t>(files_count_) || h->capacity != capacity_) {
    ::munmap(mapping_, mapping_size_);
    mapping_ = nullptr;
    return "local rank 0 made it for " + std::to_string(h->files) + " files and " +
           std::to_string(h->capacity) + " bytes, this rank expects " + std::to_string(files_count_) +
           " and " + std::to_string(capacity_);
  }
  if (h->attached.fetch_add(1) + 1 >= options_.sharers && h->unlinked.exchange(1) == 0) ::shm_unlink(name);
  return "";
}

CachedFile FileCache::find(int64_t index) const {
  if (index < 0 || index >= files_count_) return {};
  const uint64_t slot = index_of(mapping_)[index].load(std::memory_order_acquire);
  if (slot == 0) return {};
  const char* entry = static_cast<const char*>(mapping_) + sizeof(Header) +
                      static_cast<size_t>(files_count_) * sizeof(uint64_t) + (slot - 1);
  uint64_t size = 0;
  std::memcpy(&size, entry, sizeof size);
  return {reinterpret_cast<const uint8_t*>(entry + kEntryHeader), static_cast<size_t>(size)};
}

bool FileCache::insert(int64_t index, const uint8_t* data, size_t size) {
  if (index < 0 || index >= files_count_) return false;
  std::atomic<uint64_t>& slot = index_of(mapping_)[index];
  if (slot.load(std::memory_order_acquire) != 0) return true;
  Header* h = header();
  const uint64_t need = round_up8(kEntryHeader + size);
  uint64_t offset = h->used.load();
  do {
    if (offset + need > capacity_) return false;
  } while (!h->used.compare_exchange_weak(offset, offset + need));
  char* entry = static_cast<char*>(mapping_) + sizeof(Header) +
                static_cast<size_t>(files_count_) * sizeof(uint64_t) + offset;
  const uint64_t size64 = size;
  std::memcpy(entry, &size64, sizeof size64);
  std::memcpy(entry + kEntryHeader, data, size);
  uint64_t empty = 0;
  // Another thread or rank may have cached the same file meanwhile: its entry wins, this space stays unused.
  if (slot.compare_exchange_strong(empty, offset + 1, std::memory_order_release)) h->cached.fetch_add(1);
  return true;
}

bool FileCache::has_room_for(size_t size) const {
  return header()->used.load(std::memory_order_relaxed) + round_up8(kEntryHeader + size) <= capacity_;
}

int64_t FileCache::files() const { return static_cast<int64_t>(header()->cached.load()); }
uint64_t FileCache::bytes() const { return header()->used.load(); }

int64_t default_cache_bytes(int64_t available_memory) { return std::max<int64_t>(0, available_memory / 4); }

}  // namespace trainer
