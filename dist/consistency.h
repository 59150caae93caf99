#pragma once
// Agreement checks between ranks. Ranks that silently differ are the classic distributed failure:
// a different config or dataset trains a different problem per rank, and a rank that runs one step
// more than the others waits forever in an all-reduce nobody else joins. These checks turn both into
// an error on every rank, naming the ranks and values that differ.
//
// Before the ranks connect, through the store (one key per rank, one verdict from rank 0):
// check_consistency(store, ...) for the build, the communicator and the GPUs. Once connected, one tiny
// all_gather of a hash first, the store only when ranks differ (check_consistency_connected: a rank
// that has gone is noticed at once): the config, the data, the steps, the resume point. Every epoch,
// through the communicator: check_epoch_steps(comm, epoch, steps).
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

class Store;
class Comm;

struct ConsistencyItem {
  std::string name;   // "config hash"
  std::string value;  // compared as text
  std::string hint;   // what to do when ranks differ (or, for a distinct item, share a value)
  // false: every rank must have the same value. true: no two ranks may have the same value (the GPU
  // each trains on: two ranks on one GPU run out of memory or crawl while another GPU idles).
  bool distinct = false;
};

// What must be equal on every rank before training starts.
struct RunIdentity {
  std::string build;                // version + git revision + backends, e.g. "trainer 0.1.0 (b51c007, cpu)"
  std::string config_hash;          // content_hash of the resolved config, minus per-rank fields
  std::string dataset_fingerprint;  // Dataset::fingerprint() of the training split
  int64_t steps_per_epoch = 0;      // optimizer steps each rank will run per epoch
};
std::vector<ConsistencyItem> run_identity_items(const RunIdentity& identity);

// Every rank publishes `items` under "consistency/<tag>/"; rank 0 compares them and publishes a
// verdict; every rank throws the same DistError when any item differs ("start-up check failed: ...
// config hash: rank 0, 2: 'a1..'; rank 1: 'ff..'. HINT: ..."), or when ranks share the value of a
// distinct item ("GPU: 'host-a GPU-5f..' on rank(s) 0, 1"), or names the ranks that never arrived
// within `timeout`. Every rank must call it with the same tag.
void check_consistency(Store& store, int rank, int world_size, const std::vector<ConsistencyItem>& items,
                       std::chrono::milliseconds timeout, const std::string& tag = "startup");

// check_consistency for ranks that are already connected: first one all_gather of a hash of `items`
// through `comm`, which notices at once a rank that died before this point of its own error (a
// missing dataset, a port in use), as any collective does, where a store wait would last `timeout`.
// Only when the hashes differ do the ranks exchange their items through the store, for the message.
// A collective: every rank must call it at the same point, with the same tag.
void check_consistency_connected(Comm& comm, Store& store, int rank, int world_size,
                                 const std::vector<ConsistencyItem>& items, std::chrono::milliseconds timeout,
                                 const std::string& tag);

// All ranks must pass the same value (one all_gather of one int64); throws DistError on every rank
// "ranks disagree on <what>: 468 on rank(s) 0, 2; 469 on rank(s) 1. HINT: <hint>".
void check_same_on_all_ranks(Comm& comm, const std::string& what, int64_t value, const std::string& hint);
// The steps this rank will run in `epoch` (0-based); call before the epoch's first step.
// claimed_extra: steps this rank claims beyond `steps`, 0 but under the test hook
// TRAINER_TEST_EPOCH_STEPS (read at start-up by the caller, app/train/fault_injection.h), so the check
// can be seen stopping real ranks.
void check_epoch_steps(Comm& comm, int64_t epoch, int64_t steps, int64_t claimed_extra = 0);

// 16 hex digits of FNV-1a 64 of `text`: stable across hosts and builds.
std::string content_hash(std::string_view text);

}  // namespace trainer
