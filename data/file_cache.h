#pragma once
// data.cache: an entry per dataset file kept in host memory after its first good read, so that later
// epochs (and evaluations) read memory instead of the disk or a network file system. What an entry
// holds is the caller's: the file's bytes (data.cache = "encoded") or its decoded, downscaled pixels
// (data.cache = "decoded", data/decoded_cache.h). Entries are added until the byte budget is spent and
// never evicted: beyond the budget the rest is read from disk every time, which costs nothing more
// than no cache.
//
// The ranks of a node can share one cache (POSIX shared memory, shm_open + mmap): local rank 0 creates
// it, the others attach, and the name is removed as soon as all of them have attached (or when the
// creator exits), so a crashed job leaves no segment behind once its ranks have started. Where shared
// memory cannot be had (no /dev/shm, too small a /dev/shm, a rank that never came), each process keeps
// its own cache and the reason is given (fallback_reason()).
//
// What the cache assumes of the files, and how ImageFolder keeps it true (data/image_folder.cpp): an
// entry is what the file held when the dataset was listed at start. It is filled only from a read
// whose file had, before and after the read, the size and modification time listed at start; and
// every use of an entry first checks (one stat) that the file still has them. A file rewritten during
// the run is therefore never trained on stale: from then on it is read from disk every time, and never
// cached again. The check cannot see a rewrite that keeps both the size and the modification time (a
// tool that restores mtimes, or a file system with coarse timestamps rewritten within one tick). The
// cache lives only as long as the job (its name holds the dataset's fingerprint and a job id), so a new
// run reads every file again.
#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer {

struct FileCacheOptions {
  // Entry bytes kept at most (the index, 8 bytes a file, comes on top). The cache takes no more than
  // its entries can need either (the constructor's most_bytes).
  int64_t budget_bytes = 0;
  // Shared memory name ("/trainer-..."); "" keeps the cache in this process.
  std::string shared_name;
  bool create = true;  // local rank 0 creates the shared cache; the other ranks attach to it
  int sharers = 1;     // processes that attach (LOCAL_WORLD_SIZE); the name goes once all have
  double attach_timeout_seconds = 120;  // an attaching rank waits this long for the creator
};

// A view of an entry's bytes; data is null when the file is not cached.
struct CachedFile {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

class FileCache {
 public:
  // A cache for the entries of files 0..files-1, which need most_bytes at most all together (the listed
  // files' sizes added up for their bytes; an estimate for decoded images, data/decoded_cache.h). Never
  // throws for want of shared memory: it falls back to a cache of this process.
  FileCache(int64_t files, uint64_t most_bytes, FileCacheOptions options);
  ~FileCache();
  FileCache(const FileCache&) = delete;
  FileCache& operator=(const FileCache&) = delete;

  // Thread-safe and lock-free; the bytes stay valid and unchanged for the cache's life.
  CachedFile find(int64_t index) const;
  // Keeps a copy of the bytes when the budget allows. Returns whether file `index` is now cached.
  bool insert(int64_t index, const uint8_t* data, size_t size);
  // Whether an entry of `size` bytes would still fit (another thread or rank may take the room first):
  // lets a caller skip the work of making an entry that could not be kept.
  bool has_room_for(size_t size) const;

  int64_t files() const;                           // cached so far (by any process sharing it)
  uint64_t bytes() const;                          // their bytes, with 8 an entry of bookkeeping
  uint64_t capacity() const { return capacity_; }  // the budget, capped at what the files need
  bool shared() const { return shared_; }
  const std::string& fallback_reason() const { return fallback_reason_; }  // "" when as asked

  struct Header;  // the mapping's first bytes (data/file_cache.cpp)

 private:
  Header* header() const;
  void map_private();
  std::string create_shared();  // "" or what went wrong
  std::string attach_shared();

  int64_t files_count_;
  uint64_t capacity_;
  FileCacheOptions options_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  bool shared_ = false;
  std::string fallback_reason_;
};

// A quarter of MemAvailable: the default data.cache_bytes (-1), leaving the rest to the loader's
// batches, the model and the page cache.
int64_t default_cache_bytes(int64_t available_memory);

}  // namespace trainer
