#include "dist/consistency.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "dist/comm.h"
#include "dist/error.h"
#include "dist/socket.h"
#include "dist/store.h"

namespace trainer {
namespace {

std::string encode(const std::vector<ConsistencyItem>& items) {
  std::string out;
  for (const auto& it : items) {
    out += std::to_string(it.name.size()) + ":" + it.name;
    out += std::to_string(it.value.size()) + ":" + it.value;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> decode(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t pos = 0;
  auto field = [&](std::string* s) {
    const size_t colon = text.find(':', pos);
    if (colon == std::string::npos) return false;
    const size_t n = std::stoul(text.substr(pos, colon - pos));
    *s = text.substr(colon + 1, n);
    pos = colon + 1 + n;
    return true;
  };
  while (pos < text.size()) {
    std::string name, value;
    if (!field(&name) || !field(&value)) break;
    out.emplace_back(std::move(name), std::move(value));
  }
  return out;
}

// What a rank that did not report an item shows for it.
constexpr const char* kNotReported = "<not reported>";

// Long enough for a whole build line (its run-time library versions come last, and are what most
// often differs between nodes); cuts only runaway values.
std::string shorten(const std::string& v) { return v.size() <= 300 ? v : v.substr(0, 297) + "..."; }

// "'a1..' on rank(s) 0, 2; 'ff..' on rank(s) 1", values in order of first appearance.
std::string grouped(const std::vector<std::string>& values, bool quote) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    if (!ranks.count(values[r])) order.push_back(values[r]);
    ranks[values[r]].push_back(r);
  }
  std::string out;
  for (const auto& v : order) {
    if (!out.empty()) out += "; ";
    // Appends one piece at a time (GCC 12 warns falsely on "'" + std::string temporaries).
    if (quote) out += '\'';
    out += quote ? shorten(v) : v;
    if (quote) out += '\'';
    out += " on rank(s) ";
    out += format_ranks(ranks[v]);
  }
  return out;
}

// The values of `values` (one per rank) that two or more ranks share, as "'v' on rank(s) 0, 1; ...",
// in order of first appearance; those ranks are added to `ranks`. "" when every rank has its own.
std::string shared_values(const std::vector<std::string>& values, std::vector<int>& ranks) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> holders;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    std::vector<int>& h = holders[values[r]];
    if (h.empty()) order.push_back(values[r]);
    h.push_back(r);
  }
  std::string out;
  for (const std::string& v : order) {
    const std::vector<int>& h = holders[v];
    // Ranks that did not report the item at all (another kind of device) differ elsewhere already.
    if (h.size() < 2 || v == kNotReported) continue;
    for (int r : h)
      if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
    if (!out.empty()) out += "; ";
    out += '\'';
    out += shorten(v);
    out += "' on rank(s) ";
    out += format_ranks(h);
  }
  return out;
}

// Every rank's `value`, in rank order (one all_gather of one int64).
std::vector<int64_t> gather_one(Comm& comm, int64_t value) {
  std::vector<int64_t> values;
  for (const Tensor& t : comm.all_gather(Tensor::from_vector<int64_t>({value}, {1})))
    values.push_back(t.data<int64_t>()[0]);
  return values;
}

// FNV-1a, 64 bits (data/hash.h has it too, but dist/ does not link the data library).
uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::string content_hash(std::string_view text) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(text)));
  return buf;
}

std::vector<ConsistencyItem> run_identity_items(const RunIdentity& id) {
  return {
      {"trainer build", id.build,
       "install the same trainer build on every node (a shared file system or the same container image)"},
      {"config hash", id.config_hash,
       "start every rank with the same config file and the same --set overrides"},
      {"dataset fingerprint", id.dataset_fingerprint,
       "every node must see identical data: the same files at the same path (sync them, or use a shared "
       "file system)"},
      {"steps per epoch", std::to_string(id.steps_per_epoch),
       "ranks that run different numbers of steps hang in the last all-reduce: use the same dataset, batch "
       "size, "
       "grad_accum_steps and data.drop_last on every rank"},
  };
}

void check_consistency(Store& store, int rank, int world_size, const std::vector<ConsistencyItem>& items,
                       std::chrono::milliseconds timeout, const std::string& tag) {
  if (world_size <= 1) return;
  const std::string prefix = "consistency/" + tag + "/";
  store.set(prefix + "items/" + std::to_string(rank), encode(items));
  std::string verdict;
  if (rank == 0) {
    try {
      store.wait_for_ranks(prefix + "items/", world_size, timeout, "the " + tag + " consistency check");
      // values[name][rank]
      std::vector<std::string> names;
      std::map<std::string, std::vector<std::string>> values;
      std::map<std::string, std::string> hints;
      std::map<std::string, bool> distinct;
      for (const auto& it : items) {
        names.push_back(it.name);
        hints[it.name] = it.hint;
        distinct[it.name] = it.distinct;
      }
      for (int r = 0; r < world_size; ++r) {
        for (auto& [name, value] : decode(store.get(prefix + "items/" + std::to_string(r), timeout))) {
          auto& v = values[name];
          if (v.empty()) {
            v.assign(world_size, kNotReported);
            if (!hints.count(name)) names.push_back(name);
          }
          v[r] = value;
        }
      }
      std::string problems;
      std::vector<int> differing, sharing;
      for (const auto& name : names) {
        auto& v = values[name];
        if (v.empty()) v.assign(world_size, kNotReported);
        if (distinct[name]) {
          const std::string shared = shared_values(v, sharing);
          if (!shared.empty()) problems += "\n  " + name + " shared: " + shared + ". HINT: " + hints[name];
          continue;
        }
        bool same = true;
        for (int r = 1; r < world_size; ++r) {
          if (v[r] != v[0]) {
            same = false;
            if (std::find(differing.begin(), differing.end(), r) == differing.end()) differing.push_back(r);
          }
        }
        if (same) continue;
        problems += "\n  " + name + ": " + grouped(v, true) + ".";
        if (!hints[name].empty()) problems += " HINT: " + hints[name];
      }
      std::sort(sharing.begin(), sharing.end());
      std::string who;
      if (!differing.empty()) who = " rank(s) " + format_ranks(differing) + " differ from rank 0";
      if (!sharing.empty())
        who += (who.empty() ? " rank(s) " : "; rank(s) ") + format_ranks(sharing) +
               " share what must be their own";
      verdict = problems.empty() ? "ok" : "the " + tag + " check failed:" + who + ":" + problems;
    } catch (const WaitInterrupted& e) {
      // Stopped by a signal while waiting: tell the others at once (they would wait for the verdict).
      store.set(prefix + "verdict", "rank 0 was " + std::string(e.what()));
      throw;
    } catch (const DistError& e) {
      verdict = e.what();
    }
    store.set(prefix + "verdict", verdict);
    // On failure rank 0 is about to exit and take the store with it: first let the others read why
    // (briefly: ranks that never arrived will not read it either).
    if (verdict != "ok")
      store.wait_for({prefix + "all_read"},
                     std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(5)));
  } else {
    // Rank 0 answers within `timeout` (or reports the ranks that never came); allow for its own work.
    verdict = store.get(prefix + "verdict", timeout * 2 + std::chrono::seconds(10));
    if (verdict != "ok" && store.add(prefix + "read", 1) == world_size - 1)
      store.set(prefix + "all_read", "");
  }
  if (verdict != "ok") throw DistError(verdict);
}

void check_consistency_connected(Comm& comm, Store& store, int rank, int world_size,
                                 const std::vector<ConsistencyItem>& items, std::chrono::milliseconds timeout,
                                 const std::string& tag) {
  if (world_size <= 1) return;
  // Equal hashes prove only equality: items every rank must hold alone go through the store.
  for (const ConsistencyItem& it : items)
    if (it.distinct) return check_consistency(store, rank, world_size, items, timeout, tag);
  const auto hash = static_cast<int64_t>(fnv1a64(encode(items)));
  const std::vector<int64_t> hashes = gather_one(comm, hash);
  if (std::any_of(hashes.begin(), hashes.end(), [&](int64_t h) { return h != hash; }))
    check_consistency(store, rank, world_size, items, timeout, tag);
}

void check_same_on_all_ranks(Comm& comm, const std::string& what, int64_t value, const std::string& hint) {
  if (comm.world_size() <= 1) return;
  std::vector<std::string> values;
  bool same = true;
  for (int64_t v : gather_one(comm, value)) {
    values.push_back(std::to_string(v));
    same = same && values.back() == values.front();
  }
  if (!same) throw DistError("ranks disagree on " + what + ": " + grouped(values, false) + ". HINT: " + hint);
}

void check_epoch_steps(Comm& comm, int64_t epoch, int64_t steps, int64_t claimed_extra) {
  steps += claimed_extra;
  check_same_on_all_ranks(
      comm, "the number of steps in epoch " + std::to_string(epoch + 1), steps,
      "a rank that runs more steps than the others would wait forever in its extra gradient all-reduce; give "
      "every rank the same number of samples (the DistributedSampler pads or, with data.drop_last = true, "
      "drops "
      "the remainder) and the same batch size and grad_accum_steps");
}

}  // namespace trainer
