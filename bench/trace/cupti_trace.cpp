// CUPTI's activity records of one run of steps: kernels, memcpys, memsets and runtime API calls summed
// by name, with the GPU's busy time (nn_bench --trace). CMake builds cupti_trace.cpp with the CUDA
// backend and no_trace.cpp without.
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bench/trace/kernel_trace.h"

// A small Nsight-Systems substitute: CUPTI activity records of kernels, memcpys, memsets and runtime
// API calls, summed by name. libcupti is loaded at run time so that the bench runs without it.
namespace trainer::trace {
namespace {

struct Stat {
  int64_t count = 0;
  uint64_t ns = 0;
};

struct Cupti {
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetCallbackName) callback_name = nullptr;
};

Cupti g_api;
std::map<std::string, Stat> g_gpu, g_api_calls;
std::vector<std::pair<uint64_t, uint64_t>> g_busy;

// "trainer::CudaBackend::bn_apply" for our grid-stride lambdas; the kernel name, shortened, otherwise.
std::string short_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                           std::free);
  std::string n = status == 0 && d ? d.get() : mangled;
  for (size_t a; (a = n.find("(anonymous namespace)::")) != std::string::npos;) n.erase(a, 23);
  const size_t fe = n.find("for_each_kernel<");
  if (fe != std::string::npos) {
    const size_t t = n.find("trainer::", fe + 16);
    if (t != std::string::npos) {
      size_t e = n.find('(', t);
      std::string fn = n.substr(t, e - t);
      if (fn.find("{lambda") != std::string::npos) fn = fn.substr(0, fn.find("::{lambda"));
      return "for_each " + fn;
    }
  }
  const size_t cut = n.find('(');
  if (cut != std::string::npos && cut > 0) n = n.substr(0, cut);
  return n.size() > 110 ? n.substr(0, 110) : n;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{16} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (g_api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    auto gpu = [](const std::string& name, uint64_t start, uint64_t end) {
      Stat& s = g_gpu[name];
      ++s.count;
      s.ns += end - start;
      g_busy.emplace_back(start, end);
    };
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      gpu(short_name(k->name), k->start, k->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      gpu("[memcpy kind " + std::to_string(m->copyKind) + "]", m->start, m->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      gpu("[memset]", m->start, m->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME || rec->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      const char* name = nullptr;
      g_api.callback_name(
          rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
          a->cbid, &name);
      Stat& s = g_api_calls[name ? name : "?"];
      ++s.count;
      s.ns += a->end - a->start;
    }
  }
  std::free(buffer);
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};

}  // namespace

bool start() {
  void* lib = dlopen("libcupti.so.13", RTLD_NOW);
  if (!lib) lib = dlopen("libcupti.so", RTLD_NOW);
  if (!lib) {
    std::fprintf(stderr, "nn_bench: --trace needs libcupti: %s\n", dlerror());
    return false;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name));
  };
  sym(g_api.enable, "cuptiActivityEnable");
  sym(g_api.disable, "cuptiActivityDisable");
  sym(g_api.register_callbacks, "cuptiActivityRegisterCallbacks");
  sym(g_api.flush_all, "cuptiActivityFlushAll");
  sym(g_api.next_record, "cuptiActivityGetNextRecord");
  sym(g_api.callback_name, "cuptiGetCallbackName");
  if (!g_api.enable || !g_api.register_callbacks || !g_api.next_record || !g_api.callback_name) return false;
  if (g_api.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return false;
  for (CUpti_ActivityKind k : kKinds)
    if (g_api.enable(k) != CUPTI_SUCCESS) return false;
  return true;
}

void report(int steps, double wall_s) {
  g_api.flush_all(1);
  for (CUpti_ActivityKind k : kKinds) g_api.disable(k);
  std::sort(g_busy.begin(), g_busy.end());
  uint64_t busy = 0, end = 0;
  for (auto [b, e] : g_busy) {
    if (b >= end)
      busy += e - b;
    else if (e > end)
      busy += e - end;
    end = std::max(end, e);
  }
  auto print = [&](const char* title, const std::map<std::string, Stat>& m, size_t top) {
    std::vector<std::pair<std::string, Stat>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    uint64_t total = 0;
    int64_t count = 0;
    for (const auto& [n, s] : v) total += s.ns, count += s.count;
    std::printf("  %s: %.0f calls/step, %.3f ms/step\n", title, double(count) / steps, total / 1e6 / steps);
    for (size_t i = 0; i < std::min(top, v.size()); ++i)
      std::printf("    %8.3f ms %6.1f/step  %s\n", v[i].second.ns / 1e6 / steps,
                  double(v[i].second.count) / steps, v[i].first.c_str());
  };
  std::printf("trace over %d steps: wall %.3f ms/step, GPU busy %.3f ms/step\n", steps, wall_s * 1e3 / steps,
              busy / 1e6 / steps);
  print("GPU work", g_gpu, 45);
  print("runtime API", g_api_calls, 12);
}

}  // namespace trainer::trace
